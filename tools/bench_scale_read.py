"""Bytes and requests each rank fetches per epoch from remote storage, with and without shard
affinity (issue 17, "reading at scale").  Not a test; figures go to docs/scale.md.

Every rank of a W-rank job reads one epoch of a remote dataset into its own cache (as on W
nodes that share nothing); the dataset sits on fsspec's in-process ``memory://`` store, so what
is counted is exactly what the reader asks for, with no server in the way.  Ranks run one after
another in this process (the order and the cuts are pure functions of the rank: running them
together would fetch the same).

    python tools/bench_scale_read.py --shards 256 --per-shard 40 --worlds 8 32
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path


def make_dataset(shards: int, per_shard: int, size: int) -> str:
    import fsspec

    import shardpack

    tmp = Path(tempfile.mkdtemp())
    src = tmp / "src"
    for i in range(shards * per_shard):
        d = src / f"{i // per_shard:05d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:08d}.bin").write_bytes(os.urandom(size))
    shardpack.pack(src, tmp / "ds", max_samples=per_shard, workers=1, layout="files")
    fs = fsspec.filesystem("memory")
    for p in sorted((tmp / "ds").iterdir()):
        if not p.name.startswith("."):
            fs.pipe_file(f"/bench-scale/{p.name}", p.read_bytes())
    shutil.rmtree(tmp)
    return "memory:///bench-scale"


def one_epoch(url: str, world: int, rank: int, affinity: bool, cache: Path) -> dict:
    import shardpack

    ds = shardpack.ShardDataset(url, world_size=world, rank=rank, cache_dir=cache, seed=1,
                                shard_affinity=affinity, batch_size=64, batched=True,
                                prefetch=0)
    ds.set_epoch(1)
    seen = [int(i) for b in ds
            for i, r in zip(b["__index__"], b["__repeat__"], strict=True) if not r]
    tars = list(cache.rglob("*.tar"))
    return {"ids": seen, "bytes": sum(p.stat().st_size for p in tars), "shards": len(tars)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, default=256)
    p.add_argument("--per-shard", type=int, default=40)
    p.add_argument("--size", type=int, default=1000, help="bytes per sample")
    p.add_argument("--worlds", type=int, nargs="+", default=[8, 32])
    args = p.parse_args()
    url = make_dataset(args.shards, args.per_shard, args.size)
    import shardpack

    total = shardpack.DatasetReader(url).manifest.num_bytes
    n = args.shards * args.per_shard
    print(f"`python tools/bench_scale_read.py --shards {args.shards} --per-shard "
          f"{args.per_shard} --worlds {' '.join(map(str, args.worlds))}`: {n:,} samples of "
          f"{args.size} B in {args.shards} shards ({total / 1e6:.1f} MB), one epoch, every rank "
          "with its own cache:\n")
    print("| ranks | shard affinity | shards fetched per rank (median, max) | "
          "MB per rank (median) | egress per epoch / dataset | every sample once |")
    print("|---|---|---|---|---|---|")
    for world in args.worlds:
        for affinity in (True, False):
            runs = []
            for rank in range(world):
                cache = Path(tempfile.mkdtemp())
                runs.append(one_epoch(url, world, rank, affinity, cache))
                shutil.rmtree(cache)
            ids = [i for r in runs for i in r["ids"]]
            once = sorted(ids) == list(range(n))
            shards = [r["shards"] for r in runs]
            mb = statistics.median(r["bytes"] for r in runs) / 1e6
            egress = sum(r["bytes"] for r in runs) / total
            print(f"| {world} | {'on' if affinity else 'off'} | {statistics.median(shards):.0f}, "
                  f"{max(shards)} | {mb:.2f} | {egress:.2f}x | {'yes' if once else 'NO'} |",
                  flush=True)


if __name__ == "__main__":
    main()
