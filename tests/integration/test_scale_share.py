"""A 10M-sample dataset of tiny msgpack samples reads its first batch with a per-worker cost
that follows the worker's share: real shards and indexes (a 100,000-sample dataset
converted from Parquet, its shards hard-linked 100 times under new names), rank 0 of 64 with 2
DataLoader workers, the first batch checked and each worker's peak RSS reported."""

import json
import os
import time

import numpy as np
import pytest
from torch.utils.data import DataLoader

import shardpack
from shardpack import format as fmt


@pytest.mark.timeout(600)
def test_ten_million_samples_first_batch_and_worker_memory(tmp_path, record_property):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    n = 100_000
    table = pa.table({"__key__": pa.array([f"{i:07d}" for i in range(n)]),
                      "bin": pa.array([b"%07d" % i for i in range(n)], type=pa.binary()),
                      "cls": pa.array(np.arange(n) % 1000)})
    pq.write_table(table, tmp_path / "t.parquet")
    base = tmp_path / "base"
    shardpack.convert(tmp_path / "t.parquet", base, shard_format="msgpack", label_column="cls",
                      check="none", max_samples=10_000)
    manifest = json.loads((base / fmt.MANIFEST_NAME).read_text())
    big = tmp_path / "big"
    big.mkdir()
    shards = []
    for _ in range(100):
        for entry in manifest["shards"]:
            k = len(shards)
            new = dict(entry, name=f"shard-{k:05d}" + os.path.splitext(entry["name"])[1],
                           index=f"shard-{k:05d}.idx")
            os.link(base / entry["name"], big / new["name"])
            os.link(base / entry["index"], big / new["index"])
            shards.append(new)
    manifest["shards"] = shards
    for key in ("num_samples", "num_bytes"):
        if isinstance(manifest.get(key), int):
            manifest[key] *= 100
    (big / fmt.MANIFEST_NAME).write_text(json.dumps(manifest))

    start = time.perf_counter()
    # rank 0 of 64: each of its 2 workers owns 1/128 of the epoch (78,125 samples)
    ds = shardpack.ShardDataset(big, batch_size=256, batched=True, seed=1, rank=0,
                                world_size=64)
    parent = _status_kb(os.getpid(), "VmRSS:")  # what a forked worker starts with
    assert len(ds) == 10_000_000 // 64
    loader = iter(DataLoader(ds, batch_size=None, num_workers=2))
    batch = next(loader)
    first = time.perf_counter() - start
    ids = batch["__index__"].numpy()
    assert len(ids) == 256 and len(set(ids.tolist())) == 256
    # the bytes are the sample's own: each one holds its id within the base dataset
    assert [bytes(b).decode() for b in batch["bin"].items()] == \
        [f"{i % n:07d}" for i in ids.tolist()]
    workers = [int(pid) for pid in os.listdir("/proc") if pid.isdigit()
               and f"PPid:\t{os.getpid()}\n" in _status(int(pid))]
    peaks = [_status_kb(pid, "VmHWM:") / 1024 for pid in workers]
    grown = [round(peak - parent / 1024) for peak in peaks]
    del loader
    record_property("first_batch_s", round(first, 2))
    record_property("worker_peak_rss_mb", peaks)
    print(f"10M samples: first batch {first:.2f} s, worker peak RSS {peaks} MB, "
          f"{grown} MB over the training process it was forked from")
    # the whole-epoch order cost each worker ~250 MB more at 10M (docs/benchmarks.md)
    assert len(peaks) >= 2 and max(grown) < 100, (peaks, grown)


def _status(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/status").read()
    except OSError:
        return ""


def _status_kb(pid: int, field: str) -> int:
    for line in _status(pid).splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return 0
