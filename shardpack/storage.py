"""The one storage layer: every read and write of a dataset goes through fsspec.

A :class:`Storage` is rooted at a dataset folder or URL prefix (``/data/ds``, ``file:///data/ds``,
``s3://bucket/ds``, ``https://host/ds``).  Local and remote paths take the same code path; the only
difference is how :meth:`Storage.open_atomic` makes a write atomic:

* local: a hidden temp file in the same folder, fsync, ``os.replace`` onto the final name, then an
  fsync of the folder, so a crash leaves either the old file, the new file, or a temp file that
  :meth:`Storage.remove_temp_files` sweeps;
* object stores: an object only appears when its upload completes, so the final name is written
  directly.
"""

from __future__ import annotations

import errno
import os
import uuid
from contextlib import contextmanager
from typing import Iterator

import fsspec
from fsspec.implementations.local import LocalFileSystem

from .errors import DatasetNotFoundError, PackError

TEMP_MARK = ".tmp-"


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and TEMP_MARK in name


class Storage:
    def __init__(self, url: str | os.PathLike, storage_options: dict | None = None):
        self.url = os.fspath(url)
        self.fs, root = fsspec.core.url_to_fs(self.url, **(storage_options or {}))
        self.local = isinstance(self.fs, LocalFileSystem)
        self.root = root.rstrip("/") if root not in ("/", "") else root

    def __repr__(self) -> str:
        return f"Storage({self.url!r})"

    def path(self, name: str) -> str:
        return f"{self.root}/{name}" if name else self.root

    def display(self, name: str) -> str:
        """The name users see in messages: the URL they gave, joined with the file name."""
        return f"{self.url.rstrip('/')}/{name}" if name else self.url

    # -- reading ---------------------------------------------------------------------------
    def exists(self, name: str = "") -> bool:
        return self.fs.exists(self.path(name))

    def size(self, name: str) -> int:
        try:
            return int(self.fs.size(self.path(name)))
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(name)) from None

    def read_bytes(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        try:
            if start is None and end is None:
                return self.fs.cat_file(self.path(name))
            return self.fs.cat_file(self.path(name), start=start, end=end)
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(name)) from None

    @contextmanager
    def open(self, name: str, mode: str = "rb"):
        try:
            f = self.fs.open(self.path(name), mode)
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(name)) from None
        with f:
            yield f

    def listdir(self) -> list[str]:
        """Names directly inside the root (files and folders), sorted; [] if it doesn't exist."""
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        names = sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)
        return [n for n in names if n]

    # -- writing ---------------------------------------------------------------------------
    def makedirs(self) -> None:
        self.fs.makedirs(self.root, exist_ok=True)

    @contextmanager
    def open_atomic(self, name: str) -> Iterator:
        """A binary file that appears under ``name`` only when the block exits without error."""
        if not self.local:
            with self.fs.open(self.path(name), "wb") as f:
                yield f
            return
        tmp = self.path(f".{name}{TEMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            with open(tmp, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path(name))
            _fsync_dir(self.root)
        except BaseException as exc:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                raise PackError("out of disk space while writing", path=self.display(name),
                                hint="free some space, then rerun with --resume") from None
            raise

    def write_atomic(self, name: str, data: bytes) -> None:
        with self.open_atomic(name) as f:
            f.write(data)

    def remove(self, name: str) -> None:
        try:
            self.fs.rm_file(self.path(name))
        except FileNotFoundError:
            pass

    def remove_temp_files(self) -> int:
        """Delete temp files left by interrupted writes; returns how many."""
        count = 0
        for name in self.listdir():
            if is_temp_name(name):
                self.remove(name)
                count += 1
        return count


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
