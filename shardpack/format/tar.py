"""Tar, as tar shards hold it: POSIX ustar headers, with pax extended headers for long or non-ASCII
names and huge sizes.  Writing is deterministic (mode 0644, uid/gid 0, mtime 0); reading accepts
any member type and reports it, so callers refuse what is not a regular file."""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardpack.core.errors import FormatError

TAR_BLOCK = 512
TAR_END = bytes(2 * TAR_BLOCK)
TAR_MODE = 0o644
TAR_MTIME = 0
OCTAL_SIZE_LIMIT = 8 ** 11  # sizes from here on do not fit the 11 octal digits of ustar
PAX_NAME = "././@PaxHeader"


def tar_padding(size: int) -> int:
    """The zero bytes after ``size`` bytes of member data, up to the next block.

    Args:
        size: the member's data size.
    """
    return -size % TAR_BLOCK


def tar_member_name(key: str, field: str) -> str:
    """The tar member name of ``field`` of sample ``key``: ``<key>.<field>``, except that a
    '.' or '%' in the key's last part is written ``%2E`` / ``%25``.  WebDataset readers (the
    webdataset library, Hugging Face ``datasets``) split a member name at the first dot of its
    last part; escaping keeps ``IMG_2019.01.05`` one sample for them.  shardpack reads keys from
    its index, so its readers give back the original names.

    Args:
        key: the sample's key.
        field: the field's name.
    """
    head, slash, last = key.rpartition("/")
    if "." in last or "%" in last:
        last = last.replace("%", "%25").replace(".", "%2E")
    return f"{head}{slash}{last}.{field}"


_ESCAPED = re.compile("%(25|2E)")


def unescape_key_part(part: str) -> str:
    """The inverse of :func:`tar_member_name`'s escape, for the last part of a key (the member
    name's file name up to its first dot): ``IMG_2019%2E01%2E05`` -> ``IMG_2019.01.05``.  Only
    for names known to be written with that escape (``convert`` of a ``shardpack export``,
    docs/convert.md): another writer's literal ``%2E`` is a name of its own.

    Args:
        part: the escaped last part of the key.
    """
    return _ESCAPED.sub(lambda m: "%" if m.group(1) == "25" else ".", part)


def _ustar_template(typeflag: bytes) -> tuple[bytes, bytes, int]:
    """The fixed parts of a header around the name (0..100) and size (124..136) fields, and the
    checksum of everything but those two fields (chksum itself counts as 8 spaces)."""
    middle = b"%07o\0" % TAR_MODE + b"%07o\0" % 0 + b"%07o\0" % 0          # 100..124
    tail = (b"%011o\0" % TAR_MTIME + b" " * 8 + typeflag + bytes(100) + b"ustar\0" + b"00"
            + bytes(64) + b"%07o\0" % 0 + b"%07o\0" % 0 + bytes(155 + 12))   # 136..512
    return middle, tail, sum(middle) + sum(tail)


_TEMPLATES = {flag: _ustar_template(flag) for flag in (b"0", b"x")}


def ustar_block(name: bytes, size: int, typeflag: bytes) -> bytes:
    """One deterministic ustar header block.

    Args:
        name: the member name's bytes (cut to 100).
        size: the data size (below :data:`OCTAL_SIZE_LIMIT`).
        typeflag: ``b"0"`` (regular file) or ``b"x"`` (pax extended header).
    """
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
    mtime 0, no user or group names.  Names that do not fit ustar go in a pax header.

    Args:
        name: the member name.
        size: the member's data size.
    """
    raw = name.encode("utf-8", "surrogateescape")
    ascii_ok = raw.isascii() and "\n" not in name
    if ascii_ok and len(raw) <= 100 and size < OCTAL_SIZE_LIMIT:
        return ustar_block(raw, size, b"0")
    records = b""
    if not (ascii_ok and len(raw) <= 100):
        records += _pax_record("path", name)
    if size >= OCTAL_SIZE_LIMIT:
        records += _pax_record("size", str(size))
    pax = ustar_block(PAX_NAME.encode(), len(records), b"x")
    pax += records + bytes(tar_padding(len(records)))
    short = raw.decode("ascii", "replace").encode("ascii", "replace")[:100]
    return pax + ustar_block(short, min(size, OCTAL_SIZE_LIMIT - 1), b"0")


@dataclass(frozen=True)
class TarMember:
    """One member found by :func:`parse_tar_header`: its name and data size, where its data
    starts and where the member ends (past the data's padding), both relative to the offset
    the parse started at, and its type."""

    name: str
    size: int
    data_offset: int  # offset of the data, relative to the buffer given to parse_tar_member
    end: int          # offset just past the data's padding
    kind: str = "file"  # file, sparse file, directory, hard link, symlink, ...
    typeflag: bytes = b"0"


_TAR_KINDS = {b"0": "file", b"\0": "file", b"7": "file", b"1": "hard link", b"2": "symlink",
              b"3": "character device", b"4": "block device", b"5": "directory", b"6": "FIFO"}
_EXTENDED = (b"x", b"g", b"L", b"K")  # headers whose data describes the next member
_SPARSE_KEYWORD = b"GNU.sparse."  # pax records of GNU sparse formats 0.0, 0.1 and 1.0


def _octal(field: bytes, what: str, offset: int) -> int:
    if field[:1] == b"\x80":  # GNU base-256 (sizes of 8 GiB and more); 0xff, negative, is not
        return int.from_bytes(field[1:], "big")
    text = field.rstrip(b"\0 ").lstrip(b" ")
    try:
        return int(text or b"0", 8)
    except ValueError:
        raise FormatError(f"tar header field {what} is not octal: {field!r}",
                          offset=offset) from None


def _header_block(buf, pos: int) -> tuple[bytes, bytes, int]:
    """(block, typeflag, size) of the header block at ``pos``, its checksum and size checked."""
    block = bytes(buf[pos:pos + TAR_BLOCK])
    if len(block) < TAR_BLOCK:
        raise FormatError("truncated tar header", offset=pos)
    if block == bytes(TAR_BLOCK):
        raise FormatError("unexpected end-of-archive block", offset=pos)
    stored = _octal(block[148:156], "chksum", pos)
    actual = sum(block) - sum(block[148:156]) + 8 * 32  # chksum field counted as spaces
    if stored != actual:
        raise FormatError(f"tar header checksum {stored} != computed {actual}", offset=pos)
    size = _octal(block[124:136], "size", pos)
    if size < 0:  # int(..., 8) takes a sign: a negative size would step backwards
        raise FormatError(f"tar header size is negative: {block[124:136]!r}", offset=pos)
    return block, block[156:157], size


def _ustar_name(block: bytes) -> str:
    """The name a ustar block itself holds: its prefix field, a '/', its name field."""
    raw = block[:100].split(b"\0", 1)[0]
    prefix = block[345:500].split(b"\0", 1)[0]
    if prefix and block[257:263] == b"ustar\0":
        raw = prefix + b"/" + raw
    return raw.decode("utf-8", "surrogateescape")


def parse_tar_header(buf, offset: int = 0) -> TarMember:
    """Parse the header(s) of the member starting at ``offset`` of ``buf``, whatever its type.
    Global pax headers and GNU long link names are skipped; a zero block raises (end of
    archive).  A GNU sparse member (type ``S``, or pax ``GNU.sparse.*`` records) is of kind
    ``sparse file``: its size is what the archive stores (map and segments), not the file's,
    and type ``S`` may have extension blocks its ``end`` does not count (read it with
    ``tarfile``).

    Args:
        buf: a bytes-like holding at least the whole header, pax or GNU long-name records
            included.
        offset: where the member's first header block starts in ``buf``.
    """
    name = size_override = None
    sparse = False
    pos = offset
    block, typeflag, size = _header_block(buf, pos)
    while typeflag in _EXTENDED:  # extended headers: data follows, then more headers
        data = bytes(buf[pos + TAR_BLOCK:pos + TAR_BLOCK + size])
        if len(data) < size:
            raise FormatError("truncated extended tar header", offset=pos)
        if typeflag == b"x":
            name, size_override = parse_pax(data, pos, name, size_override)
            sparse = sparse or _has_sparse_record(data)
        elif typeflag == b"L":
            name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        pos += TAR_BLOCK + size + tar_padding(size)
        block, typeflag, size = _header_block(buf, pos)
    if name is None:
        name = _ustar_name(block)
    if size_override is not None:
        size = size_override
    data_offset = pos + TAR_BLOCK
    end = data_offset + size + tar_padding(size)
    if size < 0 or end <= offset:  # never: both sizes are checked; the scan must advance
        raise FormatError(f"tar member size {size} does not advance the archive", offset=pos)
    kind = "sparse file" if sparse or typeflag == b"S" else \
        _TAR_KINDS.get(typeflag, "special file")
    return TarMember(name, size, data_offset - offset, end - offset, kind, typeflag)


def _has_sparse_record(data: bytes) -> bool:
    """Whether pax data (already checked by :func:`parse_pax`) holds a ``GNU.sparse.*`` record:
    the member's data is then a sparse map and the data of its segments, not the file."""
    i = 0
    while i < len(data):
        sp = data.index(b" ", i)
        if data.startswith(_SPARSE_KEYWORD, sp + 1):
            return True
        i += int(data[i:sp])
    return False


def parse_tar_member(buf, offset: int = 0) -> TarMember:
    """:func:`parse_tar_header`, accepting only regular files: links, devices, FIFOs and
    directories raise :class:`FormatError`, so nothing downstream ever follows or creates them.

    Args:
        buf: a bytes-like holding at least the member's whole header.
        offset: where the member starts in ``buf``.
    """
    member = parse_tar_header(buf, offset)
    if member.kind != "file":
        raise FormatError(f"tar member is a {member.kind} (type {member.typeflag!r}); only "
                          "regular files are allowed", offset=offset)
    return member


def parse_pax(data: bytes, pos: int, name, size):
    """The ``path`` and ``size`` of pax records ``"%d %s=%s\\n" % (length, keyword, value)``
    (length counts the whole record), as ``(name, size)``: each the record's value, else the
    one given.  Anything else raises FormatError at ``pos``: a record whose length is not plain
    decimal digits, runs past the data or is too short to hold its own length, a record without
    '=' or the final newline, a size that is not a non-negative decimal integer of at most 19
    digits.  Each record advances by its length (> 0).

    Args:
        data: the extended header's data.
        pos: the extended header's offset, for errors.
        name: the name so far (None: none yet).
        size: the size override so far (None: none yet).
    """
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
