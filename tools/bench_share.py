"""A billion samples: what one process pays to start an epoch (issue 24).

    .venv/bin/python tools/bench_share.py [--sizes 1e6,1e7,1e8,1e9] [--real] [--write-docs]

1. ``partition.share()`` for world 64 and 8 workers (rank 0, worker 0), shards of 10,000
   samples, with shard affinity (spans = 64, the default) and without (spans = 1): seconds and
   the process's peak RSS, each in a fresh interpreter (peak RSS includes numpy's ~30 MB); the
   whole-epoch computation it replaces (epoch_order + resume_sequences + worker_split) beside it
   up to 1e8 (1e9 would need ~16 GB).
2. Opening a manifest of 100,000 shards (``DatasetReader``; indexes are read lazily).
3. With ``--real``: datasets of 1M and 10M tiny msgpack samples (the 1M one converted from a
   Parquet file; the 10M one is its 10 shards hard-linked 10 times under new names, so real
   shards and indexes with repeated keys), ``ShardDataset(batched=True)`` as rank 0 of 64 in a
   DataLoader with 2 workers: time to the first batch and each worker's peak RSS (VmHWM, shared
   pages of the training process it was forked from included).  Data in /dev/shm.
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import bench_common  # noqa: E402

HEADING = "## A billion samples: each process computes its own share (issue 24)"
WORLD, WORKERS, SHARD = 64, 8, 10_000
DATA = "/dev/shm/shardpack-share"


def _share_case(n: int, spans: int, how: str) -> dict:
    import numpy as np

    from shardpack.order import partition as P

    sizes = [SHARD] * (n // SHARD) + ([n % SHARD] if n % SHARD else [])
    t0 = time.perf_counter()
    if how == "share":
        got = P.share(sizes, seed=1, epoch=3, world=WORLD, rank=0, num_workers=WORKERS,
                      worker=0, batch_size=256, spans=spans)
    else:
        order = P.epoch_order(sizes, seed=1, epoch=3, spans=spans)
        got = P.worker_split(P.resume_sequences(order, [], WORLD)[0], WORKERS, 0, 256)
    secs = time.perf_counter() - t0
    assert len(got) > 0 and np.all(got.ids >= 0)
    return {"s": secs, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "ids": len(got)}


def _sub(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         timeout=3600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT=")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{args}: {out.stderr[-2000:]}")
    return json.loads(lines[-1][7:])


def _manifest_case() -> dict:
    """A manifest of 100,000 shards (fake hashes: only the manifest is read)."""
    from shardpack import format as fmt
    from shardpack.read.reader import DatasetReader

    folder = os.path.join(DATA, "manifest-100k")
    path = os.path.join(folder, fmt.MANIFEST_NAME)
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        src = os.path.join(DATA, "d1m", fmt.MANIFEST_NAME)
        base = json.load(open(src))
        one = base["shards"][0]
        suffix = os.path.splitext(one["name"])[1]
        base["shards"] = [dict(one, name=f"shard-{i:05d}{suffix}", index=f"shard-{i:05d}.idx")
                          for i in range(100_000)]
        for key in ("num_samples",):
            if key in base:
                base[key] = one["samples"] * 100_000
        with open(path, "w") as f:
            json.dump(base, f)
    t0 = time.perf_counter()
    reader = DatasetReader(folder)
    secs = time.perf_counter() - t0
    return {"s": secs, "shards": len(reader.shards), "mb": os.path.getsize(path) / 1e6}


def _real_case(path: str) -> dict:
    from torch.utils.data import DataLoader

    from shardpack import ShardDataset

    t0 = time.perf_counter()
    ds = ShardDataset(path, batch_size=256, batched=True, seed=1, rank=0, world_size=64)
    loader = iter(DataLoader(ds, batch_size=None, num_workers=2))
    next(loader)
    first = time.perf_counter() - t0
    rss = []
    for pid in os.listdir("/proc"):
        try:
            status = open(f"/proc/{pid}/status").read()
        except OSError:
            continue
        if f"PPid:\t{os.getpid()}\n" in status:
            hwm = [ln for ln in status.splitlines() if ln.startswith("VmHWM:")]
            if hwm:
                rss.append(int(hwm[0].split()[1]) / 1024)
    return {"first_s": first, "worker_rss_mb": sorted(rss), "samples": len(ds.reader)}


def _prepare_real() -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardpack import format as fmt

    d1m, d10m = os.path.join(DATA, "d1m"), os.path.join(DATA, "d10m")
    if not os.path.exists(os.path.join(d1m, fmt.MANIFEST_NAME)):
        os.makedirs(DATA, exist_ok=True)
        n = 1_000_000
        rng = np.random.default_rng(0)
        table = pa.table({"__key__": pa.array([f"{i:09d}" for i in range(n)]),
                          "bin": pa.array([b"x" * 16] * n, type=pa.binary()),
                          "cls": pa.array(rng.integers(0, 1000, n))})
        parquet = os.path.join(DATA, "t1m.parquet")
        pq.write_table(table, parquet, row_group_size=100_000)
        shutil.rmtree(d1m, ignore_errors=True)
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "shardpack"), "convert",
                        parquet, d1m, "--format", "msgpack", "--label-column", "cls",
                        "--check", "none", "-q"], check=True)
    if not os.path.exists(os.path.join(d10m, fmt.MANIFEST_NAME)):
        shutil.rmtree(d10m, ignore_errors=True)
        os.makedirs(d10m)
        manifest = json.load(open(os.path.join(d1m, fmt.MANIFEST_NAME)))
        shards = []
        for _ in range(10):
            for entry in manifest["shards"]:
                k = len(shards)
                new = dict(entry, name=f"shard-{k:05d}" + os.path.splitext(entry["name"])[1],
                           index=f"shard-{k:05d}.idx")
                os.link(os.path.join(d1m, entry["name"]), os.path.join(d10m, new["name"]))
                os.link(os.path.join(d1m, entry["index"]), os.path.join(d10m, new["index"]))
                shards.append(new)
        manifest["shards"] = shards
        for key in ("num_samples", "num_bytes"):
            if key in manifest and isinstance(manifest[key], int):
                manifest[key] *= 10
        with open(os.path.join(d10m, fmt.MANIFEST_NAME), "w") as f:
            json.dump(manifest, f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1e6,1e7,1e8,1e9")
    p.add_argument("--real", action="store_true")
    p.add_argument("--write-docs", action="store_true")
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        kind, *rest = json.loads(args.case)
        result = {"share": lambda: _share_case(*rest), "manifest": _manifest_case,
                  "real": lambda: _real_case(*rest)}[kind]()
        print("RESULT=" + json.dumps(result))
        return
    started = time.time()
    rows = ["| samples | spans | share(): s | share(): peak RSS | whole epoch: s | whole epoch: "
            "peak RSS | this worker's samples |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for n in [int(float(x)) for x in args.sizes.split(",")]:
        for spans in (WORLD, 1):
            new = _sub(["--case", json.dumps(["share", n, spans, "share"])])
            old = _sub(["--case", json.dumps(["share", n, spans, "whole"])]) if n <= 10 ** 8 \
                else None
            rows.append(f"| {n:,} | {spans} | {new['s']:.3f} | {new['rss_mb']:.0f} MB | "
                        + (f"{old['s']:.2f} | {old['rss_mb']:.0f} MB" if old else "- | -")
                        + f" | {new['ids']:,} |")
            print(rows[-1], flush=True)
    lines = ["\n".join(rows)]
    if args.real:
        _prepare_real()
        man = _sub(["--case", json.dumps(["manifest"])])
        lines.append(f"Opening a manifest of {man['shards']:,} shards ({man['mb']:.0f} MB of "
                     f"JSON) with `DatasetReader`: **{man['s']:.2f} s** (target: under 1 s).")
        real = ["| dataset | samples | first batch | peak RSS per worker |", "|---|---:|---:|---:|"]
        for name in ("d1m", "d10m"):
            r = _sub(["--case", json.dumps(["real", os.path.join(DATA, name)])])
            real.append(f"| {name} | {r['samples']:,} | {r['first_s']:.2f} s | "
                        f"{' / '.join(f'{x:.0f} MB' for x in r['worker_rss_mb'])} |")
            print(real[-1], flush=True)
        lines.append("\n".join(real))
    machine = bench_common.machine_info(DATA if os.path.isdir(DATA) else ROOT)
    body = (f"`.venv/bin/python tools/bench_share.py --sizes {args.sizes}"
            f"{' --real' if args.real else ''}` ({(time.time() - started) / 60:.1f} min; "
            f"{machine['nproc']} cores, shared and noisy). World {WORLD}, {WORKERS} workers, "
            f"rank 0 worker 0, batch 256, shards of {SHARD:,} samples, each case in a fresh "
            "interpreter (peak RSS includes the interpreter and numpy, ~30 MB).\n\n"
            + "\n\n".join(lines) + "\n")
    print("\n" + body)
    if args.write_docs:
        bench_common.update_section(os.path.join(ROOT, "docs", "benchmarks.md"), HEADING, body)
        print("wrote", HEADING)


if __name__ == "__main__":
    main()
