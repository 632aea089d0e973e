"""Bytes-only throughput of a 2-source mixture against one dataset of the same total size.

    .venv/bin/python tools/bench_mix.py [--count 6000] [--reps 5] [--data DIR] [--write-docs]

Data (kept in DIR, default /dev/shm/shardpack-mix so the page cache cannot drop it): COUNT files
of ~100 KB random bytes in 10 class folders; the first half of the classes packed as dataset A,
the rest as B, all of them as one dataset AB (64 MB tar shards).  Each epoch: ShardDataset(...,
batch_size=256, batched=True, shuffle=True) in DataLoader(batch_size=None, num_workers=2), bytes
only; the mixture is ShardDataset([A, B]) (default shares: each source once, the same samples as
AB).  Cases alternate within each repetition, each in a fresh interpreter; medians reported.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import bench_common  # noqa: E402

HEADING = "## Mixing datasets (issue 21)"


def prepare(data: str, count: int) -> None:
    if os.path.exists(os.path.join(data, f"ready-{count}")):
        return
    import numpy as np

    import shardpack

    shutil.rmtree(data, ignore_errors=True)
    rng = np.random.default_rng(0)
    for part, classes in (("A", range(0, 5)), ("B", range(5, 10))):
        for c in classes:
            folder = os.path.join(data, "src", part, f"c{c}")
            os.makedirs(folder)
            for i in range(count // 10):
                with open(os.path.join(folder, f"{i:05d}.jpg"), "wb") as f:
                    f.write(rng.bytes(100_000))
    both = os.path.join(data, "src", "AB")
    os.makedirs(both)
    for part in ("A", "B"):
        for c in os.listdir(os.path.join(data, "src", part)):
            os.symlink(os.path.join(data, "src", part, c), os.path.join(both, c))
    for name in ("A", "B", "AB"):
        shardpack.pack(os.path.join(data, "src", name), os.path.join(data, name),
                       shard_size="64MB", check="none", workers=2)
    shutil.rmtree(os.path.join(data, "src"))
    open(os.path.join(data, f"ready-{count}"), "w").close()


def epoch(paths: list[str]) -> dict:
    from torch.utils.data import DataLoader

    from shardpack import ShardDataset

    target = paths if len(paths) > 1 else paths[0]
    t0 = time.perf_counter()
    ds = ShardDataset(target, batch_size=256, batched=True, shuffle=True, seed=1)
    nbytes = samples = 0
    for batch in DataLoader(ds, batch_size=None, num_workers=2):
        samples += len(batch["__index__"])
        nbytes += int(batch["jpg"].offsets[-1])
    secs = time.perf_counter() - t0
    return {"s": secs, "samples": samples, "mb_s": nbytes / secs / 1e6}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=6000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--data", default="/dev/shm/shardpack-mix")
    p.add_argument("--write-docs", action="store_true")
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        print("RESULT=" + json.dumps(epoch(json.loads(args.case))))
        return
    prepare(args.data, args.count)
    cases = {"one dataset (AB)": [os.path.join(args.data, "AB")],
             "mixture [A, B]": [os.path.join(args.data, "A"), os.path.join(args.data, "B")]}
    results = {name: [] for name in cases}
    started = time.time()
    for rep in range(args.reps):
        for name, paths in cases.items():
            out = subprocess.run([sys.executable, __file__, "--case", json.dumps(paths)],
                                 capture_output=True, text=True, check=True)
            r = json.loads([ln for ln in out.stdout.splitlines()
                            if ln.startswith("RESULT=")][-1][7:])
            results[name].append(r)
            print(f"rep {rep + 1} {name:18s} {r['mb_s']:7.0f} MB/s {r['samples']} samples",
                  flush=True)
    med = {n: statistics.median(r["mb_s"] for r in rs) for n, rs in results.items()}
    one, mix = med["one dataset (AB)"], med["mixture [A, B]"]
    rows = ["| case | MB/s (median) | per repetition |", "|---|---:|---|"]
    for name, rs in results.items():
        rows.append(f"| {name} | {med[name]:.0f} | "
                    f"{' / '.join(str(round(r['mb_s'])) for r in rs)} |")
    machine = bench_common.machine_info(args.data)
    body = (f"`.venv/bin/python tools/bench_mix.py --count {args.count} --reps {args.reps}` "
            f"({(time.time() - started) / 60:.1f} min; {machine['nproc']} cores, data on "
            f"{machine['fs']}; shared and noisy). {args.count} samples of ~100 KB random bytes, "
            "64 MB tar shards; bytes only, batched, shuffle on, 2 workers; the mixture takes "
            "each source once per epoch, so both cases read the same samples.\n\n"
            + "\n".join(rows) + f"\n\nMixture / one dataset: **{mix / one:.2f}x** "
            "(target: 0.95x or more).\n")
    print("\n" + body)
    if args.write_docs:
        bench_common.update_section(os.path.join(ROOT, "docs", "benchmarks.md"), HEADING, body)
        print("wrote", HEADING)


if __name__ == "__main__":
    main()
