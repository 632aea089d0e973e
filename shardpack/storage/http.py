"""HTTP(S): reads (whole files, ranges, downloads) by a small bounded request path of its own.

The requests run on the session and event loop of fsspec's HTTP filesystem: fsspec's ``cat_file``
buffers whatever body comes and drops the status and ``Content-Range``, so an endless body filled
memory and a 206 running to the end of the file passed for the whole file.  Here every body is
read against a bound (the size the manifest records, the manifest cap, the body cap), a 206 is
taken by its ``Content-Range``, and a request ends at its deadline (docs/remote.md, "Bounded
requests").  Redirects to other hosts are refused unless allowed (storage option
``follow_redirects_to_other_hosts``).
"""

from __future__ import annotations

import asyncio
import errno
import re
import time

import fsspec

from shardpack import format as fmt
from shardpack.storage.remote import RemoteStorage, cache_error
from shardpack.storage.retry import (
    BadResponseError, DeadlineError, RedirectRefusedError, ShortReadError, deadline_text, time_left,
)


class HttpStorage(RemoteStorage):
    """A folder URL served over HTTP(S), read by bounded requests (see the module docstring)."""

    RANGES_AT_ONCE = 128   # read_ranges: requests in flight at once
    BODY_CHUNK = 4 << 20   # bytes asked of the body at a time

    def _fs_options(self) -> dict:
        """The session's own total timeout is the request deadline (for requests left to
        fsspec, such as ``open``), and redirects to other hosts are refused unless allowed."""
        import aiohttp

        opts = super()._fs_options()
        t = self.retry.timeout
        client = dict(opts.get("client_kwargs") or {})
        client.setdefault("timeout", aiohttp.ClientTimeout(total=self.deadline, connect=t,
                                                           sock_read=t))
        if "get_client" not in opts:  # (a client of the caller's own makes its own rules)
            opts["get_client"] = http_client
            client["shardpack_other_hosts"] = self.other_hosts
        opts["client_kwargs"] = client
        return opts

    @property
    def _own_requests(self) -> bool:
        """Whether reads take the bounded request path (the filesystem is fsspec's HTTP)."""
        return hasattr(self._fs, "encode_url")

    def _fetch(self, name: str, start: int | None, end: int | None, size: int | None) -> bytes:
        if not self._own_requests:
            return super()._fetch(name, start, end, size)
        return self._run(lambda fs, left: self._get(fs, name, start, end, left, size=size))

    def _fetch_ranges(self, ranges: list, asked: list) -> list[bytes]:
        if not self._own_requests:
            return super()._fetch_ranges(ranges, asked)
        got = iter(self._run(lambda fs, left: self._get_many(fs, asked, left)))
        return [next(got) if end > start else b"" for _, start, end in ranges]

    def _stream_to(self, name: str, dest: str, size: int) -> str | None:
        if not self._own_requests:
            return super()._stream_to(name, dest, size)
        return self._get_hashed(name, dest, size)  # (s3fs's get_file wants a path)

    def exists(self, name: str = "") -> bool:
        """Whether ``name`` exists (:meth:`Storage.exists`).  A server that cannot be reached is
        retried like any request, then an error: fsspec's own answer was False, so a server
        restarting made a dataset look missing.

        Args:
            name: a path relative to the root ("" for the root).
        """
        if not self._own_requests:
            return super().exists(name)
        return self._call("exists", name, self._run,
                          lambda fs, left: self._probe(fs, name, left))

    # -- the requests --------------------------------------------------------------------------
    def _run(self, make):
        """Run the coroutine ``make(fs, seconds left of the request deadline)`` on the event
        loop thread of the fsspec filesystem (whose session it uses) and wait for it."""
        fs = self.fs
        try:
            return fsspec.asyn.sync(fs.loop, make, fs, time_left(self.deadline))
        except fsspec.exceptions.FSTimeoutError as exc:  # how sync() reports any TimeoutError
            if isinstance(exc.__cause__, DeadlineError):
                raise exc.__cause__ from None
            raise

    async def _probe(self, fs, name: str, left: float) -> bool:
        """fsspec's ``exists`` (a GET whose body is not read; a status under 400 is a file),
        within ``left`` seconds, but a failed connection, a 5xx or a 429 raised (retried)."""
        import aiohttp

        session = await fs.set_session()
        kw = dict(fs.kwargs)
        kw["timeout"] = without_total(session.timeout)

        async def ask() -> bool:
            async with session.get(fs.encode_url(self.path(name)), **kw) as r:
                if r.status == 429 or r.status >= 500:
                    r.raise_for_status()
                return r.status < 400

        try:
            return await asyncio.wait_for(ask(), left)
        except asyncio.TimeoutError as exc:
            if isinstance(exc, aiohttp.ClientError):
                raise  # aiohttp's own per-read timeout
            raise DeadlineError(deadline_text(self.deadline)) from None

    async def _get_many(self, fs, asked: list[tuple[str, int, int]], left: float) -> list[bytes]:
        gate = asyncio.Semaphore(self.RANGES_AT_ONCE)
        ends = time.monotonic() + left  # one deadline for all the ranges, waits at the gate too

        async def one(name, start, end):
            async with gate:
                return await self._get(fs, name, start, end,
                                       max(ends - time.monotonic(), 0.001), named=True)

        tasks = [asyncio.ensure_future(one(*r)) for r in asked]
        try:
            return await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:  # the first error decides: the others are not waited for
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _get(self, fs, name: str, start: int | None = None, end: int | None = None,
                   left: float | None = None, *, size: int | None = None, sink=None,
                   named: bool = False):
        """One GET of ``name`` within ``left`` seconds (what is left of the request deadline):
        bytes [start, end), or the whole file (bounded as :meth:`read_bytes` says); into
        ``sink.write`` when given (then the byte count is returned)."""
        import aiohttp

        got = [0]
        try:
            return await asyncio.wait_for(
                self._get_body(fs, name, start, end, size, sink, named, got),
                self.deadline if left is None else left)
        except asyncio.TimeoutError as exc:
            if isinstance(exc, aiohttp.ClientError):
                raise  # aiohttp's own per-read timeout
            raise DeadlineError((f"{self.display(name)}: " if named else "") +
                                deadline_text(self.deadline, got[0])) from None

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
        kw["timeout"] = without_total(session.timeout)  # the deadline is ours (above)
        async with session.get(fs.encode_url(self.path(name)), **kw) as r:
            skip, want = self._body_start(r, name, start, end, size, prefix)
            pieces = await self._read_body(r, name, ranged, size, skip, want, sink, got)
        if want is not None and got[0] < want:
            raise ShortReadError(prefix + (f"asked for {want} bytes at {start}, got {got[0]}"
                                           if ranged else f"got {got[0]} bytes, expected {want}"))
        return got[0] if sink is not None else b"".join(pieces)

    def _body_start(self, r, name: str, start: int | None, end: int | None, size: int | None,
                    prefix: str) -> tuple[int, int | None]:
        """(bytes of the body to skip, bytes wanted or None: up to a cap) for the answer ``r``,
        once its status and headers say it can hold what was asked."""
        ranged = start is not None
        if r.status == 404:
            raise FileNotFoundError(self.path(name))
        r.raise_for_status()  # 4xx and 5xx: classified by their status
        skip = self._place(r, start, end, prefix)
        declared = declared_length(r)
        if declared is not None:
            declared -= skip  # the bytes after those skipped
        want = end - start if ranged else size  # exactly this many, or (None) up to a cap
        if declared is not None and want is not None and declared < want:
            raise ShortReadError(prefix + f"the server announced {declared} bytes, "
                                 f"{'asked for' if ranged else 'expected'} {want}")
        if not ranged:
            self._check_bound(name, size, 0, declared)
        return skip, want

    async def _read_body(self, r, name: str, ranged: bool, size: int | None, skip: int,
                         want: int | None, sink, got: list) -> list[bytes]:
        """The body's bytes after ``skip``: exactly ``want`` of a range (the rest is never
        read), a whole file up to its bound; into ``sink`` when given."""
        pieces = []
        while not (ranged and got[0] == want):
            chunk = await r.content.read(self.BODY_CHUNK)
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
        return pieces

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
        parsed = content_range(header)
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

    def _get_hashed(self, name: str, dest: str, size: int) -> str:
        """One streamed GET of at most ``size`` bytes into ``dest`` through a hashing sink; the
        content hash.  Every local failure (open, a write, the last flush at close) is a
        CacheError."""
        try:
            out = open(dest, "wb")
        except OSError as exc:
            raise cache_error(dest, exc) from exc
        try:
            sink = HashingSink(out, dest)
            self._run(lambda fs, left: self._get(fs, name, None, None, left, size=size,
                                                 sink=sink))
            try:
                out.close()  # writes what is still buffered
            except OSError as exc:
                raise cache_error(dest, exc) from exc
        finally:
            if not out.closed:
                try:
                    out.close()
                except OSError:
                    pass  # the error on its way out is the one to report
        return sink.hexdigest()


def without_total(timeout):
    """aiohttp's ClientTimeout ``timeout`` with no total: the request deadline is enforced
    around it.

    Args:
        timeout: the session's ClientTimeout.
    """
    import aiohttp

    return aiohttp.ClientTimeout(total=None, connect=timeout.connect,
                                 sock_connect=timeout.sock_connect, sock_read=timeout.sock_read)


def declared_length(r) -> int | None:
    """The Content-Length of a response whose body has no content coding (with one, the
    decoded body is another size), or None.

    Args:
        r: an aiohttp response.
    """
    if r.headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity"):
        return None
    try:
        value = int(r.headers.get("Content-Length", ""))
    except ValueError:
        return None
    return value if value >= 0 else None


_CONTENT_RANGE = re.compile(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*", re.IGNORECASE)


def content_range(header: str) -> tuple[int, int, int | None] | None:
    """(first, last, total or None) of a ``Content-Range: bytes first-last/total``, last
    inclusive; None when it is not one.

    Args:
        header: the header's value.
    """
    match = _CONTENT_RANGE.fullmatch(header or "")
    if match is None:
        return None
    first, last = int(match[1]), int(match[2])
    total = None if match[3] == "*" else int(match[3])
    if last < first or (total is not None and last >= total):
        return None
    return first, last, total


def same_host(a, b) -> bool:
    """Whether a redirect from URL ``a`` to ``b`` stays on one host: the same host name and
    port (another port is another server, maybe another service), or the usual upgrade from
    http on port 80 to https on 443 of the same host.

    Args:
        a: the URL redirected from (yarl).
        b: the URL redirected to (yarl).
    """
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
    if not same_host(params.url, target):
        params.response.close()
        raise RedirectRefusedError(f"redirected to another host: {params.url} -> {target} "
                                   f"(storage option follow_redirects_to_other_hosts)")


async def http_client(*, shardpack_other_hosts: bool = False, **kwargs):
    """The aiohttp session of fsspec's HTTP filesystem (its ``get_client``): fsspec's own, plus
    the redirect check (module-level, so the filesystem still pickles).

    Args:
        shardpack_other_hosts: whether redirects to other hosts are followed.
        **kwargs: aiohttp.ClientSession's arguments.
    """
    import aiohttp

    if not shardpack_other_hosts:
        trace = aiohttp.TraceConfig()
        trace.on_request_redirect.append(_refuse_other_hosts)
        kwargs["trace_configs"] = [*(kwargs.get("trace_configs") or ()), trace]
    return aiohttp.ClientSession(**kwargs)


class HashingSink:
    """A write-only file for a download: writes to ``out`` and hashes what passes, which saves
    reading the download back to check it (~0.2 s of CPU per GB).  A failed write is a
    CacheError naming ``dest`` (a local problem: not retried, not blamed on the remote).

    Args:
        out: the open local file.
        dest: its path, for messages.
    """

    def __init__(self, out, dest: str):
        self._out, self._dest = out, dest
        self._hasher = fmt.new_content_hasher()

    def write(self, data) -> int:
        """Hash and write ``data``.

        Args:
            data: bytes of the body.
        """
        self._hasher.update(data)
        try:
            return self._out.write(data)
        except OSError as exc:
            raise cache_error(self._dest, exc) from exc

    def read(self, *_):
        """Refused: fsspec tells a file object from a path by read/close/tell."""
        raise OSError(errno.EBADF, "write-only download sink")

    def tell(self) -> int:
        """Bytes written so far."""
        return self._out.tell()

    def close(self) -> None:
        """Nothing: the caller closes the real file."""

    def hexdigest(self) -> str:
        """The content hash of what was written."""
        return self._hasher.hexdigest()
