"""The OUT folder of a writer (``pack``, ``convert``, ``merge``, ``export``): one writer at a
time, which files are shardpack's, and clearing them for ``--overwrite``.

Shared by pack.py, merge.py and export.py so that all take the same lock, and by the first two to
recognise the same files.
"""

from __future__ import annotations

import os

from shardpack import format as fmt
from shardpack.core.errors import PackError, ShardpackError
from shardpack.storage import Storage, is_temp_name

LOCK_NAME = ".shardpack-lock"  # the OUT lock's file: kept (empty), never data
STATE_NAME = fmt.STATE_NAME  # options of a pack in progress; removed at commit


class OutLock:
    """One writer at a time per OUT: an exclusive ``flock`` on OUT/.shardpack-lock (local OUT),
    held for the whole pack, convert, merge or export.  The kernel drops it when the process dies,
    so a killed writer never leaves a stale lock.  A file opened for writing, not the folder, so
    that NFS (which emulates flock with fcntl locks) can lock it too.  Forked children close their
    copy at once (os.register_at_fork below): a pool worker, ours or a caller's, must not hold
    it.  Remote OUT (s3://, ...) has no such lock: docs/packing.md says so.

    ``remove``: the lock file goes when the lock is released, if this run made it (``export``:
    its OUT is for other tools).  Safe because every taker checks, once it holds the lock, that
    the file it locked is still the one named OUT/.shardpack-lock, and locks again if not."""

    held: set[int] = set()

    def __init__(self, storage: Storage, *, remove: bool = False):
        self.storage, self.fd, self.remove, self.made = storage, None, remove, False
        local = storage.local_path()
        self.path = None if local is None else os.path.join(local, LOCK_NAME)

    def __enter__(self):
        for _ in range(_RELOCKS):
            fd = self._lock()
            if fd is None or self.path is None or _same_file(fd, self.path):
                break
            os.close(fd)  # its holder removed the file as it ended: lock the one there now
        else:
            raise PackError("the lock file keeps being removed by other runs",
                            path=self.storage.url, hint="run again")
        if fd is not None:
            self.fd = fd
            self.held.add(fd)
        return self

    def _lock(self) -> int | None:
        """An fd of the lock file, locked (or where files cannot be locked, unlocked); None where
        there is no lock file (object stores)."""
        import fcntl

        self.made = self.path is not None and not os.path.lexists(self.path)
        try:
            fd = self.storage.lock_file(LOCK_NAME)
        except FileExistsError:
            raise ShardpackError("output exists and is not a folder",
                                 path=self.storage.url) from None
        except OSError as exc:
            raise PackError(f"cannot use the output folder: {exc.strerror}",
                            path=self.storage.url) from None
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PackError("another shardpack run (pack, convert, merge or export) is writing "
                            "into this folder right now", path=self.storage.url,
                            hint="wait for it to finish, or choose another folder") from None
        except OSError:  # no lock support here (ENOLCK): write unguarded, as for remote OUT
            pass
        return fd

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            if self.remove and self.made and _same_file(self.fd, self.path):
                try:
                    os.unlink(self.path)  # before the lock is released (class docstring)
                except OSError:
                    pass
            self.held.discard(self.fd)
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None


_RELOCKS = 100  # each retry follows a whole run that took and removed the lock: never reached


def _same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        there = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    here = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _close_held_locks() -> None:
    for fd in list(OutLock.held):
        try:
            os.close(fd)
        except OSError:
            pass
    OutLock.held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_held_locks)


def is_ours(name: str) -> bool:
    """Whether ``name`` (in OUT) is a file shardpack writes: the manifest, a pack's state, the
    skip report, a temp file, a shard or an index."""
    return (name in (fmt.MANIFEST_NAME, STATE_NAME, fmt.SKIPS_NAME) or is_temp_name(name)
            or (name.startswith("shard-") and name.endswith(
                fmt.SHARD_SUFFIXES + (fmt.INDEX_SUFFIX,))))


def out_names(storage: Storage) -> tuple[list[str], list[str]]:
    """``(ours, foreign)``: what OUT holds besides its lock file and temp files, split into the
    files shardpack writes and everything else; both empty when OUT does not exist."""
    names = [n for n in storage.listdir() if not is_temp_name(n) and n != LOCK_NAME]
    return [n for n in names if is_ours(n)], [n for n in names if not is_ours(n)]


def clear_out(storage: Storage, ours: list[str]) -> None:
    """``--overwrite``: remove the manifest **first** (un-publishing the old dataset), then the
    rest of ``ours`` (shards, indexes, state) and any temp files."""
    storage.remove(fmt.MANIFEST_NAME)
    for name in ours:
        storage.remove(name)
    storage.remove_temp_files()
