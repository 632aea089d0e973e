"""Checkpoints in the training example: step time with no save, a synchronous save and
``--async-save``, on CPU, with a model whose state is realistic."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys

from benchmarks import common as c
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure

TRAIN = c.ROOT / "examples" / "train_example.py"
MODES = {"no save": ["--save-every-steps", "0", "--keep", "1"],
         "synchronous save": [],
         "--async-save": ["--async-save"]}


def options(p) -> None:
    """The checkpoint suite's options."""
    p.add_argument("--steps", type=int, default=30, help="steps a run [30]")
    p.add_argument("--every", type=int, default=6, help="save every this many steps [6]")
    p.add_argument("--model", default="wide", help="train_example.py's --model [wide: 50.5M "
                   "parameters, ~606 MB a checkpoint with Adam's moments]")


def one_run(run, ds, mode) -> dict:
    """examples/train_example.py in a fresh process; its step and save timings."""
    a = run.args
    out = run.data_dir / "ckpt" / "run"
    shutil.rmtree(out, ignore_errors=True)
    stats = out.parent / "run.json"
    cmd = [sys.executable, str(TRAIN), str(ds), "--out", str(out), "--model", a.model,
           "--optimizer", "adam", "--lr", "1e-4", "--batch-size", "32", "--size", "32",
           "--workers", "1", "--epochs", "100", "--max-steps", str(a.steps),
           "--save-every-steps", str(a.every), "--keep", "2", "--stats-json", str(stats),
           *MODES[mode]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=c.child_env())
    if done.returncode != 0:
        raise RuntimeError(f"{mode}: {done.stdout[-2000:]} {done.stderr[-2000:]}")
    result = json.loads(stats.read_text())
    ckpt = sorted(out.glob("checkpoint-*.pt"))
    result["bytes"] = ckpt[-1].stat().st_size if ckpt else 0
    shutil.rmtree(out, ignore_errors=True)
    return result


@suite("checkpoint", title="Checkpoints that don't stall training", options=options,
       quick=dict(steps=6, every=3, model="small"),
       measures="""Step time of examples/train_example.py on CPU (2,000 tiny generated JPEGs, crops
       of 32 px, batch 32, 1 worker, Adam) with no save, a synchronous save and `--async-save`,
       a save every 6 steps into the data folder on disk (fsync'd, as the example does); each
       run a fresh process, modes alternated. The figure is the mean step over the run (the
       first two left out: start-up), stalls and the background write's competition for the
       CPU included; the note has the stall a save puts in the loop and the save's wall time.""",
       bounds="""The copy of the state to CPU memory is the only stall `--async-save` keeps
       (~30 ms for ~600 MB here); the background write then competes for the same 2 cores as
       the steps, so the mean step still grows. A synchronous save stalls the loop for the
       whole write (~1.6 s).""")
def run_checkpoint(run) -> Outcome:
    """The checkpoint suite."""
    src, _ = c.ensure_images(run.data_dir, 2000, tiny=True)
    ds = c.ensure_pack(src, run.data_dir / "ckpt" / "ds", "--workers", 1)
    results = {m: [] for m in MODES}
    for rep in range(run.reps):
        for mode in MODES:
            results[mode].append(one_run(run, ds, mode))
            run.log(f"rep {rep} {mode}")
    figures, base = [], None
    for mode, runs in results.items():
        steps = [s for r in runs for s in r["steps"][2:]]  # the first two: start-up
        saves = {i for i in range(len(runs[0]["steps"])) if (i + 1) % run.args.every == 0}
        quiet = [s for r in runs for i, s in enumerate(r["steps"]) if i >= 2 and i not in saves]
        mean = statistics.mean(steps)
        base = base or mean
        saving = mode != "no save"  # (that one saves once, after its last step)
        stalls = [s for r in runs for s in r["stall_s"]] if saving else []
        writes = [w for r in runs for w in r["write_s"]] if saving else []
        note = (f"{mean / base:.2f}x no save; median step without a save "
                f"{1000 * statistics.median(quiet):.0f} ms; checkpoint "
                f"{runs[0]['bytes'] / 1e6:.0f} MB")
        if stalls:
            note += (f"; stall per save {1000 * statistics.median(stalls):.0f} ms; save wall "
                     f"time {statistics.median(writes):.2f} s")
        figures.append(figure(f"{mode}: mean step", 1000 * mean, "ms", {},
                              {"no save": 1000 * base} if saving else {}, note))
    setup = (f"A save every {run.args.every} steps, {run.args.steps} steps a run, {run.reps} "
             f"runs a mode, --model {run.args.model}.")
    return Outcome(figures, setup, raw=results)
