"""Local files read as regular files only: a dataset's manifest, indexes and shards are files with
sizes, never a device, FIFO or folder (docs/reading.md, "Integrity").  Every local read of a
dataset's files goes through here: opened with O_NONBLOCK (a FIFO put in a file's place never
blocks the open), checked with fstat before a byte is read (so /dev/zero cannot fill memory),
read exactly to the size expected."""

from __future__ import annotations

import os
import stat

from shardpack import format as fmt
from shardpack.core.errors import DatasetNotFoundError, FormatError, IntegrityError

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
          (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def file_kind(name: str) -> str:
    """What a dataset's file is, for messages: manifest, index, shard or file.

    Args:
        name: the file's name in the dataset folder.
    """
    if name == fmt.MANIFEST_NAME:
        return "manifest"
    if name.endswith(fmt.INDEX_SUFFIX):
        return "index"
    if name.endswith(fmt.SHARD_SUFFIXES):
        return "shard"
    return "file"


def check_regular(st: os.stat_result, display: str, what: str) -> None:
    """A one-line :class:`FormatError` unless ``st`` is a regular file's.

    Args:
        st: the file's stat.
        display: its name in messages.
        what: what it is (manifest, index, shard).
    """
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
        raise FormatError(f"{what} is {kind}, not a regular file", path=display)


def open_regular(path: str, display: str, what: str) -> tuple[int, os.stat_result]:
    """(fd, its fstat) of the local regular file at ``path``, the same rule as the packer's
    source files (shardpack/write/fields.py).  The caller closes the fd.

    Args:
        path: the file's path.
        display: its name in messages.
        what: what it is (manifest, index, shard).
    """
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
    one-line IntegrityError when the file ends first (it shrank since it was sized).

    Args:
        fd: an open file.
        size: bytes to read.
        display: the file's name in messages.
        what: what it is (manifest, index, shard).
        offset: where the bytes start.
    """
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
    """The bytes of the local regular file at ``path`` (see :func:`open_regular`).

    Args:
        path: the file's path.
        display: its name in messages.
        what: what it is (manifest, index, shard).
        size: the size it must have (a one-line IntegrityError otherwise); None: as many bytes
            as its fstat says, which bounds the read.
        limit: with ``size`` None, the most it may hold (a FormatError past it).
    """
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


def read_span(path: str, display: str, what: str, start: int | None, end: int | None,
              size: int | None, cap: int | None) -> bytes:
    """A local regular file, whole or bytes [start, end), bounded by its fstat.

    Args:
        path: the file's path.
        display: its name in messages.
        what: what it is (manifest, index, shard).
        start: the first byte, or None (with ``end`` None) for the whole file.
        end: the byte after the last.
        size: the size a whole file must have, or None.
        cap: the most a whole file may hold (the manifest's cap), or None.
    """
    fd, st = open_regular(path, display, what)
    try:
        if start is None and end is None:
            if cap is not None and st.st_size > cap:
                raise FormatError(f"{what} is longer than {cap:,} bytes, the most one can be",
                                  path=display)
            if size is not None and st.st_size != size:
                raise IntegrityError(f"{what} is {st.st_size} bytes, the manifest says {size}",
                                     path=display)
            return read_fd(fd, st.st_size, display, what)
        if end > st.st_size:
            raise IntegrityError(f"{what} is {st.st_size} bytes, bytes {start} to {end} were "
                                 "asked for (truncated?)", path=display)
        return read_fd(fd, end - start, display, what, offset=start)
    finally:
        os.close(fd)
