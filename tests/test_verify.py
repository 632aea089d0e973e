"""`shardpack verify` catches any flipped byte and truncation, naming the shard and sample."""

import json
import random

import pytest

import shardpack
from shardpack import format as fmt

from .conftest import fake_jpeg, make_tree, reseal, run_cli

MODES = [("tar", "none"), ("msgpack", "none"), ("msgpack", "zstd")]


@pytest.fixture
def dataset(tmp_path, request):
    shard_format, compression = request.param
    rng = random.Random(1)
    files = {f"c{i % 3}/{i:04d}.jpg": fake_jpeg(rng.randint(32, 4000), seed=i) for i in range(40)}
    files.update({f"c0/{i:04d}.json": b'{"i": %d}' % i for i in range(0, 40, 3)})
    src = make_tree(tmp_path / "src", files)
    out = tmp_path / "out"
    shardpack.pack(src, out, format=shard_format, compression=compression, max_samples=15,
                   workers=1)
    return out


def _samples_at(out, shard_name, pos):
    entry = next(s for s in json.loads((out / "shardpack.json").read_text())["shards"]
                 if s["name"] == shard_name)
    index = fmt.decode_index((out / entry["index"]).read_bytes())
    for i in range(index.num_samples):
        a, b = index.span(i)
        if a <= pos < b:
            return index.key(i)
    return None


@pytest.mark.parametrize("dataset", MODES, indirect=True)
def test_clean_dataset_verifies(dataset):
    result = run_cli("verify", dataset)
    assert result.output.startswith("OK: 3 shards, 40 samples")


@pytest.mark.parametrize("dataset", MODES, indirect=True)
def test_every_flipped_byte_is_caught(dataset):
    rng = random.Random(7)
    shards = sorted(p for p in dataset.iterdir() if p.suffix in (".tar", ".spk"))
    for trial in range(25):
        shard = rng.choice(shards)
        data = bytearray(shard.read_bytes())
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
        original = shard.read_bytes()
        shard.write_bytes(bytes(data))
        try:
            result = run_cli("verify", dataset, ok=None)
            assert result.exit_code == 1, (trial, pos)
            assert f"BAD {shard}" in result.output
            key = _samples_at(dataset, shard.name, pos)
            if key is not None:
                assert f"sample {key!r}" in result.output, result.output
        finally:
            shard.write_bytes(original)
    assert run_cli("verify", dataset).exit_code == 0


@pytest.mark.parametrize("dataset", MODES, indirect=True)
def test_truncated_shard_is_named(dataset):
    shard = sorted(p for p in dataset.iterdir() if p.suffix in (".tar", ".spk"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2])
    result = run_cli("verify", dataset, ok=None)
    assert result.exit_code == 1
    assert f"BAD {shard}: shard is {len(data) // 2} bytes" in result.output
    assert "runs past the end of the shard" in result.output


@pytest.mark.parametrize("dataset", MODES, indirect=True)
def test_missing_shard_and_bad_index_are_named(dataset):
    (dataset / "shard-00002.idx").write_bytes(b"garbage")
    (dataset / "shard-00001.tar").unlink(missing_ok=True)
    (dataset / "shard-00001.spk").unlink(missing_ok=True)
    result = run_cli("verify", dataset, ok=None)
    assert result.exit_code == 1
    assert "shard-00002.idx: index is 7 bytes, the manifest says" in result.output
    assert "shard-00001." in result.output and "missing" in result.output


@pytest.mark.parametrize("dataset", [("tar", "none")], indirect=True)
def test_structural_checks_catch_resealed_tampering(dataset):
    """Hashes recomputed after tampering: only the structure check can see it."""
    shard = dataset / "shard-00000.tar"
    data = bytearray(shard.read_bytes())
    data[0:4] = b"zzzz"  # the first member's name
    data[148:156] = b" " * 8
    data[148:156] = b"%06o\0 " % sum(data[:512])
    shard.write_bytes(bytes(data))
    reseal(dataset)
    result = run_cli("verify", dataset, ok=None)
    assert result.exit_code == 1 and "does not match the index" in result.output


def test_reader_checks_crc_on_read(tmp_path):
    from shardpack.errors import IntegrityError
    from shardpack.reader import DatasetReader

    src = make_tree(tmp_path / "src", {"a.bin": b"x" * 1000})
    out = tmp_path / "out"
    shardpack.pack(src, out, format="msgpack", workers=1)
    shard = out / "shard-00000.spk"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"shard-00000.spk, sample 'a', offset 16: sample "
                                             r"bytes do not match the index hash"):
        DatasetReader(out).read_sample(0)
    # storage trusted: no hash check, and the record's own CRC still catches it
    with pytest.raises(IntegrityError, match=r"shard-00000.spk, sample 'a', offset 16: record "
                                             r"CRC32C mismatch"):
        DatasetReader(out, trust_storage=True).read_sample(0)
