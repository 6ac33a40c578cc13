"""Where registry files live: a local folder or any ``pyarrow.fs`` URI (S3, GCS, HDFS).

Layout under the root::

    <key>/versions/<n>/            a checkpoint plus record.json (written last: then it is visible)
    <key>/versions/<n>/DELETED     a tombstone: the version was deleted; <n> is never handed out again
    <key>/versions/<n>/CLAIMED     object stores: the writer's claim on <n> (S3: a conditional write)
    <key>/aliases/<alias>.json     one file per alias, replaced whole
    <key>/.staging/...             local puts in progress (a killed writer's are collected later)
    <key>/.lock                    local: serializes alias changes and deletes of one key

Local storage claims a version number with an atomic directory rename; S3
with a conditional write of ``CLAIMED`` (``If-None-Match: *``). Either way
concurrent writers get distinct versions, and a version is visible only once
its ``record.json`` is written, after every other file. Every path is checked to stay inside the root.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from raymodel._internal import storage, tmp
from raymodel.exceptions import RegistryError

RECORD = "record.json"
TOMBSTONE = "DELETED"
CLAIM = "CLAIMED"


class Store:
    """Small file operations relative to the registry's root, local or on a ``pyarrow.fs`` filesystem."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.local = "://" not in uri or uri.startswith("file://")
        try:
            if self.local:
                self.root = Path(uri.removeprefix("file://")).expanduser().resolve()
                self.root.mkdir(parents=True, exist_ok=True)
            else:
                import pyarrow.fs

                self.fs, self.base = pyarrow.fs.FileSystem.from_uri(uri)
                self.base = self.base.rstrip("/")
                self.fs.create_dir(self.base, recursive=True)
        except FileExistsError as exc:
            raise RegistryError(f"The registry `{uri}` is a file, not a folder; choose a folder.") from exc
        except PermissionError as exc:
            raise RegistryError(f"Cannot create the registry folder `{uri}`: permission denied.") from exc
        except (OSError, ValueError) as exc:  # pyarrow: unknown scheme, bad URI, unreachable store
            raise RegistryError(f"Cannot open the registry `{uri}`: {exc}") from exc

    # ---------------------------------------------------------------- paths
    def path(self, rel: str) -> Path:
        """The local path of ``rel``, which must stay inside the root."""
        try:
            path = (self.root / rel).resolve()
        except (ValueError, OSError) as exc:
            raise RegistryError(f"`{rel!r}` is not a path inside the registry root `{self.root}`.") from exc
        if path != self.root and not path.is_relative_to(self.root):
            raise RegistryError(f"`{rel}` is outside the registry root `{self.root}`.")
        return path

    def _remote(self, rel: str) -> str:
        if rel.startswith("/") or ".." in rel.split("/"):
            raise RegistryError(f"`{rel}` is outside the registry root `{self.uri}`.")
        return f"{self.base}/{rel}" if rel else self.base

    def exists(self, rel: str) -> bool:
        if self.local:
            return self.path(rel).exists()
        import pyarrow.fs

        return self.fs.get_file_info(self._remote(rel)).type != pyarrow.fs.FileType.NotFound

    def listdir(self, rel: str) -> list[str]:
        if self.local:
            path = self.path(rel)
            return sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        import pyarrow.fs

        infos = self.fs.get_file_info(pyarrow.fs.FileSelector(self._remote(rel), allow_not_found=True))
        return sorted(info.base_name for info in infos)

    def read_text(self, rel: str) -> str:
        if self.local:
            return self.path(rel).read_text()
        with self.fs.open_input_stream(self._remote(rel)) as fh:
            return fh.read().decode()

    def read_json(self, rel: str) -> Any:
        """The parsed file; ``FileNotFoundError`` if absent, ``RegistryError`` naming it if corrupt."""
        try:
            text = self.read_text(rel)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if not self.exists(rel):
                raise FileNotFoundError(rel) from exc
            raise RegistryError(f"Cannot read `{self.describe(rel)}`: {exc}") from exc
        try:
            return json.loads(text)
        except ValueError as exc:
            raise RegistryError(f"`{self.describe(rel)}` is corrupt (not JSON: {exc}).") from exc

    def describe(self, rel: str) -> str:
        return str(self.root / rel) if self.local else storage.join(self.uri, rel)

    def write_text(self, rel: str, text: str) -> None:
        """Replace a small file whole (a temporary file renamed over it, locally)."""
        if self.local:
            path = self.path(rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, staged = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
            try:
                with os.fdopen(fd, "w") as fh:
                    fh.write(text)
                os.replace(staged, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(staged)
                raise
            return
        with self.fs.open_output_stream(self._remote(rel)) as fh:
            fh.write(text.encode())

    def delete_file(self, rel: str) -> None:
        if self.local:
            with contextlib.suppress(FileNotFoundError):
                self.path(rel).unlink()
            return
        with contextlib.suppress(FileNotFoundError, OSError):
            self.fs.delete_file(self._remote(rel))

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Serialize alias changes and deletes of ``key`` (an advisory file lock, local storage only)."""
        if not self.local:
            yield
            return
        import fcntl

        path = self.path(f"{key}/.lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # -------------------------------------------------------------- versions
    def numbers(self, key: str) -> list[int]:
        """Every version number ever claimed for ``key`` (deleted ones included)."""
        return sorted(int(n) for n in self.listdir(f"{key}/versions") if n.isascii() and n.isdigit())

    def publish(self, source: Path, key: str, record: dict[str, Any]) -> int:
        """Make ``source`` (a finished checkpoint folder) the next version of ``key``: one never used before."""
        record_text = lambda n: json.dumps({**record, "version": n}, indent=2, sort_keys=True)  # noqa: E731
        taken = self.numbers(key)
        n = max(taken) + 1 if taken else 1
        if not self.local:
            while not self._claim(f"{key}/versions/{n}/{CLAIM}"):  # one writer per number
                n += 1
            target = f"{key}/versions/{n}"
            storage.upload(source, storage.join(self.uri, target))
            self.write_text(f"{target}/{RECORD}", record_text(n))  # written last: now visible
            return n
        staging_root = self.path(f"{key}/.staging")
        with tmp.tempdir("put", parent=staging_root) as staging:
            staged = staging / "v"
            shutil.copytree(source, staged)
            versions = self.path(f"{key}/versions")
            versions.mkdir(parents=True, exist_ok=True)
            while True:
                (staged / RECORD).write_text(record_text(n))
                try:
                    os.rename(staged, versions / str(n))  # the atomic claim: fails if <n> exists
                    return n
                except OSError:
                    if not (versions / str(n)).exists():
                        raise
                    n += 1

    def _claim(self, rel: str) -> bool:
        """Create the empty object ``rel`` unless it exists: ``False`` when another writer has it.

        On S3 this is a conditional write (``If-None-Match: *``, through boto3),
        which the store itself decides, so of any number of writers exactly one
        gets a number. Other object stores have no such write in ``pyarrow.fs``:
        there a writer checks and claims, which is safe for one writer at a time.
        """
        if self.uri.startswith("s3://"):
            client, bucket, name = _s3_client(self.uri, self._remote(rel))
            from botocore.exceptions import ClientError

            try:
                client.put_object(Bucket=bucket, Key=name, Body=b"", IfNoneMatch="*")
                return True
            except ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if status in (409, 412):  # 412: the object exists; 409: a concurrent conditional write won
                    return False
                raise RegistryError(f"Cannot claim `{self.describe(rel)}`: {exc}") from exc
        if self.exists(rel):
            return False
        self.write_text(rel, "")
        return True

    def fetch(self, rel: str, into: Path) -> Path:
        """A local folder with the files of ``rel`` (the folder itself when local)."""
        if self.local:
            return self.path(rel)
        self._remote(rel)  # checked to stay inside the root
        return storage.download(storage.join(self.uri, rel), into)

    def tombstone(self, key: str, n: int) -> None:
        """Delete version ``n``: the tombstone first (it is gone at once), then its files; the number stays taken."""
        rel = f"{key}/versions/{n}"
        self.write_text(f"{rel}/{TOMBSTONE}", "{}")
        self.delete_file(f"{rel}/{RECORD}")
        if self.local:
            for child in self.path(rel).iterdir():
                if child.name != TOMBSTONE:
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
            return
        import pyarrow.fs

        selector = pyarrow.fs.FileSelector(self._remote(rel), recursive=True)
        for info in self.fs.get_file_info(selector):
            if info.type == pyarrow.fs.FileType.File and info.base_name not in (TOMBSTONE, CLAIM):
                self.fs.delete_file(info.path)


def _s3_client(uri: str, path: str) -> tuple[Any, str, str]:
    """A boto3 S3 client configured as ``pyarrow.fs`` reads ``uri`` (its ``endpoint_override``,
    ``scheme`` and ``region`` query options; credentials from the environment), and
    ``(bucket, key)`` of ``path``."""
    from urllib.parse import parse_qs, urlsplit

    try:
        import boto3
    except ImportError as exc:
        raise RegistryError(
            "A registry on S3 needs boto3 for its conditional writes: `pip install 'raymodel[s3]'`."
        ) from exc
    options = {k: v[-1] for k, v in parse_qs(urlsplit(uri).query).items()}
    kwargs: dict[str, Any] = {}
    if "endpoint_override" in options:
        endpoint = options["endpoint_override"]
        kwargs["endpoint_url"] = endpoint if "://" in endpoint else f"{options.get('scheme', 'https')}://{endpoint}"
    if "region" in options:
        kwargs["region_name"] = options["region"]
    if "access_key" in options and "secret_key" in options:
        kwargs["aws_access_key_id"], kwargs["aws_secret_access_key"] = options["access_key"], options["secret_key"]
    bucket, _, name = path.partition("/")
    return boto3.client("s3", **kwargs), bucket, name
