"""A local shard cache that many processes share safely, within a disk budget.

Layout: ``CACHE/<xxh3-64 of the dataset URL>/<shard hash>-<shard name>``, so two datasets that
both have ``shard-00000.tar`` never collide, and a changed shard (new hash) is a new entry.

Safety comes from OS file locks (``flock``), which the kernel releases when a process dies: no
shared memory, no lock state that outlives a crash.

* ``CACHE/.lock``: one small lock file; held exclusively only for short bookkeeping steps
  (look up, claim a download, publish, evict), never while downloading.
* A reader holds a shared lock on the cached file for as long as it uses it (the memory map);
  eviction only removes files it can lock exclusively, so a shard being read is never evicted.
* A downloader writes ``.<entry>.tmp-<pid>`` holding an exclusive lock on it.  Others wanting the
  same shard find the locked temp file and wait for it instead of downloading again; a temp file
  whose lock is free belongs to a dead process and is deleted.
* Every download is checked against the manifest's xxh3-128 before it is renamed into place, so a
  reader never sees a partial or wrong file.  Downloads are not fsynced, so a file that a crash
  may have torn must be hashed again before use: a verified file carries a stamp (extended
  attribute ``user.shardpack.verified``: the kernel's boot id, inode, size, mtime), and a file
  whose stamp is of this boot and still matches needs no re-hash (a crash that could tear it
  means a new boot).  Without the stamp (other boot, file changed, or a file system without user
  xattrs) it is re-hashed the first time each process opens it; a corrupt one is deleted and
  fetched again, once, then it is an error.
* LRU: a file's access time is set on every use; before a new file is published, the least
  recently used files that nobody holds are deleted until the cache fits ``limit`` bytes.  When
  everything cached is in use, the cache overshoots rather than deadlock, and shrinks again as
  readers let go.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass

import xxhash

from . import format as fmt
from .errors import IntegrityError

LOCK_NAME = ".lock"


def default_cache_dir() -> str:
    base = os.environ.get("SHARDPACK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "shardpack")
    return base


@dataclass(frozen=True, slots=True)
class CacheItem:
    """A file the cache holds: its name in the dataset, its xxh3-128 and its size.  A manifest's
    :class:`~shardpack.format.ShardEntry` has these attributes too and is passed as it is; an
    index is passed as ``CacheItem(entry.index, entry.index_hash, entry.index_bytes)``."""
    name: str
    hash: str
    bytes: int


CacheFile = CacheItem | fmt.ShardEntry  # anything with name, hash and bytes


@dataclass
class CacheEntry:
    path: str
    fd: int  # holds the shared lock while the entry is in use

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ShardCache:
    def __init__(self, cache_dir: str | os.PathLike, limit: int):
        self.root = os.path.abspath(os.fspath(cache_dir))
        self.limit = limit
        os.makedirs(self.root, exist_ok=True)
        self._verified: set[tuple[str, int, int]] = set()  # (path, size, mtime) hashed here
        self.stats = {"hits": 0, "downloads": 0, "refetches": 0, "evictions": 0, "waits": 0,
                      "busy": 0, "rehashed": 0, "stamped": 0}

    # -- locking ------------------------------------------------------------------------------
    @contextmanager
    def _global(self):
        fd = os.open(os.path.join(self.root, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def entry_path(self, dataset_url: str, shard: CacheFile) -> str:
        folder = xxhash.xxh3_64_hexdigest(dataset_url.rstrip("/").encode())
        return os.path.join(self.root, folder, f"{shard.hash[:32]}-{shard.name}")

    # -- the one entry point --------------------------------------------------------------------
    def open(self, dataset_url: str, shard: CacheFile, download,
             wait: bool = True) -> CacheEntry | None:
        """The cached file of ``shard`` (a manifest entry or :class:`CacheItem`), fetching it
        with ``download(path)`` when missing (which may return the content hash of what it
        wrote, else the file is hashed here).  The caller must ``close()`` the entry when done
        reading.  With ``wait=False``, None instead of waiting while another process or thread
        fetches it (a prefetcher moves on to the next shard)."""
        path = self.entry_path(dataset_url, shard)
        for _ in range(2):
            entry = self._get(path, shard, download, wait)
            if entry is None:
                return None
            if self._verify(entry, shard):
                return entry
            ident = _identity(entry.path, entry.fd)
            entry.close()
            self._discard(path, ident)  # corrupt in the cache: fetch again, once
            self.stats["refetches"] += 1
        raise IntegrityError("cached shard is still corrupt after fetching it again",
                             path=path, hint="the remote shard itself may be bad: run "
                                             "'shardpack verify' on the dataset")

    def _get(self, path: str, shard: CacheFile, download, wait: bool = True) -> CacheEntry | None:
        folder, name = os.path.split(path)
        os.makedirs(folder, exist_ok=True)
        while True:
            with self._global():
                entry = self._open_shared(path)
                if entry is not None:
                    self.stats["hits"] += 1
                    return entry
                busy = self._locked_temp(folder, name)
                if busy is None:
                    tmp = os.path.join(folder, f".{name}.tmp-{os.getpid()}-{time.monotonic_ns()}")
                    tfd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                    fcntl.flock(tfd, fcntl.LOCK_EX)
            if busy is not None and not wait:
                os.close(busy)
                self.stats["busy"] += 1
                return None
            if busy is not None:  # another process is fetching it: wait for its lock to go
                self.stats["waits"] += 1
                try:
                    fcntl.flock(busy, fcntl.LOCK_SH)
                finally:
                    os.close(busy)
                continue
            try:
                digest = download(tmp)  # the content hash when computed on the way, or None
                if os.path.getsize(tmp) != shard.bytes:
                    raise IntegrityError(f"downloaded {os.path.getsize(tmp)} bytes, the "
                                         f"manifest says {shard.bytes}", path=shard.name)
                if (digest or _file_hash(tmp)) != shard.hash:
                    raise IntegrityError("downloaded shard does not match the manifest's hash",
                                         path=shard.name)
                # no fsync: a process re-hashes a cache file before its first use unless it
                # carries a stamp of this boot, so one torn by a crash (a new boot) is refetched;
                # fsync would cost a good part of a cold remote epoch (docs/remote.md)
                _stamp(tfd, shard.hash, own=True)  # before anyone can find it (by inode)
                st = os.fstat(tfd)
                with self._global():
                    self._evict(shard.bytes, keep=path)
                    os.replace(tmp, path)
                    self._verified.add((path, st.st_size, st.st_mtime_ns))  # == _identity(path)
                    # the same open file now is the cache entry: turn the writer's exclusive
                    # lock into a reader's shared one (waiters wake up and find the file)
                    fcntl.flock(tfd, fcntl.LOCK_SH)
                    entry, tfd = CacheEntry(path, tfd), -1
                self.stats["downloads"] += 1
                return entry
            except BaseException:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
                raise
            finally:
                if tfd >= 0:
                    os.close(tfd)

    # -- helpers (called with the global lock held unless noted) ---------------------------------
    def _open_shared(self, path: str) -> CacheEntry | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.utime(fd, ns=(time.time_ns(), os.fstat(fd).st_mtime_ns))  # LRU recency: access time
        return CacheEntry(path, fd)

    def _locked_temp(self, folder: str, name: str) -> int | None:
        """An fd of a temp file some live process is downloading into, or None; temp files of
        dead processes are deleted."""
        prefix = f".{name}.tmp-"
        for other in os.listdir(folder):
            if not other.startswith(prefix):
                continue
            full = os.path.join(folder, other)
            try:
                fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return fd  # held: a live download
                os.close(fd)
                raise
            os.close(fd)
            os.unlink(full)  # lock free: its writer died
        return None

    def _verify(self, entry: CacheEntry, shard: CacheFile) -> bool:
        ident = _identity(entry.path, entry.fd)
        if ident in self._verified:
            return True
        if ident[1] != shard.bytes:
            return False
        if _stamp_ok(entry.fd, shard.hash):
            self.stats["stamped"] += 1
        elif _file_hash(entry.path) == shard.hash:
            self.stats["rehashed"] += 1
            _stamp(entry.fd, shard.hash)
        else:
            return False
        self._verified.add(ident)
        return True

    def _discard(self, path: str, ident: tuple) -> None:
        """Delete a cached file found corrupt (unless it was replaced meanwhile).  Readers that
        mapped it keep their mapping; they check it themselves."""
        with self._global():
            try:
                if _identity(path) == ident:
                    os.unlink(path)
            except FileNotFoundError:
                pass

    def _evict(self, incoming: int, keep: str) -> None:
        files = []
        for dirpath, _, names in os.walk(self.root):
            for name in names:
                if name == LOCK_NAME or name.startswith("."):
                    continue
                full = os.path.join(dirpath, name)
                try:
                    st = os.stat(full)
                except FileNotFoundError:
                    continue
                files.append((st.st_atime_ns, st.st_size, full))
        used = sum(size for _, size, _ in files)
        for _, size, full in sorted(files):
            if used + incoming <= self.limit:
                break
            if full == keep:
                continue
            fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue  # in use: never evicted
            try:
                os.unlink(full)
                used -= size
                self.stats["evictions"] += 1
            finally:
                os.close(fd)

    # -- inspection -----------------------------------------------------------------------------
    def usage(self) -> dict:
        """What the cache holds: all files (``files``, ``bytes``), and split into shards and
        indexes (an index is cached beside its shard, under its own name ``*.idx``)."""
        counts = {"shards": 0, "shard_bytes": 0, "indexes": 0, "index_bytes": 0}
        for dirpath, _, names in os.walk(self.root):
            for name in names:
                if name != LOCK_NAME and not name.startswith("."):
                    try:
                        size = os.path.getsize(os.path.join(dirpath, name))
                    except FileNotFoundError:  # evicted by another process meanwhile
                        continue
                    if name.endswith(fmt.INDEX_SUFFIX):
                        counts["indexes"] += 1
                        counts["index_bytes"] += size
                    else:
                        counts["shards"] += 1
                        counts["shard_bytes"] += size
        return {"dir": self.root, "files": counts["shards"] + counts["indexes"],
                "bytes": counts["shard_bytes"] + counts["index_bytes"], **counts,
                "limit": self.limit}

    def clear(self) -> int:
        """Delete every cached file nobody is reading; returns how many were deleted."""
        removed = 0
        with self._global():
            for dirpath, _, names in os.walk(self.root, topdown=False):
                for name in names:
                    if name == LOCK_NAME:
                        continue
                    full = os.path.join(dirpath, name)
                    fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        os.unlink(full)
                        removed += 1
                    except OSError:
                        pass
                    finally:
                        os.close(fd)
                if dirpath != self.root:
                    try:
                        os.rmdir(dirpath)
                    except OSError:
                        pass
        return removed


STAMP_ATTR = "user.shardpack.verified"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""  # no boot id (not Linux): no stamps, every process re-hashes


_BOOT_ID = _boot_id()
STAMP_MARGIN_NS = 50_000_000  # well over the kernel's coarse timestamp tick (<= 10 ms)


def _stamp_value(fd: int, content_hash: str) -> bytes:
    st = os.fstat(fd)
    return f"{_BOOT_ID} {st.st_ino} {st.st_size} {st.st_mtime_ns} {content_hash}".encode()


def _stamp(fd: int, content_hash: str, own: bool = False) -> None:
    """Mark the open cache file as hashed and found good in this boot (best effort).

    The kernel stamps writes with a coarse clock (a tick of up to 10 ms), so a change made in
    the same tick as the hash keeps the mtime the stamp records, and would be trusted.  A file
    whose mtime is that recent is not stamped (the next process re-hashes it, and stamps it
    then), except the download's own temp file (``own``), whose mtime is set back by a second
    instead: any later write then moves it."""
    if not _BOOT_ID or not hasattr(os, "setxattr"):
        return
    try:
        st = os.fstat(fd)
        if time.time_ns() - st.st_mtime_ns < STAMP_MARGIN_NS:
            if not own:
                return
            os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns - 1_000_000_000))
        os.setxattr(fd, STAMP_ATTR, _stamp_value(fd, content_hash))
    except OSError:
        pass  # no user xattrs here: processes re-hash instead


def _stamp_ok(fd: int, content_hash: str) -> bool:
    if not _BOOT_ID or not hasattr(os, "getxattr"):
        return False
    try:
        return os.getxattr(fd, STAMP_ATTR) == _stamp_value(fd, content_hash)
    except OSError:
        return False


def _identity(path: str, fd: int | None = None) -> tuple[str, int, int]:
    """(path, size, mtime) of a cache file; from its open fd when given (another thread or
    process may have deleted the path meanwhile)."""
    st = os.fstat(fd) if fd is not None else os.stat(path)
    return path, st.st_size, st.st_mtime_ns


def _file_hash(path: str) -> str:
    """xxh3-128 of the file, read into one reused 1 MB buffer: faster than a memory map, and
    than fresh chunks whose pages are new memory each time (docs/remote.md)."""
    hasher = fmt.new_content_hasher()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            hasher.update(view[:n])
    return hasher.hexdigest()
