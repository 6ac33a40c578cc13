"""A real S3-compatible server for tests: moto's server mode on 127.0.0.1, one bucket.

moto checks a conditional write (``If-None-Match: *``) and then writes, two steps, on a thread per
request: two writers of one key can both pass the check (seen in CI: two registry writers got one
version). S3 itself decides such a write atomically, so the server run here (``python s3server.py
PORT``) is moto's own, with its conditional writes taken one at a time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from raymodel._ray.ingress import free_port

#: Credentials moto accepts; set in the environment of every process that reaches the server.
ENV = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


class S3Server:
    """``with S3Server() as s3: s3.uri("registry")`` is ``s3://models/registry?endpoint_override=...``."""

    def __init__(self, bucket: str = "models", host: str = "127.0.0.1") -> None:
        self.bucket, self.port, self.host = bucket, free_port(), host
        self.endpoint = f"http://{host}:{self.port}"
        self.process: subprocess.Popen | None = None

    def uri(self, path: str = "") -> str:
        return f"s3://{self.bucket}/{path.strip('/')}?endpoint_override={self.host}:{self.port}&scheme=http&region=us-east-1"

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def __enter__(self) -> S3Server:
        os.environ.update(ENV)
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(self.port), self.host],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client().create_bucket(Bucket=self.bucket)
                return self
            except Exception:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.__exit__()
                    raise
                time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()


def conditional_writes_one_at_a_time(app):
    """A WSGI middleware: requests with ``If-None-Match`` or ``If-Match`` run under one lock, so a
    conditional write's check and write are one step, as on S3."""
    import threading

    lock = threading.Lock()

    def serialized(environ, start_response):
        if "HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ:
            with lock:
                return list(app(environ, start_response))
        return app(environ, start_response)

    return serialized


def main(port: int, host: str = "127.0.0.1") -> None:
    """moto's server (as ``python -m moto.server`` runs it), its conditional writes atomic."""
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    os.environ.setdefault("MOTO_PORT", str(port))
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(host, port, conditional_writes_one_at_a_time(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main(int(sys.argv[1]), *sys.argv[2:3])
