"""A batch's sample hashes in one call (shardpack.format.hashing.sample_hashes): the extension
(shardpack.format.libxxh3ranges) and its pure-Python fallback give xxhash's digest of every range,
and a corrupt byte is caught by every read path on both."""

import mmap
import os

import numpy as np
import pytest
import xxhash
from torch.utils.data import DataLoader

import shardpack
from shardpack import ShardDataset
from shardpack.core.errors import IntegrityError
from shardpack.format import hashing
from testbed.helpers import make_tree


@pytest.fixture(params=["extension", "fallback"])
def path(request, monkeypatch):
    """Each test twice: with the extension (skipped where it is not built) and without."""
    hashing.ranges_extension.cache_clear()
    if request.param == "fallback":
        monkeypatch.setenv(hashing.RANGES_ENV, "0")
    elif hashing.ranges_extension() is None:
        pytest.skip("shardpack.format.libxxh3ranges is not built here")
    yield request.param
    monkeypatch.delenv(hashing.RANGES_ENV, raising=False)
    hashing.ranges_extension.cache_clear()


def test_the_extension_is_used_unless_turned_off(path):
    assert (hashing.ranges_extension() is None) == (path == "fallback")


def test_the_extension_is_built_where_required():
    """CI must notice a missing extension: its tests above would only skip."""
    if os.environ.get("SHARDPACK_REQUIRE_HASH_RANGES") != "1":
        pytest.skip("SHARDPACK_REQUIRE_HASH_RANGES is not set (scripts/test.sh sets it)")
    hashing.ranges_extension.cache_clear()
    assert hashing.ranges_extension() is not None, (
        "the batch hash extension is not built: apt-get install gcc libxxhash-dev, then "
        "bash scripts/setup.sh (docs/reading.md, Integrity)")


def _ranges(size: int, seed: int):
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, size + 1, 300)
    ends = np.minimum(starts + rng.integers(0, 70_000, 300), size)
    ends[:20] = starts[:20]  # empty ranges
    starts[20], ends[20] = 0, size  # the whole buffer
    starts[21] = ends[21] = size  # empty, at the very end
    starts[22], ends[22] = 1, 2  # one byte, at an odd offset
    return starts, ends


def test_digests_are_xxh3_of_each_range(path, tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    starts, ends = _ranges(len(data), 1)
    want = [xxhash.xxh3_64_intdigest(data[a:b]) for a, b in zip(starts, ends, strict=True)]
    got = hashing.sample_hashes(data, starts, ends)
    assert got.dtype == np.uint64 and got.tolist() == want
    file = tmp_path / "blob"
    file.write_bytes(data)
    with open(file, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)  # a read-only map, as a reader's shard
        assert hashing.sample_hashes(view, starts, ends).tolist() == want
        # int32 bounds and strided (non-contiguous) arrays are taken as they come
        both = np.stack([starts, ends]).astype(np.int32)
        assert hashing.sample_hashes(view, both[0], both[1]).tolist() == want
        assert hashing.sample_hashes(view, starts[::2], ends[::2]).tolist() == want[::2]
        view.release()
    assert hashing.sample_hashes(data, np.zeros(0), np.zeros(0)).tolist() == []


@pytest.mark.parametrize("start, end", [(-1, 4), (5, 4), (0, 1025)])
def test_a_range_outside_the_buffer_is_refused(path, start, end):
    with pytest.raises(ValueError, match="outside the buffer of 1024 bytes"):
        hashing.sample_hashes(bytes(1024), np.array([0, start]), np.array([1, end]))


def _corrupt(tmp_path, shard_format: str) -> tuple:
    """A packed dataset whose sample '9' has one byte flipped; (folder, that sample's offset)."""
    src = make_tree(tmp_path / "src", {f"{i}.bin": bytes([i]) * 3000 for i in range(16)})
    out = tmp_path / "out"
    shardpack.pack(src, out, shard_format=shard_format, workers=1)
    index = shardpack.read.reader.DatasetReader(out).index(0)
    row = index.keys().index("9")
    start = int(index.starts[row])
    (shard,) = [p for p in out.iterdir() if p.name.startswith("shard-") and
                not p.name.endswith(".idx")]
    data = bytearray(shard.read_bytes())
    data[(start + int(index.starts[row + 1])) // 2] ^= 0x10  # inside the sample's bytes
    shard.write_bytes(bytes(data))
    return out, start


@pytest.mark.parametrize("shard_format", ["tar", "msgpack"])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("check", ["every", "once"])
def test_a_corrupt_byte_is_caught_on_every_path(path, tmp_path, shard_format, batched, check):
    out, start = _corrupt(tmp_path, shard_format)
    ds = ShardDataset(out, shuffle=False, batch_size=4, batched=batched, check=check)
    with pytest.raises(IntegrityError, match=rf"sample '9', offset {start}: .*index hash"):
        for _ in DataLoader(ds, batch_size=None if batched else 4):
            pass


@pytest.mark.parametrize("shard_format", ["tar", "msgpack"])
def test_a_corrupt_byte_is_caught_by_worker_threads(path, tmp_path, shard_format):
    """Worker threads hash at the same time (the extension releases the GIL): still caught."""
    out, start = _corrupt(tmp_path, shard_format)
    ds = ShardDataset(out, shuffle=False, batch_size=2, batched=True, execution="threads",
                      workers=2)
    with pytest.raises(IntegrityError, match=rf"sample '9', offset {start}: .*index hash"):
        for _ in ds:
            pass
