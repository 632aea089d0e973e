"""Fuzzing the format's decoders: whatever bytes come in, the index decoder, the
manifest decoder, the msgpack payload decoder and the record reader either succeed or raise a
typed FormatError, quickly and without a large allocation.  Mutations are resealed (trailer hash
recomputed) so they reach the parsing instead of stopping at the checksum."""

from __future__ import annotations

import json
import resource
import struct

import numpy as np
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardpack import format as fmt
from shardpack.core.errors import FormatError
from shardpack.read.reader import record_payload

FUZZ = settings(max_examples=400, deadline=2000,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _index_bytes(shard_format: str = "tar") -> bytes:
    n, fields = 6, ["cls", "jpg", "json"]
    foff = np.full((n, 3), fmt.MISSING, dtype="<u8")
    fsize = np.zeros((n, 3), dtype="<u8")
    for i in range(n):
        foff[i, 0], fsize[i, 0] = 512, 1
        foff[i, 1], fsize[i, 1] = 1536, 100
        if i % 2:
            foff[i, 2], fsize[i, 2] = 2048, 9
    starts = [2560 * i for i in range(n + 1)]
    return fmt.encode_index(shard_format=shard_format, compression="none",
                            shard_bytes=starts[-1] + 1024, shard_hash=bytes(16),
                            plan_digest=7, skipped=0, fields=fields, starts=starts,
                            raw_sizes=[2560] * n, sample_hashes=list(range(n)),
                            field_offsets=foff, field_sizes=fsize,
                            keys=[f"k/{i}" for i in range(n)])


def _reseal(body: bytes) -> bytes:
    return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))


edits = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1,
                 max_size=8)


@FUZZ
@given(edits=edits, cut=st.integers(0, 64))
def test_index_decoder_raises_only_format_errors(edits, cut):
    body = bytearray(_index_bytes()[:-8])
    for pos, value in edits:
        body[pos % len(body)] = value
    data = _reseal(bytes(body[:len(body) - cut]))
    try:
        index = fmt.decode_index(data, "fuzz.idx")
    except FormatError:
        return
    for i in range(index.num_samples):  # what decoded must be usable without surprises
        index.key(i)
        for _, off, size in index.sample_fields(i):
            assert off + size <= int(index.raw_sizes[i])
    for name in index.fields:
        index.field_spans[name]


@FUZZ
@given(data=st.binary(max_size=600))
def test_index_decoder_on_arbitrary_bytes(data):
    for attempt in (data, _reseal(data)):
        try:
            fmt.decode_index(attempt, "fuzz.idx")
        except FormatError:
            pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                        children, max_size=4),
    max_leaves=12)


def _manifest() -> dict:
    return {"format": "shardpack", "version": 2, "shard_format": "tar", "compression": "none",
            "hash": "xxh3-128", "num_samples": 6, "num_shards": 1, "num_bytes": 16384,
            "fields": ["cls", "jpg"], "classes": ["a", "b"], "layout": "imagefolder",
            "shards": [{"name": "shard-00000.tar", "index": "shard-00000.idx", "samples": 6,
                        "bytes": 16384, "hash": "0" * 32, "index_bytes": 900,
                        "index_hash": "1" * 32}]}


@FUZZ
@given(key=st.sampled_from(["format", "version", "shard_format", "compression", "hash",
                            "num_samples", "fields", "classes", "shards", "samples", "name",
                            "index", "bytes", "index_bytes", "hash2"]),
       value=json_values)
def test_manifest_decoder_raises_only_format_errors(key, value):
    m = _manifest()
    if key in ("samples", "name", "index", "bytes", "index_bytes"):
        m["shards"][0][key] = value
    elif key == "hash2":
        m["shards"][0]["hash"] = value
    else:
        m[key] = value
    try:
        out = fmt.decode_manifest(json.dumps(m).encode(), "fuzz.json")
    except FormatError:
        return
    for s in out.shards:  # what passed is safe to size arrays by and to open
        assert isinstance(s.samples, int) and s.samples * 32 <= s.index_bytes
        assert "/" not in s.name and "\x00" not in s.name


@FUZZ
@given(data=st.binary(max_size=2000))
def test_manifest_decoder_on_arbitrary_bytes(data):
    try:
        fmt.decode_manifest(data, "fuzz.json")
    except FormatError:
        pass


@FUZZ
@given(edits=edits, zstd=st.booleans())
def test_msgpack_record_reader_raises_only_format_errors(edits, zstd):
    import zstandard

    payload, offsets = fmt.encode_payload("k/1", [("cls", b"3"), ("jpg", b"\xff" * 300)])
    stored = zstandard.ZstdCompressor().compress(payload) if zstd else payload
    record = bytearray(fmt.record_header(stored, len(payload), zstd) + stored)
    for pos, value in edits:
        record[pos % len(record)] = value
    index_data = fmt.encode_index(
        shard_format="msgpack", compression="zstd" if zstd else "none",
        shard_bytes=16 + len(record), shard_hash=bytes(16), plan_digest=0, skipped=0,
        fields=["cls", "jpg"], starts=[16, 16 + len(record)], raw_sizes=[len(payload)],
        sample_hashes=[0], field_offsets=np.array([offsets], dtype="<u8"),
        field_sizes=np.array([[1, 300]], dtype="<u8"), keys=["k/1"])
    index = fmt.decode_index(index_data)
    try:
        out = record_payload(index, 0, bytes(record), "fuzz.spk")
    except FormatError:
        return
    assert len(out) == len(payload)  # decompression bounded by the size the index records
    try:
        fmt.decode_payload(bytes(out), max_fields=2)
    except FormatError:
        pass


def test_huge_claims_fail_under_a_memory_limit():
    """A manifest claiming 3e8 samples and an index claiming 2^60 samples must fail as a
    FormatError in a process limited to ~3.5 GB of address space, not allocate."""
    import subprocess
    import sys
    from pathlib import Path

    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    limit = 2 << 30

    code = f"""
import resource, json, struct, xxhash
resource.setrlimit(resource.RLIMIT_AS, ({limit} + 1_500_000_000, {hard}))
from shardpack import format as fmt
from shardpack.core.errors import FormatError
import tests.robustness.test_fuzz as t
m = t._manifest(); m["shards"][0]["samples"] = 300_000_000
try:
    fmt.decode_manifest(json.dumps(m).encode())
    raise SystemExit("manifest accepted")
except FormatError:
    pass
body = bytearray(t._index_bytes()[:-8])
struct.pack_into("<Q", body, 16, 1 << 60)   # n
try:
    fmt.decode_index(t._reseal(bytes(body)))
    raise SystemExit("index accepted")
except FormatError:
    pass
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=str(Path(__file__).parents[2]))
    assert done.returncode == 0 and "ok" in done.stdout, done.stdout + done.stderr
