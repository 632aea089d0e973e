"""Any fsspec URL that is not a file of this machine (``s3://``, ``gs://``, ``memory://``, chains):
every request retried by the storage's :class:`~shardpack.storage.retry.RetryPolicy` within its
deadline, whole reads bounded by the sizes the manifest records, objects written directly
(an object only appears when its upload completes), copies made by the store where it can."""

from __future__ import annotations

import os
import weakref
from contextlib import contextmanager
from typing import Iterator

import fsspec

from shardpack import format as fmt
from shardpack.core.errors import (
    CacheError, DatasetNotFoundError, FormatError, IntegrityError, RemoteError, ShardpackError,
)
from shardpack.storage import base
from shardpack.storage.base import Storage
from shardpack.storage.folders import info_mtime_ns
from shardpack.storage.retry import ShortReadError, retried_call, time_left

# NOTE [async clients across fork]: fsspec's async filesystems (HTTP, S3) close their session from
# a weakref finalizer that hands the close to the event-loop thread and waits for it, looking once
# a second.  A forked DataLoader worker inherits the clients but not that thread.  Each client is
# in a reference cycle with itself (its sync methods are bound to it), so one that dies is freed
# by a garbage collection, and in a worker that was the first collection: for the client
# RemoteStorage.fs replaces with a process-local one, and for any dropped dataset the parent had
# not collected yet.  The worker then waited a full second per client before its first batch, and
# the close went through the epoll instance it shares with the parent (docs/remote.md, "Cold
# epochs on a fast link").  A child therefore keeps every async client it inherited alive, never
# using it.  DataLoader and multiprocessing workers leave by os._exit, so no finalizer runs there;
# a plain os.fork() child that exits normally still runs fsspec's finalizers at exit (fsspec's
# behaviour, not changed here).  The cost: the inherited sockets stay open in the worker until it
# exits.  The parent closes its own clients as usual.
_ASYNC_FS: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()  # by id: fsspec
_INHERITED: dict = {}                                                      # ones compare equal


def _keep_inherited() -> None:
    _INHERITED.update(_ASYNC_FS.items())


os.register_at_fork(after_in_child=_keep_inherited)


def cache_error(dest: str, exc: OSError) -> CacheError:
    """The error for a download that could not be written to ``dest`` (a local problem: not
    retried, not blamed on the remote).

    Args:
        dest: the local file written.
        exc: what writing it raised.
    """
    return CacheError(f"cannot write a download: {exc.strerror or exc}", path=dest)


class RemoteStorage(Storage):
    """A folder on an object store or any fsspec filesystem that is not this machine's."""

    retries = True
    STREAM_MAX = 256 << 20  # download(): files up to this size come as one streamed request
    READ_THREADS = 8  # map_reads: calls in flight at once

    def _connect(self) -> tuple:
        options = self._fs_options()
        if self.protocol not in ("file", "local"):
            # a fresh client per Storage: fsspec's shared instances keep pooled keep-alive
            # connections that a proxy or NAT may have dropped silently while idle
            options["skip_instance_cache"] = True
        fs, root = fsspec.core.url_to_fs(self.url, **options)
        self._keep(fs)
        return fs, root

    def _fs_options(self) -> dict:
        """Per-request timeouts by default; the caller's storage_options win."""
        opts = super()._fs_options()
        if self.protocol in ("s3", "s3a"):
            t = self.retry.timeout
            config = dict(opts.get("config_kwargs") or {})
            config.setdefault("connect_timeout", t)
            config.setdefault("read_timeout", t)
            config.setdefault("retries", {"max_attempts": 1})  # our retries, not botocore's
            opts["config_kwargs"] = config
        return opts

    @property
    def fs(self):
        """The filesystem, one instance per process: async clients don't survive a fork."""
        if self._pid != os.getpid():
            self._fs = type(self._fs)(**self._fs_options(), skip_instance_cache=True)
            self._keep(self._fs)
            self._pid = os.getpid()
        return self._fs

    @staticmethod
    def _keep(fs) -> None:
        if getattr(fs, "async_impl", False):
            _ASYNC_FS[id(fs)] = fs  # NOTE [async clients across fork]

    # -- requests: retried, bounded ----------------------------------------------------------
    def _call(self, what: str, name: str, fn, *args, **kwargs):
        """Run one request with the retry policy, within the request deadline (retry.py)."""
        return retried_call(self, what, name, fn, args, kwargs)

    @property
    def _limit(self) -> dict:
        """The ``timeout`` the sync wrapper of an async fsspec method takes (it cancels the
        request): what is left of the request deadline."""
        return {"timeout": time_left(self.deadline)} if getattr(self.fs, "async_impl", False) \
            else {}

    # -- where things are --------------------------------------------------------------------
    def location(self, name: str = "") -> str:
        """The URL of ``name``.

        Args:
            name: a path relative to the root ("" for the URL as given).
        """
        return self.display(name)

    def kind(self, name: str = "", *, request: bool = True) -> str | None:
        """'file' or 'dir' (one request), None when nothing is there, 'unknown' without
        ``request``.

        Args:
            name: a path relative to the root ("" for the root).
            request: whether the request may be made.
        """
        if not request:
            return "unknown"
        try:
            info = self.fs.info(self.path(name))
        except FileNotFoundError:
            return None
        return "dir" if info.get("type") == "directory" else "file"

    def real(self, path: str) -> str:
        """The path on the store of a URL below :meth:`location`.

        Args:
            path: a URL below this storage's.
        """
        return self.root.rstrip("/") + path[len(self.url.rstrip("/")):]

    def _ls(self, folder: str) -> list[tuple[str, str, dict]]:
        """(name, URL, fsspec info) of a folder's entries, sorted by name: one request."""
        where = self.real(folder)
        out = []
        for info in self.fs.ls(where, detail=True):
            full = info["name"].rstrip("/")
            if full == where.rstrip("/"):  # the folder's own marker object ("tree/")
                continue
            name = full.rsplit("/", 1)[-1]
            if name:
                out.append((name, f"{folder}/{name}", info))
        return sorted(out, key=lambda t: t[0])

    def entries(self, folder: str) -> list[tuple[str, str, bool, bool]]:
        """(name, URL, is a folder, False) of each entry: one listing request.

        Args:
            folder: a URL below this storage's.
        """
        return [(name, path, info["type"] == "directory", False)
                for name, path, info in self._ls(folder)]

    def scan(self, folder: str, stop: tuple[str, ...] = ()) -> list[tuple] | None:
        """See :meth:`Storage.scan`: one listing request; no links or special files here, and
        the modification time, where the store gives one, guards against a file changing
        during a pack.

        Args:
            folder: a URL below this storage's.
            stop: names that make the scan stop at once.
        """
        listed = self._ls(folder)
        if stop and any(name in stop for name, _, _ in listed):
            return None
        return [(name, path, "dir", None, 0, None, None) if info.get("type") == "directory"
                else (name, path, "file", int(info.get("size") or 0), info_mtime_ns(info),
                      None, None)
                for name, path, info in listed]

    def marked(self, folder: str, names: tuple[str, ...]) -> bool:
        """Whether ``folder`` holds the first of ``names``: one request, the others are not
        asked for.

        Args:
            folder: a URL below this storage's.
            names: file names, the one that matters most first.
        """
        return self.fs.exists(f"{self.real(folder)}/{names[0]}")

    def every_folder(self, names: list[str]) -> bool:
        """False: telling would take a request per name (such a tree is named by the user).

        Args:
            names: names of entries of the root.
        """
        return False

    def has_file_below(self, suffix: str, depth: int, peek: int) -> bool:
        """See :meth:`Storage.has_file_below`: the store lists the levels itself.

        Args:
            suffix: the end of the name.
            depth: folder levels looked into.
            peek: unused (the store lists whole levels).
        """
        try:
            found = self.fs.find(self.root, maxdepth=depth)
        except (OSError, ValueError):
            return False
        return any(p.endswith(suffix) and "/." not in p for p in found)

    def contains(self, other: Storage, strictly: bool = False) -> str | None:
        """``other``'s path on the store when it lies below this root on the same kind of
        store (or is it, unless ``strictly``).

        Args:
            other: another storage.
            strictly: whether this root itself does not count.
        """
        if not isinstance(other, RemoteStorage) or other.protocol != self.protocol:
            return None
        root, real = self.root.rstrip("/"), other.root.rstrip("/")
        if real.startswith(root + "/") or (not strictly and real == root):
            return real
        return None

    def place(self) -> tuple[str, str]:
        """(the filesystem's class name, the root)."""
        return type(self.fs).__name__, self.root.rstrip("/")

    def map_reads(self, fn, items) -> list:
        """``[fn(item) for item in items]``, READ_THREADS calls in flight at once.

        Args:
            fn: a function that reads.
            items: its arguments.
        """
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self.READ_THREADS) as pool:
            return list(pool.map(fn, items))

    # -- reading -----------------------------------------------------------------------------
    def read_bytes(self, name: str, start: int | None = None, end: int | None = None, *,
                   size: int | None = None) -> bytes:
        """The file, or bytes [start, end) (:meth:`Storage.read_bytes`).  A whole file is read
        against a bound, never buffered past it: ``size``, else the size the manifest this
        storage read records, the manifest itself against the manifest cap, any other file
        against the body cap.  Shorter than ``size`` is retried; longer is an
        :class:`IntegrityError`, over a cap a one-line error, neither retried.  A server that
        ignores Range and sends the whole file is tolerated (the range is cut out, counted).

        Args:
            name: a path relative to the root.
            start: the first byte (None with ``end`` None: the whole file).
            end: the byte after the last.
            size: the size the manifest records for the whole file, if known.
        """
        data = super().read_bytes(name, start, end, size=size)
        if start is None and end is None and name == fmt.MANIFEST_NAME:
            self._manifest, self._sizes = data, {}  # parsed when a size is first wanted
        return data

    def _fetch(self, name: str, start: int | None, end: int | None, size: int | None) -> bytes:
        if start is None:
            return self._bounded(name, self.fs.cat_file(self.path(name), **self._limit), size)
        return self._exact(self.fs.cat_file(self.path(name), start=start, end=end,
                                            **self._limit), start, end, size=size)

    def _bounded(self, name: str, data: bytes, size: int | None) -> bytes:
        """A whole file fsspec read (S3 and others: botocore reads what Content-Length says,
        so the body was bounded by the server's word), checked against the bound."""
        if size is not None and len(data) < size:
            raise ShortReadError(f"got {len(data)} bytes, expected {size}")
        self._check_bound(name, size, len(data), len(data))
        return data

    def _known_sizes(self) -> dict[str, int]:
        """File name -> size, from the manifest this storage read (parsed on first use: with a
        cache, downloads are given their sizes and this is never needed)."""
        if self._manifest is not None:
            self._sizes, self._manifest = manifest_sizes(self._manifest), None
        return self._sizes

    def _check_bound(self, name: str, size: int | None, got: int,
                     declared: int | None) -> None:
        """Refuse a body that runs past its bound (``got``: bytes come so far, ``declared``:
        the length the server announced, if any)."""
        if size is not None:
            if declared is not None and declared > size:
                said = f"is {declared} bytes, the manifest says {size}"
            elif got > size:
                said = f"is longer than the {size} bytes the manifest says"
            else:
                return
            raise IntegrityError(f"remote file {said}", path=self.display(name),
                                 hint="was the dataset changed after packing?")
        over = declared if declared is not None else got
        if name == fmt.MANIFEST_NAME and over > base.MANIFEST_CAP:
            raise FormatError(f"manifest is longer than {base.MANIFEST_CAP:,} bytes, the most one "
                              f"may be (docs/format.md, \"Manifest\")", path=self.display(name))
        if over > base.BODY_CAP:
            raise RemoteError(f"body is longer than {base.BODY_CAP:,} bytes, the most read of a "
                              f"file whose size the manifest does not record",
                              path=self.display(name))

    @property
    def _stream_options(self) -> dict:
        """get_file options that keep a download one stream, written as it arrives: s3fs would
        otherwise fetch an object over 50 MiB as 10 concurrent parts held in memory."""
        return {"max_concurrency": 1} if self.protocol in ("s3", "s3a") else {}

    def download(self, name: str, dest: str, size: int, part_size: int = 16 << 20,
                 parallel: int = 4) -> str | None:
        """Copy one remote file into the local path ``dest``.  Up to STREAM_MAX bytes: one
        streamed request, written as it arrives.  Bigger files: ``parallel`` ranged reads of
        ``part_size`` bytes at a time, each retried on its own.  Why streaming first:
        docs/remote.md, "Downloads".

        Args:
            name: a path relative to the root.
            dest: the local file to write.
            size: the file's size, as the manifest records it.
            part_size: bytes per ranged read of a big file.
            parallel: ranged reads in flight at once.

        Returns:
            The content hash (:func:`format.content_hash`) of what was written when it could
            be computed on the way, else None: the caller hashes the file.
        """
        if size <= self.STREAM_MAX or parallel <= 1:
            return self._call("download", name, self._download_whole, name, dest, size)
        from concurrent.futures import ThreadPoolExecutor

        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, size)

            def part(offset: int) -> None:
                data = self.read_bytes(name, offset, min(size, offset + part_size))
                os.pwrite(fd, data, offset)

            with ThreadPoolExecutor(parallel) as pool:
                list(pool.map(part, range(0, size, part_size)))
        finally:
            os.close(fd)

    def _download_whole(self, name: str, dest: str, size: int) -> str | None:
        try:
            digest = self._stream_to(name, dest, size)
        except OSError as exc:
            if isinstance(exc, ShardpackError):  # a CacheError is an OSError too
                raise
            if getattr(exc, "filename", None) == dest:  # writing here failed
                raise cache_error(dest, exc) from exc
            raise
        got = os.path.getsize(dest)
        if got > size:
            raise IntegrityError(f"remote file is {got} bytes, the manifest says {size}",
                                 path=self.display(name),
                                 hint="was the dataset changed after packing?")
        if got < size:
            raise ShortReadError(f"{self.display(name)}: got {got} bytes, expected {size}")
        return digest

    def _stream_to(self, name: str, dest: str, size: int) -> str | None:
        """One streamed request of ``name`` into ``dest`` (the backend's ``get_file``); the
        content hash when computed on the way, else None."""
        self.fs.get_file(self.path(name), dest, **self._stream_options, **self._limit)
        return None

    # -- writing -----------------------------------------------------------------------------
    @contextmanager
    def open_atomic(self, name: str) -> Iterator:
        """The object ``name``, written directly: it only appears when its upload completes.

        Args:
            name: a path relative to the root.
        """
        f = self.fs.open(self.path(name), "wb")
        try:
            yield f
        except BaseException:
            self._abandon(f, name)
            raise
        f.close()

    def _abandon(self, f, name: str) -> None:
        """Throw an unfinished upload away: closing it (what ``with`` does, error or not) would
        publish the partial object under its name, over an older one."""
        from fsspec.spec import AbstractBufferedFile

        if isinstance(f, AbstractBufferedFile):
            f.discard()  # S3: aborts the multipart upload; all: drops the buffer
            f.closed = True  # no upload when it is collected either
        else:  # a file object of another kind: the object appears, and goes at once
            f.close()
            self._drop_partial(name)

    def _drop_partial(self, dest: str) -> None:
        try:  # an object appears when its upload ends, error or not
            self.remove(dest)
        except Exception:  # noqa: BLE001 - the first error is the one to report
            pass

    def _copy_direct(self, source: Storage, name: str, dest: str, size: int) -> str | None:
        """Both on one object store (same filesystem class and options): the store copies
        (fsspec ``cp_file``; S3 CopyObject), no byte passes through this process."""
        if not isinstance(source, RemoteStorage) or type(self._fs) is not type(source._fs) \
                or self.storage_options != source.storage_options:
            return None

        def server_copy() -> bool:
            try:
                self.fs.cp_file(source.path(name), self.path(dest), **self._limit)
            except NotImplementedError:  # a filesystem without a copy of its own
                return False
            except FileNotFoundError:
                raise DatasetNotFoundError("file is missing", path=source.display(name)) from None
            return True

        if self._call("copy", dest, server_copy):
            self._check_size(dest, size, source.display(name))
            return "server"
        return None


def manifest_sizes(data: bytes) -> dict[str, int]:
    """File name -> size for every shard, index and skip report a manifest records; what does
    not look right is left out (the reader's own check of the manifest says what is wrong).

    Args:
        data: the manifest's bytes.
    """
    import json

    try:
        doc = json.loads(data)
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    sizes: dict[str, int] = {}
    entries = doc.get("shards") if isinstance(doc.get("shards"), list) else []
    report = doc.get("skip_report")
    for entry in [*entries, report] if isinstance(report, dict) else entries:
        if not isinstance(entry, dict):
            continue
        for name, size in (("name", "bytes"), ("index", "index_bytes")):
            value = entry.get(size)
            if isinstance(entry.get(name), str) and type(value) is int and value >= 0:
                sizes[entry[name]] = value
    return sizes
