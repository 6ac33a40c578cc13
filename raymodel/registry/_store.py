"""Where registry files live: a local folder or any ``pyarrow.fs`` URI (S3, GCS, HDFS).

Local storage claims a version number with an atomic directory rename, so
concurrent writers get distinct versions and a half-written version is never
visible. On object stores a version is visible once its ``record.json``
(written last) exists.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


class Store:
    """Minimal file operations relative to the registry's root."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.local = "://" not in uri or uri.startswith("file://")
        if self.local:
            self.root = Path(uri.removeprefix("file://")).expanduser().resolve()
            self.root.mkdir(parents=True, exist_ok=True)
        else:
            import pyarrow.fs

            self.fs, self.base = pyarrow.fs.FileSystem.from_uri(uri)
            self.base = self.base.rstrip("/")
            self.fs.create_dir(self.base, recursive=True)

    # ---------------------------------------------------------------- paths
    def _remote(self, rel: str) -> str:
        return f"{self.base}/{rel}" if rel else self.base

    def exists(self, rel: str) -> bool:
        if self.local:
            return (self.root / rel).exists()
        import pyarrow.fs

        return self.fs.get_file_info(self._remote(rel)).type != pyarrow.fs.FileType.NotFound

    def listdir(self, rel: str) -> list[str]:
        if self.local:
            path = self.root / rel
            return sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        import pyarrow.fs

        infos = self.fs.get_file_info(pyarrow.fs.FileSelector(self._remote(rel), allow_not_found=True))
        return sorted(info.base_name for info in infos)

    def read_text(self, rel: str) -> str:
        if self.local:
            return (self.root / rel).read_text()
        with self.fs.open_input_stream(self._remote(rel)) as fh:
            return fh.read().decode()

    def write_text(self, rel: str, text: str) -> None:
        """Replace a small file whole (temp file + rename locally)."""
        if self.local:
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.replace(tmp, path)
            return
        with self.fs.open_output_stream(self._remote(rel)) as fh:
            fh.write(text.encode())

    def read_json(self, rel: str, default: Any = None) -> Any:
        try:
            return json.loads(self.read_text(rel))
        except (FileNotFoundError, OSError):
            return default

    # ------------------------------------------------------------ directories
    def publish(self, source: Path, key: str, first: int, record: dict[str, Any]) -> int:
        """Make ``source`` (a finished checkpoint folder) the next free version of ``key``."""
        record_text = lambda n: json.dumps({**record, "version": n}, indent=2, sort_keys=True)  # noqa: E731
        if self.local:
            staging = self.root / key / ".staging" / os.urandom(8).hex()
            staging.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(source, staging)
            (self.root / key / "versions").mkdir(parents=True, exist_ok=True)
            n = first
            while True:
                (staging / "record.json").write_text(record_text(n))
                try:
                    os.rename(staging, self.root / key / "versions" / str(n))  # atomic claim
                    return n
                except OSError:
                    if not (self.root / key / "versions" / str(n)).exists():
                        raise
                    n += 1
        n = first
        while self.exists(f"{key}/versions/{n}"):
            n += 1
        target = f"{key}/versions/{n}"
        for path in sorted(source.rglob("*")):
            if path.is_file():
                with self.fs.open_output_stream(self._remote(f"{target}/{path.relative_to(source).as_posix()}")) as fh:
                    fh.write(path.read_bytes())
        self.write_text(f"{target}/record.json", record_text(n))  # written last: now visible
        return n

    def fetch(self, rel: str, into: Path) -> Path:
        """A local folder with the files of ``rel`` (the folder itself when local)."""
        if self.local:
            return self.root / rel
        import pyarrow.fs

        pyarrow.fs.copy_files(self._remote(rel), str(into), source_filesystem=self.fs,
                              destination_filesystem=pyarrow.fs.LocalFileSystem())
        return into

    def delete(self, rel: str) -> None:
        if self.local:
            path = self.root / rel
            # Hide it first (rename), then remove: readers never see a half-deleted version.
            hidden = path.parent / f".deleted-{path.name}-{os.urandom(4).hex()}"
            os.rename(path, hidden)
            shutil.rmtree(hidden, ignore_errors=True)
            return
        self.fs.delete_file(self._remote(f"{rel}/record.json"))
        self.fs.delete_dir(self._remote(rel))
