"""LitData's ``json`` leaves -> JSON text.

LitData stores a list/dict leaf either as JSON text (older writers: the payload starts with '['
or '{', or any byte above 0x20) or in a compact tagged binary form (first byte 0..11).  The
tagged form, as this module reads it (all integers little-endian, text UTF-8 with a uint32
length in front):

====  =========  ==========================================================================
tag   name       payload
====  =========  ==========================================================================
0     json       uint32 n, n bytes of JSON text
1     strs       uint32 count, then count texts
2     i64s       uint32 count, count int64
3     f64s       uint32 count, count float64
4     bools      uint32 count, count bytes (0/1)
5     dict       uint32 count, then count (text key, tagged value)
6     records    uint32 rows, uint32 keys, the key texts, then per row and key a kind byte
                 (0x10 null, 0x11 text, 0x12 int64, 0x13 float64, 0x14 bool byte) and value
7..11 scalars    text, int64, float64, bool byte, null (no payload)
====  =========  ==========================================================================

JSON text is carried byte for byte; the tagged form is decoded and written as compact JSON
(``separators=(",", ":")``, UTF-8, keys in stored order).

Bounds (hostile leaves): nesting deeper than ``MAX_DEPTH`` (JSON text or tags) is refused, every
count is checked against the bytes left before anything is built, and a records value with no
keys may hold at most as many rows as the leaf has bytes (each such row reads nothing).
"""

from __future__ import annotations

import json
import struct

_U32, _I64, _F64 = struct.Struct("<I"), struct.Struct("<q"), struct.Struct("<d")
_ARRAYS = {2: ("<q", 8), 3: ("<d", 8)}
MAX_DEPTH = 200


def to_json(data: bytes) -> bytes:
    """The leaf as JSON text; ValueError if it is neither JSON nor the tagged form."""
    if not data or data[0] > 0x20:
        try:
            json.loads(data)
        except RecursionError:
            raise ValueError("json leaf is nested too deeply") from None
        except ValueError as exc:
            raise ValueError(f"json leaf is not valid JSON: {exc}") from None
        return bytes(data)
    try:
        value, end = _read(data, 0)
    except RecursionError:
        raise ValueError("json leaf is nested too deeply") from None
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"json leaf is truncated or corrupt: {exc}") from None
    if end != len(data):
        raise ValueError(f"json leaf has {len(data) - end} trailing bytes")
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _text(data: bytes, pos: int) -> tuple[str, int]:
    n = _U32.unpack_from(data, pos)[0]
    end = pos + 4 + n
    if end > len(data):
        raise IndexError("text runs past the end")
    return data[pos + 4:end].decode("utf-8"), end


def _read(data: bytes, pos: int, depth: int = 0):
    if depth > MAX_DEPTH:
        raise ValueError(f"json leaf is nested more than {MAX_DEPTH} deep")
    tag = data[pos]
    pos += 1
    if tag in _COUNTED:
        count = _U32.unpack_from(data, pos)[0]
        pos += 4
        # every item reads at least 4 (text), 1 (value) or 0 (a row of no keys) bytes
        if count * (4 if tag in (1, 5) else 1) > len(data) - pos and tag != 6:
            raise IndexError(f"{count} items run past the end")
        return _COUNTED[tag](data, pos, count, tag, depth)
    if tag in _SCALAR_KINDS:
        return _scalar(_SCALAR_KINDS[tag], data, pos)
    raise ValueError(f"unknown json leaf tag {tag}")


def _read_json_text(data: bytes, pos: int, count: int, tag: int, depth: int):
    end = pos + count
    if end > len(data):
        raise IndexError("json text runs past the end")
    try:
        return json.loads(data[pos:end]), end
    except RecursionError:
        raise ValueError("embedded JSON is nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"embedded JSON is invalid: {exc}") from None


def _read_texts(data: bytes, pos: int, count: int, tag: int, depth: int):
    out = []
    for _ in range(count):
        text, pos = _text(data, pos)
        out.append(text)
    return out, pos


def _read_numbers(data: bytes, pos: int, count: int, tag: int, depth: int):
    fmt, width = _ARRAYS[tag]
    end = pos + width * count
    if end > len(data):
        raise IndexError("array runs past the end")
    return list(struct.unpack_from(f"<{count}{fmt[1]}", data, pos)), end


def _read_bools(data: bytes, pos: int, count: int, tag: int, depth: int):
    if pos + count > len(data):
        raise IndexError("bools run past the end")
    return [b != 0 for b in data[pos:pos + count]], pos + count


def _read_dict(data: bytes, pos: int, count: int, tag: int, depth: int):
    out = {}
    for _ in range(count):
        key, pos = _text(data, pos)
        out[key], pos = _read(data, pos, depth + 1)
    return out, pos


def _read_records(data: bytes, pos: int, count: int, tag: int, depth: int):
    nkeys = _U32.unpack_from(data, pos)[0]
    pos += 4
    if nkeys * 4 > len(data) - pos or count * nkeys > len(data) - pos \
            or (not nkeys and count > len(data)):
        raise IndexError(f"records of {count} rows and {nkeys} keys run past the end")
    keys = []
    for _ in range(nkeys):
        key, pos = _text(data, pos)
        keys.append(key)
    rows = []
    for _ in range(count):
        row = {}
        for key in keys:
            row[key], pos = _record_value(data, pos)
        rows.append(row)
    return rows, pos


# tags 0..6: a uint32 count, then the items (read by these, called with the tag and depth)
_COUNTED = {0: _read_json_text, 1: _read_texts, 2: _read_numbers, 3: _read_numbers,
            4: _read_bools, 5: _read_dict, 6: _read_records}
# tags 7..11: one scalar, read as the records value of this kind
_SCALAR_KINDS = {7: 0x11, 8: 0x12, 9: 0x13, 10: 0x14, 11: 0x10}


def _record_value(data: bytes, pos: int):
    return _scalar(data[pos], data, pos + 1)


def _scalar(kind: int, data: bytes, pos: int):
    """A records value of ``kind`` (0x10 null, 0x11 text, 0x12 int64, 0x13 float64, 0x14 bool
    byte) at ``pos``, and the position after it."""
    if kind == 0x10:
        return None, pos
    if kind == 0x11:
        return _text(data, pos)
    if kind == 0x12:
        return _I64.unpack_from(data, pos)[0], pos + 8
    if kind == 0x13:
        return _F64.unpack_from(data, pos)[0], pos + 8
    if kind == 0x14:
        return data[pos] != 0, pos + 1
    raise ValueError(f"unknown record value kind {kind:#x}")
