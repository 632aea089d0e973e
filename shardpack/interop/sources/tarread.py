"""What the WebDataset reader needs beyond its own header scan, so that it reads a tar the way GNU
tar does or refuses it in one line: the compression a file's bytes hold (which must be the one its
name says), gzip decompression of every member of a multi-member stream under the decompression
cap, GNU sparse members expanded by ``tarfile``, and members read into one buffer of their own
size (docs/convert.md, "WebDataset").
"""

from __future__ import annotations

import gzip
import struct
import tarfile
import zlib

from shardpack.core.errors import SourceError
from shardpack.interop.sources.common import EXPANSION_FLOOR, MAX_EXPANSION

MAX_INLINE_MEMBER = 1 << 30  # a member carried inline is held whole: the cap on that memory
CHUNK = 1 << 20  # a member's bytes are read in pieces of this size into its buffer
HEADER_LIMIT = 1 << 20  # the most bytes of headers one member may have (the plain scan's limit)
# the magic numbers tarfile's "r|*" would have accepted, and GNU tar's -a detects
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"),
          (b"\x28\xb5\x2f\xfd", "zstd"))


def compression_of(head: bytes) -> str | None:
    """The compression whose magic number starts ``head`` (``gzip``, ``bzip2``, ``xz``,
    ``zstd``), or None.

    Args:
        head: the first bytes of a file (6 are enough).
    """
    return next((kind for magic, kind in _MAGIC if head.startswith(magic)), None)


def decompression_cap(compressed: int) -> int:
    """The most bytes a compressed tar of ``compressed`` bytes may decompress to: the cap of
    every decompression in the converters (:data:`~.common.MAX_EXPANSION` times the compressed
    size, or :data:`~.common.EXPANSION_FLOOR`)."""
    return max(EXPANSION_FLOOR, MAX_EXPANSION * compressed)


def cap_text(cap: int) -> str:
    """How a refusal at the decompression cap ``cap`` explains it."""
    return (f"the cap of {cap} bytes: refused (at most {MAX_EXPANSION}x the compressed size, or "
            f"{EXPANSION_FLOOR >> 20} MiB)")


class CapExceeded(Exception):
    """The decompressed stream went past its cap."""


class HeadersTooLong(Exception):
    """``tarfile`` read more than :data:`HEADER_LIMIT` bytes for one member's headers."""


class _Metered:
    """A file for ``tarfile`` that counts what it reads for one member's headers (pax records,
    GNU long names, old GNU sparse extension blocks, a pax 1.0 sparse map: all read by
    ``tarfile.next()``, all held in memory, the last two with no bound of their own) and raises
    :class:`HeadersTooLong` past :data:`HEADER_LIMIT`.  :meth:`data` lifts the count while a
    member's data is read or skipped; :meth:`headers` starts it again."""

    header_left: int | None = HEADER_LIMIT

    def headers(self) -> None:
        """Count what is read from here on as one member's headers."""
        self.header_left = HEADER_LIMIT

    def data(self) -> None:
        """Stop counting: a member's data is read from here on."""
        self.header_left = None

    def _counted(self, data: bytes) -> bytes:
        if self.header_left is not None:
            self.header_left -= len(data)
            if self.header_left < 0:
                raise HeadersTooLong
        return data


class GzipTar(_Metered):
    """The decompressed bytes of a gzip file, every member of it as ``gzip -d`` reads them
    (``tarfile``'s own gzip stream stops after the first member: a BGZF-style tar.gz lost its
    samples), as a forward-only stream for ``tarfile.open(mode="r|")``.  Raises
    :class:`CapExceeded` once more than ``cap`` bytes came out.

    Args:
        f: the compressed file, open for reading.
        cap: the most bytes it may decompress to.
    """

    def __init__(self, f, cap: int):
        self.gz = gzip.GzipFile(fileobj=f, mode="rb")
        self.cap, self.total = cap, 0

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` decompressed bytes (never more than one byte past the cap).

        Args:
            size: the most bytes wanted; negative: up to the cap.
        """
        left = self.cap + 1 - self.total
        data = self.gz.read(left if size < 0 else min(size, left))
        self.total += len(data)
        if self.total > self.cap:
            raise CapExceeded
        return self._counted(data)


class PlainTar(_Metered):
    """A plain tar file for ``tarfile.open(mode="r:")``, its header reads counted.

    Args:
        f: the tar file, open for reading (seekable).
    """

    def __init__(self, f):
        self.f = f

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes from here.

        Args:
            size: the most bytes wanted.
        """
        return self._counted(self.f.read(size))

    def seek(self, pos: int, whence: int = 0) -> int:
        """Move to ``pos`` (as ``io`` files do).

        Args:
            pos: the offset.
            whence: 0 (from the start), 1 (from here) or 2 (from the end).
        """
        return self.f.seek(pos, whence)

    def tell(self) -> int:
        """Where the next read starts."""
        return self.f.tell()


def read_member(tf: tarfile.TarFile, m: tarfile.TarInfo, shown: str) -> bytearray:
    """All ``m.size`` bytes of member ``m`` (holes of a sparse member as zeros), read in
    :data:`CHUNK` pieces into one buffer of that size: memory holds the member once, never
    the member and a copy.  Fewer bytes than that is a SourceError (truncated)."""
    buf = bytearray(m.size)
    view, got = memoryview(buf), 0
    with tf.extractfile(m) as r:
        while got < m.size:
            n = r.readinto(view[got:got + CHUNK])
            if not n:
                break
            got += n
    view.release()
    if got != m.size:
        raise SourceError(f"tar member {m.name!r} holds {got} of its {m.size} bytes: "
                          "truncated", path=shown)
    return buf


def check_member_size(m: tarfile.TarInfo, shown: str) -> None:
    """Refuse, before reading it, a member larger than :data:`MAX_INLINE_MEMBER`, or a sparse
    member whose file is larger than the expansion cap for the bytes the archive stores of
    it (:func:`decompression_cap`)."""
    if m.size > MAX_INLINE_MEMBER:
        raise SourceError(f"tar member {m.name!r} is {m.size} bytes, more than the "
                          f"{MAX_INLINE_MEMBER >> 20} MiB a member read into memory may hold "
                          "(a member of a compressed tar, or a sparse file)", path=shown,
                          hint="gunzip the tar (a plain tar's regular files are read in "
                               "byte ranges, with no such limit), or extract it with GNU tar "
                               "and pack the files")
    if m.sparse is not None:
        stored = sum(n for _, n in m.sparse)
        if m.size > decompression_cap(stored):
            raise SourceError(f"tar member {m.name!r} is a sparse file of {m.size} bytes "
                              f"holding {stored}: refused (at most {MAX_EXPANSION}x the bytes "
                              f"stored, or {EXPANSION_FLOOR >> 20} MiB)", path=shown)


def sparse_member(f, pos: int, shown: str) -> tuple[str, bytearray, int]:
    """The GNU sparse member whose headers start at byte ``pos`` of the plain tar ``f``
    (``tarfile`` reads every GNU format: old GNU ``S``, pax 0.0, 0.1 and 1.0): ``(name,
    the expanded file, where the next member starts)``.  Errors are SourceErrors naming it."""
    f.seek(pos)
    plain = PlainTar(f)
    try:
        tf = tarfile.open(fileobj=plain, mode="r:", encoding="utf-8")
        m = tf.next()
        if m is None or m.sparse is None:
            raise SourceError(f"tar member at byte {pos} has GNU sparse headers that tarfile "
                              "does not read as a sparse file", path=shown)
        check_member_size(m, shown)
        plain.data()
        return m.name, read_member(tf, m, shown), tf.offset
    except HeadersTooLong:
        raise SourceError(f"sparse tar member at byte {pos}: {HEADERS_TOO_LONG}",
                          path=shown) from None
    except READ_ERRORS as exc:
        raise SourceError(f"sparse tar member at byte {pos} cannot be read: "
                          f"{type(exc).__name__}: {exc}", path=shown) from None


HEADERS_TOO_LONG = (f"its headers (pax records, GNU long names, sparse map) run over "
                    f"{HEADER_LIMIT >> 20} MiB: refused")
# what tarfile and the decompressors raise on a broken archive (tarfile's own parsers index past
# a short block, fail on int() of a bad number, ...)
READ_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error, ValueError, UnicodeError,
               OverflowError, struct.error, IndexError)
