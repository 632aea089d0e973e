"""The storage ABC: a dataset folder or URL prefix, and everything shardpack does with files there.

A :class:`Storage` is rooted at a folder or URL prefix (``/data/ds``, ``file:///data/ds``,
``s3://bucket/ds``, ``https://host/ds``).  ``Storage(url, storage_options)`` builds the class of
the URL's kind, chosen once, in :func:`storage_class`:
:class:`~shardpack.storage.local.LocalStorage` for files of this machine,
:class:`~shardpack.storage.remote.RemoteStorage` for any other fsspec URL,
:class:`~shardpack.storage.http.HttpStorage` for HTTP(S).  Every difference
between kinds is a method here (reading, atomic writes, link-or-copy, walking a folder, mtimes,
where a worker finds a file, locks); code above this layer never asks which kind it has (it
asks :meth:`Storage.local_path` where it needs an operating-system path).  Adding a kind: a
module with a subclass, and one line in :func:`storage_class`.
"""

from __future__ import annotations

import abc
import os
from contextlib import contextmanager
from typing import Iterator

import fsspec

from shardpack import format as fmt
from shardpack.core.errors import DatasetNotFoundError, IntegrityError
from shardpack.storage.folders import Folders
from shardpack.storage.options import (
    deadline_option, flag_option, fsspec_options, retry_option,
)
from shardpack.storage.retry import BadResponseError, RetryPolicy, ShortReadError

TEMP_MARK = ".tmp-"
MANIFEST_CAP = fmt.MANIFEST_CAP
# The most a whole-file read takes of a file whose size nothing records (a conversion's source
# files): such files are read into memory whole anyway.
BODY_CAP = 4 << 30


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is a temp file of an interrupted atomic write (``.NAME.tmp-...``).

    Args:
        name: a file name.
    """
    return name.startswith(".") and TEMP_MARK in name


def within(real: str, root: str) -> bool:
    """Whether the path ``real`` is ``root`` or lies below it.

    Args:
        real: a real (resolved) path, or a path on an object store.
        root: the folder it may lie in.
    """
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def storage_class(url: str) -> type["Storage"]:
    """The one place that chooses a storage kind, from the URL's scheme.

    Args:
        url: a local path or a URL.
    """
    from shardpack.storage.http import HttpStorage
    from shardpack.storage.local import LocalStorage, is_local
    from shardpack.storage.remote import RemoteStorage

    protocol = fsspec.core.split_protocol(url)[0] or "file"
    if is_local(url, protocol):
        return LocalStorage
    if protocol in ("http", "https"):
        return HttpStorage
    return RemoteStorage


class Storage(Folders):
    """A dataset folder or URL prefix; ``Storage(url, storage_options)`` builds the kind the URL
    names (:func:`storage_class`).

    Args:
        url: a local path or a URL (``s3://bucket/ds``, ``https://host/ds``).
        storage_options: fsspec options, plus shardpack's own (shardpack/storage/options.py).
        retry: the retry policy of remote requests.
    """

    COPY_CHUNK = 8 << 20  # copy_from: bytes per read of a streamed copy
    retries = False  # whether this kind retries requests (a streamed copy runs in its retries)

    def __new__(cls, url=None, storage_options=None, retry=None):
        if cls is Storage:
            cls = storage_class(os.fspath(url))
        return super().__new__(cls)

    def __init__(self, url: str | os.PathLike, storage_options: dict | None = None,
                 retry: RetryPolicy | None = None):
        self.url = os.fspath(url)
        self.storage_options = dict(storage_options or {})
        self.retry = retry_option(self.storage_options, retry)
        self.deadline = deadline_option(self.storage_options)
        self.other_hosts = flag_option(self.storage_options, "follow_redirects_to_other_hosts")
        self.protocol = fsspec.core.split_protocol(self.url)[0] or "file"
        self._fs, root = self._connect()
        self._pid = os.getpid()
        self.root = root.rstrip("/") if root not in ("/", "") else root
        self.stats = {"requests": 0, "retries": 0, "ignored_range": 0, "sliced_range": 0}
        self._manifest: bytes | None = None  # the remote manifest as read, until _sizes parses it
        self._sizes: dict[str, int] = {}     # file name -> size, from that manifest

    @abc.abstractmethod
    def _connect(self) -> tuple:
        """(fsspec filesystem, root path on it) for :attr:`url`."""

    def _fs_options(self) -> dict:
        """The options the filesystem is made with."""
        return fsspec_options(self.storage_options)

    @property
    def fs(self):
        """The fsspec filesystem."""
        return self._fs

    def __getstate__(self):
        self._known_sizes()  # the sizes travel, not the manifest's bytes
        state = dict(self.__dict__)
        state["_pid"] = -1  # rebuilt lazily in the receiving process
        return state

    def __repr__(self) -> str:
        return f"Storage({self.url!r})"

    def path(self, name: str) -> str:
        """The path of ``name`` on the filesystem (:attr:`fs`).

        Args:
            name: a path relative to the root ("" for the root).
        """
        return f"{self.root}/{name}" if name else self.root

    def display(self, name: str) -> str:
        """The name users see in messages: the URL they gave, joined with the file name.

        Args:
            name: a path relative to the root ("" for the root).
        """
        return f"{self.url.rstrip('/')}/{name}" if name else self.url

    # -- what differs between kinds --------------------------------------------------------
    @abc.abstractmethod
    def location(self, name: str = "") -> str:
        """Where a process on any machine finds ``name``: an absolute path or a URL (tasks may
        run in another folder, or on another machine).

        Args:
            name: a path relative to the root ("" for the root).
        """

    def local_path(self, name: str = "") -> str | None:
        """The operating-system path of ``name`` when this storage's files are files of this
        machine (they can be opened, mapped and locked where they are), else None.

        Args:
            name: a path relative to the root ("" for the root).
        """
        return None

    def mtime_ns(self, name: str) -> int:
        """The modification time of ``name`` that a writer checks a file against (a file that
        changed between the walk and the read is refused), or 0: not checked.

        Args:
            name: a path relative to the root.
        """
        return 0

    @abc.abstractmethod
    def contains(self, other: "Storage", strictly: bool = False) -> str | None:
        """Where ``other``'s root lies when it is this root or below it (strictly below with
        ``strictly``) on the same file system or store: its real path or store path; else None.

        Args:
            other: another storage.
            strictly: whether the root itself does not count.
        """

    @abc.abstractmethod
    def place(self) -> tuple[str, str]:
        """(filesystem, real path or root): equal for two storages of one place."""

    def lock_file(self, name: str) -> int | None:
        """An fd of the file ``name`` for an exclusive ``flock``, made (with the root) when
        missing; None where files cannot be locked.  FileExistsError: the root exists and is
        not a folder.

        Args:
            name: the lock file's name in the root.
        """
        return None

    def can_link(self, source: "Storage") -> bool:
        """Whether :meth:`copy_from` ``source`` tries a hard link first.

        Args:
            source: the storage copied from.
        """
        return False

    def map_reads(self, fn, items) -> list:
        """``[fn(item) for item in items]``, side by side where each call waits on requests.

        Args:
            fn: a function that reads.
            items: its arguments.
        """
        return list(map(fn, items))

    # -- requests --------------------------------------------------------------------------
    def _call(self, what: str, name: str, fn, *args, **kwargs):
        """Run one request; kinds whose requests can fail for a while retry them."""
        return fn(*args, **kwargs)

    @property
    def _limit(self) -> dict:
        """The ``timeout`` the sync wrapper of an async fsspec method takes: nothing here."""
        return {}

    # -- reading ---------------------------------------------------------------------------
    def exists(self, name: str = "") -> bool:
        """Whether ``name`` exists.

        Args:
            name: a path relative to the root ("" for the root).
        """
        return self._call("exists", name, self.fs.exists, self.path(name), **self._limit)

    def size(self, name: str) -> int:
        """The size of file ``name`` in bytes.

        Args:
            name: a path relative to the root.
        """
        try:
            return int(self._call("size", name, self.fs.size, self.path(name), **self._limit))
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(name)) from None

    def read_bytes(self, name: str, start: int | None = None, end: int | None = None, *,
                   size: int | None = None) -> bytes:
        """The file, or bytes [start, end): exactly that many, or an error.

        Args:
            name: a path relative to the root.
            start: the first byte (None with ``end`` None: the whole file).
            end: the byte after the last.
            size: the size the manifest records for the whole file, if known: a whole file of
                another size is an error.
        """
        whole = start is None and end is None
        if whole and size is None:
            size = self._known_sizes().get(name)
        if not whole:
            start = start or 0
            if end <= start:
                return b""
        try:
            return self._call("read", name, self._fetch, name, start, end, size)
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(name)) from None

    def read_manifest(self) -> bytes:
        """The dataset's manifest, read against the manifest cap."""
        return self.read_bytes(fmt.MANIFEST_NAME)

    @abc.abstractmethod
    def _fetch(self, name: str, start: int | None, end: int | None, size: int | None) -> bytes:
        """One read of :meth:`read_bytes` (the whole file when ``start`` is None)."""

    def read_ranges(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        """Bytes [start, end) of each (name, start, end), fetched concurrently where requests
        are; exactly those bytes, or an error.  Retried as a whole.

        Args:
            ranges: (name, start, end) of each read.
        """
        asked = [r for r in ranges if r[2] > r[1]]  # (S3 refuses an empty range)
        if not asked:
            return [b""] * len(ranges)
        try:
            return self._call("read", asked[0][0], self._fetch_ranges, ranges, asked)
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(asked[0][0])) \
                from None

    def _fetch_ranges(self, ranges: list, asked: list) -> list[bytes]:
        got = iter(self.fs.cat_ranges([self.path(n) for n, _, _ in asked],
                                      [s for _, s, _ in asked], [e for _, _, e in asked],
                                      on_error="raise", **self._limit))
        sizes = self._known_sizes()
        return [self._exact(next(got), start, end, name, sizes.get(name))
                if end > start else b"" for name, start, end in ranges]

    def _known_sizes(self) -> dict[str, int]:
        """File name -> size, from a manifest this storage read, where it keeps them."""
        return self._sizes

    def _exact(self, data: bytes, start: int, end: int, name: str | None = None,
               size: int | None = None) -> bytes:
        """Bytes [start, end) from what a ranged request returned: a server that ignored Range
        and sent the whole file is tolerated (the range is cut out, counted), when it is the
        whole file (``size``: its size, where known); short is an error (naming ``name``, for
        requests of several files)."""
        want = end - start
        if len(data) == want:
            return data
        if len(data) > want and end <= len(data) and (size is None or len(data) == size):
            self.stats["ignored_range"] += 1  # a 200 with the whole body
            return data[start:end]
        prefix = f"{self.display(name)}: " if name else ""
        if len(data) > want:
            raise BadResponseError(f"{prefix}asked for {want} bytes at {start}, got {len(data)}, "
                                   f"which is not the whole file either")
        raise ShortReadError(prefix + f"asked for {want} bytes at {start}, got {len(data)}")

    def _manifest_cap(self, name: str) -> int | None:
        """The most a whole read of ``name`` may hold: the cap for a manifest, else None."""
        return MANIFEST_CAP if name == fmt.MANIFEST_NAME else None

    @contextmanager
    def open(self, name: str, mode: str = "rb"):
        """The file ``name``, open (a context manager).

        Args:
            name: a path relative to the root.
            mode: the mode to open it in.
        """
        try:
            f = self.fs.open(self.path(name), mode)
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(name)) from None
        with f:
            yield f

    def open_arrow(self, name: str):
        """A pyarrow file for ``name`` (Parquet reads).

        Args:
            name: a path relative to the root.
        """
        import pyarrow as pa

        try:
            return pa.PythonFile(self.fs.open(self.path(name), "rb"), mode="r")
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(name)) from None

    def listdir(self) -> list[str]:
        """Names directly inside the root (files and folders), sorted; [] if it doesn't exist."""
        try:
            entries = self._call("list", "", self.fs.ls, self.root, detail=False,
                                 **self._limit)
        except (FileNotFoundError, DatasetNotFoundError):
            return []
        names = sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)
        return [n for n in names if n]

    # -- writing ---------------------------------------------------------------------------
    def makedirs(self) -> None:
        """Make the root folder (and those above it) where folders exist."""
        self.fs.makedirs(self.root, exist_ok=True)

    @abc.abstractmethod
    def open_atomic(self, name: str) -> Iterator:
        """A binary file (a context manager) that appears under ``name`` only when the block
        exits without error.

        Args:
            name: a path relative to the root.
        """

    def write_atomic(self, name: str, data: bytes) -> None:
        """Write ``data`` as the file ``name``, atomically (:meth:`open_atomic`).

        Args:
            name: a path relative to the root.
            data: its bytes.
        """
        with self.open_atomic(name) as f:
            f.write(data)

    def copy_from(self, source: "Storage", name: str, dest: str, *, size: int,
                  content_hash: str) -> str:
        """Put file ``name`` of ``source`` here as ``dest``, checked against the ``size`` and
        ``content_hash`` (:func:`format.content_hash`) a manifest records for it.  Returns how:
        ``"linked"`` (both local on one file system: a hard link, so only the size is checked),
        ``"server"`` (both on one object store: the store copies; the size is checked), or
        ``"streamed"`` (read and written through this process in COPY_CHUNK pieces, atomically,
        and hashed on the way: size and hash are checked).  A copy that does not match is
        removed and raises :class:`IntegrityError`.

        Args:
            source: the storage the file is in.
            name: its name there.
            dest: its name here.
            size: its size, as its manifest records it.
            content_hash: its content hash, as its manifest records it.
        """
        how = self._copy_direct(source, name, dest, size)
        if how is not None:
            return how
        carrier = source if source.retries else self
        carrier._call("copy", name if carrier is source else dest, self._stream_copy, source,
                      name, dest, size, content_hash)
        return "streamed"

    def _copy_direct(self, source: "Storage", name: str, dest: str, size: int) -> str | None:
        """A copy that moves no byte through this process ("linked", "server"), or None."""
        return None

    def _stream_copy(self, source: "Storage", name: str, dest: str, size: int,
                     content_hash: str) -> None:
        hasher = fmt.new_content_hasher()
        got = 0
        try:
            with source.open(name) as src, self.open_atomic(dest) as out:
                while got <= size:  # (a source longer than its manifest says is not read on)
                    chunk = src.read(min(self.COPY_CHUNK, size + 1 - got))
                    if not chunk:
                        break
                    hasher.update(chunk)
                    out.write(chunk)
                    got += len(chunk)
                # checked inside the block: a local copy that differs is never renamed into place
                if got != size:
                    said = f"is {got} bytes" if got < size else f"is over {size} bytes"
                    raise IntegrityError(f"{said}, its manifest says {size}",
                                         path=source.display(name))
                if hasher.hexdigest() != content_hash:
                    raise IntegrityError("does not match the hash its manifest records",
                                         path=source.display(name))
        except BaseException:
            self._drop_partial(dest)
            raise

    def _drop_partial(self, dest: str) -> None:
        """After a failed :meth:`open_atomic` write of ``dest``: remove what it left, if any."""
        return None

    def _check_size(self, dest: str, size: int, what: str) -> None:
        got = self.size(dest)
        if got != size:
            self.remove(dest)
            raise IntegrityError(f"is {got} bytes, its manifest says {size}", path=what)

    def remove(self, name: str) -> None:
        """Delete the file ``name``; nothing when it is missing.

        Args:
            name: a path relative to the root.
        """
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
