"""Cost of checking every sample against its index hash (issue 16): bytes-only batched reading of
one dataset with the check on (the default) and off (``trust_storage=True``), alternated, first
epoch (every sample hashed) and second epoch (the per-process memo: nothing hashed), median
samples/s.  Not a test; figures go to docs/benchmarks.md.

    python tools/bench_check_ab.py bench-data/imagenet-20000 --reps 5
    python tools/bench_check_ab.py bench-data/tiny-100000 --tiny 100000 --reps 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(ds: str, trust: bool, fmt_: str, batch: int) -> list[float]:
    """Two epochs in this process (the memo lives in the reader), samples/s each."""
    import shardpack

    data = shardpack.ShardDataset(ds, batch_size=batch, batched=True, seed=1,
                                  trust_storage=trust)
    rates = []
    for epoch in range(2):
        data.set_epoch(epoch)
        t = time.perf_counter()
        n = sum(len(b["__index__"]) for b in data)
        rates.append(n / (time.perf_counter() - t))
    return rates


def same_process(ds: Path, batch: int, epochs: int = 4) -> tuple[float, float]:
    """Epochs after the first, both readers in this one process, alternated: the fairest look
    at what the memo leaves (separate processes differ by 15% run to run here)."""
    import shardpack

    readers = {t: shardpack.ShardDataset(str(ds), batch_size=batch, batched=True, seed=1,
                                         trust_storage=t) for t in (False, True)}
    for data in readers.values():
        for _ in data:  # epoch 1: the memo fills
            pass
    rates = {False: [], True: []}
    for epoch in range(1, epochs + 1):
        for trust in ((False, True) if epoch % 2 else (True, False)):
            data = readers[trust]
            data.set_epoch(epoch)
            t = time.perf_counter()
            n = sum(len(b["__index__"]) for b in data)
            rates[trust].append(n / (time.perf_counter() - t))
    return statistics.median(rates[False]), statistics.median(rates[True])


def memory_rates(ds: Path, reps: int = 3) -> tuple[float, float]:
    """GB/s of hashing the samples of the first shard with the index's hash (xxh3) and of
    copying them (``b"".join`` of 256 at a time, as a bytes-only batch does), best of ``reps``:
    the two passes a first read makes over each sample's bytes."""
    import mmap

    from shardpack import format as fmt
    from shardpack.read.reader import DatasetReader

    reader = DatasetReader(str(ds))
    index = reader.index(0)
    with open(reader.shard_path(0), "rb") as f:
        view = memoryview(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
    starts = index.starts.astype(int).tolist()
    spans = [view[a:b] for a, b in zip(starts[:-1], starts[1:], strict=True)]
    total = sum(len(s) for s in spans)
    best = {"hash": 0.0, "copy": 0.0}
    for _ in range(reps):
        t = time.perf_counter()
        for s in spans:
            fmt.sample_hash(s)
        best["hash"] = max(best["hash"], total / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        for i in range(0, len(spans), 256):
            b"".join(spans[i:i + 256])
        best["copy"] = max(best["copy"], total / (time.perf_counter() - t) / 1e9)
    return best["hash"], best["copy"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", help="an image tree (packed once into SRC-packed-FORMAT)")
    p.add_argument("--format", default="tar", choices=["tar", "msgpack"])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--tiny", type=int, default=0, help="make SRC as N tiny (~1 KB) JPEGs first")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        ds, trust = args.child
        print(*one_run(ds, trust == "1", args.format, args.batch))
        return
    src = Path(args.src)
    if args.tiny and not src.exists():
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_images.py"), str(src),
                        "--count", str(args.tiny), "--tiny"], check=True)
    ds = Path(f"{src}-packed-{args.format}")
    if not (ds / "shardpack.json").exists():
        subprocess.run([sys.executable, "-m", "shardpack.cli", "pack", str(src), str(ds),
                        "--format", args.format, "-q", "--overwrite"], check=True)
    results = {"check": [], "trust": []}
    for rep in range(args.reps):
        for name in (("check", "trust") if rep % 2 == 0 else ("trust", "check")):
            out = subprocess.run([sys.executable, __file__, str(ds), "--format", args.format,
                                  "--batch", str(args.batch), "--child", str(ds),
                                  "1" if name == "trust" else "0"],
                                 capture_output=True, text=True, check=True, cwd=ROOT)
            first, second = map(float, out.stdout.split())
            results[name].append((first, second))
            print(f"rep {rep} {name:5s} epoch 1 {first:,.0f}/s  epoch 2 {second:,.0f}/s",
                  file=sys.stderr)
    print(f"`python tools/bench_check_ab.py {args.src} --format {args.format} --reps "
          f"{args.reps}`, {len(results['check'])} runs each, alternated, median samples/s, "
          f"batched bytes only, num_workers 0, batch {args.batch}:\n")
    print("| | check on (default) | trust_storage=True | ratio |")
    print("|---|---|---|---|")
    for k, label in ((0, "epoch 1 (every sample hashed)"), (1, "epoch 2 (memo)")):
        on = statistics.median(r[k] for r in results["check"])
        off = statistics.median(r[k] for r in results["trust"])
        print(f"| {label} | {on:,.0f} | {off:,.0f} | {on / off:.3f} |")
    on, off = same_process(ds, args.batch)
    print(f"\nBoth readers in one process, epochs 2-5 alternated (memo warm), median samples/s: "
          f"check on {on:,.0f}, trust_storage {off:,.0f}, ratio {on / off:.3f}")
    hashing, copying = memory_rates(ds)
    print(f"\nShard 0, warm: hashing {hashing:.1f} GB/s, copying {copying:.1f} GB/s (best of 3)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
