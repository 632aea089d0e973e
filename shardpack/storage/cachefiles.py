"""The files of the shard cache: their identity, their hash, and removing one nobody holds."""

from __future__ import annotations

import fcntl
import os

from shardpack import format as fmt


def identity(path: str, fd: int | None = None) -> tuple[str, int, int]:
    """(path, size, mtime) of a cache file; from its open fd when given (another thread or
    process may have deleted the path meanwhile)."""
    st = os.fstat(fd) if fd is not None else os.stat(path)
    return path, st.st_size, st.st_mtime_ns


def file_hash(path: str) -> str:
    """xxh3-128 of the file at ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fd_hash(fd, os.fstat(fd).st_size) or ""
    finally:
        os.close(fd)


def fd_hash(fd: int, size: int) -> str | None:
    """xxh3-128 of the first ``size`` bytes of the open file (None if it is shorter now), read
    into one reused 1 MB buffer: faster than a memory map, and than fresh chunks whose pages are
    new memory each time (docs/remote.md)."""
    hasher = fmt.new_content_hasher()
    view = memoryview(bytearray(1 << 20))
    offset = 0
    while offset < size:
        n = os.preadv(fd, [view[:min(len(view), size - offset)]], offset)
        if n == 0:
            return None  # truncated meanwhile
        hasher.update(view[:n])
        offset += n
    return hasher.hexdigest()


def remove_if_free(path: str) -> bool:
    """Delete the cache file (or temp file) at ``path`` unless some process holds a lock on it
    (a reader, or a live download); whether it was deleted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # gone meanwhile, or not ours to open
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.unlink(path)
        return True
    except OSError:
        return False  # held: in use
    finally:
        os.close(fd)
