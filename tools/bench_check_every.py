"""What checking every read costs: ``check="every"`` (the default) against ``check="once"`` (the
per-process memo it replaced as the default), epochs after the first (with "once" nothing is
hashed then; with "every" each sample is hashed again).  Both readers live in one process (or
one pair of DataLoaders), warmed by one untimed epoch each, and are read alternately, ``--reps``
epochs each; median samples/s and the ratio.  Not a test; figures go to docs/benchmarks.md.

    python tools/make_images.py bench-data/imagenet-5000 --count 5000
    shardpack pack bench-data/imagenet-5000 bench-data/imagenet-5000-packed
    python tools/bench_check_every.py bench-data/imagenet-5000-packed --reps 5

Three readings: bytes only through the batched path (``batched=True``, no decode, no workers:
the most the check can cost), bytes only sample by sample, and the README's training pipeline
on CPU (``batched=True``, ``CpuDecode(224)``, a DataLoader with 2 persistent workers).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("once", "every")


def _count(item) -> int:
    """Samples in a batch (its ``__index__`` is a tensor), or 1 for a sample."""
    index = item["__index__"]
    return 1 if isinstance(index, int) else len(index)


def cpu_seconds(pids=()) -> float:
    """CPU time of this process and of the processes ``pids`` (DataLoader workers) so far: on a
    shared machine it moves less with the neighbours' load than the wall clock does."""
    total = time.process_time()
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def alternate(make, reps: int, label: str) -> dict:
    """``make(mode)`` -> an iterable with ``set_epoch`` (and ``pids()``, its worker processes);
    one untimed epoch each, then ``reps`` timed epochs each, the two modes alternated (and which
    goes first alternated).  Median samples/s and median CPU seconds an epoch."""
    readers = {mode: make(mode) for mode in MODES}
    for it in readers.values():
        it.set_epoch(0)
        sum(_count(b) for b in it)
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpus: dict[str, list[float]] = {mode: [] for mode in MODES}
    for rep in range(reps):
        for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
            it = readers[mode]
            it.set_epoch(rep + 1)
            pids = it.pids() if hasattr(it, "pids") else ()
            t, c = time.perf_counter(), cpu_seconds(pids)
            n = sum(_count(b) for b in it)
            rates[mode].append(n / (time.perf_counter() - t))
            cpus[mode].append(cpu_seconds(pids) - c)
            print(f"{label} rep {rep} {mode:5s} {rates[mode][-1]:,.0f}/s, "
                  f"{cpus[mode][-1]:.2f} CPU s", file=sys.stderr)
    return {mode: (statistics.median(rates[mode]), statistics.median(cpus[mode]),
                   min(rates[mode]), max(rates[mode])) for mode in MODES}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--only", choices=["batched", "samples", "decode", "pipeline"],
                   default=None)
    args = p.parse_args()

    import shardpack
    from torch.utils.data import DataLoader

    ds = args.dataset
    rows = []
    if args.only in (None, "batched"):
        rows.append(("bytes only, batched", alternate(
            lambda m: shardpack.ShardDataset(ds, batch_size=args.batch, batched=True, seed=1,
                                             check=m), args.reps, "batched")))
    if args.only in (None, "samples"):
        rows.append(("bytes only, sample by sample", alternate(
            lambda m: shardpack.ShardDataset(ds, seed=1, check=m), args.reps, "samples")))
    def decoding(mode):
        return shardpack.ShardDataset(ds, batch_size=args.batch, batched=True, seed=1,
                                      check=mode,
                                      decode=shardpack.CpuDecode(224, on_error="skip"))

    if args.only in (None, "decode"):
        rows.append(("CpuDecode(224), no workers", alternate(decoding, args.reps, "decode")))
    if args.only in (None, "pipeline"):
        class Loader:  # the README's DataLoader; its epoch is set through its dataset
            def __init__(self, mode):
                self.ds = decoding(mode)
                self.loader = DataLoader(self.ds, batch_size=None, num_workers=args.workers,
                                         persistent_workers=True)
                self.it = None

            def set_epoch(self, epoch):
                self.ds.set_epoch(epoch)

            def pids(self):
                return [w.pid for w in self.it._workers] if self.it is not None else []

            def __iter__(self):
                self.it = iter(self.loader)
                return self.it

        rows.append((f"CpuDecode(224), {args.workers} workers", alternate(
            Loader, args.reps, "pipeline")))
    print(f"\n`python tools/bench_check_every.py {ds} --reps {args.reps}`: median samples/s "
          f"(lowest-highest) of {args.reps} epochs each after a warm-up epoch, alternated, batch "
          f"{args.batch}; CPU: median CPU seconds an epoch, workers included\n")
    print('| reading | check="once" | check="every" (default) | ratio | CPU "once" | '
          'CPU "every" | CPU ratio |')
    print("|---|---|---|---|---|---|---|")
    for label, r in rows:
        (once, once_cpu, lo1, hi1), (every, every_cpu, lo2, hi2) = r["once"], r["every"]
        print(f"| {label} | {once:,.0f} ({lo1:,.0f}-{hi1:,.0f}) | {every:,.0f} "
              f"({lo2:,.0f}-{hi2:,.0f}) | {every / once:.3f} | {once_cpu:.2f} | "
              f"{every_cpu:.2f} | {every_cpu / once_cpu:.3f} |")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
