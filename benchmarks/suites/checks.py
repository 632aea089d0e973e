"""What checking every read costs: ``check="every"`` (the default) against ``check="once"``, read
after read, bytes only and in the README's decode pipeline."""

from __future__ import annotations

import os
import statistics
import sys
import time

from benchmarks import common as c
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure

MODES = ("once", "every")
READINGS = ("batched", "samples", "decode", "pipeline")


def options(p) -> None:
    """The checks suite's options."""
    p.add_argument("--images", type=int, default=5000, help="100 KB JPEGs [5000]")
    p.add_argument("--dataset", default=None, help="a packed dataset to use instead")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--only", choices=READINGS, default=None, help="one reading only")


def _count(item) -> int:
    """Samples in a batch (its ``__index__`` is a tensor), or 1 for a sample."""
    index = item["__index__"]
    return 1 if isinstance(index, int) else len(index)


def alternate(make, reps: int, label: str) -> dict:
    """``make(mode)`` -> an iterable with ``set_epoch`` (and ``pids()``, its worker processes);
    one untimed epoch each, then ``reps`` timed epochs each, the two modes alternated (and which
    goes first alternated). Median samples/s, lowest, highest, median CPU seconds an epoch (the
    workers' included: on a shared machine it moves less with the neighbours than the clock)."""
    readers = {mode: make(mode) for mode in MODES}
    for it in readers.values():
        it.set_epoch(0)
        sum(_count(b) for b in it)
    rates = {mode: [] for mode in MODES}
    cpus = {mode: [] for mode in MODES}
    for rep in range(reps):
        for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
            it = readers[mode]
            it.set_epoch(rep + 1)
            pids = it.pids() if hasattr(it, "pids") else ()
            t, cpu = time.perf_counter(), time.process_time() + c.process_cpu(pids)
            n = sum(_count(b) for b in it)
            rates[mode].append(n / (time.perf_counter() - t))
            cpus[mode].append(time.process_time() + c.process_cpu(pids) - cpu)
            print(f"{label} rep {rep} {mode:5s} {rates[mode][-1]:,.0f}/s", file=sys.stderr)
    return {mode: dict(rate=statistics.median(rates[mode]), cpu=statistics.median(cpus[mode]),
                       lo=min(rates[mode]), hi=max(rates[mode])) for mode in MODES}


class Pipeline:
    """The README's DataLoader (2 persistent workers); its epoch is set through its dataset."""

    def __init__(self, ds, workers):
        from torch.utils.data import DataLoader
        self.ds, self.it = ds, None
        self.loader = DataLoader(ds, batch_size=None, num_workers=workers,
                                 persistent_workers=True)

    def set_epoch(self, epoch):
        """Set the dataset's epoch."""
        self.ds.set_epoch(epoch)

    def pids(self):
        """The worker processes (for their CPU time)."""
        return [w.pid for w in self.it._workers] if self.it is not None else []

    def __iter__(self):
        self.it = iter(self.loader)
        return self.it


def measure(ds: str, reps: int, batch: int, workers: int, only) -> list:
    """Child: every reading, both modes alternated in this one process; [(reading, medians)]."""
    import shardpack

    def decoding(mode):
        return shardpack.ShardDataset(ds, batch_size=batch, batched=True, seed=1, check=mode,
                                      decode=shardpack.CpuDecode(224, on_error="skip"))
    makers = {
        "batched": ("bytes only, batched, no workers", lambda m: shardpack.ShardDataset(
            ds, batch_size=batch, batched=True, seed=1, check=m)),
        "samples": ("bytes only, sample by sample", lambda m: shardpack.ShardDataset(
            ds, seed=1, check=m)),
        "decode": ("CpuDecode(224), batched, no workers", decoding),
        "pipeline": (f"CpuDecode(224), batched, DataLoader {workers} workers",
                     lambda m: Pipeline(decoding(m), workers)),
    }
    return [(label, alternate(make, reps, key)) for key, (label, make) in makers.items()
            if only in (None, key)]


@suite("checks", title="Sample checks on every read", options=options,
       quick=dict(images=200),
       measures="""Samples per second of `check="every"` (the default: each sample hashed every
       time it is read) against `check="once"` (a per-process memo: epochs after the first
       hash nothing), epochs after an untimed warm-up epoch, both readers in one process and
       read alternately; bytes only through the batched path (no workers: the most the check
       can cost), sample by sample, and the README's pipeline (`CpuDecode(224)`, a DataLoader
       with 2 workers). Also the CPU seconds an epoch (workers included).""",
       bounds="""The hash is one more pass over every byte: ~12 us for a 100 KB sample in the
       batched path, ~3 us sample by sample (the copy that follows finds the bytes in cache).
       In the training pipeline a 224 px decode costs ~2 ms of CPU a sample, so the check is
       inside the run-to-run spread there; bytes only it takes a third of the batched
       throughput.""")
def run_checks(run) -> Outcome:
    """The checks suite: one child process, both modes alternated in it."""
    a = run.args
    if a.dataset:
        ds, what = a.dataset, a.dataset
    else:
        src, gen = c.ensure_images(run.data_dir, a.images)
        ds = str(c.ensure_pack(src, run.data_dir / "checks" / f"img{a.images}-tar"))
        what = f"{a.images:,} JPEGs (`{gen}`), packed with `shardpack pack`"
    c.warm(c.files_under(ds))
    rows = c.fresh("benchmarks.suites.checks:measure", ds, run.reps, a.batch, a.workers, a.only,
                   timeout=3600)
    figures = []
    for label, r in rows:
        once, every = r["once"], r["every"]
        figures.append(figure(
            label, every["rate"], "samples/s", {}, {'check="once"': once["rate"]},
            f"{every['rate'] / once['rate']:.3f}x; CPU an epoch {every['cpu']:.2f} s against "
            f"{once['cpu']:.2f} s ({every['cpu'] / once['cpu']:.3f}x); runs "
            f"{every['lo']:,.0f}-{every['hi']:,.0f}"))
    setup = (f"{what}; page cache warm; batch {a.batch}; {run.reps} epochs a mode after one "
             f"untimed epoch each, alternated; {os.cpu_count()} CPUs.")
    return Outcome(figures, setup, raw={"rows": rows})
