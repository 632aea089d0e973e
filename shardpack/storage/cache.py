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
  recently used files that nobody holds are deleted until the cache fits ``limit`` bytes, and
  so are temp files of dead downloads (of any shard: one nobody asks for again would stay
  forever).  When everything cached is in use, the cache overshoots rather than deadlock, and
  shrinks again at the next publish or ``prune``.  So the cache holds at most ``limit`` bytes,
  plus what readers hold open beyond it, plus one partial file per download in flight.
* A cache this process cannot write (a node cache filled ahead, mounted read-only or owned by
  another user) serves what it holds and writes nothing: no lock file, access time, stamp or
  temp file.  Anything missing or corrupt there is a one-line error: it cannot be fetched.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass

import xxhash

from shardpack import format as fmt
from shardpack.core.errors import CacheError, IntegrityError, ShardpackError
from shardpack.storage.cachefiles import fd_hash, file_hash, identity, remove_if_free

LOCK_NAME = ".lock"


def default_cache_dir() -> str:
    """The cache folder when none is given: $SHARDPACK_CACHE, else $XDG_CACHE_HOME/shardpack
    (~/.cache/shardpack)."""
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
    """A cached file in use: its path, and an open fd holding a shared lock on it (the file is
    never evicted while the lock is held)."""

    path: str
    fd: int  # holds the shared lock while the entry is in use

    def close(self) -> None:
        """Release the entry (close the fd, which drops its lock); closing twice is fine."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ShardCache:
    """The shared shard cache at ``cache_dir`` (see the module docstring).

    Args:
        cache_dir: its folder, made when missing (a folder this process cannot write is used
            read-only).
        limit: the bytes it may hold.
    """

    def __init__(self, cache_dir: str | os.PathLike, limit: int):
        self.root = os.path.abspath(os.fspath(cache_dir))
        self.limit = limit
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise CacheError("cache_dir is not a folder (a file is in its place)", path=self.root,
                             hint="give a folder, or a path that does not exist yet")
        if not os.path.isdir(self.root):  # (no mkdir try on an existing one: it may be read-only)
            with _writing(self.root, "cannot create the cache folder"):
                os.makedirs(self.root, exist_ok=True)
        if not os.access(self.root, os.R_OK | os.X_OK):
            raise CacheError("cannot read the cache folder (permission denied)", path=self.root)
        # a folder this process cannot write (read-only mount, another user's) is used as it is:
        # a warm one serves its files (docs/remote.md, "The cache")
        self.read_only = not os.access(self.root, os.W_OK)
        self._verified: set[tuple[str, int, int]] = set()  # (path, size, mtime) hashed here
        self.stats = {"hits": 0, "downloads": 0, "refetches": 0, "evictions": 0, "waits": 0,
                      "busy": 0, "rehashed": 0, "stamped": 0}

    # -- locking ------------------------------------------------------------------------------
    @contextmanager
    def _global(self):
        """The bookkeeping lock: exclusive; shared in a read-only cache, whose readers only look
        up (and none there when no writer ever made the lock file: none to keep out)."""
        path = os.path.join(self.root, LOCK_NAME)
        if self.read_only:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                fd = -1
            mode = fcntl.LOCK_SH
        else:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except PermissionError:  # another user's lock file: a read-only fd locks it too
                with _writing(path, "cannot open the cache's lock file"):
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise CacheError(f"cannot create the cache's lock file: {exc.strerror or exc}",
                                 path=path) from exc
            mode = fcntl.LOCK_EX
        try:
            if fd >= 0:
                fcntl.flock(fd, mode)
            yield
        finally:
            if fd >= 0:
                os.close(fd)

    def _need_write(self, what: str) -> None:
        if self.read_only:
            raise CacheError(f"cannot {what}: the cache folder is read-only", path=self.root)

    def entry_path(self, dataset_url: str, shard: CacheFile) -> str:
        """Where the cache keeps ``shard`` of the dataset at ``dataset_url``.

        Args:
            dataset_url: the dataset's URL.
            shard: a manifest entry or :class:`CacheItem`.
        """
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
            ident = identity(entry.path, entry.fd)
            entry.close()
            if self.read_only:
                raise IntegrityError("cached file does not match the manifest's size or hash, and "
                                     "the cache folder is read-only: it cannot be fetched again",
                                     path=path, hint="refill the cache where it is writable, "
                                                     "or give another cache_dir")
            # corrupt in the cache: fetch again, once (another reader that found it corrupt too
            # may have removed it, or fetched it again, already: then that is what _get finds)
            self._discard(path, ident)
            self.stats["refetches"] += 1
        raise IntegrityError("cached shard is still corrupt after fetching it again",
                             path=path, hint="the remote shard itself may be bad: run "
                                             "'shardpack verify' on the dataset")

    def _get(self, path: str, shard: CacheFile, download, wait: bool = True) -> CacheEntry | None:
        folder, name = os.path.split(path)
        while True:
            with self._global():
                entry = self._open_shared(path)
                if entry is not None:
                    self.stats["hits"] += 1
                    return entry
                busy = self._locked_temp(folder, name)
                if busy is None:
                    if self.read_only:
                        raise CacheError(f"cannot fetch {shard.name} into the cache: the cache "
                                         "folder is read-only, and the file is not in it",
                                         path=self.root, hint="fill the cache where it is "
                                                              "writable, or give another "
                                                              "cache_dir")
                    tmp = os.path.join(folder, f".{name}.tmp-{os.getpid()}-{time.monotonic_ns()}")
                    with _writing(folder, "cannot write into the cache"):
                        # in the lock: prune removes empty folders under it
                        os.makedirs(folder, exist_ok=True)
                        tfd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                                      0o644)
                    fcntl.flock(tfd, fcntl.LOCK_EX)
            if busy is None:
                return self._fetch_into(tmp, tfd, path, shard, download)
            if not wait:
                os.close(busy)
                self.stats["busy"] += 1
                return None
            self.stats["waits"] += 1  # another process is fetching it: wait for its lock to go
            try:
                fcntl.flock(busy, fcntl.LOCK_SH)
            finally:
                os.close(busy)

    def _fetch_into(self, tmp: str, tfd: int, path: str, shard: CacheFile,
                    download) -> CacheEntry:
        """Download ``shard`` into the temp file ``tmp`` (``tfd``: open, locked exclusively),
        check it against the manifest, and publish it as ``path``: the entry, held shared.
        Closes ``tfd``; removes ``tmp`` on any failure."""
        try:
            digest = download(tmp)  # the content hash when computed on the way, or None
            if os.path.getsize(tmp) != shard.bytes:
                raise IntegrityError(f"downloaded {os.path.getsize(tmp)} bytes, the "
                                     f"manifest says {shard.bytes}", path=shard.name)
            if (digest or file_hash(tmp)) != shard.hash:
                raise IntegrityError("downloaded shard does not match the manifest's hash",
                                     path=shard.name)
            # no fsync: a process re-hashes a cache file before its first use unless it
            # carries a stamp of this boot, so one torn by a crash (a new boot) is refetched;
            # fsync would cost a good part of a cold remote epoch (docs/remote.md)
            _stamp(tfd, shard.hash, own=True)  # before anyone can find it (by inode)
            st = os.fstat(tfd)
            with self._global():
                self._evict(shard.bytes, keep=path)
                with _writing(path, "cannot write into the cache"):
                    os.replace(tmp, path)
                self._verified.add((path, st.st_size, st.st_mtime_ns))  # == identity(path)
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
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise CacheError(f"cannot read a cached file: {exc.strerror or exc}",
                             path=path) from exc
        fcntl.flock(fd, fcntl.LOCK_SH)
        if not self.read_only:
            try:  # LRU recency: access time
                os.utime(fd, ns=(time.time_ns(), os.fstat(fd).st_mtime_ns))
            except OSError:
                pass  # another user's file in a shared cache: its recency just stays
        return CacheEntry(path, fd)

    def _locked_temp(self, folder: str, name: str) -> int | None:
        """An fd of a temp file some live process is downloading into, or None; temp files of
        dead processes are deleted (left alone in a read-only cache)."""
        prefix = f".{name}.tmp-"
        try:
            others = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            return None  # (the dataset's folder is made when its first download starts)
        for other in others:
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
            if not self.read_only:
                try:
                    os.unlink(full)  # lock free: its writer died
                except FileNotFoundError:
                    pass
        return None

    def _verify(self, entry: CacheEntry, shard: CacheFile) -> bool:
        ident = identity(entry.path, entry.fd)
        if ident in self._verified:
            return True
        if ident[1] != shard.bytes:
            return False
        if _stamp_ok(entry.fd, shard.hash):
            self.stats["stamped"] += 1
        # hashed through the open fd, not the path: another reader that found the same file
        # corrupt may have removed it, or fetched it again, meanwhile
        elif fd_hash(entry.fd, shard.bytes) == shard.hash:
            self.stats["rehashed"] += 1
            if not self.read_only:
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
                if identity(path) == ident:
                    os.unlink(path)
            except FileNotFoundError:
                pass

    def _evict(self, incoming: int, keep: str | None,
               limit: int | None = None) -> list[tuple[str, int]]:
        """Delete the least recently used files nobody holds until the cache and ``incoming``
        bytes fit ``limit`` (the cache's own by default), and every temp file of a dead
        download, whatever the limit (one of a shard nobody asks for again would stay for
        good).  Temp files of live downloads are not counted: in flight, not the cache's yet.
        Returns (path, bytes) of each file deleted."""
        limit = self.limit if limit is None else limit
        files, removed = [], []
        for dirpath, _, names in os.walk(self.root):
            for name in names:
                if name == LOCK_NAME:
                    continue
                full = os.path.join(dirpath, name)
                try:
                    st = os.stat(full)
                except FileNotFoundError:
                    continue
                if name.startswith("."):
                    if ".tmp-" in name and remove_if_free(full):  # its writer died
                        removed.append((full, st.st_size))
                    continue
                files.append((st.st_atime_ns, st.st_size, full))
        used = sum(size for _, size, _ in files)
        for _, size, full in sorted(files):
            if used + incoming <= limit:
                break
            if full == keep:
                continue
            if remove_if_free(full):  # (one in use is never evicted)
                used -= size
                removed.append((full, size))
                self.stats["evictions"] += 1
        return removed

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

    def prune(self, limit: int | None = None) -> dict:
        """Bring the cache under ``limit`` bytes (its own limit by default): delete the least
        recently used files nobody holds, every temp file of a dead download, then empty
        folders.  Returns ``removed`` ((path, bytes) of each deleted file), and what is left:
        ``bytes``, ``files`` (over the limit only by files some process holds)."""
        self._need_write("prune it")
        with self._global():
            removed = self._evict(0, keep=None, limit=limit)
            for folder in os.listdir(self.root):
                full = os.path.join(self.root, folder)
                if os.path.isdir(full) and not os.path.islink(full):
                    try:
                        os.rmdir(full)  # (only an empty one goes)
                    except OSError:
                        pass
        usage = self.usage()
        return {"removed": removed, "bytes": usage["bytes"], "files": usage["files"]}

    def clear(self) -> int:
        """Delete every cached file nobody is reading; returns how many were deleted."""
        self._need_write("clear it")
        removed = 0
        with self._global():
            for dirpath, _, names in os.walk(self.root, topdown=False):
                for name in names:
                    if name != LOCK_NAME and remove_if_free(os.path.join(dirpath, name)):
                        removed += 1
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


@contextmanager
def _writing(path: str, what: str):
    """The cache's own writes: an OSError is a one-line CacheError naming ``path`` (a local
    problem: not retried, not blamed on the remote)."""
    try:
        yield
    except ShardpackError:
        raise
    except OSError as exc:
        raise CacheError(f"{what}: {exc.strerror or exc}", path=path) from exc
