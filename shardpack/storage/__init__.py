"""The one storage layer: every read and write of a dataset goes through fsspec.

A :class:`Storage` is rooted at a dataset folder or URL prefix (``/data/ds``, ``file:///data/ds``,
``s3://bucket/ds``, ``https://host/ds``).  Local and remote paths take the same code path; the only
difference is how :meth:`Storage.open_atomic` makes a write atomic:

* local: a hidden temp file in the same folder, fsync, ``os.replace`` onto the final name, then an
  fsync of the folder, so a crash leaves either the old file, the new file, or a temp file that
  :meth:`Storage.remove_temp_files` sweeps;
* object stores: an object only appears when its upload completes, so the final name is written
  directly.

HTTP(S) reads (whole files, ranges, downloads) go through a small request path of its own
(:meth:`Storage._get`) on the session and event loop of fsspec's HTTP filesystem: fsspec's
``cat_file`` buffers whatever body comes and drops the status and ``Content-Range``, so an
endless body filled memory and a 206 running to the end of the file passed for the whole file.
Here every body is read against a bound (the size the manifest records, :data:`MANIFEST_CAP`,
:data:`BODY_CAP`), a 206 is taken by its ``Content-Range``, and a request ends at its deadline
(docs/remote.md, "Bounded requests").
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import random
import re
import time
import uuid
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import fsspec
from fsspec.implementations.local import LocalFileSystem

from shardpack import format as fmt
from shardpack.core.errors import (
    CacheError, DatasetNotFoundError, FormatError, IntegrityError, PackError, RemoteError,
    ShardpackError,
)

TEMP_MARK = ".tmp-"

MANIFEST_CAP = fmt.MANIFEST_CAP
# The most a whole-file read takes of a file whose size nothing records (a conversion's source
# files): such files are read into memory whole anyway.
BODY_CAP = 4 << 30
# Seconds one request may take from start to last byte (storage option request_deadline): a
# server that drips a byte now and then never trips the per-read timeout.  Room for a 256 MiB
# shard at 1 MB/s.
REQUEST_DEADLINE = 300.0
# storage_options that are shardpack's, not fsspec's (removed before fsspec sees them)
OWN_OPTIONS = ("request_deadline", "follow_redirects_to_other_hosts")

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
    """A read returned fewer bytes than asked or than the manifest records (a connection cut
    mid-body, a server serving a truncated copy): retried."""


class DeadlineError(TimeoutError):
    """A request that did not end within the storage's request deadline: retried, like other
    timeouts."""


class BadResponseError(OSError):
    """An answer that cannot be the bytes asked for (a 206 for another range, a status that is
    neither 200 nor 206): not retried."""


class RedirectRefusedError(OSError):
    """A redirect to another host, refused (storage option follow_redirects_to_other_hosts)."""


class StorageOptionError(ShardpackError, ValueError):
    """A storage option of shardpack's own with a value it cannot use."""


def _what(name: str) -> str:
    """What a dataset's file is, for messages."""
    if name == fmt.MANIFEST_NAME:
        return "manifest"
    if name.endswith(fmt.INDEX_SUFFIX):
        return "index"
    if name.endswith(tuple(fmt.SHARD_SUFFIX.values())):
        return "shard"
    return "file"


# -- local files: regular files only ------------------------------------------------------------

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
          (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def check_regular(st: os.stat_result, display: str, what: str) -> None:
    """A one-line :class:`FormatError` unless ``st`` is a regular file's: a dataset's manifest,
    indexes and shards are files with sizes, never a device, FIFO or folder (docs/reading.md,
    "Integrity")."""
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
        raise FormatError(f"{what} is {kind}, not a regular file", path=display)


def open_regular(path: str, display: str, what: str) -> tuple[int, os.stat_result]:
    """(fd, its fstat) of the local regular file at ``path``.  Opened with O_NONBLOCK, so a FIFO
    put in its place never blocks the open, and checked with fstat before a byte is read (so
    /dev/zero cannot fill memory): the same rule as the packer's source files
    (shardpack/write/fields.py).  The caller closes the fd."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise DatasetNotFoundError(f"{what} is missing", path=display) from None
    except OSError as exc:  # a socket (ENXIO), no permission, ...
        raise FormatError(f"cannot open the {what}: {exc.strerror}", path=display) from None
    try:
        st = os.fstat(fd)
        check_regular(st, display, what)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_fd(fd: int, size: int, display: str, what: str, offset: int = 0) -> bytes:
    """Exactly ``size`` bytes from ``offset`` of ``fd`` (pread, whatever its position), or a
    one-line IntegrityError when the file ends first (it shrank since it was sized)."""
    parts, got = [], 0
    while got < size:
        try:
            part = os.pread(fd, size - got, offset + got)
        except OSError as exc:
            raise FormatError(f"cannot read the {what}: {exc.strerror}", path=display) from None
        if not part:
            raise IntegrityError(f"the {what} ended after {got} of its {size} bytes (truncated "
                                 "while it was read)", path=display)
        parts.append(part)
        got += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_regular(path: str, display: str, what: str, size: int | None = None,
                 limit: int | None = None) -> bytes:
    """The bytes of the local regular file at ``path`` (see :func:`open_regular`): exactly
    ``size`` of them, a one-line IntegrityError if the file has another size, or (``size``
    None) as many as its fstat says, which bounds the read, up to ``limit`` (a FormatError
    past it)."""
    fd, st = open_regular(path, display, what)
    try:
        if size is not None and st.st_size != size:
            raise IntegrityError(f"{what} is {st.st_size} bytes, the manifest says {size}",
                                 path=display)
        if limit is not None and st.st_size > limit:
            raise FormatError(f"{what} is {st.st_size:,} bytes, more than the {limit:,} any "
                              f"{what} can be", path=display)
        return read_fd(fd, st.st_size, display, what)
    finally:
        os.close(fd)



class Storage:
    def __init__(self, url: str | os.PathLike, storage_options: dict | None = None,
                 retry: RetryPolicy | None = None):
        self.url = os.fspath(url)
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.deadline = _deadline_option(self.storage_options)
        self.other_hosts = _flag_option(self.storage_options, "follow_redirects_to_other_hosts")
        self.protocol = fsspec.core.split_protocol(self.url)[0] or "file"
        options = self._options()
        local_path = _local_path(self.url, self.protocol)
        if local_path is not None:  # a local path holding "::", not an fsspec chain
            self.protocol = "file"
            self._fs, root = LocalFileSystem(), LocalFileSystem._strip_protocol(local_path)
        else:
            if self.protocol not in ("file", "local"):
                # a fresh client per Storage: fsspec's shared instances keep pooled keep-alive
                # connections that a proxy or NAT may have dropped silently while idle
                options["skip_instance_cache"] = True
            self._fs, root = fsspec.core.url_to_fs(self.url, **options)
        self._keep(self._fs)
        self._pid = os.getpid()
        self.local = isinstance(self._fs, LocalFileSystem)
        self.root = root.rstrip("/") if root not in ("/", "") else root
        self.stats = {"requests": 0, "retries": 0, "ignored_range": 0, "sliced_range": 0}
        self._manifest: bytes | None = None  # the remote manifest as read, until _sizes parses it
        self._sizes: dict[str, int] = {}     # file name -> size, from that manifest

    def _options(self) -> dict:
        """Per-request timeouts by default; the caller's storage_options win.  Over HTTP, the
        session's own total timeout is the request deadline (for requests left to fsspec, such
        as ``open``), and redirects to other hosts are refused unless allowed."""
        opts = {k: v for k, v in self.storage_options.items() if k not in OWN_OPTIONS}
        t = self.retry.timeout
        if self.protocol in ("http", "https"):
            import aiohttp

            client = dict(opts.get("client_kwargs") or {})
            client.setdefault("timeout", aiohttp.ClientTimeout(total=self.deadline, connect=t,
                                                               sock_read=t))
            if "get_client" not in opts:  # (a client of the caller's own makes its own rules)
                opts["get_client"] = _http_client
                client["shardpack_other_hosts"] = self.other_hosts
            opts["client_kwargs"] = client
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
        self._known_sizes()  # the sizes travel, not the manifest's bytes
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
            started = time.monotonic()
            try:
                return fn(*args, **kwargs)
            except ShardpackError:  # decided already (a local failure, a changed file)
                raise
            except Exception as exc:  # noqa: BLE001 - classified below
                if _is_timeout(exc) and not isinstance(exc, DeadlineError) and \
                        time.monotonic() - started >= self.deadline:
                    exc = DeadlineError(self._deadline_text())  # fsspec's sync(timeout=)
                retry, after = classify(exc)
                last = exc
                refused = _in_chain(exc, RedirectRefusedError)  # (fsspec may wrap it)
                if refused is not None:
                    last, retry = refused, False
                elif isinstance(exc, FileNotFoundError):
                    raise DatasetNotFoundError("file is missing", path=self.display(name)) \
                        from None
                if not retry or attempt == self.retry.attempts - 1:
                    break
                self.stats["retries"] += 1
                time.sleep(self.retry.delay(attempt, after))
        # fsspec turns every timeout into an empty FSTimeoutError: the cause has the words
        cause = str(last) or str(last.__cause__ or "") or "no details"
        if not isinstance(last, DeadlineError) and \
                ("Timeout" in type(last).__name__ or isinstance(last, TimeoutError)):
            cause += f" (per-request timeout {self.retry.timeout:g} s)"
        raise RemoteError(f"{what} failed after {attempt + 1} attempt(s): "
                          f"{type(last).__name__}: {cause}", path=self.display(name)) from last

    def _deadline_text(self, got: int | None = None) -> str:
        text = (f"no complete answer within the request deadline of {self.deadline:g} s "
                f"(storage option request_deadline)")
        return text + (f"; {got} byte(s) of the body had come" if got is not None else "")

    @property
    def _limit(self) -> dict:
        """The ``timeout`` the sync wrapper of an async fsspec method takes (it cancels the
        request): the request deadline.  Nothing for local files."""
        return {"timeout": self.deadline} if getattr(self.fs, "async_impl", False) else {}

    @property
    def _http(self) -> bool:
        """Whether reads take the bounded HTTP path of this module (:meth:`_get`)."""
        return self.protocol in ("http", "https") and hasattr(self._fs, "encode_url")

    # -- reading ---------------------------------------------------------------------------
    def exists(self, name: str = "") -> bool:
        return self._call("exists", name, self.fs.exists, self.path(name), **self._limit)

    def size(self, name: str) -> int:
        try:
            return int(self._call("size", name, self.fs.size, self.path(name), **self._limit))
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(name)) from None

    def read_bytes(self, name: str, start: int | None = None, end: int | None = None, *,
                   size: int | None = None) -> bytes:
        """The file, or bytes [start, end): exactly that many, or an error.  A server that
        ignores Range and sends the whole file is tolerated (the range is cut out, counted).

        A whole remote file is read against a bound, never buffered past it: ``size``, the size
        the manifest records for it, else the size the manifest this storage read records
        (:meth:`_known_sizes`); the manifest itself against :data:`MANIFEST_CAP`; any other
        file against :data:`BODY_CAP`.  Shorter than ``size`` is retried; longer is an
        :class:`IntegrityError`, over a cap a one-line error, neither retried."""
        whole = start is None and end is None
        if whole and size is None:
            size = self._known_sizes().get(name)
        if not whole:
            start = start or 0
            if end <= start:
                return b""

        def fetch():
            if self.local:  # regular files only: never a FIFO's wait or /dev/zero's flood
                return self._read_local(name, start, end, size)
            if self._http:
                return self._run(lambda fs: self._get(fs, name, start, end, size=size))
            if whole:
                return self._bounded(name, self.fs.cat_file(self.path(name), **self._limit),
                                     size)
            return self._exact(self.fs.cat_file(self.path(name), start=start, end=end,
                                                **self._limit), start, end, size=size)

        try:
            data = self._call("read", name, fetch)
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(name)) from None
        if whole and name == fmt.MANIFEST_NAME and not self.local:
            self._manifest, self._sizes = data, {}  # parsed when a size is first wanted
        return data

    def _read_local(self, name: str, start: int | None, end: int | None,
                    size: int | None) -> bytes:
        """A local file, whole or bytes [start, end), read through :func:`open_regular`: a
        regular file, bounded by its fstat (a manifest also by :data:`MANIFEST_CAP`)."""
        what = _what(name)
        display = self.display(name)
        fd, st = open_regular(self.path(name), display, what)
        try:
            if start is None and end is None:
                if name == fmt.MANIFEST_NAME and st.st_size > MANIFEST_CAP:
                    raise FormatError(f"manifest is longer than {MANIFEST_CAP:,} bytes, the most "
                                      "one can be", path=display)
                if size is not None and st.st_size != size:
                    raise IntegrityError(f"{what} is {st.st_size} bytes, the manifest says "
                                         f"{size}", path=display)
                return read_fd(fd, st.st_size, display, what)
            if end > st.st_size:
                raise IntegrityError(f"{what} is {st.st_size} bytes, bytes {start} to {end} "
                                     "were asked for (truncated?)", path=display)
            return read_fd(fd, end - start, display, what, offset=start)
        finally:
            os.close(fd)

    def _bounded(self, name: str, data: bytes, size: int | None) -> bytes:
        """A whole file fsspec read (S3 and others: botocore reads what Content-Length says,
        so the body was bounded by the server's word), checked against the bound."""
        if size is not None and len(data) < size:
            raise ShortReadError(f"got {len(data)} bytes, expected {size}")
        self._check_bound(name, size, len(data), len(data))
        return data

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
        if name == fmt.MANIFEST_NAME and over > MANIFEST_CAP:
            raise FormatError(f"manifest is longer than {MANIFEST_CAP:,} bytes, the most one "
                              f"may be (docs/format.md, \"Manifest\")", path=self.display(name))
        if over > BODY_CAP:
            raise RemoteError(f"body is longer than {BODY_CAP:,} bytes, the most read of a file "
                              f"whose size the manifest does not record", path=self.display(name))

    def _known_sizes(self) -> dict[str, int]:
        """File name -> size, from the remote manifest this storage read (parsed on first use:
        with a cache, downloads are given their sizes and this is never needed)."""
        if self._manifest is not None:
            self._sizes, self._manifest = _manifest_sizes(self._manifest), None
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

    def read_ranges(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        """Bytes [start, end) of each (name, start, end), fetched concurrently (one request
        each, in the event loop of the remote store's client); exactly those bytes, or an error.
        Retried as a whole."""
        asked = [r for r in ranges if r[2] > r[1]]  # (S3 refuses an empty range)
        if not asked:
            return [b""] * len(ranges)

        def fetch():
            if self._http:
                got = iter(self._run(lambda fs: self._get_many(fs, asked)))
                return [next(got) if end > start else b"" for _, start, end in ranges]
            got = iter(self.fs.cat_ranges([self.path(n) for n, _, _ in asked],
                                          [s for _, s, _ in asked], [e for _, _, e in asked],
                                          on_error="raise", **self._limit))
            sizes = self._known_sizes()
            return [self._exact(next(got), start, end, name, sizes.get(name))
                    if end > start else b"" for name, start, end in ranges]

        try:
            return self._call("read", asked[0][0], fetch)
        except FileNotFoundError:
            raise DatasetNotFoundError("file is missing", path=self.display(asked[0][0])) \
                from None

    # -- HTTP(S): bounded requests of our own (module docstring) -----------------------------
    RANGES_AT_ONCE = 128   # read_ranges: requests in flight at once
    BODY_CHUNK = 4 << 20   # bytes asked of the body at a time

    def _run(self, make):
        """Run the coroutine ``make(fs)`` on the event loop thread of the fsspec filesystem
        (whose session it uses) and wait for it."""
        fs = self.fs
        try:
            return fsspec.asyn.sync(fs.loop, make, fs)
        except fsspec.exceptions.FSTimeoutError as exc:  # how sync() reports any TimeoutError
            if isinstance(exc.__cause__, DeadlineError):
                raise exc.__cause__ from None
            raise

    async def _get_many(self, fs, asked: list[tuple[str, int, int]]) -> list[bytes]:
        gate = asyncio.Semaphore(self.RANGES_AT_ONCE)

        async def one(name, start, end):
            async with gate:  # (the deadline starts when the request does)
                return await self._get(fs, name, start, end, named=True)

        tasks = [asyncio.ensure_future(one(*r)) for r in asked]
        try:
            return await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:  # the first error decides: the others are not waited for
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _get(self, fs, name: str, start: int | None = None, end: int | None = None, *,
                   size: int | None = None, sink=None, named: bool = False):
        """One GET of ``name`` within the request deadline: bytes [start, end), or the whole
        file (bounded as :meth:`read_bytes` says); into ``sink.write`` when given (then the
        byte count is returned)."""
        import aiohttp

        got = [0]
        try:
            return await asyncio.wait_for(
                self._get_body(fs, name, start, end, size, sink, named, got), self.deadline)
        except asyncio.TimeoutError as exc:
            if isinstance(exc, aiohttp.ClientError):
                raise  # aiohttp's own per-read timeout
            raise DeadlineError((f"{self.display(name)}: " if named else "") +
                                self._deadline_text(got[0])) from None

    async def _get_body(self, fs, name, start, end, size, sink, named, got) -> bytes | int:
        ranged = start is not None
        prefix = f"{self.display(name)}: " if named else ""
        session = await fs.set_session()
        kw = dict(fs.kwargs)
        headers = dict(kw.pop("headers", None) or {})
        headers["Accept-Encoding"] = "identity"  # sizes and ranges of the bytes as stored
        if ranged:
            headers["Range"] = f"bytes={start}-{end - 1}"
        kw["headers"] = headers
        kw["timeout"] = _without_total(session.timeout)  # the deadline is ours (above)
        async with session.get(fs.encode_url(self.path(name)), **kw) as r:
            if r.status == 404:
                raise FileNotFoundError(self.path(name))
            r.raise_for_status()  # 4xx and 5xx: classified by their status
            skip = self._place(r, start, end, prefix)
            declared = _declared_length(r)
            if declared is not None:
                declared -= skip  # the bytes after those skipped
            want = end - start if ranged else size  # exactly this many, or (None) up to a cap
            if declared is not None and want is not None and declared < want:
                raise ShortReadError(prefix + f"the server announced {declared} bytes, "
                                     f"{'asked for' if ranged else 'expected'} {want}")
            if not ranged:
                self._check_bound(name, size, 0, declared)
            pieces = []
            while not (ranged and got[0] == want):  # a range ends when it is in: the rest of
                chunk = await r.content.read(self.BODY_CHUNK)  # the body is never read
                if not chunk:
                    break
                if skip:
                    if len(chunk) <= skip:
                        skip -= len(chunk)
                        continue
                    chunk, skip = chunk[skip:], 0
                if ranged:
                    chunk = chunk[:want - got[0]]
                elif size is None or got[0] + len(chunk) > size:
                    self._check_bound(name, size, got[0] + len(chunk), None)  # cut, refused
                if sink is not None:
                    sink.write(chunk)
                else:
                    pieces.append(chunk)
                got[0] += len(chunk)
        if want is not None and got[0] < want:
            raise ShortReadError(prefix + (f"asked for {want} bytes at {start}, got {got[0]}"
                                           if ranged else f"got {got[0]} bytes, expected {want}"))
        return got[0] if sink is not None else b"".join(pieces)

    def _place(self, r, start: int | None, end: int | None, prefix: str) -> int:
        """How many leading bytes of the body ``r`` to skip to reach byte ``start`` (0 for a
        whole file), from its status and Content-Range; an answer that does not hold the bytes
        asked for is refused (a 206 is never taken for the file)."""
        ranged = start is not None
        if r.status == 200:
            if ranged:
                self.stats["ignored_range"] += 1  # a server that ignores Range: the whole file
            return start if ranged else 0
        if r.status != 206:
            raise BadResponseError(f"{prefix}the server answered {r.status} {r.reason or ''}"
                                   .rstrip() + ", not 200 or 206")
        header = r.headers.get("Content-Range", "")
        parsed = _content_range(header)
        asked = f"bytes {start}-{end - 1}" if ranged else "the whole file"
        if parsed is None:
            raise BadResponseError(f"{prefix}the server answered 206 with Content-Range "
                                   f"{header!r} to a request for {asked}")
        first, last, total = parsed
        if ranged:
            holds = first <= start and last + 1 >= end
        else:
            holds = first == 0 and total is not None and last + 1 == total
        if not holds:
            raise BadResponseError(f"{prefix}the server answered 206 with Content-Range "
                                   f"{header!r} to a request for {asked}: refused")
        if ranged and (first, last + 1) != (start, end):
            self.stats["sliced_range"] += 1  # more than asked: cut out by its Content-Range
        return start - first if ranged else 0

    STREAM_MAX = 256 << 20  # download(): files up to this size come as one streamed request

    @property
    def _stream_options(self) -> dict:
        """get_file options that keep a download one stream, written as it arrives: s3fs would
        otherwise fetch an object over 50 MiB as 10 concurrent parts held in memory."""
        return {"max_concurrency": 1} if self.protocol in ("s3", "s3a") else {}

    def download(self, name: str, dest: str, size: int, part_size: int = 16 << 20,
                 parallel: int = 4) -> str | None:
        """Copy one remote file of ``size`` bytes (what the manifest records) into the local path
        ``dest``.  Up to STREAM_MAX bytes: one streamed request (over HTTP our own bounded GET,
        :meth:`_get`: never more than ``size`` bytes are written; else the backend's own
        ``get_file``), written as it arrives.  Bigger
        files: ``parallel`` ranged reads of ``part_size`` bytes at a time, each retried on its
        own.  Returns the content hash (:func:`format.content_hash`) of what was written when it
        could be computed on the way (a streamed HTTP download), else None: the caller hashes
        the file.  Why streaming first: docs/remote.md, "Downloads"."""
        if size <= self.STREAM_MAX or parallel <= 1:
            def fetch():
                digest = None
                try:
                    if self._http:  # hashed on the way (s3fs's get_file wants a path)
                        digest = self._get_hashed(name, dest, size)
                    else:
                        self.fs.get_file(self.path(name), dest, **self._stream_options,
                                         **self._limit)
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

    def _get_hashed(self, name: str, dest: str, size: int) -> str:
        """One streamed GET of at most ``size`` bytes into ``dest`` through a hashing sink; the
        content hash.  Every local failure (open, a write, the last flush at close) is a
        CacheError."""
        try:
            out = open(dest, "wb")
        except OSError as exc:
            raise _cache_error(dest, exc) from exc
        try:
            sink = _HashingSink(out, dest)
            self._run(lambda fs: self._get(fs, name, size=size, sink=sink))
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
            entries = self._call("list", "", self.fs.ls, self.root, detail=False,
                                 **self._limit)
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
                    self.fs.cp_file(source.path(name), self.path(dest), **self._limit)
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


def _flag_option(options: dict, name: str) -> bool:
    """A yes/no storage option: true or false (JSON, as ``-o NAME=true`` gives), never a
    string whose truth would be its being non-empty (``-o NAME=False`` is the string 'False',
    which ``bool`` reads as yes: a security switch turned on by its 'off')."""
    value = options.get(name, False)
    if not isinstance(value, bool):
        raise StorageOptionError(f"storage option {name} must be true or false, not {value!r}")
    return value


def _deadline_option(options: dict) -> float:
    value = options.get("request_deadline", REQUEST_DEADLINE)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or value == float("inf"):
        raise StorageOptionError(f"storage option request_deadline must be a number of seconds "
                                 f"over 0, not {value!r}")
    return float(value)


def _local_path(url: str, protocol: str | None) -> str | None:
    """The local path ``url`` names when it holds ``::`` but is no fsspec chain (fsspec would
    split ``/data/a::b`` into the chain ``/data/a`` and ``b``): a path that exists, or one that
    is not a chain of known protocols (``simplecache::s3://...`` and ``zip://x::s3://...`` stay
    chains; ``/data/a::b`` and ``file:///data/a::v2`` are paths, existing or not, so a pack
    never writes to ``/data/a`` instead).  None otherwise."""
    if "::" not in url or protocol not in ("file", "local"):
        return None
    scheme, path = fsspec.core.split_protocol(url)
    if os.path.lexists(path) or not _is_chain(url):
        return path
    return None


def _is_chain(url: str) -> bool:
    """Whether ``url`` is an fsspec chain: its first ``::`` piece is a known protocol's name
    (``simplecache::...``), or every piece is a URL of a known protocol (``zip://x::s3://...``).
    ``file:///data/a::v2`` is neither."""
    known = set(fsspec.available_protocols())
    pieces = url.split("::")
    return pieces[0] in known or all(fsspec.core.split_protocol(piece)[0] in known
                                     for piece in pieces)


def _manifest_sizes(data: bytes) -> dict[str, int]:
    """File name -> size for every shard, index and skip report a manifest records; what does
    not look right is left out (the reader's own check of the manifest says what is wrong)."""
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


def _in_chain(exc: BaseException | None, kind: type) -> BaseException | None:
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, kind):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, (TimeoutError, asyncio.TimeoutError)) or \
        "Timeout" in type(exc).__name__


def _without_total(timeout):
    """aiohttp's ClientTimeout with no total: the request deadline is enforced around it."""
    import aiohttp

    return aiohttp.ClientTimeout(total=None, connect=timeout.connect,
                                 sock_connect=timeout.sock_connect, sock_read=timeout.sock_read)


def _declared_length(r) -> int | None:
    """The Content-Length of a response whose body has no content coding (with one, the
    decoded body is another size), or None."""
    if r.headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity"):
        return None
    try:
        value = int(r.headers.get("Content-Length", ""))
    except ValueError:
        return None
    return value if value >= 0 else None


_CONTENT_RANGE = re.compile(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*", re.IGNORECASE)


def _content_range(header: str) -> tuple[int, int, int | None] | None:
    """(first, last, total or None) of a ``Content-Range: bytes first-last/total``, last
    inclusive; None when it is not one."""
    match = _CONTENT_RANGE.fullmatch(header or "")
    if match is None:
        return None
    first, last = int(match[1]), int(match[2])
    total = None if match[3] == "*" else int(match[3])
    if last < first or (total is not None and last >= total):
        return None
    return first, last, total


def _same_host(a, b) -> bool:
    """Whether a redirect from URL ``a`` to ``b`` (yarl URLs) stays on one host: the same host
    name and port (another port is another server, maybe another service), or the usual
    upgrade from http on port 80 to https on 443 of the same host."""
    if (a.host or "").lower() != (b.host or "").lower():
        return False
    if a.scheme == b.scheme:
        return a.port == b.port
    return (a.scheme, a.port, b.scheme, b.port) == ("http", 80, "https", 443)


async def _refuse_other_hosts(session, context, params) -> None:
    """aiohttp trace hook, called before a redirect is followed: one to another host raises
    :class:`RedirectRefusedError` (so nothing is sent there)."""
    from yarl import URL

    location = params.response.headers.get("Location") or params.response.headers.get("URI")
    if location is None:
        return
    try:
        target = params.url.join(URL(location))
    except ValueError:
        return  # aiohttp refuses it itself
    if not _same_host(params.url, target):
        params.response.close()
        raise RedirectRefusedError(f"redirected to another host: {params.url} -> {target} "
                                   f"(storage option follow_redirects_to_other_hosts)")


async def _http_client(*, shardpack_other_hosts: bool = False, **kwargs):
    """The aiohttp session of fsspec's HTTP filesystem (its ``get_client``): fsspec's own, plus
    the redirect check (module-level, so the filesystem still pickles)."""
    import aiohttp

    if not shardpack_other_hosts:
        trace = aiohttp.TraceConfig()
        trace.on_request_redirect.append(_refuse_other_hosts)
        kwargs["trace_configs"] = [*(kwargs.get("trace_configs") or ()), trace]
    return aiohttp.ClientSession(**kwargs)


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
