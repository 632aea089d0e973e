"""Mixing: bytes-only throughput of a 2-source mixture against one dataset of the same
samples."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from benchmarks import common as c
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure

HERE = "benchmarks.suites.mix"


def options(p) -> None:
    """The mix suite's options."""
    p.add_argument("--count", type=int, default=6000, help="~100 KB samples [6000]")
    p.add_argument("--data", type=Path, default=Path("/dev/shm/shardpack-mix"),
                   help="where the datasets go (tmpfs: the page cache cannot drop them) "
                        "[/dev/shm/shardpack-mix; --quick: DATA_DIR/mix]")


def prepare(data: Path, count: int) -> None:
    """COUNT files of 100 KB random bytes in 10 class folders; the first half of the classes
    packed as dataset A, the rest as B, all of them as one dataset AB (64 MB tar shards)."""
    if (data / f"ready-{count}").exists():
        return
    import numpy as np

    import shardpack

    shutil.rmtree(data, ignore_errors=True)
    rng = np.random.default_rng(0)
    for part, classes in (("A", range(0, 5)), ("B", range(5, 10))):
        for k in classes:
            folder = data / "src" / part / f"c{k}"
            folder.mkdir(parents=True)
            for i in range(count // 10):
                (folder / f"{i:05d}.jpg").write_bytes(rng.bytes(100_000))
    for part in ("A", "B"):  # AB: hard links (pack refuses folder links that leave the source)
        for folder in (data / "src" / part).iterdir():
            (data / "src" / "AB" / folder.name).mkdir(parents=True)
            for f in folder.iterdir():
                os.link(f, data / "src" / "AB" / folder.name / f.name)
    for name in ("A", "B", "AB"):
        shardpack.pack(data / "src" / name, data / name, shard_size="64MB", check="none",
                       workers=2)
    shutil.rmtree(data / "src")
    (data / f"ready-{count}").touch()


def epoch(paths: list) -> dict:
    """Child: one epoch of ShardDataset(paths, batched, shuffle) in a DataLoader(2 workers)."""
    from shardpack import ShardDataset
    from torch.utils.data import DataLoader

    target = paths if len(paths) > 1 else paths[0]
    t0 = time.perf_counter()
    ds = ShardDataset(target, batch_size=256, batched=True, shuffle=True, seed=1)
    nbytes = samples = 0
    for batch in DataLoader(ds, batch_size=None, num_workers=2):
        samples += len(batch["__index__"])
        nbytes += int(batch["jpg"].offsets[-1])
    secs = time.perf_counter() - t0
    return {"s": secs, "samples": samples, "mb_s": nbytes / secs / 1e6}


@suite("mix", title="Mixing datasets", options=options, quick=dict(count=300, data=None),
       measures="""MB/s of one bytes-only epoch of `ShardDataset([A, B])` (the default shares:
       each source once per epoch) against one dataset AB holding the same samples: 100 KB
       random samples, 64 MB tar shards on tmpfs, batched, shuffle on, 2 DataLoader workers;
       each epoch in a fresh interpreter, the two alternated, medians.""",
       bounds="""The one-dataset read: a mixture draws the same samples through the same
       path, so the target is to stay within 5% of it.""")
def run_mix(run) -> Outcome:
    """The mix suite."""
    a = run.args
    a.data = a.data or run.data_dir / "mix"
    prepare(a.data, a.count)
    cases = {"one dataset (AB)": [str(a.data / "AB")],
             "mixture [A, B]": [str(a.data / "A"), str(a.data / "B")]}
    results = {name: [] for name in cases}
    for rep in range(run.reps):
        for name in c.rotated(list(cases), rep):
            results[name].append(c.fresh(f"{HERE}:epoch", cases[name]))
            run.log(f"rep {rep} {name:18s} {results[name][-1]['mb_s']:7.0f} MB/s")
    one = c.med(r["mb_s"] for r in results["one dataset (AB)"])
    mix = c.med(r["mb_s"] for r in results["mixture [A, B]"])
    runs = " / ".join(str(round(r["mb_s"])) for r in results["mixture [A, B]"])
    fig = figure("mixture [A, B]", mix, "MB/s", {}, {"one dataset (AB)": one},
                 f"{mix / one:.2f}x one dataset (target >= 0.95x: {c.verdict(mix >= 0.95 * one)});"
                 f" runs {runs}")
    setup = f"{a.count:,} samples of 100 KB random bytes in {a.data}; {run.reps} repetitions."
    return Outcome([fig], setup, raw=results)
