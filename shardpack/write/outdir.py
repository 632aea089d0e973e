"""The OUT folder of a writer (``pack``, ``convert``, ``merge``): one writer at a time, which files
are shardpack's, and clearing them for ``--overwrite``.

Shared by pack.py and merge.py so that both take the same lock and recognise the same files.
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
    held for the whole pack, convert or merge.  The kernel drops it when the process dies, so a
    killed writer never leaves a stale lock.  A file opened for writing, not the folder, so that
    NFS (which emulates flock with fcntl locks) can lock it too.  Forked children close their
    copy at once (os.register_at_fork below): a pool worker, ours or a caller's, must not hold
    it.  Remote OUT (s3://, ...) has no such lock: docs/packing.md says so."""

    held: set[int] = set()

    def __init__(self, storage: Storage):
        self.storage, self.fd = storage, None

    def __enter__(self):
        import fcntl

        try:
            fd = self.storage.lock_file(LOCK_NAME)
        except FileExistsError:
            raise ShardpackError("output exists and is not a folder",
                                 path=self.storage.url) from None
        except OSError as exc:
            raise PackError(f"cannot use the output folder: {exc.strerror}",
                            path=self.storage.url) from None
        if fd is None:  # files here cannot be locked (object stores)
            return self
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PackError("another pack or convert is writing into this folder right now "
                            "(or a merge)", path=self.storage.url,
                            hint="wait for it to finish, or choose another folder") from None
        except OSError:  # no lock support here (ENOLCK): write unguarded, as for remote OUT
            pass
        self.fd = fd
        self.held.add(fd)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            self.held.discard(self.fd)
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None


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
