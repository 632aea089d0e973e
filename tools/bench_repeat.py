"""Epochs one after another in one training process: a fresh ShardDataset and DataLoader each
time, alternating a local epoch and a cold cached one over nginx on 127.0.0.1.  Shows what a
process's earlier datasets cost the next DataLoader's workers (docs/remote.md, "Cold epochs on a
fast link": a dropped remote dataset stalled each forked worker 1 s before the fix).

    .venv/bin/python tools/bench_repeat.py PACKED_DIR [--rounds 4]

PACKED_DIR: a packed dataset (e.g. bench-data/remote-fast/packed from
``tools/bench_remote.py --fast``); its parent folder is served.  Prints one line per epoch:
first batch and epoch seconds.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def epoch(url: str, cache: str | None) -> tuple[float, float]:
    import shardpack
    from torch.utils.data import DataLoader

    t0 = time.perf_counter()
    ds = shardpack.ShardDataset(url, batch_size=256, batched=True, cache_dir=cache, seed=1)
    first = None
    for _ in DataLoader(ds, batch_size=None, num_workers=2):
        first = first if first is not None else time.perf_counter() - t0
    return first, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("packed", type=Path)
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    from tests.servers import NginxServer

    packed = args.packed.resolve()
    with tempfile.TemporaryDirectory() as work, NginxServer(packed.parent, Path(work)) as nginx:
        url = nginx.url_for(packed.name)
        for r in range(args.rounds):
            for name, target in (("local", str(packed)), ("cold cached", url)):
                cache = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
                try:
                    first, total = epoch(target, None if name == "local" else cache)
                finally:
                    shutil.rmtree(cache)
                print(f"round {r + 1} {name:12s} first batch {first:.2f} s, epoch {total:.2f} s",
                      flush=True)


if __name__ == "__main__":
    main()
