"""Write the hostile conversion inputs of tests/robustness/hostile/sources/ (for
test_hostile_sources.py).

Regenerate (the files are committed, so the corpus stays fixed; rerun only to add a case)::

    .venv/bin/python -m tests.robustness.hostile.make_sources

Deterministic: only the standard library, no timestamps (gzip mtime 0), zstd frames written by
hand (one raw block), so the bytes do not depend on a library version.  Each input is a few KB at
most.  Every case is a file or folder under sources/ named after what is wrong with it; the
expected error of each is listed in tests/robustness/test_hostile_sources.py (CASES).
"""

from __future__ import annotations

import gzip
import json
import shutil
import struct
from pathlib import Path

from testbed.peerformats import LEAF, litdata, mds, mds_shard, spec  # noqa: F401

OUT = Path(__file__).resolve().parent / "sources"
BLOCK = 512


# -- tar ----------------------------------------------------------------------------------------
def ustar(name: bytes, size_field: bytes, typeflag: bytes = b"0") -> bytes:
    """One ustar header block with a correct checksum; ``size_field`` is the raw 12-byte field."""
    assert len(size_field) == 12
    block = bytearray(BLOCK)
    block[0:len(name)] = name
    block[100:108] = b"0000644\0"
    block[108:116] = block[116:124] = b"0000000\0"
    block[124:136] = size_field
    block[136:148] = b"00000000000\0"
    block[148:156] = b" " * 8
    block[156:157] = typeflag
    block[257:265] = b"ustar\x0000"
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def octal(size: int) -> bytes:
    return b"%011o\0" % size


def pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def pax_record(keyword: bytes, value: bytes) -> bytes:
    body = b" " + keyword + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n = len(str(n)) + len(body)
    return str(n).encode() + body


def pax_member(records: bytes, name: bytes = b"k.txt", data: bytes = b"hello") -> bytes:
    """A pax header holding ``records``, then a regular member ``name`` holding ``data``."""
    return (ustar(b"././@PaxHeader", octal(len(records)), b"x") + pad(records)
            + ustar(name, octal(len(data))) + pad(data))


def tar(*members: bytes) -> bytes:
    return b"".join(members) + bytes(2 * BLOCK)


GOOD = ustar(b"a.txt", octal(3)) + pad(b"abc")  # a good member before the bad one

TARS = {
    # pax size=-1536 pointed the next header back at the start: convert looped forever
    "tar_pax_negative_size.tar": tar(GOOD, pax_member(pax_record(b"size", b"-1536"),
                                                      data=b"x" * 10)),
    "tar_pax_size_not_a_number.tar": tar(GOOD, pax_member(pax_record(b"size", b"abc"))),
    # the record says it is 99 bytes long; the pax data holds 20
    "tar_pax_record_too_long.tar": tar(GOOD, pax_member(b"99 path=long-name.txt\n")),
    "tar_pax_record_without_equals.tar": tar(GOOD, pax_member(b"10 pathxx\n")),
    # a negative octal size in the ustar field (Python's int(..., 8) accepts the sign)
    "tar_negative_octal_size.tar": tar(GOOD, ustar(b"k.txt", b"-0000001000\0") + pad(b"x")),
    # the same in a pax header block: the header loop itself did not advance
    "tar_pax_header_negative_octal_size.tar": tar(
        GOOD, ustar(b"././@PaxHeader", b"-0000001000\0", b"x") + pad(b"5 a=\n")),
    "tar_non_utf8_name.tar": tar(GOOD, ustar(b"k\xff\xfe.txt", octal(5)) + pad(b"hello")),
}
TGZ = {  # the same through the .tar.gz path (Python's tarfile)
    "tgz_pax_negative_size.tar.gz": "tar_pax_negative_size.tar",
    "tgz_pax_size_not_a_number.tar.gz": "tar_pax_size_not_a_number.tar",
    "tgz_negative_octal_size.tar.gz": "tar_negative_octal_size.tar",
    "tgz_non_utf8_name.tar.gz": "tar_non_utf8_name.tar",
}


# -- zstd -----------------------------------------------------------------------------------------
def zstd_frame(content: bytes, declared: int | None = None) -> bytes:
    """A single-segment zstd frame with a 4-byte content size (``declared``, else the real
    one) and ``content`` as one raw, last block."""
    assert len(content) < 1 << 17
    header = struct.pack("<IBI", 0xFD2FB528, 0xA0, len(content) if declared is None else declared)
    return header + ((len(content) << 3) | 1).to_bytes(3, "little") + content


def pil_cell(width: int, height: int, mode: bytes, pixels: bytes) -> bytes:
    return struct.pack("<III", width, height, len(mode)) + mode + pixels


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir()
    for name, data in TARS.items():
        (OUT / name).write_bytes(data)
    for name, plain in TGZ.items():
        (OUT / name).write_bytes(gzip.compress(TARS[plain], mtime=0))

    # MDS, zstd: index.json claims 1 GiB, the frame header says what the shard really holds
    raw = mds_shard([[b"hello"]])
    mds(OUT / "mds_zstd_index_claims_1gib", {"x": "bytes"}, [[b"hello"]],
        zstd=zstd_frame(raw), raw_bytes=1 << 30)
    # frame header and index.json agree on 1 GiB, from 18 bytes on disk: over the cap
    mds(OUT / "mds_zstd_frame_claims_1gib", {"x": "bytes"}, [[b"hello"]],
        zstd=zstd_frame(b"\0" * 5, declared=1 << 30), raw_bytes=1 << 30)
    # a 13-byte pil cell claiming 40000 x 40000 pixels
    mds(OUT / "mds_pil_40000x40000", {"image": "pil"}, [[pil_cell(40000, 40000, b"L", b"")]])
    litdata(OUT / "litdata_pil_40000x40000", ["pil"],
            [[pil_cell(40000, 40000, b"RGB", b"\0")]], spec(["image"]))

    # LitData data_spec oddities (index.json only: refused when the source is opened)
    oddities = {
        "not_json": "[1, {",
        "not_a_string": {"type": "builtins.dict"},
        "not_a_pair": json.dumps([1]),
        "root_not_object": json.dumps([1, "builtins.dict"]),
        "no_context": json.dumps([1, {"type": "builtins.dict", "children_spec": [LEAF]}]),
        "context_not_json": json.dumps([1, {"type": "builtins.dict", "context": "[image",
                                            "children_spec": [LEAF]}]),
        "context_not_list": json.dumps([1, {"type": "builtins.dict", "context": "5",
                                            "children_spec": [LEAF]}]),
        "children_not_list": json.dumps([1, {"type": "builtins.dict", "context": '["a"]',
                                             "children_spec": {"a": LEAF}}]),
        "type_not_string": json.dumps([1, {"type": ["builtins.dict"], "context": '["a"]',
                                           "children_spec": [LEAF]}]),
        "protocol_2": json.dumps([2, {"type": None, "context": None, "children_spec": []}]),
        "deeply_nested": "[" * 5000 + "]" * 5000,
    }
    for name, data_spec in oddities.items():
        litdata(OUT / f"litdata_spec_{name}", ["bytes"], None, data_spec)

    # LitData json leaves: a records value of 2^32 - 1 rows with no keys (each row reads no
    # bytes: the reader looped and grew a list of empty dicts), and nesting past any sane depth
    records = bytes([6]) + struct.pack("<II", 0xFFFF_FFFF, 0)
    litdata(OUT / "litdata_json_records_without_keys", ["json"], [[records]], spec(["meta"]))
    nested = (bytes([5]) + struct.pack("<II", 1, 0)) * 1100 + bytes([11])  # {"": {"": ...}}
    litdata(OUT / "litdata_json_nested_tags", ["json"], [[nested]], spec(["meta"]))
    litdata(OUT / "litdata_json_nested_text", ["json"], [[b"[" * 3000 + b"]" * 3000]],
            spec(["meta"]))


if __name__ == "__main__":
    main()
