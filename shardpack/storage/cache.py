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
* A cache this process cannot write (a node cache filled ahead, mounted read-only or root's)
  serves what it holds and writes nothing: no lock file, access time, stamp or temp file.
  Anything missing or corrupt there is a one-line error: it cannot be fetched.
* Trusted only as far as the cache made it: a cache folder (or a folder in it) of another
  user than this one or root, or one others can write, is refused; nothing in it is opened
  through a link (``O_NOFOLLOW``, relative to its folder's fd).  A link where a cached file,
  a folder or a temp file goes is removed (then fetched), one at the lock file is refused.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
from contextlib import contextmanager
from dataclasses import dataclass

import xxhash

from shardpack import format as fmt
from shardpack.core.errors import CacheError, IntegrityError, ShardpackError
from shardpack.storage.cachefiles import (FOLDER_MODE, LOCK_NAME, fd_hash, file_hash, identity,
                                          listing, live_temp, make_temp, open_file, open_folder,
                                          open_lock, open_root, remove_empty_folders,
                                          remove_if_free, unlink_quietly)


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
                os.makedirs(self.root, mode=FOLDER_MODE, exist_ok=True)
        if not os.access(self.root, os.R_OK | os.X_OK):
            raise CacheError("cannot read the cache folder (permission denied)", path=self.root)
        os.close(open_root(self.root))  # another user's folder: one line now, not mid-epoch
        # a folder this process cannot write (read-only mount, root's) is used as it is:
        # a warm one serves its files (docs/remote.md, "The cache")
        self.read_only = not os.access(self.root, os.W_OK)
        self._verified: set[tuple[str, int, int]] = set()  # (path, size, mtime) hashed here
        self.stats = {"hits": 0, "downloads": 0, "refetches": 0, "evictions": 0, "waits": 0,
                      "busy": 0, "rehashed": 0, "stamped": 0}

    # -- locking ------------------------------------------------------------------------------
    @contextmanager
    def _global(self):
        """The bookkeeping lock: exclusive; shared in a read-only cache, whose readers only look
        up (and none there when no writer ever made the lock file: none to keep out).  Yields
        an fd of the cache folder, checked again: all under it is opened through it."""
        root = open_root(self.root)
        fd = -1
        try:
            fd = open_lock(root, os.path.join(self.root, LOCK_NAME), self.read_only)
            if fd >= 0:
                fcntl.flock(fd, fcntl.LOCK_SH if self.read_only else fcntl.LOCK_EX)
            yield root
        finally:
            if fd >= 0:
                os.close(fd)
            os.close(root)

    def _need_write(self, what: str) -> None:
        if self.read_only:
            raise CacheError(f"cannot {what}: the cache folder is read-only", path=self.root)

    def _where(self, dataset_url: str, shard: CacheFile) -> tuple[str, str]:
        """(folder, file name) of ``shard`` under the cache folder."""
        folder = xxhash.xxh3_64_hexdigest(dataset_url.rstrip("/").encode())
        return folder, f"{shard.hash[:32]}-{shard.name}"

    def entry_path(self, dataset_url: str, shard: CacheFile) -> str:
        """Where the cache keeps ``shard`` of the dataset at ``dataset_url``.

        Args:
            dataset_url: the dataset's URL.
            shard: a manifest entry or :class:`CacheItem`.
        """
        return os.path.join(self.root, *self._where(dataset_url, shard))

    def _folder(self, root: int, folder: str, create: bool = False) -> int | None:
        """An fd of the cache's ``folder`` (a dataset's), None when missing (see
        :func:`~shardpack.storage.cachefiles.open_folder`)."""
        path = os.path.join(self.root, folder)
        with _writing(path, "cannot open a folder of the cache"):
            return open_folder(root, folder, path, not self.read_only, create)

    # -- the one entry point --------------------------------------------------------------------
    def open(self, dataset_url: str, shard: CacheFile, download,
             wait: bool = True) -> CacheEntry | None:
        """The cached file of ``shard`` (a manifest entry or :class:`CacheItem`), fetching it
        with ``download(path)`` when missing (which may return the content hash of what it
        wrote, else the file is hashed here).  The caller must ``close()`` the entry when done
        reading.  With ``wait=False``, None instead of waiting while another process or thread
        fetches it (a prefetcher moves on to the next shard)."""
        where = self._where(dataset_url, shard)
        path = os.path.join(self.root, *where)
        for _ in range(2):
            entry = self._get(where, shard, download, wait)
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
            self._discard(where, ident)
            self.stats["refetches"] += 1
        raise IntegrityError("cached shard is still corrupt after fetching it again",
                             path=path, hint="the remote shard itself may be bad: run "
                                             "'shardpack verify' on the dataset")

    def _get(self, where: tuple[str, str], shard: CacheFile, download,
             wait: bool = True) -> CacheEntry | None:
        while True:
            with self._global() as root:
                found = self._look_up(root, *where)
                if isinstance(found, CacheEntry):
                    self.stats["hits"] += 1
                    return found
                if found is None:
                    if self.read_only:
                        raise CacheError(f"cannot fetch {shard.name} into the cache: the cache "
                                         "folder is read-only, and the file is not in it",
                                         path=self.root, hint="fill the cache where it is "
                                                              "writable, or give another "
                                                              "cache_dir")
                    # in the lock: prune removes empty folders under it
                    temp = self._start_temp(root, *where)
            if found is None:
                return self._fetch_into(temp, where, shard, download)
            if not wait:
                os.close(found)
                self.stats["busy"] += 1
                return None
            self.stats["waits"] += 1  # another process is fetching it: wait for its lock to go
            try:
                fcntl.flock(found, fcntl.LOCK_SH)
            finally:
                os.close(found)

    def _start_temp(self, root: int, folder: str, name: str) -> tuple[int, str, int]:
        """A new temp file to download ``name`` into, locked exclusively: (an fd of its
        folder, its name, its fd)."""
        with _writing(os.path.join(self.root, folder), "cannot write into the cache"):
            dfd = self._folder(root, folder, create=True)
            try:
                temp, tfd = make_temp(dfd, name)
            except BaseException:
                os.close(dfd)
                raise
        fcntl.flock(tfd, fcntl.LOCK_EX)
        return dfd, temp, tfd

    def _fetch_into(self, temp: tuple[int, str, int], where: tuple[str, str],
                    shard: CacheFile, download) -> CacheEntry:
        """Download ``shard`` into the temp file ``temp`` (its folder's fd, its name, its fd:
        locked exclusively), check it against the manifest, and publish it: the entry, held
        shared.  Closes the fds; removes the temp file on any failure."""
        dfd, tmp, tfd = temp
        path = os.path.join(self.root, *where)
        try:
            digest = download(os.path.join(self.root, where[0], tmp))  # its hash, or None
            # sized and hashed through this process's own fd: bytes a swapped name took
            # elsewhere are not in it
            got = os.fstat(tfd).st_size
            if got != shard.bytes:
                raise IntegrityError(f"downloaded {got} bytes, the manifest says {shard.bytes}",
                                     path=shard.name)
            if (digest or file_hash(tfd)) != shard.hash:
                raise IntegrityError("downloaded shard does not match the manifest's hash",
                                     path=shard.name)
            # no fsync: a process re-hashes a cache file before its first use unless it
            # carries a stamp of this boot, so one torn by a crash (a new boot) is refetched;
            # fsync would cost a good part of a cold remote epoch (docs/remote.md)
            _stamp(tfd, shard.hash, own=True)  # before anyone can find it (by inode)
            st = os.fstat(tfd)
            with self._global() as root:
                self._evict(root, shard.bytes, keep=path)
                with _writing(path, "cannot write into the cache"):
                    now = os.lstat(tmp, dir_fd=dfd)
                    if (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev):
                        raise CacheError("the download's temp file was replaced meanwhile",
                                         path=os.path.join(self.root, where[0], tmp))
                    os.replace(tmp, where[1], src_dir_fd=dfd, dst_dir_fd=dfd)
                self._verified.add((path, st.st_size, st.st_mtime_ns))  # == identity(path)
                # the same open file now is the cache entry: turn the writer's exclusive
                # lock into a reader's shared one (waiters wake up and find the file)
                fcntl.flock(tfd, fcntl.LOCK_SH)
                entry, tfd = CacheEntry(path, tfd), -1
            self.stats["downloads"] += 1
            return entry
        except BaseException:
            unlink_quietly(dfd, tmp)
            raise
        finally:
            if tfd >= 0:
                os.close(tfd)
            os.close(dfd)

    # -- helpers (called with the global lock held unless noted) ---------------------------------
    def _look_up(self, root: int, folder: str, name: str) -> CacheEntry | int | None:
        """The cached file ``name`` held shared; else an fd of the temp file a live download
        of it writes; else None."""
        dfd = self._folder(root, folder)
        if dfd is None:
            return None  # (the dataset's folder is made when its first download starts)
        try:
            entry = self._open_shared(dfd, folder, name)
            return entry if entry is not None else live_temp(dfd, name, self.read_only)
        finally:
            os.close(dfd)

    def _open_shared(self, dfd: int, folder: str, name: str) -> CacheEntry | None:
        path = os.path.join(self.root, folder, name)
        try:  # a link or special file in its place is removed (then fetched), never followed
            fd = open_file(dfd, name, path, not self.read_only)
        except ShardpackError:
            raise
        except OSError as exc:
            raise CacheError(f"cannot read a cached file: {exc.strerror or exc}",
                             path=path) from exc
        if fd is None:
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)
        if not self.read_only:
            try:  # LRU recency: access time
                os.utime(fd, ns=(time.time_ns(), os.fstat(fd).st_mtime_ns))
            except OSError:
                pass  # another user's file in a shared cache: its recency just stays
        return CacheEntry(path, fd)

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

    def _discard(self, where: tuple[str, str], ident: tuple) -> None:
        """Delete a cached file found corrupt (unless it was replaced meanwhile).  Readers that
        mapped it keep their mapping; they check it themselves."""
        with self._global() as root:
            dfd = self._folder(root, where[0])
            if dfd is None:
                return
            try:
                st = os.lstat(where[1], dir_fd=dfd)
                if stat.S_ISREG(st.st_mode) and (st.st_size, st.st_mtime_ns) == ident[1:]:
                    os.unlink(where[1], dir_fd=dfd)
            except FileNotFoundError:
                pass
            finally:
                os.close(dfd)

    def _remover(self, root: int, folders: dict):
        """``remove(folder, name)``: :func:`remove_if_free` in the folder (its fd kept in
        ``folders``, which the caller closes)."""
        def remove(folder: str, name: str) -> bool:
            if folder not in folders:
                folders[folder] = self._folder(root, folder) if folder else -1
            fd = root if not folder else folders[folder]
            return fd is not None and remove_if_free(fd, name)
        return remove

    def _evict(self, root: int, incoming: int, keep: str | None,
               limit: int | None = None) -> list[tuple[str, int]]:
        """Delete the least recently used files nobody holds until the cache and ``incoming``
        bytes fit ``limit`` (the cache's own by default), every temp file of a dead download,
        whatever the limit (one of a shard nobody asks for again would stay for good), and
        every link or special file (never followed).  Temp files of live downloads are not
        counted: in flight, not the cache's yet.  Returns (path, bytes) of each file deleted."""
        limit = self.limit if limit is None else limit
        files, rest = listing(root, self.root)
        folders: dict[str, int | None] = {}
        remove, removed = self._remover(root, folders), []
        try:
            for folder, name, size in rest:  # (a live download's temp file is held)
                if remove(folder, name):
                    removed.append((os.path.join(self.root, folder, name), size))
            used = sum(size for _, size, _, _ in files)
            for _, size, folder, name in sorted(files):
                if used + incoming <= limit:
                    break
                full = os.path.join(self.root, folder, name)
                if full != keep and remove(folder, name):  # (one in use is never evicted)
                    used -= size
                    removed.append((full, size))
                    self.stats["evictions"] += 1
        finally:
            for fd in folders.values():
                if fd is not None and fd >= 0:
                    os.close(fd)
        return removed

    # -- inspection -----------------------------------------------------------------------------
    def usage(self) -> dict:
        """What the cache holds: all files (``files``, ``bytes``), and split into shards and
        indexes (an index is cached beside its shard, under its own name ``*.idx``)."""
        counts = {"shards": 0, "shard_bytes": 0, "indexes": 0, "index_bytes": 0}
        root = open_root(self.root)
        try:
            files, _ = listing(root, self.root)
        finally:
            os.close(root)
        for _, size, _, name in files:
            kind = "indexes" if name.endswith(fmt.INDEX_SUFFIX) else "shards"
            counts[kind] += 1
            counts["index_bytes" if kind == "indexes" else "shard_bytes"] += size
        return {"dir": self.root, "files": counts["shards"] + counts["indexes"],
                "bytes": counts["shard_bytes"] + counts["index_bytes"], **counts,
                "limit": self.limit}

    def prune(self, limit: int | None = None) -> dict:
        """Bring the cache under ``limit`` bytes (its own limit by default): delete the least
        recently used files nobody holds, every temp file of a dead download, links, then
        empty folders.  Returns ``removed`` ((path, bytes) of each deleted file), and what is
        left: ``bytes``, ``files`` (over the limit only by files some process holds)."""
        self._need_write("prune it")
        with self._global() as root:
            removed = self._evict(root, 0, keep=None, limit=limit)
            remove_empty_folders(root)
        usage = self.usage()
        return {"removed": removed, "bytes": usage["bytes"], "files": usage["files"]}

    def clear(self) -> int:
        """Delete every cached file nobody is reading; returns how many were deleted."""
        self._need_write("clear it")
        with self._global() as root:
            removed = len(self._evict(root, 0, keep=None, limit=0))
            remove_empty_folders(root)
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
