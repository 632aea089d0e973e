"""The I/O-free format module: layouts round-trip, and bad bytes raise typed, named errors."""

import io
import json
import tarfile

import numpy as np
import pytest

from shardpack import format as fmt
from shardpack.core.errors import FormatError, IntegrityError, VersionError


@pytest.mark.parametrize("name", [
    "a/0001.jpg", "x" * 100 + ".jpg", "long/" * 40 + "k.png", "ünï/cödé.jpg",
    "new\nline.txt", "sp ace.cls",
])
@pytest.mark.parametrize("size", [0, 1, 511, 512, 513])
def test_tar_header_read_by_tarfile_and_parser(name, size):
    data = bytes(range(256)) * 3
    data = data[:size]
    blob = fmt.tar_header(name, size) + data + bytes(fmt.tar_padding(size)) + fmt.TAR_END
    with tarfile.open(fileobj=io.BytesIO(blob)) as tf:
        (member,) = tf.getmembers()
        assert member.name == name and member.size == size and member.isreg()
        assert member.mode == 0o644 and member.mtime == 0 and member.uid == 0
        assert tf.extractfile(member).read() == data
    parsed = fmt.parse_tar_member(blob)
    assert parsed.name == name and parsed.size == size
    assert blob[parsed.data_offset:parsed.data_offset + size] == data
    assert parsed.end == len(blob) - len(fmt.TAR_END)


@pytest.mark.parametrize("kind,flag", [("symlink", tarfile.SYMTYPE), ("hard link", tarfile.LNKTYPE),
                                       ("character device", tarfile.CHRTYPE),
                                       ("FIFO", tarfile.FIFOTYPE), ("directory", tarfile.DIRTYPE)])
def test_tar_parser_refuses_non_regular_members(kind, flag):
    info = tarfile.TarInfo("evil")
    info.type = flag
    info.linkname = "/etc/passwd"
    blob = info.tobuf(tarfile.USTAR_FORMAT)
    with pytest.raises(FormatError, match=kind):
        fmt.parse_tar_member(blob)


def test_tar_parser_catches_bad_checksum():
    blob = bytearray(fmt.tar_header("a.jpg", 3))
    blob[0] = ord("b")
    with pytest.raises(FormatError, match="checksum"):
        fmt.parse_tar_member(bytes(blob))


def _index(n=3, fields=("cls", "jpg")):
    foff = np.arange(n * len(fields), dtype="<u8").reshape(n, len(fields))
    fsize = np.ones((n, len(fields)), dtype="<u8")
    foff[0, 1] = fmt.MISSING
    fsize[0, 1] = 0
    return dict(shard_format="msgpack", compression="zstd", shard_bytes=1000,
                shard_hash=bytes(range(16)), plan_digest=42, skipped=1, fields=list(fields),
                starts=[16 + 100 * i for i in range(n + 1)], raw_sizes=[100] * n,
                sample_hashes=[7] * n, field_offsets=foff, field_sizes=fsize,
                keys=[f"k/{i}ü" for i in range(n)])


def test_index_round_trip():
    args = _index()
    index = fmt.decode_index(fmt.encode_index(**args))
    assert index.fields == ("cls", "jpg") and index.num_samples == 3
    assert index.keys() == args["keys"] and index.plan_digest == 42 and index.skipped == 1
    assert index.shard_format == "msgpack" and index.compression == "zstd"
    assert index.sample_fields(0) == [("cls", 0, 1)]
    assert index.sample_fields(1) == [("cls", 2, 1), ("jpg", 3, 1)]
    assert index.span(2) == (216, 316)


def _v1_index(args) -> bytes:
    """A version-1 index, laid out by hand from docs/format.md (dense n x F field tables)."""
    import struct

    import numpy as np
    import xxhash

    n, fields = len(args["raw_sizes"]), args["fields"]
    names = b"".join(struct.pack("<H", len(f)) + f.encode() for f in fields)
    names += bytes(-len(names) % 8)
    keys = [k.encode() for k in args["keys"]]
    koff = np.concatenate([[0], np.cumsum([len(k) for k in keys])]).astype("<u8")
    header = fmt.INDEX_HEADER.pack(fmt.INDEX_MAGIC, 1, 1, 1, 0, n, len(fields), len(names),
                                   args["shard_bytes"], args["shard_hash"],
                                   args["plan_digest"], args["skipped"])
    body = header + names + b"".join(np.asarray(a, dtype="<u8").tobytes() for a in (
        args["starts"], args["raw_sizes"], args["sample_hashes"], args["field_offsets"],
        args["field_sizes"], koff)) + b"".join(keys)
    return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))


def test_version_1_index_still_reads_the_same():
    args = _index()
    old, new = fmt.decode_index(_v1_index(args)), fmt.decode_index(fmt.encode_index(**args))
    assert old.version == 1 and new.version == 2
    for i in range(3):
        assert old.sample_fields(i) == new.sample_fields(i)
    assert (old.field_offsets == new.field_offsets).all()
    assert old.member_name("a/b.c", "jpg") == "a/b.c.jpg"
    assert new.member_name("a/b.c", "jpg") == "a/b%2Ec.jpg"


def test_index_size_grows_with_the_fields_a_sample_has():
    """Version 2: 100 samples, each with one field of its own (100 field names), cost about
    what 100 samples with one shared field cost, not 100 x 100 table cells."""
    import numpy as np

    def size(width: int) -> int:
        n = 100
        foff = np.full((n, width), fmt.MISSING, dtype="<u8")
        fsize = np.zeros((n, width), dtype="<u8")
        for i in range(n):
            foff[i, i % width], fsize[i, i % width] = 0, 10
        return len(fmt.encode_index(
            shard_format="tar", compression="none", shard_bytes=10_000, shard_hash=bytes(16),
            plan_digest=0, skipped=0, fields=[f"f{j:03d}" for j in range(width)],
            starts=list(range(0, 1001, 10)), raw_sizes=[10] * n, sample_hashes=[0] * n,
            field_offsets=foff, field_sizes=fsize, keys=[f"{i:03d}" for i in range(n)]))

    assert size(100) - size(1) < 100 * 6 + 8  # only the 99 extra names in the name table
    # per sample: 40 bytes of arrays, 10 for its one field (u32 offset and size, u16 number),
    # 3 of key; plus the header, the arrays' last entries and padding
    assert size(1) <= 100 * (40 + 10 + 3) + 128


def test_index_entries_widen_past_4_gib():
    """A field that starts or ends past 4 GiB in its sample switches the entries to u64."""
    import numpy as np

    big = 5 << 30
    foff = np.array([[0, big]], dtype="<u8")
    fsize = np.array([[10, 7]], dtype="<u8")
    data = fmt.encode_index(
        shard_format="tar", compression="none", shard_bytes=big + 2048, shard_hash=bytes(16),
        plan_digest=0, skipped=0, fields=["a", "b"], starts=[0, big + 1024],
        raw_sizes=[big + 1024], sample_hashes=[0], field_offsets=foff, field_sizes=fsize,
        keys=["k"])
    assert fmt.INDEX_HEADER.unpack_from(data)[4] == fmt.INDEX_WIDE
    assert fmt.decode_index(data).sample_fields(0) == [("a", 0, 10), ("b", big, 7)]


@pytest.mark.parametrize("where,message", [("runs", "not increasing"),
                                           ("fields", "field number")])
def test_index_refuses_bad_field_runs_even_when_resealed(where, message):
    import struct

    import xxhash

    args = _index()
    data = bytearray(fmt.encode_index(**args))
    n, width = 3, 2
    names_len = struct.unpack_from("<I", data, 28)[0]
    runs = fmt.INDEX_HEADER.size + names_len + 8 * (3 * n + 1)  # after starts, sizes, hashes
    if where == "runs":
        struct.pack_into("<Q", data, runs + 8, 5)  # sample 0 claims 5 entries: past sample 1's
    else:
        entries = struct.unpack_from("<Q", data, runs + 8 * n)[0]
        fields_at = runs + 8 * (n + 1) + 2 * (4 * entries + -(4 * entries) % 8)  # u32 entries
        struct.pack_into("<H", data, fields_at, width + 3)  # a field number past the table
    body = bytes(data[:-8])
    data[-8:] = struct.pack("<Q", xxhash.xxh3_64_intdigest(body))
    with pytest.raises(FormatError, match=message):
        fmt.decode_index(bytes(data), "x.idx")


def test_index_rejects_flipped_byte_and_truncation():
    data = fmt.encode_index(**_index())
    for pos in (20, 100, len(data) - 20):
        bad = bytearray(data)
        bad[pos] ^= 0x40
        with pytest.raises(FormatError):
            fmt.decode_index(bytes(bad), "x.idx")
    with pytest.raises(FormatError, match="x.idx"):
        fmt.decode_index(data[:-9], "x.idx")


def test_index_unknown_version_names_both():
    data = bytearray(fmt.encode_index(**_index()))
    data[8] = 99
    with pytest.raises(VersionError, match=r"expected one of \(1, 2\), found 99"):
        fmt.decode_index(bytes(data), "s.idx")


def _manifest(**over):
    m = {"format": "shardpack", "version": 1, "shard_format": "tar", "compression": "none",
         "hash": "xxh3-128", "shards": []}
    m.update(over)
    return json.dumps(m).encode()


@pytest.mark.parametrize("over,match", [
    ({"version": 7}, r"expected one of \(1, 2\), found 7"),
    ({"shard_format": "zip"}, "found 'zip'"),
    ({"compression": "lz4"}, "found 'lz4'"),
    ({"hash": "md5"}, "found 'md5'"),
])
def test_manifest_unknown_versions_and_codecs(over, match):
    with pytest.raises(VersionError, match=match):
        fmt.decode_manifest(_manifest(**over), "m.json")


def test_manifest_refuses_unsafe_shard_names():
    entry = {"name": "../x.tar", "index": "x.idx", "samples": 1, "bytes": 1, "hash": "",
             "index_bytes": 1, "index_hash": ""}
    with pytest.raises(FormatError, match="unsafe"):
        fmt.decode_manifest(_manifest(shards=[entry]))


def test_payload_offsets_point_at_field_bytes():
    fields = [("cls", b"3"), ("jpg", b"\xff\xd8" * 200), ("json", b"{}")]
    payload, offsets = fmt.encode_payload("a/b", fields)
    for (_, data), off in zip(fields, offsets, strict=True):
        assert payload[off:off + len(data)] == data
    obj = fmt.decode_payload(payload, max_fields=3)
    assert obj == {"__key__": "a/b", "cls": b"3", "jpg": b"\xff\xd8" * 200, "json": b"{}"}


def test_payload_unpacking_is_bounded_and_typed():
    import msgpack

    with pytest.raises(FormatError):  # more fields than the index knows
        fmt.decode_payload(fmt.encode_payload("k", [("a", b"1"), ("b", b"2")])[0], max_fields=1)
    with pytest.raises(FormatError):  # ext types are refused
        fmt.decode_payload(msgpack.packb({"__key__": "k", "a": msgpack.ExtType(1, b"x")}), 2)
    with pytest.raises(FormatError, match="expected bytes"):
        fmt.decode_payload(msgpack.packb({"__key__": "k", "a": 5}), 2)


@pytest.mark.parametrize("name,ok", [("a/b.jpg", True), ("/etc/x", False), ("../x", False),
                                     ("a/../../x", False), ("a//b", False), ("./a", False),
                                     ("a\x00b", False), ("", False), ("sp ace/ü.jpg", True)])
def test_unsafe_names(name, ok):
    assert (fmt.unsafe_name_reason(name) is None) == ok


def test_crc_and_hash_are_standard():
    assert fmt.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert len(bytes.fromhex(fmt.content_hash(b"x"))) == 16


def test_integrity_error_is_a_value_error():
    assert issubclass(IntegrityError, ValueError)


def _resealed(data: bytearray) -> bytes:
    import struct

    import xxhash

    body = bytes(data[:-8])
    return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))


def test_index_field_past_its_sample_cannot_wrap_around():
    """offset 2^64 - 2 plus size 10 wraps to 8 in u64 arithmetic: must still be refused."""
    import numpy as np

    foff = np.array([[(1 << 64) - 2]], dtype="<u8")
    data = fmt.encode_index(
        shard_format="tar", compression="none", shard_bytes=2048, shard_hash=bytes(16),
        plan_digest=0, skipped=0, fields=["jpg"], starts=[0, 1024], raw_sizes=[1024],
        sample_hashes=[0], field_offsets=foff, field_sizes=np.array([[10]], dtype="<u8"),
        keys=["k"])
    with pytest.raises(FormatError, match="extends past its sample"):
        fmt.decode_index(data, "x.idx")


def test_index_with_a_field_listed_twice_is_refused():
    import struct

    data = bytearray(fmt.encode_index(**_index()))
    names_len = struct.unpack_from("<I", data, 28)[0]
    n = 3
    runs = fmt.INDEX_HEADER.size + names_len + 8 * (3 * n + 1)
    entries = struct.unpack_from("<Q", data, runs + 8 * n)[0]
    fields_at = runs + 8 * (n + 1) + 2 * (4 * entries + -(4 * entries) % 8)
    # sample 1 has entries 1 and 2 (cls, jpg): make both say cls
    struct.pack_into("<H", data, fields_at + 2 * 2, 0)
    with pytest.raises(FormatError, match="not increasing"):
        fmt.decode_index(_resealed(data), "x.idx")


def test_index_names_table_is_bounded():
    import struct

    data = bytearray(fmt.encode_index(**_index()))
    struct.pack_into("<I", data, 24, 5000)  # F = 5,000 names in an 8-byte table
    with pytest.raises(FormatError, match="field-name table"):
        fmt.decode_index(_resealed(data), "x.idx")
    data = bytearray(fmt.encode_index(**_index()))
    struct.pack_into("<H", data, fmt.INDEX_HEADER.size, 200)  # a name longer than the table
    with pytest.raises(FormatError, match="field-name table"):
        fmt.decode_index(_resealed(data), "x.idx")


def test_many_field_names_cost_no_dense_table():
    """4,000 field names and 100 samples of one field each: decoding keeps the entries sparse
    (a crafted index must not make a reader allocate n x F cells)."""
    import numpy as np

    n, width = 100, 4000
    foff = np.full((n, width), fmt.MISSING, dtype="<u8")
    fsize = np.zeros((n, width), dtype="<u8")
    for i in range(n):
        foff[i, i * 37 % width], fsize[i, i * 37 % width] = 0, 5
    data = fmt.encode_index(
        shard_format="tar", compression="none", shard_bytes=10_000, shard_hash=bytes(16),
        plan_digest=0, skipped=0, fields=[f"f{j:04d}" for j in range(width)],
        starts=list(range(0, 1001, 10)), raw_sizes=[10] * n, sample_hashes=[0] * n,
        field_offsets=foff, field_sizes=fsize, keys=[f"{i:03d}" for i in range(n)])
    index = fmt.decode_index(data)
    assert "field_offsets" not in index.__dict__  # the dense view was never made
    assert index.sample_fields(3) == [("f0111", 0, 5)]
    starts, sizes = index.field_spans["f0111"]
    assert sizes.tolist() == [5 if i == 3 else 0 for i in range(n)]
    assert len(index.field_spans.made) == 1


def test_more_field_names_than_an_index_holds_is_an_error():
    import numpy as np

    width = fmt.MAX_INDEX_FIELDS + 1
    with pytest.raises(FormatError, match="65,536 distinct field names"):
        fmt.encode_index(
            shard_format="tar", compression="none", shard_bytes=0, shard_hash=bytes(16),
            plan_digest=0, skipped=0, fields=[f"f{j}" for j in range(width)], starts=[0],
            raw_sizes=[], sample_hashes=[], field_offsets=np.zeros((0, width), dtype="<u8"),
            field_sizes=np.zeros((0, width), dtype="<u8"), keys=[])
