"""Decode in the loader against its own ceiling (issue 4): is the loader the bottleneck?

    python tools/bench_decode.py [--data bench-data/peers/imagenet-5000/shardpack-tar] [--reps 3]

Two contenders, alternating within each repetition, medians reported:
* ceiling: `CpuDecode` itself in a tight loop, 2 processes, each decoding half of the epoch's
  batches (raw bytes gathered beforehand, so no reading, no transport; outputs in reused slots
  as in the loader).
* loader: `ShardDataset(batched=True, decode=CpuDecode(...))` + `DataLoader(num_workers=2,
  persistent_workers=True)`, 2 epochs; the 2nd epoch and the rate after the 1st batch of the 1st
  epoch are reported, with the time to the first batch.
Same images, batch 256, output 224 px, training crops.  Each measurement runs in a fresh process.
Writes the "## Decode: loader vs its own ceiling" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))
from bench_common import machine_info, update_section, warm  # noqa: E402

BATCH, WORKERS, SIZE = 256, 2, 224
HEADING = "## Decode: loader vs its own ceiling"


def ceiling(path):
    import multiprocessing as mp

    import shardpack
    from shardpack.loader.batches import Batch
    from shardpack.loader.gather import gather_batch
    from shardpack.loader.buffers import SlotPool

    ds = shardpack.ShardDataset(path, batch_size=BATCH, batched=True, shuffle=True)
    share = ds._share(ds._placement(), 0, [])
    batches = [gather_batch(ds.reader, share.ids[s:s + BATCH], share.repeat[s:s + BATCH])
               for s in range(0, len(share), BATCH)]
    decode = shardpack.CpuDecode(SIZE)
    # outputs go into reused slots, as in the loader's workers: the ceiling does not pay for
    # fresh output pages either (a fresh 38.5 MB buffer per batch costs ~10% here)
    pool = SlotPool.create()
    ready, go = mp.get_context("fork").Barrier(WORKERS + 1), mp.get_context("fork").Event()
    out = mp.get_context("fork").Queue()

    def run(worker):
        mine = batches[worker::WORKERS]
        ready.wait()
        go.wait()
        t, n = time.perf_counter(), 0
        for b in mine:
            batch = Batch(b)
            batch.pool = pool
            n += len(decode(batch)["image"])
        out.put((n, time.perf_counter() - t))

    procs = [mp.get_context("fork").Process(target=run, args=(w,)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    ready.wait()
    go.set()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return dict(rate=sum(n for n, _ in results) / max(s for _, s in results))


def loader(path):
    from torch.utils.data import DataLoader

    import shardpack

    t0 = time.perf_counter()
    ds = shardpack.ShardDataset(path, batch_size=BATCH, batched=True, shuffle=True,
                                decode=shardpack.CpuDecode(SIZE))
    dl = DataLoader(ds, batch_size=None, num_workers=WORKERS, persistent_workers=True)
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        start = t0 if epoch == 0 else time.perf_counter()
        first, n, n_first = None, 0, 0
        for b in dl:
            n += len(b["image"])
            if first is None:
                first, n_first = time.perf_counter(), n
        end = time.perf_counter()
        epochs.append(dict(seconds=end - start, first=first - start, n=n,
                           after_first=(n - n_first) / (end - first)))
    return dict(rate=epochs[1]["n"] / epochs[1]["seconds"], ttfb=epochs[0]["first"],
                after_first=epochs[0]["after_first"], first_epoch=epochs[0]["n"] /
                epochs[0]["seconds"])


def child(kind, path):
    out = subprocess.run([sys.executable, __file__, "--one", kind, path], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "bench-data", "peers", "imagenet-5000",
                                                   "shardpack-tar"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        kind, path = args.one
        return print(json.dumps((ceiling if kind == "ceiling" else loader)(path)))
    if not os.path.exists(os.path.join(args.data, "shardpack.json")):
        raise SystemExit(f"{args.data}: no packed dataset; run tools/bench_peers.py first, or "
                         "pack one with `shardpack pack SRC OUT` and pass --data OUT")
    warm([os.path.join(args.data, f) for f in os.listdir(args.data)])
    runs = {"ceiling": [], "loader": []}
    for rep in range(args.reps):
        for kind in (("ceiling", "loader") if rep % 2 == 0 else ("loader", "ceiling")):
            r = child(kind, args.data)
            runs[kind].append(r)
            print(f"rep {rep} {kind:8s} {r['rate']:7.0f} images/s"
                  + (f", after 1st batch {r['after_first']:.0f}/s, 1st batch {r['ttfb']:.2f} s"
                     if kind == "loader" else ""), flush=True)
    med = statistics.median
    ceil = med(r["rate"] for r in runs["ceiling"])
    steady = med(r["rate"] for r in runs["loader"])
    after = med(r["after_first"] for r in runs["loader"])
    ttfb = med(r["ttfb"] for r in runs["loader"])
    m = machine_info(args.data)
    cmd = shlex.join(["python", "tools/bench_decode.py"] + [a for a in sys.argv[1:]])
    body = [
        f"Command: `{cmd}` ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC). Machine: "
        f"{m['nproc']} CPUs ({m['cpu']}), Linux {m['kernel']}, Python {m['python']}; shared and "
        "noisy. Data: 5,000 generated JPEGs of ~100 KB (tools/make_images.py), packed as tar.",
        "",
        f"`CpuDecode({SIZE})` (training crops), batch {BATCH}, {WORKERS} workers / processes, warm "
        f"page cache, {args.reps} repetitions alternating, medians. Ceiling: the decode function "
        "alone in a tight loop in 2 processes over pre-gathered batches, writing into reused "
        "output slots as the loader does. Loader: ShardDataset + "
        "DataLoader (persistent workers), 2nd epoch.",
        "",
        "| measure | images/s | vs ceiling | runs |",
        "|---|---:|---:|---|",
        f"| ceiling: CpuDecode, 2 processes | {ceil:,.0f} | 1.00x | "
        + ", ".join(f"{r['rate']:,.0f}" for r in runs["ceiling"]) + " |",
        f"| loader, 2nd epoch | {steady:,.0f} | {steady / ceil:.2f}x | "
        + ", ".join(f"{r['rate']:,.0f}" for r in runs["loader"]) + " |",
        f"| loader, 1st epoch after its 1st batch | {after:,.0f} | {after / ceil:.2f}x | "
        + ", ".join(f"{r['after_first']:,.0f}" for r in runs["loader"]) + " |",
        "",
        f"Time to the first decoded batch (dataset construction to batch): {ttfb:.2f} s (median; "
        + ", ".join(f"{r['ttfb']:.2f}" for r in runs["loader"]) + ").",
        "",
        "| target (issue 4) | measured | result |",
        "|---|---|---|",
        f"| loader >= 95% of its decode ceiling | {steady / ceil:.0%} | "
        f"{'pass' if steady >= 0.95 * ceil else 'FAIL'} |",
        f"| >= 1,000 images/s on 2 cores, steady | {steady:,.0f} | "
        f"{'pass' if steady >= 1000 else 'FAIL'} |",
        f"| startup (first batch) < 1 s | {ttfb:.2f} s | {'pass' if ttfb < 1 else 'FAIL'} |",
    ]
    if args.out:
        update_section(args.out, HEADING, "\n".join(body))
    print("\n".join(body))


if __name__ == "__main__":
    main()
