"""``verify`` of shards too large to hold: one sequential pass of ranged reads, each byte hashed
once for the manifest's shard hash, records under :data:`WHOLE_RECORD` held one at a time, larger
ones hashed in chunks and checked from the bytes around their large fields' data
(docs/format.md, "Verifying").  Memory is bounded by :data:`WHOLE_RECORD` plus :data:`CHUNK`,
whatever the shard or sample size."""

from __future__ import annotations

import xxhash

from shardpack import format as fmt
from shardpack.core.errors import FormatError, IntegrityError
from shardpack.storage import Storage

WHOLE_SHARD = 512 << 20  # verify reads a shard up to this size whole, a larger one in chunks
WHOLE_RECORD = 64 << 20  # ... holding each record under this size whole, hashing larger ones
CHUNK = 8 << 20          # the size of each ranged read


class ShardChunks:
    """The bytes of one shard file in order, by ranged reads of up to :data:`CHUNK` bytes
    through its storage, each byte fed once to the shard's content hasher.

    Args:
        storage: the dataset's storage.
        name: the shard file.
        size: its size (the file's own).
    """

    def __init__(self, storage: Storage, name: str, size: int):
        self.storage, self.name, self.size = storage, name, size
        self.hasher = fmt.new_content_hasher()
        self.fetched = 0     # bytes read from the file so far
        self.buf = b""       # read, not yet handed out
        self.used = 0        # bytes of buf handed out

    def _more(self) -> bytes:
        """The next ranged read, hashed; b"" at the end of the file."""
        end = min(self.size, self.fetched + CHUNK)
        data = self.storage.read_bytes(self.name, self.fetched, end)
        self.fetched = end
        self.hasher.update(data)
        return data

    def pieces(self, n: int):
        """The next ``n`` bytes (fewer at the end of the file) as pieces of up to CHUNK."""
        while n > 0:
            if self.used == len(self.buf):
                self.buf, self.used = self._more(), 0
                if not self.buf:
                    return
            piece = self.buf[self.used:self.used + n]
            self.used += len(piece)
            n -= len(piece)
            yield piece

    def read(self, n: int) -> bytes:
        """The next ``n`` bytes, joined (fewer at the end of the file).

        Args:
            n: how many.
        """
        return b"".join(self.pieces(n))

    def rest(self) -> bytes:
        """The bytes left, which read the file to its end (the shard's tail: a few blocks)."""
        return self.read(self.size)


class GappedRecord:
    """A record's bytes with the data of its large fields left out (read as zeros): what the
    structure checks of a record read in chunks look at.  Slices only, the way tar header
    parsing reads a payload.

    Args:
        size: the record's size.
        segments: ``(offset, bytes)`` of every kept stretch, in order.
        base: the offset of this view's byte 0 in the record (a msgpack payload: 24).
    """

    def __init__(self, size: int, segments: list[tuple[int, bytes]], base: int = 0):
        self.size, self.segments, self.base = size, segments, base

    def __len__(self) -> int:
        return self.size - self.base

    def payload(self, offset: int) -> GappedRecord:
        """The same bytes from ``offset`` on (a msgpack record's payload).

        Args:
            offset: where the payload starts in the record.
        """
        return GappedRecord(self.size, self.segments, self.base + offset)

    def __getitem__(self, span: slice) -> bytes:
        start, stop, _ = span.indices(len(self))
        start, stop = start + self.base, max(start, stop) + self.base
        out = bytearray(stop - start)
        for off, data in self.segments:
            a, b = max(start, off), min(stop, off + len(data))
            if a < b:
                out[a - start:b - start] = data[a - off:b - off]
        return bytes(out)


def read_large_record(index: fmt.ShardIndex, row: int, chunks: ShardChunks):
    """Read record ``row`` through ``chunks``: ``(xxh3-64 of its bytes, CRC32C of its bytes
    from the payload on, the record with its large fields' data left out)``, or None when the
    file ends first."""
    start, end = index.span(row)
    base = index.codec.payload_offset
    gaps = sorted((base + off, base + off + size) for _, off, size in index.sample_fields(row)
                  if size >= CHUNK)
    hasher, crc, update = xxhash.xxh3_64(), 0, fmt.crc32c_function()
    segments, pos = [], 0
    for piece in chunks.pieces(end - start):
        hasher.update(piece)
        if pos + len(piece) > base:
            crc = update(piece[max(0, base - pos):], crc)
        segments += _outside(pos, piece, gaps)
        pos += len(piece)
    if pos != end - start:
        return None
    return hasher.intdigest(), crc, GappedRecord(pos, segments)


def _outside(pos: int, piece: bytes, gaps: list[tuple[int, int]]) -> list[tuple[int, bytes]]:
    """The stretches of ``piece`` (at record offset ``pos``) outside every gap."""
    out, at, end = [], pos, pos + len(piece)
    for a, b in gaps:
        if b <= at or a >= end:
            continue
        if a > at:
            out.append((at, piece[at - pos:a - pos]))
        at = max(at, b)
    if at < end:
        out.append((at, piece[at - pos:]))
    return out


def check_large_record(index: fmt.ShardIndex, row: int, record: GappedRecord, crc: int,
                       path: str):
    """The structure checks of a record read in chunks; returns its payload (gapped).
    A record with framing of its own (msgpack) must be, byte for byte outside its large
    fields' data, the record pack writes for the index's key and fields with the CRC32C just
    computed; tar members are parsed and checked as for any record."""
    codec = index.codec
    if not codec.framed_records:
        codec.check_members(index, row, record, whole=True)
        return record
    fields = sorted(index.sample_fields(row), key=lambda f: f[1])
    parts, _, raw = codec.sample_parts(index.key(row), [(n, _Sized(s)) for n, _, s in fields],
                                       lambda _: crc)
    if int(index.raw_sizes[row]) != raw or len(record) != raw + codec.payload_offset:
        raise FormatError(f"record sizes disagree with the index ({len(record)} bytes stored, "
                          f"{int(index.raw_sizes[row])} raw)", path=path, key=index.key(row))
    pos = 0
    for part in parts:
        if not isinstance(part, _Sized) and record[pos:pos + len(part)] != part:
            raise IntegrityError("record header or msgpack framing mismatch (or its CRC32C)",
                                 path=path, offset=int(index.starts[row]) + pos,
                                 key=index.key(row))
        pos += len(part)
    return record.payload(codec.payload_offset)


class _Sized:
    """A field's value known only by its size, for laying out the expected record."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size
