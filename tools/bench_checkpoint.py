"""Checkpoint cost in the training example: step time with no save, a synchronous save and
--async-save, on CPU, with a model whose state is realistic (tools/train_example.py --model wide:
50.5M parameters, ~202 MB, plus Adam's two moments: ~606 MB a checkpoint).

    .venv/bin/python tools/bench_checkpoint.py [--reps 2] [--steps 30] [--every 6] [--write-docs]

Each run is tools/train_example.py in a fresh process on a small generated dataset (tiny JPEGs,
crops of 32 px, batch 32, 1 worker), checkpoints into bench-data/ckpt/ on the disk (fsync'd, as
the example does).  Modes alternate within each repetition; medians over everything.  Reported:
the median step without a save, the mean step over the run (stalls and the background write's
competition for the CPU included), the stall a save puts in the loop, and the save's wall time.
"""
import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import bench_common  # noqa: E402

HEADING = "## Checkpoints that don't stall training"
MODES = {"no save": ["--save-every-steps", "0", "--keep", "1"],
         "synchronous save": [],
         "--async-save": ["--async-save"]}


def dataset(data: Path) -> Path:
    ds = data / "ds"
    if not (ds / "manifest.json").exists():
        import importlib.util

        import shardpack

        spec = importlib.util.spec_from_file_location("make_images", ROOT / "tools" /
                                                      "make_images.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        shutil.rmtree(data, ignore_errors=True)
        mod.make_images(data / "img", 2000, classes=10, workers=2, tiny=True)
        shardpack.pack(data / "img", ds, workers=1)
    return ds


def run(ds: Path, out: Path, mode: str, steps: int, every: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    stats = out.parent / f"{out.name}.json"
    save = MODES[mode] or []
    cmd = [sys.executable, str(ROOT / "tools" / "train_example.py"), str(ds), "--out", str(out),
           "--model", "wide", "--optimizer", "adam", "--lr", "1e-4", "--batch-size", "32",
           "--size", "32", "--workers", "1", "--epochs", "100", "--max-steps", str(steps),
           "--save-every-steps", str(every), "--keep", "2", "--stats-json", str(stats), *save]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{mode}: {done.stdout[-2000:]} {done.stderr[-2000:]}")
    result = json.loads(stats.read_text())
    ckpt = sorted(out.glob("checkpoint-*.pt"))
    result["bytes"] = ckpt[-1].stat().st_size if ckpt else 0
    shutil.rmtree(out, ignore_errors=True)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--every", type=int, default=6, help="save every this many steps")
    p.add_argument("--data", type=Path, default=ROOT / "bench-data" / "ckpt")
    p.add_argument("--write-docs", action="store_true")
    args = p.parse_args()
    ds = dataset(args.data)
    started = time.time()
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    for rep in range(args.reps):
        for mode in MODES:
            r = run(ds, args.data / "run", mode, args.steps, args.every)
            results[mode].append(r)
            print(f"rep {rep + 1} {mode:17s} mean step {1000 * statistics.mean(r['steps'][2:]):.0f}"
                  f" ms, stalls {[round(1000 * s) for s in r['stall_s']]} ms, writes "
                  f"{[round(w, 2) for w in r['write_s']]} s", flush=True)
    rows = ["| mode | median step without a save | mean step (whole run) | stall per save "
            "(median) | save wall time (median) | checkpoint |", "|---|---:|---:|---:|---:|---:|"]
    base = None
    for mode, runs in results.items():
        steps = [s for r in runs for s in r["steps"][2:]]  # the first two: start-up
        saves = {i for i in range(len(runs[0]["steps"])) if (i + 1) % args.every == 0}
        quiet = [s for r in runs for i, s in enumerate(r["steps"]) if i >= 2 and i not in saves]
        mean = statistics.mean(steps)
        base = base or mean
        saving = mode != "no save"  # (that one saves once, after its last step)
        stalls = [s for r in runs for s in r["stall_s"]] if saving else []
        writes = [w for r in runs for w in r["write_s"]] if saving else []
        rows.append(f"| {mode} | {1000 * statistics.median(quiet):.0f} ms | {1000 * mean:.0f} ms "
                    f"({mean / base:.2f}x) | "
                    f"{f'{1000 * statistics.median(stalls):.0f} ms' if stalls else '-'} | "
                    f"{f'{statistics.median(writes):.2f} s' if writes and stalls else '-'} | "
                    f"{runs[0]['bytes'] / 1e6:.0f} MB |")
    machine = bench_common.machine_info(str(args.data))
    body = (f"`.venv/bin/python tools/bench_checkpoint.py --reps {args.reps} --steps {args.steps} "
            f"--every {args.every}` ({(time.time() - started) / 60:.1f} min; {machine['nproc']} "
            f"cores, {machine['fs']}, shared and noisy). A save every {args.every} steps, "
            f"{args.steps} steps a run, {args.reps} runs a mode, alternating.\n\n"
            + "\n".join(rows) + "\n")
    print("\n" + body)
    if args.write_docs:
        md = ROOT / "docs" / "device.md"
        text = md.read_text()
        start = text.index("### Measured", text.index(HEADING))
        end = text.find("\n## ", start)
        end = len(text) if end < 0 else end
        md.write_text(text[:start] + "### Measured\n\n" + body + text[end:])
        print("wrote", HEADING, "/ Measured in docs/device.md")


if __name__ == "__main__":
    main()
