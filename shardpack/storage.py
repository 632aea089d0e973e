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

import asyncio
import errno
import os
import random
import time
import uuid
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import fsspec
from fsspec.implementations.local import LocalFileSystem

from . import format as fmt
from .errors import (CacheError, DatasetNotFoundError, IntegrityError, PackError,
                     RemoteError, ShardpackError)

TEMP_MARK = ".tmp-"

# NOTE [async clients across fork]: fsspec's async filesystems (HTTP, S3) close their session from
# a weakref finalizer that hands the close to the event-loop thread and waits for it, looking once
# a second.  A forked DataLoader worker inherits the clients but not that thread.  Each client is
# in a reference cycle with itself (its sync methods are bound to it), so one that dies is freed
# by a garbage collection, and in a worker that was the first collection: for the client
# Storage.fs replaces with a process-local one, and for any dropped dataset the parent had not
# collected yet.  The worker then waited a full second per client before its first batch, and the
# close went through the epoll instance it shares with the parent (docs/remote.md, "Cold epochs
# on a fast link").  A child therefore keeps every async client it inherited alive, never using
# it.  DataLoader and multiprocessing workers leave by os._exit, so no finalizer runs there; a
# plain os.fork() child that exits normally still runs fsspec's finalizers at exit (fsspec's
# behaviour, not changed here).  The cost: the inherited sockets stay open in the worker until it
# exits.  The parent closes its own clients as usual.
_ASYNC_FS: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()  # by id: fsspec
_INHERITED: dict = {}                                                      # ones compare equal


def _keep_inherited() -> None:
    _INHERITED.update(_ASYNC_FS.items())


os.register_at_fork(after_in_child=_keep_inherited)


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and TEMP_MARK in name


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and full jitter, for remote requests only."""

    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 10.0
    timeout: float = 30.0  # seconds per request (connect, and between reads)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay * 3)
        return random.uniform(0, min(self.max_delay, self.base_delay * 2 ** attempt))


def classify(exc: BaseException) -> tuple[bool, float | None]:
    """(retry?, Retry-After seconds) for an exception from fsspec, aiohttp or botocore.
    Never retried: missing (404), forbidden (401/403), bad request (400)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False, None
    status = getattr(exc, "status", None)
    response = getattr(exc, "response", None)
    if status is None and isinstance(response, dict):  # botocore ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if isinstance(status, int):
        if status == 429 or status >= 500:
            return True, _retry_after(getattr(exc, "headers", None) or {})
        return False, None
    name = type(exc).__name__
    transient = ("Timeout", "Connection", "Disconnected", "Payload", "Reset", "Incomplete",
                 "EndpointConnection", "ReadTimeout", "ClientOSError", "ShortRead")
    if isinstance(exc, (TimeoutError, ConnectionError, asyncio.TimeoutError, ShortReadError)) or \
            any(t in name for t in transient):
        return True, None
    return False, None


def _retry_after(headers) -> float | None:
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class ShortReadError(OSError):
    """A ranged read returned fewer bytes than asked (a connection cut mid-body)."""


class Storage:
    def __init__(self, url: str | os.PathLike, storage_options: dict | None = None,
                 retry: RetryPolicy | None = None):
        self.url = os.fspath(url)
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.protocol = fsspec.core.split_protocol(self.url)[0] or "file"
        options = self._options()
        if self.protocol not in ("file", "local"):
            # a fresh client per Storage: fsspec's shared instances keep pooled keep-alive
            # connections that a proxy or NAT may have dropped silently while idle
            options["skip_instance_cache"] = True
        self._fs, root = fsspec.core.url_to_fs(self.url, **options)
        self._keep(self._fs)
        self._pid = os.getpid()
        self.local = isinstance(self._fs, LocalFileSystem)
        self.root = root.rstrip("/") if root not in ("/", "") else root
        self.stats = {"requests": 0, "retries": 0, "ignored_range": 0}

    def _options(self) -> dict:
        """Per-request timeouts by default; the caller's storage_options win."""
        opts = dict(self.storage_options)
        t = self.retry.timeout
        if self.protocol in ("http", "https") and "client_kwargs" not in opts:
            import aiohttp

            opts["client_kwargs"] = {"timeout": aiohttp.ClientTimeout(total=None, connect=t,
                                                                       sock_read=t)}
        if self.protocol in ("s3", "s3a"):
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
            cls = type(self._fs)
            self._fs = cls(**self._options(), skip_instance_cache=True) if not self.local \
                else self._fs
            self._keep(self._fs)
            self._pid = os.getpid()
        return self._fs

    @staticmethod
    def _keep(fs) -> None:
        if getattr(fs, "async_impl", False):
            _ASYNC_FS[id(fs)] = fs  # NOTE [async clients across fork]

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_pid"] = -1  # rebuilt lazily in the receiving process
        return state

    def __repr__(self) -> str:
        return f"Storage({self.url!r})"

    def path(self, name: str) -> str:
        return f"{self.root}/{name}" if name else self.root

    def display(self, name: str) -> str:
        """The name users see in messages: the URL they gave, joined with the file name."""
        return f"{self.url.rstrip('/')}/{name}" if name else self.url

    def _call(self, what: str, name: str, fn, *args, **kwargs):
        """Run one request with the retry policy; local files are not retried."""
        if self.local:
            return fn(*args, **kwargs)
        last = None
        for attempt in range(self.retry.attempts):
            self.stats["requests"] += 1
            try:
                return fn(*args, **kwargs)
            except ShardpackError:  # decided already (a local failure, a changed file)
                raise
            except Exception as exc:  # noqa: BLE001 - classified below
                retry, after = classify(exc)
                last = exc
                if isinstance(exc, FileNotFoundError):
                    raise DatasetNotFoundError("file is missing", path=self.display(name)) \
                        from None
                if not retry or attempt == self.retry.attempts - 1:
                    break
                self.stats["retries"] += 1
                time.sleep(self.retry.delay(attempt, after))
        # fsspec turns every timeout into an empty FSTimeoutError: the cause has the words
        cause = str(last) or str(last.__cause__ or "") or "no details"
        if "Timeout" in type(last).__name__ or isinstance(last, TimeoutError):
            cause += f" (per-request timeout {self.retry.timeout:g} s)"
        raise RemoteError(f"{what} failed after {attempt + 1} attempt(s): "
                          f"{type(last).__name__}: {cause}", path=self.display(name)) from last

    # -- reading ---------------------------------------------------------------------------
    def exists(self, name: str = "") -> bool:
        return self._call("exists", name, self.fs.exists, self.path(name))

    def size(self, name: str) -> int:
        try:
            return int(self._call("size", name, self.fs.size, self.path(name)))
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(name)) from None

    def read_bytes(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        """The file, or bytes [start, end): exactly that many, or an error.  A server that
        ignores Range and sends the whole file is tolerated (the range is cut out, counted)."""
        def fetch():
            if start is None and end is None:
                return self.fs.cat_file(self.path(name))
            return self._exact(self.fs.cat_file(self.path(name), start=start, end=end),
                               start or 0, end)

        try:
            return self._call("read", name, fetch)
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(name)) from None

    def _exact(self, data: bytes, start: int, end: int, name: str | None = None) -> bytes:
        """Bytes [start, end) from what a ranged request returned: a server that ignored Range
        and sent the whole file is tolerated (the range is cut out, counted); short is an error
        (naming ``name``, for requests of several files)."""
        want = end - start
        if len(data) == want:
            return data
        if len(data) > want and end <= len(data):
            self.stats["ignored_range"] += 1  # a 200 with the whole body
            return data[start:end]
        raise ShortReadError((f"{self.display(name)}: " if name else "") +
                             f"asked for {want} bytes at {start}, got {len(data)}")

    def read_ranges(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        """Bytes [start, end) of each (name, start, end), fetched concurrently by fsspec (one
        request each, in its event loop for remote stores); exactly those bytes, or an error.
        Retried as a whole."""
        asked = [r for r in ranges if r[2] > r[1]]  # (S3 refuses an empty range)
        if not asked:
            return [b""] * len(ranges)

        def fetch():
            got = iter(self.fs.cat_ranges([self.path(n) for n, _, _ in asked],
                                          [s for _, s, _ in asked], [e for _, _, e in asked],
                                          on_error="raise"))
            return [self._exact(next(got), start, end, name) if end > start else b""
                    for name, start, end in ranges]

        try:
            return self._call("read", asked[0][0], fetch)
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(asked[0][0])) \
                from None

    STREAM_MAX = 256 << 20  # download(): files up to this size come as one streamed request

    @property
    def _stream_options(self) -> dict:
        """get_file options that keep a download one stream, written as it arrives: s3fs would
        otherwise fetch an object over 50 MiB as 10 concurrent parts held in memory."""
        return {"max_concurrency": 1} if self.protocol in ("s3", "s3a") else {}

    def download(self, name: str, dest: str, size: int, part_size: int = 16 << 20,
                 parallel: int = 4) -> str | None:
        """Copy one remote file into the local path ``dest``.  Up to STREAM_MAX bytes: one
        streamed request through the backend's own ``get_file``, written as it arrives.  Bigger
        files: ``parallel`` ranged reads of ``part_size`` bytes at a time, each retried on its
        own.  Returns the content hash (:func:`format.content_hash`) of what was written when it
        could be computed on the way (a streamed HTTP download), else None: the caller hashes
        the file.  Why streaming first: docs/remote.md, "Downloads"."""
        if size <= self.STREAM_MAX or parallel <= 1:
            def fetch():
                digest = None
                try:
                    if self.protocol in ("http", "https"):  # get_file writes into an open file
                        digest = self._get_hashed(name, dest)  # (s3fs's wants a path)
                    else:
                        self.fs.get_file(self.path(name), dest, **self._stream_options)
                except OSError as exc:
                    if isinstance(exc, ShardpackError):  # a CacheError is an OSError too
                        raise
                    if getattr(exc, "filename", None) == dest:  # writing here failed
                        raise _cache_error(dest, exc) from exc
                    raise
                got = os.path.getsize(dest)
                if got > size:
                    raise IntegrityError(f"remote file is {got} bytes, the manifest says {size}",
                                         path=self.display(name),
                                         hint="was the dataset changed after packing?")
                if got < size:
                    raise ShortReadError(f"{self.display(name)}: got {got} bytes, expected {size}")
                return digest

            return self._call("download", name, fetch)
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

    def _get_hashed(self, name: str, dest: str) -> str:
        """One streamed ``get_file`` into ``dest`` through a hashing sink; the content hash.
        Every local failure (open, a write, the last flush at close) is a CacheError."""
        try:
            out = open(dest, "wb")
        except OSError as exc:
            raise _cache_error(dest, exc) from exc
        try:
            sink = _HashingSink(out, dest)
            self.fs.get_file(self.path(name), sink, **self._stream_options)
            try:
                out.close()  # writes what is still buffered
            except OSError as exc:
                raise _cache_error(dest, exc) from exc
        finally:
            if not out.closed:
                try:
                    out.close()
                except OSError:
                    pass  # the error on its way out is the one to report
        return sink.hexdigest()

    @contextmanager
    def open(self, name: str, mode: str = "rb"):
        try:
            f = self.fs.open(self.path(name), mode)
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(name)) from None
        with f:
            yield f

    def open_arrow(self, name: str):
        """A pyarrow file for ``name`` (Parquet reads): a memory map when local (pyarrow reads
        it without a Python file object in the way: docs/benchmarks.md, "Converting"), else the
        fsspec file."""
        import pyarrow as pa

        if self.local:
            try:
                return pa.memory_map(self.path(name))
            except FileNotFoundError:
                raise DatasetNotFoundError("file is missing", path=self.display(name)) from None
        try:
            return pa.PythonFile(self.fs.open(self.path(name), "rb"), mode="r")
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(name)) from None

    def listdir(self) -> list[str]:
        """Names directly inside the root (files and folders), sorted; [] if it doesn't exist."""
        try:
            entries = self._call("list", "", self.fs.ls, self.root, detail=False)
        except (FileNotFoundError, DatasetNotFoundError):
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

    COPY_CHUNK = 8 << 20  # copy_from: bytes per read of a streamed copy
    # os.link errors that mean "no hard link here", not "something is wrong": another file
    # system, links not allowed (protected_hardlinks, FAT, some FUSE), too many links
    _NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP,
                          errno.EMLINK})

    def copy_from(self, source: "Storage", name: str, dest: str, *, size: int,
                  content_hash: str) -> str:
        """Put file ``name`` of ``source`` here as ``dest``, checked against the ``size`` and
        ``content_hash`` (:func:`format.content_hash`) a manifest records for it.  Returns how:

        * ``"linked"``: both local on one file system: a hard link (``os.link``), the same
          inode, so only the size is checked;
        * ``"server"``: both on one object store (same filesystem class and options): the
          store copies (fsspec ``cp_file``; S3 CopyObject), no byte passes through this process;
          the size of the copy is checked;
        * ``"streamed"``: anything else (another file system, across stores): read and written
          through this process in COPY_CHUNK pieces (atomically, like every write here), and
          hashed on the way: size and hash are checked.

        A copy that does not match is removed and raises :class:`IntegrityError`."""
        if self.local and source.local:
            try:
                os.link(source.path(name), self.path(dest))
            except FileNotFoundError:
                if not os.path.exists(source.path(name)):
                    raise DatasetNotFoundError("file is missing",
                                               path=source.display(name)) from None
                raise
            except OSError as exc:
                if exc.errno not in self._NO_LINK:
                    raise
            else:
                self._check_size(dest, size, source.display(name))
                return "linked"
        elif not self.local and not source.local and type(self._fs) is type(source._fs) \
                and self.storage_options == source.storage_options:
            def server_copy() -> bool:
                try:
                    self.fs.cp_file(source.path(name), self.path(dest))
                except NotImplementedError:  # a filesystem without a copy of its own
                    return False
                except FileNotFoundError:
                    raise DatasetNotFoundError("file is missing",
                                               path=source.display(name)) from None
                return True

            if self._call("copy", dest, server_copy):
                self._check_size(dest, size, source.display(name))
                return "server"
        remote = source if not source.local else self
        remote._call("copy", name if remote is source else dest, self._stream_copy, source,
                     name, dest, size, content_hash)
        return "streamed"

    def _stream_copy(self, source: "Storage", name: str, dest: str, size: int,
                     content_hash: str) -> None:
        hasher = fmt.new_content_hasher()
        got = 0
        try:
            with source.open(name) as src, self.open_atomic(dest) as out:
                while True:
                    chunk = src.read(self.COPY_CHUNK)
                    if not chunk:
                        break
                    hasher.update(chunk)
                    out.write(chunk)
                    got += len(chunk)
                # checked inside the block: a local copy that differs is never renamed into place
                if got != size:
                    raise IntegrityError(f"is {got} bytes, its manifest says {size}",
                                         path=source.display(name))
                if hasher.hexdigest() != content_hash:
                    raise IntegrityError("does not match the hash its manifest records",
                                         path=source.display(name))
        except BaseException:
            if not self.local:  # an object appears when its upload ends, error or not
                try:
                    self.remove(dest)
                except Exception:  # noqa: BLE001 - the first error is the one to report
                    pass
            raise

    def _check_size(self, dest: str, size: int, what: str) -> None:
        got = self.size(dest)
        if got != size:
            self.remove(dest)
            raise IntegrityError(f"is {got} bytes, its manifest says {size}", path=what)

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


def _cache_error(dest: str, exc: OSError) -> CacheError:
    return CacheError(f"cannot write a download: {exc.strerror or exc}", path=dest)


class _HashingSink:
    """A write-only file for ``get_file``: writes to ``out`` and hashes what passes, which saves
    reading the download back to check it (~0.2 s of CPU per GB).  A failed write is a
    CacheError naming ``dest`` (a local problem: not retried, not blamed on the remote)."""

    def __init__(self, out, dest: str):
        self._out, self._dest = out, dest
        self._hasher = fmt.new_content_hasher()

    def write(self, data) -> int:
        self._hasher.update(data)
        try:
            return self._out.write(data)
        except OSError as exc:
            raise _cache_error(self._dest, exc) from exc

    def read(self, *_):  # fsspec tells a file object from a path by read/close/tell
        raise OSError(errno.EBADF, "write-only download sink")

    def tell(self) -> int:
        return self._out.tell()

    def close(self) -> None:  # the caller closes the real file
        pass

    def hexdigest(self) -> str:
        return self._hasher.hexdigest()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
