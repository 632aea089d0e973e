"""The I/O-free format module: layouts round-trip, and bad bytes raise typed, named errors."""

import io
import json
import tarfile

import numpy as np
import pytest

from shardpack import format as fmt
from shardpack.errors import FormatError, IntegrityError, VersionError


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
    with pytest.raises(VersionError, match="expected 1, found 99"):
        fmt.decode_index(bytes(data), "s.idx")


def _manifest(**over):
    m = {"format": "shardpack", "version": 1, "shard_format": "tar", "compression": "none",
         "hash": "xxh3-128", "shards": []}
    m.update(over)
    return json.dumps(m).encode()


@pytest.mark.parametrize("over,match", [
    ({"version": 7}, "expected 1, found 7"),
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
    for (name, data), off in zip(fields, offsets):
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
