"""The on-disk format as code: byte layouts, encoders and decoders, and nothing that does I/O.

Everything here takes and returns bytes.  ``docs/format.md`` mirrors these layouts as byte tables;
change both together and bump :data:`FORMAT_VERSION` when a reader of the old version would
misread the new bytes.  All integers are little-endian.

A dataset is a folder (or URL prefix) holding

* ``shard-NNNNN.tar`` or ``shard-NNNNN.spk`` - the samples, one shard file per plan task;
* ``shard-NNNNN.idx`` - that shard's binary index (offsets, sizes, hashes and keys of its samples);
* ``shardpack.json`` - the manifest, written last: it is the commit point of a pack.
"""

from __future__ import annotations

import functools
import json
import operator
import struct
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from types import MappingProxyType
from typing import Iterable, Mapping, Sequence

import crc32c as _crc32c
import msgpack
import numpy as np
import xxhash

from shardpack.core.errors import FormatError, IntegrityError, VersionError

FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)  # version 1: dense per-shard field table in the index (docs/format.md)
MANIFEST_NAME = "shardpack.json"
STATE_NAME = ".shardpack-pack.json"  # options of a pack in progress (or failed); removed at commit
# The most a manifest may be: room for 10^6 shard entries (10^9 samples at 1,000 samples a shard)
# of at most 256 bytes each (a 12-digit shard size and a 6-digit shard number encode to 247), and
# 32 MiB for everything else (classes, fields, notes).  docs/format.md, "Manifest".
MANIFEST_CAP = 10**6 * 256 + (32 << 20)
SKIPS_NAME = "skipped.jsonl"  # the skip report (shardpack/write/skips.py), when a pack skipped any
MANIFEST_FORMAT = "shardpack"
HASH_NAME = "xxh3-128"
SHARD_FORMATS = ("tar", "msgpack")
COMPRESSIONS = ("none", "zstd")
SHARD_SUFFIX = {"tar": ".tar", "msgpack": ".spk"}
INDEX_SUFFIX = ".idx"
KEY_FIELD = "__key__"
MISSING = np.uint64(0xFFFF_FFFF_FFFF_FFFF)  # field offset of a field a sample lacks


def shard_name(number: int, shard_format: str) -> str:
    return f"shard-{number:05d}{SHARD_SUFFIX[shard_format]}"


def index_name(number: int) -> str:
    return f"shard-{number:05d}{INDEX_SUFFIX}"


# ---------------------------------------------------------------------------------------------
# Checksums
# ---------------------------------------------------------------------------------------------

def content_hash(data) -> str:
    """The manifest's shard and index hash: xxh3-128, hex."""
    return xxhash.xxh3_128_hexdigest(data)


def new_content_hasher():
    return xxhash.xxh3_128()


# The index's per-sample hash over the sample's stored bytes: xxh3-64, as an int.  Bound
# directly, not wrapped: readers call it once per sample on their first read, and a Python
# wrapper was a quarter of that cost for 1 KB samples (docs/benchmarks.md, "Sample checks").
sample_hash = xxhash.xxh3_64_intdigest


def crc32c(data) -> int:
    return _crc32c.crc32c(data)


def crc32c_function():
    """The CRC32C function itself, for loops over many records (no wrapper call each)."""
    return _crc32c.crc32c


# ---------------------------------------------------------------------------------------------
# Keys and field names
# ---------------------------------------------------------------------------------------------

def split_name(basename: str) -> tuple[str, str]:
    """``"0001.seg.png"`` -> ``("0001", "seg.png")``: the WebDataset rule, key up to the first
    dot."""
    stem, dot, field = basename.partition(".")
    return stem, field


def check_field_name(field: str) -> str | None:
    """Return why ``field`` cannot be a field name, or None when it can: the one rule of the
    walk, listings, converters and ``verify``.  Refused: empty; names starting with '__' (the
    reader's own entries ``__key__``, ``__index__``, ... and any ``__*__``); '/' or NUL (a
    field is the end of a file name); '..' (never half of a path step)."""
    if not field:
        return "has no extension, so it has no field name"
    return reserved_field_reason(field) or (
        f"field name {field!r} contains '..'" if ".." in field else None)


def reserved_field_reason(field: str) -> str | None:
    """Why a non-empty field name can never be in an index, or None.  No release wrote these
    names, so readers refuse an index that has one (a field ``__key__`` would replace the
    sample's key in every sample dict); '..' is refused when packing and by ``verify`` only, as
    datasets packed before that rule may hold it."""
    if field == KEY_FIELD or field.startswith("__"):
        return f"field name {field!r} is reserved (names starting with '__')"
    if "/" in field or "\x00" in field:
        return f"field name {field!r} contains '/' or NUL"
    return None


def tar_member_name(key: str, field: str) -> str:
    """The tar member name of ``field`` of sample ``key``: ``<key>.<field>``, except that a
    '.' or '%' in the key's last part is written ``%2E`` / ``%25``.  WebDataset readers (the
    webdataset library, Hugging Face ``datasets``) split a member name at the first dot of its
    last part; escaping keeps ``IMG_2019.01.05`` one sample for them.  shardpack reads keys from
    its index, so its readers give back the original names."""
    head, slash, last = key.rpartition("/")
    if "." in last or "%" in last:
        last = last.replace("%", "%25").replace(".", "%2E")
    return f"{head}{slash}{last}.{field}"


# ---------------------------------------------------------------------------------------------
# Tar (POSIX ustar, with pax extended headers for long or non-ASCII names and huge sizes)
# ---------------------------------------------------------------------------------------------

TAR_BLOCK = 512
TAR_END = bytes(2 * TAR_BLOCK)
TAR_MODE = 0o644
TAR_MTIME = 0
_OCTAL_SIZE_LIMIT = 8 ** 11
PAX_NAME = "././@PaxHeader"


def tar_padding(size: int) -> int:
    return -size % TAR_BLOCK


def _ustar_template(typeflag: bytes) -> tuple[bytes, bytes, int]:
    """The fixed parts of a header around the name (0..100) and size (124..136) fields, and the
    checksum of everything but those two fields (chksum itself counts as 8 spaces)."""
    middle = b"%07o\0" % TAR_MODE + b"%07o\0" % 0 + b"%07o\0" % 0          # 100..124
    tail = (b"%011o\0" % TAR_MTIME + b" " * 8 + typeflag + bytes(100) + b"ustar\0" + b"00"
            + bytes(64) + b"%07o\0" % 0 + b"%07o\0" % 0 + bytes(155 + 12))   # 136..512
    return middle, tail, sum(middle) + sum(tail)


_TEMPLATES = {flag: _ustar_template(flag) for flag in (b"0", b"x")}


def _ustar_block(name: bytes, size: int, typeflag: bytes) -> bytes:
    middle, tail, base = _TEMPLATES[typeflag]
    name = name[:100]
    size_field = b"%011o\0" % size
    chksum = b"%06o\0 " % (base + sum(name) + sum(size_field))
    return (name + bytes(100 - len(name)) + middle + size_field + tail[:12] + chksum
            + tail[20:])


def _pax_record(keyword: str, value: str) -> bytes:
    body = f" {keyword}={value}\n".encode("utf-8")
    n = len(body) + 1
    while len(str(n).encode()) + len(body) != n:
        n = len(str(n).encode()) + len(body)
    return str(n).encode() + body


def tar_header(name: str, size: int) -> bytes:
    """The header block(s) of one regular-file member.  Deterministic: mode 0644, uid/gid 0,
    mtime 0, no user or group names.  Names that do not fit ustar go in a pax header."""
    raw = name.encode("utf-8", "surrogateescape")
    ascii_ok = raw.isascii() and "\n" not in name
    if ascii_ok and len(raw) <= 100 and size < _OCTAL_SIZE_LIMIT:
        return _ustar_block(raw, size, b"0")
    records = b""
    if not (ascii_ok and len(raw) <= 100):
        records += _pax_record("path", name)
    if size >= _OCTAL_SIZE_LIMIT:
        records += _pax_record("size", str(size))
    pax = _ustar_block(PAX_NAME.encode(), len(records), b"x")
    pax += records + bytes(tar_padding(len(records)))
    short = raw.decode("ascii", "replace").encode("ascii", "replace")[:100]
    return pax + _ustar_block(short, min(size, _OCTAL_SIZE_LIMIT - 1), b"0")


@dataclass(frozen=True)
class TarMember:
    name: str
    size: int
    data_offset: int  # offset of the data, relative to the buffer given to parse_tar_member
    end: int          # offset just past the data's padding
    kind: str = "file"  # file, directory, hard link, symlink, character device, ...
    typeflag: bytes = b"0"


_TAR_KINDS = {b"0": "file", b"\0": "file", b"7": "file", b"1": "hard link", b"2": "symlink",
              b"3": "character device", b"4": "block device", b"5": "directory", b"6": "FIFO"}


def _octal(field: bytes, what: str, offset: int) -> int:
    text = field.rstrip(b"\0 ").lstrip(b" ")
    try:
        return int(text or b"0", 8)
    except ValueError:
        raise FormatError(f"tar header field {what} is not octal: {field!r}",
                          offset=offset) from None


def parse_tar_header(buf, offset: int = 0) -> TarMember:
    """Parse the header(s) of the member starting at ``offset`` of ``buf`` (a bytes-like holding at
    least the whole header, pax or GNU long-name records included), whatever its type.  Global pax
    headers and GNU long link names are skipped; a zero block raises (end of archive)."""
    name = None
    size_override = None
    pos = offset
    while True:
        block = bytes(buf[pos:pos + TAR_BLOCK])
        if len(block) < TAR_BLOCK:
            raise FormatError("truncated tar header", offset=pos)
        if block == bytes(TAR_BLOCK):
            raise FormatError("unexpected end-of-archive block", offset=pos)
        stored = _octal(block[148:156], "chksum", pos)
        actual = sum(block) - sum(block[148:156]) + 8 * 32  # chksum field counted as spaces
        if stored != actual:
            raise FormatError(f"tar header checksum {stored} != computed {actual}", offset=pos)
        typeflag = block[156:157]
        size = _octal(block[124:136], "size", pos)
        if size < 0:  # int(..., 8) takes a sign: a negative size would step backwards
            raise FormatError(f"tar header size is negative: {block[124:136]!r}", offset=pos)
        if typeflag in (b"x", b"g", b"L", b"K"):  # extended headers: data follows, then more
            data = bytes(buf[pos + TAR_BLOCK:pos + TAR_BLOCK + size])
            if len(data) < size:
                raise FormatError("truncated extended tar header", offset=pos)
            if typeflag == b"x":
                name, size_override = _parse_pax(data, pos, name, size_override)
            elif typeflag == b"L":
                name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            pos += TAR_BLOCK + size + tar_padding(size)
            continue
        if name is None:
            raw = block[:100].split(b"\0", 1)[0]
            prefix = block[345:500].split(b"\0", 1)[0]
            if prefix and block[257:263] == b"ustar\0":
                raw = prefix + b"/" + raw
            name = raw.decode("utf-8", "surrogateescape")
        if size_override is not None:
            size = size_override
        kind = _TAR_KINDS.get(typeflag, "special file")
        data_offset = pos + TAR_BLOCK
        end = data_offset + size + tar_padding(size)
        if size < 0 or end <= offset:  # never: both sizes are checked; the scan must advance
            raise FormatError(f"tar member size {size} does not advance the archive", offset=pos)
        return TarMember(name, size, data_offset - offset, end - offset, kind, typeflag)


def parse_tar_member(buf, offset: int = 0) -> TarMember:
    """:func:`parse_tar_header`, accepting only regular files: links, devices, FIFOs and
    directories raise :class:`FormatError`, so nothing downstream ever follows or creates them."""
    member = parse_tar_header(buf, offset)
    if member.kind != "file":
        raise FormatError(f"tar member is a {member.kind} (type {member.typeflag!r}); only "
                          "regular files are allowed", offset=offset)
    return member


def _parse_pax(data: bytes, pos: int, name, size):
    """The ``path`` and ``size`` of pax records ``"%d %s=%s\n" % (length, keyword, value)``
    (length counts the whole record).  Anything else raises FormatError at ``pos``: a record
    whose length is not plain decimal digits, runs past the data or is too short to hold its
    own length, a record without '=' or the final newline, a size that is not a non-negative
    decimal integer of at most 19 digits.  Each record advances by its length (> 0)."""
    i = 0
    while i < len(data):
        sp = data.find(b" ", i, i + 21)
        if sp < 0:
            raise FormatError(f"bad pax record at byte {i} of the extended header: no length",
                              offset=pos)
        length = data[i:sp]
        n = int(length) if length.isdigit() and len(length) <= 20 else -1
        if n < sp - i + 3 or i + n > len(data):  # "N k=\n" at least, within the data
            raise FormatError(f"bad pax record length {length[:20]!r} at byte {i} of the "
                              f"{len(data)}-byte extended header", offset=pos)
        record = data[sp + 1:i + n]
        keyword, eq, value = record[:-1].partition(b"=")
        if not eq or not keyword or record[-1:] != b"\n":
            raise FormatError(f"bad pax record {data[i:i + n][:60]!r}: expected "
                              "'LENGTH KEYWORD=VALUE\\n'", offset=pos)
        if keyword == b"path":
            name = value.decode("utf-8", "surrogateescape")
        elif keyword == b"size":
            if not (value.isdigit() and len(value) <= 19):
                raise FormatError(f"pax size {value[:40]!r} is not a non-negative decimal "
                                  "integer", offset=pos)
            size = int(value)
        i += n
    return name, size


# ---------------------------------------------------------------------------------------------
# msgpack shards: file header, then records of [record header | payload]
# ---------------------------------------------------------------------------------------------

MSGPACK_MAGIC = b"SPKMSGPK"
MSGPACK_HEADER = struct.Struct("<8sII")      # magic, version, reserved
RECORD_HEADER = struct.Struct("<QQII")       # stored_len, raw_len, crc32c(stored), flags
RECORD_HEADER_DTYPE = np.dtype([("stored", "<u8"), ("raw", "<u8"), ("crc", "<u4"),
                                ("flags", "<u4")])  # the same, for many records at once
FLAG_ZSTD = 1


def msgpack_file_header() -> bytes:
    return MSGPACK_HEADER.pack(MSGPACK_MAGIC, FORMAT_VERSION, 0)


def check_msgpack_file_header(data: bytes, path: str | None = None) -> None:
    if len(data) < MSGPACK_HEADER.size:
        raise FormatError("truncated shard header", path=path, offset=0)
    magic, version, _ = MSGPACK_HEADER.unpack_from(data)
    if magic != MSGPACK_MAGIC:
        raise FormatError(f"not a shardpack msgpack shard (magic {magic!r}, expected "
                          f"{MSGPACK_MAGIC!r})", path=path, offset=0)
    if version not in READ_VERSIONS:
        raise VersionError(f"unsupported shard version: expected one of {READ_VERSIONS}, found "
                           f"{version}", path=path, offset=0)


_packb = msgpack.Packer(use_bin_type=True).pack
_packed_names: dict[str, bytes] = {}


def _bin_header(n: int) -> bytes:
    if n < 0x100:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 0x10000:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def encode_payload(key: str, fields: Sequence[tuple[str, bytes]]) -> tuple[bytes, list[int]]:
    """A msgpack map ``{"__key__": key, field: bin, ...}`` (fields in the given order) and the
    offset of each field's bytes inside it, so readers can slice fields without unpacking."""
    parts = [_map_header(len(fields) + 1), _PACKED_KEY_FIELD, _packb(key)]
    size = len(parts[0]) + len(parts[1]) + len(parts[2])
    offsets = []
    for name, value in fields:
        head = _packed_names.get(name)
        if head is None:
            head = _packed_names.setdefault(name, _packb(name))
        bin_head = _bin_header(len(value))
        size += len(head) + len(bin_head)
        offsets.append(size)
        size += len(value)
        parts += (head, bin_head, value)
    return b"".join(parts), offsets


def _map_header(n: int) -> bytes:
    return bytes((0x80 | n,)) if n < 16 else b"\xde" + n.to_bytes(2, "big")


_PACKED_KEY_FIELD = _packb(KEY_FIELD)


def record_header(stored: bytes, raw_len: int, zstd: bool) -> bytes:
    return RECORD_HEADER.pack(len(stored), raw_len, crc32c(stored), FLAG_ZSTD if zstd else 0)


def decode_payload(raw: bytes, max_fields: int) -> dict:
    """Unpack a record payload with every size bounded by the payload itself; no ext types."""
    try:
        obj = msgpack.unpackb(raw, raw=False, use_list=True, strict_map_key=True,
                              max_bin_len=len(raw), max_str_len=len(raw), max_array_len=0,
                              max_map_len=max_fields + 1, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types
        raise FormatError(f"bad msgpack payload: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get(KEY_FIELD), str):
        raise FormatError("msgpack payload is not a map with a '__key__' string")
    for name, value in obj.items():
        if name != KEY_FIELD and not isinstance(value, bytes):
            raise FormatError(f"field {name!r} is {type(value).__name__}, expected bytes")
    return obj


# ---------------------------------------------------------------------------------------------
# Per-shard binary index
# ---------------------------------------------------------------------------------------------

INDEX_MAGIC = b"SPKINDEX"
INDEX_HEADER = struct.Struct("<8sIBBHQIIQ16sQQ")  # 72 bytes, see docs/format.md
INDEX_TRAILER = struct.Struct("<Q")
INDEX_WIDE = 1  # header flags (v2): entry offsets and sizes are u64; else u32 (all < 2^32)
MAX_INDEX_FIELDS = 0xFFFF  # entry field numbers are u16
MAX_EXPANSION = 1024  # a zstd record may decompress to at most this times its stored size + 1 MiB
_FORMAT_CODE = {"tar": 0, "msgpack": 1}
_COMPRESSION_CODE = {"none": 0, "zstd": 1}


@dataclass(frozen=True)
class ShardIndex:
    """One shard's index.  Arrays are read-only numpy views of the index bytes (version 1's dense
    tables are turned into the same sparse entries when the index is decoded)."""

    shard_format: str
    compression: str
    shard_bytes: int
    shard_hash: bytes        # 16-byte xxh3-128 digest of the shard file
    plan_digest: int         # fingerprint of the plan task that made the shard (used by --resume)
    skipped: int             # samples of the plan task the writer skipped (--skip-bad)
    fields: tuple[str, ...]
    starts: np.ndarray       # uint64[n+1]: sample i is bytes [starts[i], starts[i+1]) of the shard
    raw_sizes: np.ndarray    # uint64[n]: payload size after decompression (tar: record size)
    sample_hashes: np.ndarray  # uint64[n]: xxh3-64 of the sample's stored bytes
    field_runs: np.ndarray     # int64[n+1]: sample i's fields are entries [runs[i], runs[i+1])
    entry_fields: np.ndarray   # [m]: field number (into ``fields``) of each entry
    entry_offsets: np.ndarray  # [m]: offset of the entry's field in its sample's payload
    entry_sizes: np.ndarray    # [m]: its size
    key_offsets: np.ndarray    # uint64[n+1] into key_blob
    key_blob: bytes
    version: int = FORMAT_VERSION

    def member_name(self, key: str, field: str) -> str:
        """The tar member name this shard holds for ``field`` of ``key``."""
        return tar_member_name(key, field) if self.version >= 2 else f"{key}.{field}"

    @property
    def num_samples(self) -> int:
        return len(self.raw_sizes)

    def key(self, i: int) -> str:
        a, b = int(self.key_offsets[i]), int(self.key_offsets[i + 1])
        return self.key_blob[a:b].decode("utf-8", "surrogateescape")

    def keys(self) -> list[str]:
        return [self.key(i) for i in range(self.num_samples)]

    @functools.cached_property
    def entry_rows(self) -> np.ndarray:
        """int64[m]: the sample of each entry."""
        return np.repeat(np.arange(self.num_samples), np.diff(self.field_runs))

    @functools.cached_property
    def field_spans(self) -> "_FieldSpans":
        """Uncompressed shards: per field, (start in the shard file, size) of every sample's value
        as int64, size 0 where a sample lacks the field.  Each field's arrays are made on first
        use and kept, so a batch gather does two lookups per field instead of re-deriving them,
        and memory grows with the fields asked for, not with every name in the shard."""
        return _FieldSpans(self)

    @functools.cached_property
    def field_offsets(self) -> np.ndarray:
        """Dense uint64[n, F] view of the entries, MISSING where a sample lacks a field (tools and
        tests; readers use the entries)."""
        out = np.full((self.num_samples, len(self.fields)), MISSING, dtype="<u8")
        out[self.entry_rows, self.entry_fields] = self.entry_offsets
        return out

    @functools.cached_property
    def field_sizes(self) -> np.ndarray:
        out = np.zeros((self.num_samples, len(self.fields)), dtype="<u8")
        out[self.entry_rows, self.entry_fields] = self.entry_sizes
        return out

    @functools.cached_property
    def key_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) of every key in ``key_blob``, int64."""
        offsets = self.key_offsets.astype(np.int64)
        return offsets[:-1], offsets[1:]

    def span(self, i: int) -> tuple[int, int]:
        return int(self.starts[i]), int(self.starts[i + 1])

    def sample_fields(self, i: int) -> list[tuple[str, int, int]]:
        """``[(field, offset, size)]`` of the fields sample ``i`` has, offsets into its payload."""
        a, b = int(self.field_runs[i]), int(self.field_runs[i + 1])
        return [(self.fields[f], off, size) for f, off, size in zip(
            self.entry_fields[a:b].tolist(), self.entry_offsets[a:b].tolist(),
            self.entry_sizes[a:b].tolist(), strict=True)]


class _FieldSpans:
    """``name -> (starts, sizes)`` of :attr:`ShardIndex.field_spans`, made per field on use."""

    def __init__(self, index: ShardIndex):
        self.index = index
        self.numbers = {name: i for i, name in enumerate(index.fields)}
        self.made: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def __contains__(self, name) -> bool:
        return name in self.numbers

    def __getitem__(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        spans = self.made.get(name)
        if spans is None:
            index = self.index
            base = index.starts[:-1].astype(np.int64)
            if index.shard_format == "msgpack":
                base += RECORD_HEADER.size
            mine = index.entry_fields == self.numbers[name]
            rows = index.entry_rows[mine]
            starts = base.copy()
            sizes = np.zeros(index.num_samples, dtype=np.int64)
            starts[rows] += index.entry_offsets[mine].astype(np.int64)
            sizes[rows] = index.entry_sizes[mine].astype(np.int64)
            spans = self.made[name] = (starts, sizes)
        return spans


def encode_index(*, shard_format: str, compression: str, shard_bytes: int, shard_hash: bytes,
                 plan_digest: int, skipped: int, fields: Sequence[str], starts: Sequence[int],
                 raw_sizes: Sequence[int], sample_hashes: Sequence[int],
                 field_offsets: np.ndarray, field_sizes: np.ndarray,
                 keys: Iterable[str]) -> bytes:
    """Version 2: the fields each sample has are listed sparsely (CSR: per sample a run of
    (field number, offset, size) entries), so the index grows with the fields a sample has, not
    with the number of distinct field names in the shard.  ``field_offsets`` / ``field_sizes``
    come dense, ``[n, len(fields)]``, MISSING where a sample lacks a field."""
    n = len(raw_sizes)
    if len(fields) > MAX_INDEX_FIELDS:
        raise FormatError(f"{len(fields):,} distinct field names in one shard: at most "
                          f"{MAX_INDEX_FIELDS:,} fit an index")
    names = b"".join(struct.pack("<H", len(f.encode())) + f.encode() for f in fields)
    names += bytes(-len(names) % 8)
    key_bytes = [k.encode("utf-8", "surrogateescape") for k in keys]
    key_offsets = np.zeros(n + 1, dtype="<u8")
    np.cumsum([len(k) for k in key_bytes], out=key_offsets[1:])
    offsets = np.asarray(field_offsets, dtype="<u8").reshape(n, len(fields))
    sizes = np.asarray(field_sizes, dtype="<u8").reshape(n, len(fields))
    rows, cols = np.nonzero(offsets != MISSING)  # row-major: each sample's fields in order
    field_index = np.zeros(n + 1, dtype="<u8")
    np.cumsum(np.bincount(rows, minlength=n), out=field_index[1:])
    entry_offsets, entry_sizes = offsets[rows, cols], sizes[rows, cols]
    wide = bool(len(rows)) and int(max(entry_offsets.max(), entry_sizes.max())) >> 32 != 0
    width = "<u8" if wide else "<u4"  # u32 entries unless a field lies past 4 GiB
    header = INDEX_HEADER.pack(INDEX_MAGIC, FORMAT_VERSION, _FORMAT_CODE[shard_format],
                               _COMPRESSION_CODE[compression], INDEX_WIDE if wide else 0, n,
                               len(fields), len(names), shard_bytes, shard_hash, plan_digest,
                               skipped)

    def padded(a: np.ndarray) -> bytes:
        raw = a.tobytes()
        return raw + bytes(-len(raw) % 8)

    arrays = [np.asarray(starts, dtype="<u8"), np.asarray(raw_sizes, dtype="<u8"),
              np.asarray(sample_hashes, dtype="<u8"), field_index,
              entry_offsets.astype(width), entry_sizes.astype(width), cols.astype("<u2"),
              key_offsets]
    body = header + names + b"".join(padded(a) for a in arrays) + b"".join(key_bytes)
    return body + INDEX_TRAILER.pack(xxhash.xxh3_64_intdigest(body))


def decode_index(buf, path: str | None = None) -> ShardIndex:
    """Parse and validate an index.  ``buf`` may be bytes or a memory map."""
    (version, fmt, comp, flags, n, nfields, names_len, shard_bytes, shard_hash, plan_digest,
     skipped) = _index_header(buf, path)
    size = len(buf)
    end = INDEX_HEADER.size + names_len
    if end > size - INDEX_TRAILER.size or 2 * nfields > names_len:
        raise FormatError("index field-name table runs past the index", path=path)
    fields = _index_field_names(buf, nfields, end, path)
    arrays = _IndexArrays(buf, end, path)
    starts, raw_sizes, hashes = arrays.take(n + 1), arrays.take(n), arrays.take(n)
    if version == 1:
        runs, rows, entry_fields, entry_offsets, entry_sizes = _index_entries_v1(arrays, n,
                                                                                 nfields)
    else:
        runs, rows, entry_fields, entry_offsets, entry_sizes = _index_entries(arrays, n, nfields,
                                                                              flags, path)
    koff = arrays.take(n + 1)
    pos, key_len = arrays.pos, int(koff[-1])
    if pos + key_len + INDEX_TRAILER.size != size:
        raise FormatError("index size does not match its header", path=path)
    _check_index_spans(fmt, comp, starts, raw_sizes, koff, shard_bytes, path)
    raw = raw_sizes[rows]  # compared without a sum that could wrap around 2^64
    if np.any((entry_sizes > raw) | (entry_offsets > raw - np.minimum(entry_sizes, raw))):
        raise FormatError("index field extends past its sample", path=path)
    formats = {v: k for k, v in _FORMAT_CODE.items()}
    comps = {v: k for k, v in _COMPRESSION_CODE.items()}
    return ShardIndex(formats[fmt], comps[comp], int(shard_bytes), bytes(shard_hash),
                      int(plan_digest), int(skipped), tuple(fields), starts, raw_sizes, hashes,
                      runs, entry_fields, entry_offsets, entry_sizes, koff,
                      bytes(buf[pos:pos + key_len]), version)


def _index_header(buf, path: str | None) -> tuple:
    """The header's values after the magic, once magic, version, format and compression codes
    and the checksum of the whole index are checked."""
    size = len(buf)
    if size < INDEX_HEADER.size + INDEX_TRAILER.size:
        raise FormatError(f"index is {size} bytes, too short", path=path)
    magic, version, fmt, comp, *rest = INDEX_HEADER.unpack_from(buf)
    if magic != INDEX_MAGIC:
        raise FormatError(f"not a shardpack index (magic {magic!r})", path=path, offset=0)
    if version not in READ_VERSIONS:
        raise VersionError(f"unsupported index version: expected one of {READ_VERSIONS}, found "
                           f"{version}", path=path)
    formats, comps = set(_FORMAT_CODE.values()), set(_COMPRESSION_CODE.values())
    if fmt not in formats or comp not in comps:
        raise VersionError(f"unknown shard format code {fmt} or compression code {comp}: "
                           f"expected one of {sorted(formats)} and {sorted(comps)}", path=path)
    (stored,) = INDEX_TRAILER.unpack_from(buf, size - INDEX_TRAILER.size)
    if xxhash.xxh3_64_intdigest(memoryview(buf)[:size - INDEX_TRAILER.size]) != stored:
        raise IntegrityError("index checksum mismatch (corrupt or truncated index)", path=path)
    return (version, fmt, comp, *rest)


def _index_field_names(buf, nfields: int, end: int, path: str | None) -> list[str]:
    """The field-name table (``nfields`` length-prefixed UTF-8 names) that ends at ``end``."""
    pos = INDEX_HEADER.size
    fields = []
    for _ in range(nfields):
        (ln,) = struct.unpack_from("<H", buf, pos)
        if pos + 2 + ln > end:
            raise FormatError("index field-name table runs past its length", path=path)
        try:
            name = bytes(buf[pos + 2:pos + 2 + ln]).decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError("index field name is not UTF-8", path=path) from None
        why = reserved_field_reason(name) if name else "field name is empty"
        if why:
            raise FormatError(f"index {why}"[:300], path=path)
        fields.append(name)
        pos += 2 + ln
    return fields


class _IndexArrays:
    """The index's arrays in order, each padded to 8 bytes; none may run into the trailer."""

    def __init__(self, buf, pos: int, path: str | None):
        self.buf, self.pos, self.path = buf, pos, path
        self.limit = len(buf) - INDEX_TRAILER.size

    def take(self, count: int, dtype: str = "<u8") -> np.ndarray:
        width = np.dtype(dtype).itemsize
        if self.pos + width * count > self.limit:
            raise FormatError("index arrays run past the end of the index", path=self.path)
        out = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
        self.pos += width * count + (-(width * count) % 8)
        return out


def _index_entries_v1(arrays: _IndexArrays, n: int, nfields: int) -> tuple:
    """Version 1: dense n x F tables (their size is bounded by the file's), turned into
    ``(runs, rows, entry_fields, entry_offsets, entry_sizes)``."""
    foff = arrays.take(n * nfields).reshape(n, nfields)
    fsize = arrays.take(n * nfields).reshape(n, nfields)
    rows, cols = np.nonzero(foff != MISSING)
    runs = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=runs[1:])
    return runs, rows, cols, foff[rows, cols], fsize[rows, cols]


def _index_entries(arrays: _IndexArrays, n: int, nfields: int, flags: int,
                   path: str | None) -> tuple:
    """Version 2 on: per-sample runs of (field, offset, size) entries, checked, as
    ``(runs, rows, entry_fields, entry_offsets, entry_sizes)``."""
    if flags & ~INDEX_WIDE:
        raise VersionError(f"unknown index flags {flags:#x}: expected only "
                           f"{INDEX_WIDE:#x}", path=path)
    runs = arrays.take(n + 1).astype(np.int64)  # int64: a crafted u64 past 2^63 turns negative
    entries = int(runs[-1]) if n else 0
    if n and (runs[0] != 0 or np.any(runs[1:] < runs[:-1]) or entries > n * nfields):
        raise FormatError("index field runs are not increasing", path=path)
    width = "<u8" if flags & INDEX_WIDE else "<u4"
    entry_offsets, entry_sizes = arrays.take(entries, width), arrays.take(entries, width)
    entry_fields = arrays.take(entries, "<u2")
    if entries and int(entry_fields.max()) >= nfields:
        raise FormatError("index names a field number past its field table", path=path)
    rows = np.repeat(np.arange(n), np.diff(runs))
    # within a sample, field numbers strictly increase: no field listed twice
    if entries > 1 and not np.all((np.diff(entry_fields.astype(np.int32)) > 0)
                                  | (np.diff(rows) != 0)):
        raise FormatError("index field numbers of a sample are not increasing", path=path)
    return runs, rows, entry_fields, entry_offsets, entry_sizes


def _check_index_spans(fmt: int, comp: int, starts: np.ndarray, raw_sizes: np.ndarray,
                       koff: np.ndarray, shard_bytes: int, path: str | None) -> None:
    """Sample and key offsets increase and stay inside the shard; raw sizes agree with the
    spans (tar) or are bounded by them (msgpack)."""
    n = len(raw_sizes)
    if n and (np.any(starts[1:] < starts[:-1]) or int(starts[-1]) > shard_bytes
              or np.any(koff[1:] < koff[:-1])):
        raise FormatError("index offsets are not increasing or run past the shard", path=path)
    if n and fmt == _FORMAT_CODE["tar"] and np.any(raw_sizes != np.diff(starts)):
        raise FormatError("index raw sizes of tar samples differ from their spans", path=path)
    if n and fmt == _FORMAT_CODE["msgpack"]:
        stored = np.diff(starts.astype(np.int64)) - RECORD_HEADER.size
        if comp == _COMPRESSION_CODE["none"]:
            bad = np.any(raw_sizes.astype(np.int64) != stored)
        else:  # decompression is sized by raw_sizes: bounded by the bytes actually stored
            bad = np.any(raw_sizes > np.maximum(stored, 0).astype(np.uint64) * MAX_EXPANSION
                         + (1 << 20))
        if bad:
            raise FormatError("index raw sizes of msgpack records disagree with their spans"
                              + ("" if comp == _COMPRESSION_CODE["none"] else
                                 f" (more than {MAX_EXPANSION}x the stored size)"), path=path)


# ---------------------------------------------------------------------------------------------
# Manifest (JSON, the commit point)
# ---------------------------------------------------------------------------------------------

_SHARD_KEYS = ("name", "index", "samples", "bytes", "hash", "index_bytes", "index_hash")


def encode_manifest(manifest: dict) -> bytes:
    """Deterministic JSON: sorted keys, no timestamps, so two packs of one tree are identical."""
    return (json.dumps(manifest, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()


@dataclass(frozen=True, slots=True)
class ShardEntry:
    """One ``shards`` entry of a decoded manifest (docs/format.md): shard N's file names, its
    sample count, and the size and xxh3-128 of the shard and of its index."""
    name: str
    index: str
    samples: int
    bytes: int
    hash: str
    index_bytes: int
    index_hash: str

    @classmethod
    def from_dict(cls, entry: dict) -> ShardEntry:
        return cls(*_shard_values(entry))

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in _SHARD_KEYS}


_shard_values = operator.itemgetter(*_SHARD_KEYS)


@dataclass(frozen=True, slots=True)
class Part:
    """``pack --part I/N``: the manifest's ``part`` record."""
    index: int
    count: int


def _freeze(value):
    """JSON values made read-only: lists to tuples, objects to read-only mappings."""
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def thaw(value):
    """The JSON value of a manifest attribute: the inverse of the read-only forms (tuples to
    lists, mappings to dicts, :class:`Part` and :class:`ShardEntry` to objects)."""
    if isinstance(value, (ShardEntry, Part)):
        return {k: getattr(value, k) for k in value.__slots__}
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class Manifest:
    """A decoded, checked manifest (docs/format.md): every key pack, merge and convert write, as
    read-only values (lists as tuples, objects as read-only mappings).  An optional key the
    file lacks is None.  ``raw`` is the decoded JSON as read, for keys a newer release may add
    and for tools that print it; :meth:`to_dict` gives the JSON of the typed values."""
    format: str
    version: int
    shard_format: str
    compression: str
    hash: str
    fields: tuple[str, ...]
    shards: tuple[ShardEntry, ...]
    num_samples: int | None = None
    num_shards: int | None = None
    num_bytes: int | None = None
    classes: tuple[str, ...] | None = None
    layout: str | None = None
    skipped: Mapping[str, int] | None = None  # reason -> count, read-only
    hidden: int | None = None
    group: str | None = None
    ignored: int | None = None
    preprocessing: Mapping[str, int] | None = None
    part: Part | None = None
    merged_from: int | None = None
    source: Mapping | None = None
    skip_report: Mapping | None = None  # {"name": SKIPS_NAME, "entries": N, "bytes": B}
    raw: dict = dataclass_field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, manifest: dict, path: str | None = None) -> Manifest:
        """Check ``manifest`` (a decoded JSON object) as :func:`decode_manifest` does, and type
        it; raises :class:`FormatError` or :class:`VersionError`."""
        _check_manifest(manifest, path)
        try:
            return cls._typed(manifest)
        except RecursionError:  # a 'source' or 'preprocessing' nested past the stack
            raise FormatError("manifest is nested too deeply", path=path) from None

    @classmethod
    def _typed(cls, manifest: dict, shards: tuple | None = None) -> Manifest:
        """A checked manifest object, typed (``shards``: its entries, already typed)."""
        part = manifest.get("part")
        values = {k: _freeze(manifest.get(k)) for k in _MANIFEST_KEYS}
        if shards is None:
            shards = tuple(ShardEntry(*_shard_values(s)) for s in manifest["shards"])
        values.update(shards=shards,
                      part=Part(part["index"], part["count"]) if part is not None else None)
        return cls(**values, raw=manifest)

    def __reduce__(self):
        # read-only mappings do not pickle: a reader travels to DataLoader workers as its JSON,
        # but with the ShardEntry tuple itself, which the reader and its access mode share (one
        # copy in the pickle and in the worker)
        raw = self.to_dict()
        raw.pop("shards", None)
        return (_typed_manifest_with, (raw, self.shards))

    def to_dict(self) -> dict:
        """The manifest as a JSON object: ``raw``'s keys (unknown ones included, their values
        shared with ``raw``), each typed key from its attribute; an optional key the file
        lacked stays out while it is None."""
        out = dict(self.raw)
        for key in _MANIFEST_KEYS + ("shards", "part"):
            value = getattr(self, key)
            if value is not None or key in self.raw:
                out[key] = thaw(value)
        return out


def _typed_manifest_with(manifest: dict, shards: tuple) -> Manifest:
    return Manifest._typed(manifest, shards)


_MANIFEST_KEYS = ("format", "version", "shard_format", "compression", "hash", "fields",
                  "num_samples", "num_shards", "num_bytes", "classes", "layout", "skipped",
                  "hidden", "group", "ignored", "preprocessing", "merged_from", "source",
                  "skip_report")


def decode_manifest(data: bytes, path: str | None = None) -> Manifest:
    """The manifest file's bytes, parsed and checked: a :class:`Manifest`."""
    return Manifest.from_dict(_parse_manifest(data, path), path)


def _check_manifest(manifest: dict, path: str | None) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise FormatError(f"not a shardpack manifest (no \"format\": \"{MANIFEST_FORMAT}\")",
                          path=path)
    _check_manifest_codes(manifest, path)
    shards = manifest.get("shards")
    if not isinstance(shards, list) or any(
            not isinstance(s, dict) or any(k not in s for k in _SHARD_KEYS) for s in shards):
        raise FormatError(f"manifest shards must be a list of objects with {_SHARD_KEYS}",
                          path=path)
    seen: set = set()
    for number, s in enumerate(shards):
        _check_shard_entry(number, s, manifest["shard_format"], seen, path)
    if sum(s["samples"] for s in shards) >= MAX_COUNT:
        raise FormatError("manifest shards hold more samples than any dataset can", path=path)
    _check_manifest_values(manifest, path)


def _parse_manifest(data: bytes, path: str | None):
    """The JSON value, with a key written twice in one object refused."""
    try:
        manifest = json.loads(data, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise FormatError(f"manifest writes the key {exc.key!r} twice in one object (a JSON "
                          "reader would keep either copy)", path=path) from None
    except (ValueError, RecursionError) as exc:  # ValueError: bad JSON, UTF-8, huge integers
        what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise FormatError(f"manifest is not valid JSON: {what}", path=path) from None
    return manifest


def _check_manifest_codes(manifest: dict, path: str | None) -> None:
    """Version, shard format, compression and hash: values this reader knows."""
    version = manifest.get("version")
    if not _is_int(version) or version not in READ_VERSIONS:  # 2.0 == 2, True == 1: refused
        raise VersionError(f"unsupported manifest version: expected one of {READ_VERSIONS}, "
                           f"found {version!r}", path=path, hint="upgrade shardpack to read it")
    if manifest.get("shard_format") not in SHARD_FORMATS:
        raise VersionError(f"unknown shard format: expected one of {SHARD_FORMATS}, found "
                           f"{manifest.get('shard_format')!r}", path=path)
    if manifest.get("compression") not in COMPRESSIONS:
        raise VersionError(f"unknown compression: expected one of {COMPRESSIONS}, found "
                           f"{manifest.get('compression')!r}", path=path)
    if manifest.get("hash") != HASH_NAME:
        raise VersionError(f"unknown hash: expected {HASH_NAME!r}, found "
                           f"{manifest.get('hash')!r}", path=path)


def _check_shard_entry(number: int, s: dict, shard_format: str, seen: set,
                       path: str | None) -> None:
    """Shard entry ``number``: safe file names not used before (``seen``, updated), the names
    of shard ``number``, counts and hashes of the right types."""
    for name in (s["name"], s["index"]):
        if not isinstance(name, str) or "/" in name or "\x00" in name or \
                name in ("", ".", ".."):
            raise FormatError(f"manifest names an unsafe shard file {name!r}", path=path)
        if name in seen:
            raise FormatError(f"manifest names the file {name!r} twice", path=path)
        seen.add(name)
    # entry N is shard N: a swapped or reordered entry (each still matching its own file)
    # would change which samples have which position.  The suffix is compared with
    # shard_format by verify and by the index (which records the shard's format).
    expected = shard_name(number, shard_format)
    stem = expected[:-len(SHARD_SUFFIX[shard_format])]
    if s["name"] not in (stem + suffix for suffix in SHARD_SUFFIX.values()) or \
            s["index"] != index_name(number):
        raise FormatError(f"manifest shard entry {number} names {s['name']!r} and "
                          f"{s['index']!r}, expected {expected!r} and "
                          f"{index_name(number)!r} (entries are numbered in order)"[:300],
                          path=path)
    for key in ("samples", "bytes", "index_bytes"):
        if not _count(s[key]):
            raise FormatError(f"manifest shard {number} ({s['name']}): {key!r} must be a "
                              f"non-negative integer, found {s[key]!r}", path=path)
    # every sample costs at least MIN_INDEX_BYTES of its index: a count the index cannot
    # hold is refused before anything is sized by it
    if s["samples"] * MIN_INDEX_BYTES > s["index_bytes"]:
        raise FormatError(f"manifest shard {number} ({s['name']}) claims {s['samples']:,} "
                          f"samples, more than its {s['index_bytes']:,}-byte index can hold",
                          path=path)
    for key in ("hash", "index_hash"):
        if not isinstance(s[key], str) or len(s[key]) != 32 or \
                s[key].strip("0123456789abcdef"):
            raise FormatError(f"manifest shard {number} ({s['name']}): {key!r} must be 32 "
                              f"hex digits", path=path)


def _check_manifest_values(manifest: dict, path: str | None) -> None:
    """The top-level values besides the shards: counts, fields, classes, notes, layout, and
    the optional ``part`` and ``merged_from``."""
    for key in ("num_samples", "num_shards", "num_bytes"):
        if key in manifest and not _count(manifest[key]):
            raise FormatError(f"manifest {key!r} must be a non-negative integer, found "
                              f"{manifest[key]!r}", path=path)
    fields = manifest.get("fields")
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise FormatError("manifest 'fields' must be a list of field names", path=path)
    classes = manifest.get("classes")
    if classes is not None and (not isinstance(classes, list)
                                or not all(isinstance(c, str) for c in classes)):
        raise FormatError("manifest 'classes' must be null or a list of names", path=path)
    _check_notes(manifest, path)
    _check_layout(manifest, path)
    part = manifest.get("part")  # pack --part I/N (optional key)
    if part is not None and not (isinstance(part, dict) and _count(part.get("index"))
                                 and _count(part.get("count"))
                                 and part["index"] < part["count"]):
        raise FormatError(f"manifest 'part' must be null or {{\"index\": I, \"count\": N}} "
                          f"with 0 <= I < N, found {part!r}"[:300], path=path)
    merged = manifest.get("merged_from")  # shardpack merge (optional key)
    if merged is not None and not (_count(merged) and merged >= 1):
        raise FormatError(f"manifest 'merged_from' must be a positive integer, found "
                          f"{merged!r}"[:300], path=path)


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list) -> dict:
    """``json.loads`` object hook: a key written twice in one object is refused (plain
    ``json.loads`` keeps the last copy, other readers may keep the first)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


CONVERTED_LAYOUTS = ("webdataset", "mds", "litdata", "parquet")  # convert --from: layout = from
PACK_LAYOUTS = ("imagefolder", "files", "listing")                # pack's walk or listing


def _check_notes(manifest: dict, path: str | None) -> None:
    """The informational keys, when present: ``hidden``/``ignored`` counts, ``skipped`` counts
    by reason, ``preprocessing`` null or ``{"resize": N, "quality": Q}``."""
    for key in ("hidden", "ignored"):
        if key in manifest and not _count(manifest[key]):
            raise FormatError(f"manifest {key!r} must be a non-negative integer, found "
                              f"{manifest[key]!r}"[:300], path=path)
    if "skipped" in manifest:
        skipped = manifest["skipped"]
        if not isinstance(skipped, dict) or not all(_count(v) for v in skipped.values()):
            raise FormatError(f"manifest 'skipped' must map reasons to non-negative integers, "
                              f"found {skipped!r}"[:300], path=path)
    report = manifest.get("skip_report")
    if report is not None and not (isinstance(report, dict) and report.get("name") == SKIPS_NAME
                                   and _count(report.get("entries"))
                                   and _count(report.get("bytes"))):
        raise FormatError(f"manifest 'skip_report' must be null or {{\"name\": "
                          f"\"{SKIPS_NAME}\", \"entries\": N, \"bytes\": B}}, found "
                          f"{report!r}"[:300], path=path)
    pre = manifest.get("preprocessing")
    if pre is not None and not (isinstance(pre, dict) and _count(pre.get("resize"))
                                and pre["resize"] > 0 and _count(pre.get("quality"))):
        raise FormatError(f"manifest 'preprocessing' must be null or {{\"resize\": N, "
                          f"\"quality\": Q}} (integers, N > 0), found {pre!r}"[:300], path=path)


def _check_layout(manifest: dict, path: str | None) -> None:
    """What the layout implies, as pack, convert and merge write it (docs/format.md):

    * ``imagefolder``: ``classes`` a list of distinct folder names (non-empty, no '/', not '.' or
      '..'); ``verify`` checks each sample's ``cls`` and key against them;
    * ``files``, ``listing``: no class list (pack's walk has no classes there);
    * ``group`` only with ``imagefolder`` and ``files`` (how the walk grouped files);
    * a ``source`` record (convert) names the layout: ``source.from`` is the layout, one of
      :data:`CONVERTED_LAYOUTS`.

    An unknown layout is left to ``verify``: a later release may add one."""
    layout = manifest.get("layout")
    classes = manifest.get("classes")
    where = f"manifest layout {layout!r}"
    if isinstance(classes, list) and len(set(classes)) != len(classes):
        seen: set = set()
        twice = next(c for c in classes if c in seen or seen.add(c))
        raise FormatError(f"manifest 'classes' lists {twice!r} twice: class names must be "
                          "distinct"[:300], path=path)
    source = manifest.get("source")
    if source is not None:
        if not isinstance(source, dict):
            raise FormatError(f"manifest 'source' must be an object, found {source!r}"[:300],
                              path=path)
        origin = source.get("from")
        if origin is not None and (origin not in CONVERTED_LAYOUTS or origin != layout):
            raise FormatError(f"manifest 'source' says converted from {origin!r}, so layout "
                              f"must be {origin!r}, found {layout!r}"[:300], path=path)
    if layout not in PACK_LAYOUTS + CONVERTED_LAYOUTS:  # unknown or missing: verify names it
        return
    if manifest.get("group") is not None and layout not in ("imagefolder", "files"):
        raise FormatError(f"{where} has no file grouping: 'group' must be null, found "
                          f"{manifest['group']!r}"[:300], path=path)
    if layout in ("files", "listing") and classes is not None:
        raise FormatError(f"{where} has no class folders: 'classes' must be null, found a list "
                          f"of {len(classes)}"[:300], path=path)
    if layout != "imagefolder":
        return
    if not classes:
        raise FormatError(f"{where} needs the class folder names: 'classes' must be a "
                          f"non-empty list, found {classes!r}"[:300], path=path)
    for number, name in enumerate(classes):
        why = unsafe_name_reason(name) or ("has a '/'" if "/" in name else None)
        if why:
            raise FormatError(f"manifest classes[{number}] {name!r} cannot be a class folder "
                              f"name: {why}"[:300], path=path)


MIN_INDEX_BYTES = 32  # the least index bytes one sample takes (v1 and v2: starts, sizes, hash,
#                       key offset, and v2's field run)


MAX_COUNT = 1 << 53  # counts and byte sizes a manifest may state (exact as JSON numbers anywhere)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_COUNT


def unsafe_name_reason(name: str) -> str | None:
    """Why a member or key name must not become a path under an output folder, or None.
    Refused: absolute names, empty, '.' or '..' components (so '//' and a trailing '/'), NUL,
    and bytes that are not UTF-8 (an index key is decoded with surrogate escapes: keys are UTF-8
    text, and a tar or Parquet export could not write one).  The one key rule of pack's listings,
    the converters, ``unpack``, ``export`` and ``verify``.  A newline is allowed: a file name
    may hold one, pack keeps it and unpack writes it back (``ls`` prints it escaped)."""
    if not name:
        return "empty name"
    if name.startswith("/"):
        return "absolute name"
    if "\x00" in name:
        return "name contains NUL"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "name has an empty, '.' or '..' component"
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            return "name is not valid UTF-8"
    return None
