"""A real S3-compatible server for tests: moto's server mode on 127.0.0.1, one bucket."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from raymodel._internal.ingress import free_port

#: Credentials moto accepts; set in the environment of every process that reaches the server.
ENV = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


class S3Server:
    """``with S3Server() as s3: s3.uri("registry")`` is ``s3://models/registry?endpoint_override=...``."""

    def __init__(self, bucket: str = "models") -> None:
        self.bucket, self.port = bucket, free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def uri(self, path: str = "") -> str:
        return (
            f"s3://{self.bucket}/{path.strip('/')}?endpoint_override=127.0.0.1:{self.port}&scheme=http&region=us-east-1"
        )

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
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
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
