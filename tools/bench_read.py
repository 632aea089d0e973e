#!/usr/bin/env python3
"""Reading benchmark: shardpack vs WebDataset (same tar shards) vs raw files, bytes only; time to
first batch on 1M samples; shuffle quality. Writes the "## Reading" section of docs/benchmarks.md.

    python tools/bench_read.py [--reps 3] [--skip-tiny] [--skip-1m] [--out docs/benchmarks.md]

Data lives in bench-data/ (trees reused when `.done` exists, packs when shardpack.json exists).
"""
import argparse
import datetime
import importlib.metadata as md
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "bench-data")
READ = os.path.join(DATA, "read")
SHARDPACK = os.path.join(os.path.dirname(sys.executable), "shardpack")
BATCH, WORKERS, WDS_BUFFER = 256, 2, 1000
HEADING = "## Reading"
TARGETS = {"img": 10_000, "tiny": 300_000, "ttfb": 1.0}
METHOD = f"""Method: bytes only (no decode), batch {BATCH}, {WORKERS} DataLoader workers, shuffling
on, page cache warm (every file read once before the first run). Each run is a fresh process doing
2 full epochs with persistent workers: **samples/s and MB/s are the 2nd epoch** (steady state);
*1st epoch samples/s* and *time to 1st batch* count from constructing the dataset and loader.
Contenders alternate within each of the {{reps}} repetitions (rotated order); figures are medians.
Before each run the script waits (up to 60 s) for a moment when other processes use < 15% of the
CPUs, and it records their share during the run (in parentheses). MB/s counts `jpg` bytes.
WebDataset reads the shardpack tar shards unchanged, in the faster of two configurations in a
quick A/B here (batching in the pipeline beat `DataLoader(batch_size=256)` on 100 KB, tied on 1 KB):
`WebDataset(shards, shardshuffle=100, nodesplitter=single_node_only,
workersplitter=split_by_worker, empty_check=False).shuffle({WDS_BUFFER}).to_tuple("jpg", "cls")
.batched({BATCH})`, loader `batch_size=None`. Raw files: map-style Dataset, `open().read()` per
file, `DataLoader(shuffle=True)`, collate to a list of bytes.
"""
QUALITY_NOTE = f"""From the packed position of each sample (found from its key) in the order the
loader yields one epoch, over its batches of {BATCH}: the mean |position difference| of consecutive
samples within a batch divided by N (random order: about 1/3), the mean number of distinct shards
per batch, and the fraction of batches drawn from a single shard. With workers, WebDataset gives
each worker whole shards and the loader alternates between workers' batches; shardpack's order is
the same for any worker count.
"""


# ------------------------------------------------------------------ loaders (child process side)
def tar_urls(path):
    with open(os.path.join(path, "shardpack.json")) as f:
        return [os.path.join(path, s["name"]) for s in json.load(f)["shards"]]


class RawFiles(torch.utils.data.Dataset):
    """Map-style dataset over an ImageFolder tree: item i is (file bytes, class index)."""

    def __init__(self, root):
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.items = [(os.path.join(root, c, f), ci) for ci, c in enumerate(classes)
                      for f in sorted(os.listdir(os.path.join(root, c)))]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, ci = self.items[i]
        with open(path, "rb") as f:
            return f.read(), ci


class Replay(torch.utils.data.IterableDataset):
    """One batch yielded `count` times in all, spread over the workers: the DataLoader alone."""

    def __init__(self, batch, count):
        super().__init__()
        self.batch, self.count = batch, count

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        mine = range(self.count)[info.id::info.num_workers] if info else range(self.count)
        return (self.batch for _ in mine)


def collate_raw(samples):
    return [s[0] for s in samples], [s[1] for s in samples]


def wds_pipeline(path):
    import webdataset as wds
    # empty_check=False: with 1 shard and 2 workers, worker 1 legitimately gets no shard
    return wds.WebDataset(tar_urls(path), shardshuffle=100, seed=0,
                          nodesplitter=wds.single_node_only, workersplitter=wds.split_by_worker,
                          empty_check=False).shuffle(WDS_BUFFER, seed=0)


def make_loader(kind, path):
    """(dataset, loader, count) for one contender; count(batch) -> (samples, jpg bytes)."""
    common = dict(num_workers=WORKERS, persistent_workers=True)
    if kind in ("sp-batched", "sp-sample", "replay"):
        import shardpack
        ds = shardpack.ShardDataset(path, batch_size=BATCH, batched=kind != "sp-sample",
                                    shuffle=True, seed=0)
        if kind == "replay":  # transport only: a real batch of this dataset, over and over
            ds = Replay(next(iter(ds)), len(ds) // BATCH)
        loader = DataLoader(ds, batch_size=BATCH, collate_fn=shardpack.collate, **common) \
            if kind == "sp-sample" else DataLoader(ds, batch_size=None, **common)
        return ds, loader, lambda b: (len(b["cls"]), b["jpg"].data.numel())
    if kind == "wds":  # batched inside the workers; the loader only transports
        loader = DataLoader(wds_pipeline(path).to_tuple("jpg", "cls").batched(BATCH),
                            batch_size=None, **common)
    elif kind == "raw":
        loader = DataLoader(RawFiles(path), batch_size=BATCH, shuffle=True,
                            collate_fn=collate_raw, **common)
    else:
        raise SystemExit(f"unknown contender kind {kind!r}")
    return None, loader, lambda b: (len(b[0]), sum(map(len, b[0])))


def run_one(kind, path, epochs=2):
    """Time `epochs` full passes; epoch 0 starts before the dataset is constructed."""
    t0 = time.perf_counter()
    ds, loader, count = make_loader(kind, path)
    out = []
    for epoch in range(epochs):
        if hasattr(ds, "set_epoch"):
            ds.set_epoch(epoch)
        start, first, n, nbytes = (t0 if epoch == 0 else time.perf_counter()), None, 0, 0
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            k, b = count(batch)
            n, nbytes = n + k, nbytes + b
        out.append(dict(seconds=time.perf_counter() - start, first=first, n=n, bytes=nbytes))
    return out


def run_ttfb(path):
    """Seconds from constructing ShardDataset + DataLoader to the first batch (imports done)."""
    import shardpack
    t0 = time.perf_counter()
    ds = shardpack.ShardDataset(path, batch_size=BATCH, batched=True, shuffle=True, seed=0)
    next(iter(DataLoader(ds, batch_size=None, num_workers=WORKERS)))
    return time.perf_counter() - t0


# ------------------------------------------------------------------ data preparation
def ensure_tree(count, tiny):
    path = os.path.join(DATA, f"{'tiny' if tiny else 'imagenet'}-{count}")
    if not os.path.exists(path + ".done"):
        cmd = [sys.executable, os.path.join(ROOT, "tools", "make_images.py"), path, "--count",
               str(count), "--overwrite"] + (["--tiny"] if tiny else [])
        subprocess.run(cmd, check=True)
        with open(path + ".done", "w") as f:  # the marker: the tree is complete
            print(shlex.join(cmd[1:]), file=f)
    return path


def ensure_pack(src, name, fmt, *extra):
    out = os.path.join(READ, name)
    if not os.path.exists(os.path.join(out, "shardpack.json")):
        cmd = [SHARDPACK, "pack", src, out, "--format", fmt, "-q", *extra]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd + (["--overwrite"] if os.path.exists(out) else []), check=True)
    return out


def warm(path):
    """Read every file under path once (page cache)."""
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                while f.read(1 << 22):
                    pass


def wait_for_process(pattern, poll=30, limit=2400):
    """Wait while a process matching `pattern` runs (at most `limit` s); returns seconds waited."""
    t0 = time.time()
    while True:
        out = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
        pids = [ln.split()[0] for ln in out.splitlines() if "bench_read.py" not in ln]
        if not pids or time.time() - t0 > limit:
            print(f"warning: {pattern} still runs after {limit} s" if pids else "", end="")
            return time.time() - t0
        print(f"waiting: {pattern} running (pids {' '.join(pids)})", flush=True)
        time.sleep(poll)


# ------------------------------------------------------------------ measurement (parent side)
def cpu_seconds():
    """(CPU seconds the whole machine was busy, CPU seconds of our finished descendants)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    mine = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy = (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # not idle, iowait
    return busy, mine.ru_utime + mine.ru_stime


def quiet_moment(limit=60, window=2.0, share=0.15):
    """Wait (at most `limit` s) until other processes use < `share` of the CPUs for `window` s."""
    t0 = time.time()
    while time.time() - t0 < limit:
        busy = cpu_seconds()[0]
        time.sleep(window)
        if cpu_seconds()[0] - busy < share * window * os.cpu_count():
            return


def child(args, timeout=900):
    """Run this script in a subprocess -> (its JSON, CPU share other processes used meanwhile)."""
    cmd = [sys.executable, os.path.abspath(__file__)] + args
    quiet_moment()
    (busy0, mine0), t0 = cpu_seconds(), time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    (busy1, mine1), wall = cpu_seconds(), time.perf_counter() - t0
    if res.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    other = max(0.0, (busy1 - busy0) - (mine1 - mine0)) / (wall * os.cpu_count())
    return json.loads(res.stdout.strip().splitlines()[-1]), other


def bench_suite(contenders, reps, expected):
    """contenders: [(label, kind, path)]; returns {label: summary} of medians over reps."""
    runs = {label: [] for label, _, _ in contenders}
    for rep in range(reps):
        order = contenders[rep % len(contenders):] + contenders[:rep % len(contenders)]
        for label, kind, path in order:
            try:
                (first, steady), other = child(["--one", kind, path])
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"  rep {rep} {label} FAILED: {exc}", flush=True)
                continue
            if kind != "replay" and {first["n"], steady["n"]} != {expected}:
                print(f"  WRONG COUNT: {label} yielded {first['n']}, {steady['n']} samples per "
                      f"epoch, expected {expected}", flush=True)
            runs[label].append((first, steady, other))
            print(f"  rep {rep} {label:48s} {steady['n'] / steady['seconds']:9,.0f} samples/s, "
                  f"1st batch {first['first']:.3f} s, other processes {other:.0%}", flush=True)
    med = statistics.median
    return {label: dict(rate=med(s["n"] / s["seconds"] for _, s, _ in rs),
                        mbs=med(s["bytes"] / s["seconds"] / 1e6 for _, s, _ in rs),
                        first_rate=med(f["n"] / f["seconds"] for f, _, _ in rs),
                        ttfb=med(f["first"] for f, _, _ in rs),
                        runs=[(s["n"] / s["seconds"], o) for _, s, o in rs])
            for label, rs in runs.items() if rs}


def speed_table(res, labels, ref):
    rows = ["| contender | samples/s | MB/s | vs best WebDataset | 1st epoch samples/s | time to "
            "1st batch | runs: samples/s (other processes' CPU share) |",
            "|---|---:|---:|---:|---:|---:|---|"]
    for label in labels:
        r = res.get(label)
        if r is None:
            rows.append(f"| {label} | failed (see the run's output) | | | | | |")
            continue
        ratio = f"{r['rate'] / res[ref]['rate']:.2f}x" if ref in res else "-"
        runs = ", ".join(f"{x:,.0f} ({o:.0%})" for x, o in r["runs"])
        rows.append(f"| {label} | {r['rate']:,.0f} | {r['mbs']:,.1f} | {ratio} | "
                    f"{r['first_rate']:,.0f} | {r['ttfb'] * 1000:.0f} ms | {runs} |")
    return rows


# ------------------------------------------------------------------ shuffle quality
def order_metrics(batches, shard_of):
    """batches: lists of packed positions -> (mean |consecutive distance| / N, mean distinct
    shards per batch, fraction of batches from one shard, samples)."""
    batches = [np.asarray(b) for b in batches if len(b) > 1]
    dist = np.concatenate([np.abs(np.diff(b)) for b in batches]).mean() / len(shard_of)
    shards = [len(np.unique(shard_of[b])) for b in batches]
    return dist, np.mean(shards), np.mean([s == 1 for s in shards]), sum(map(len, batches))


def shuffle_quality(path):
    import shardpack
    reader = shardpack.open_dataset(path).reader  # key -> position in packed order, and shard
    keys = [(k, s) for s in range(len(reader.shards)) for k in reader.index(s).keys()]
    pos, shard_of = {k: i for i, (k, _) in enumerate(keys)}, np.array([s for _, s in keys])
    rows = []
    for name, make, get_keys in (
            ("shardpack (block 256 + window 4096)", lambda: shardpack.ShardDataset(
                path, batch_size=BATCH, batched=True, shuffle=True, seed=0, fields=["cls"]),
             lambda b: b["__key__"]),
            (f"WebDataset (shardshuffle=100 + .shuffle({WDS_BUFFER}))",
             lambda: wds_pipeline(path).to_tuple("__key__").batched(BATCH), lambda b: b[0])):
        for workers in (0, WORKERS):
            loader = DataLoader(make(), batch_size=None, num_workers=workers)
            batches = [[pos[k] for k in get_keys(b)] for b in loader]
            rows.append((f"{name}, {workers} workers", order_metrics(batches, shard_of)))
    perm = np.random.default_rng(0).permutation(len(shard_of))
    ideal = order_metrics([perm[i:i + BATCH] for i in range(0, len(perm), BATCH)], shard_of)
    return rows + [("ideal: full random permutation", ideal)]


# ------------------------------------------------------------------ report
def machine():
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "unknown")
    mem = int(open("/proc/meminfo").readline().split()[1]) / 2**20
    vers = ", ".join(f"{p} {md.version(p)}" for p in ("shardpack", "torch", "webdataset", "numpy"))
    git = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty=+uncommitted",
                          "--exclude", "*"], capture_output=True, text=True).stdout.strip()
    return (f"{os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB RAM, Linux {platform.release()}, "
            f"Python {platform.python_version()}, {vers}; repository at {git or '?'}")


def write_section(md_path, body):
    """Replace (or append) this benchmark's section. The file is re-read right before an atomic
    rename, so sections that others wrote meanwhile are kept."""
    lines = open(md_path).read().splitlines() if os.path.exists(md_path) else ["# Benchmarks"]
    if HEADING not in lines:
        lines += ["", HEADING]
    start = lines.index(HEADING)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    lines[start:end] = [HEADING, ""] + body.rstrip("\n").splitlines() + \
        ([""] if end < len(lines) else [])
    tmp = f"{md_path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, md_path)


def prepare(args):
    """Generate / pack what is missing -> ({dataset: path}, [(name, title, samples, tree,
    [(label, kind, dataset path)])])."""
    n_img, n_tiny = args.images, args.tiny_count
    img = ensure_tree(n_img, tiny=False)
    sets = {"img-tar": ensure_pack(img, f"img{n_img}-tar", "tar"),
            "img-msgpack": ensure_pack(img, f"img{n_img}-msgpack", "msgpack"),
            "img-tar-10": ensure_pack(img, f"img{n_img}-tar-10", "tar",
                                      "--max-samples", str(-(-n_img // 10)))}
    tiny = None if args.skip_tiny else ensure_tree(n_tiny, tiny=True)
    if tiny:
        sets["tiny-tar-10"] = ensure_pack(tiny, f"tiny{n_tiny}-tar-10", "tar",
                                          "--max-samples", str(-(-n_tiny // 10)))
        for fmt in ("tar", "msgpack"):  # one shard whatever the size
            sets[f"tiny-{fmt}-1"] = ensure_pack(tiny, f"tiny{n_tiny}-{fmt}-1", fmt,
                                                "--shard-size", "1TB")
    if not args.skip_1m:
        sets["big"] = ensure_pack(ensure_tree(args.big_count, tiny=True),
                                  f"tiny{args.big_count}-msgpack", "msgpack")
    n = {k: len(tar_urls(v)) for k, v in sets.items()}
    suites = [("img", f"{args.images:,} JPEGs of ~100 KB", args.images, img, [
        (f"shardpack tar, batched ({n['img-tar']} shards)", "sp-batched", sets["img-tar"]),
        (f"shardpack msgpack, batched ({n['img-msgpack']} shards)", "sp-batched",
         sets["img-msgpack"]),
        ("shardpack tar, sample path + collate", "sp-sample", sets["img-tar"]),
        (f"WebDataset ({n['img-tar']} shards)", "wds", sets["img-tar"]),
        ("raw files", "raw", img)])]
    if tiny:
        suites.append(("tiny", f"{args.tiny_count:,} tiny JPEGs of ~1 KB", args.tiny_count, tiny, [
            ("shardpack tar, batched, 10 shards", "sp-batched", sets["tiny-tar-10"]),
            ("shardpack tar, batched, 1 shard", "sp-batched", sets["tiny-tar-1"]),
            ("shardpack msgpack, batched, 1 shard", "sp-batched", sets["tiny-msgpack-1"]),
            ("shardpack tar, sample path + collate, 10 shards", "sp-sample", sets["tiny-tar-10"]),
            ("WebDataset, 10 shards", "wds", sets["tiny-tar-10"]),
            ("WebDataset, 1 shard", "wds", sets["tiny-tar-1"]),
            ("raw files", "raw", tiny),
            ("DataLoader alone: one shardpack batch replayed", "replay", sets["tiny-tar-1"])]))
    return sets, suites


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip-tiny", action="store_true")
    ap.add_argument("--skip-1m", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"),
                    help="markdown file whose '## Reading' section is replaced ('' = none)")
    ap.add_argument("--images", type=int, default=20_000)
    ap.add_argument("--tiny-count", type=int, default=100_000)
    ap.add_argument("--big-count", type=int, default=1_000_000)
    ap.add_argument("--wait-for", default="bench_pack.py",
                    help="first wait until no process matches this pgrep -f pattern ('' = no)")
    ap.add_argument("--one", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--ttfb", metavar="PATH", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one or args.ttfb:
        return print(json.dumps(run_one(*args.one) if args.one else run_ttfb(args.ttfb)))

    started, t_start = datetime.datetime.now(datetime.timezone.utc), time.perf_counter()
    waited = wait_for_process(args.wait_for) if args.wait_for else 0.0
    (sets, suites), results = prepare(args), {}
    for name, title, count, tree, contenders in suites:
        print(f"== {title}: warming the page cache", flush=True)
        for path in {tree} | {p for _, _, p in contenders}:
            warm(path)
        results[name] = bench_suite(contenders, args.reps, count)
    ttfb = []
    if not args.skip_1m:
        print("== time to first batch, 1M msgpack", flush=True)
        warm(sets["big"])
        ttfb = [child(["--ttfb", sets["big"]]) for _ in range(args.reps)]
        print("  ", ", ".join(f"{t:.3f} s ({o:.0%})" for t, o in ttfb), flush=True)
    print("== shuffle quality", flush=True)
    quality = shuffle_quality(sets["img-tar-10"])

    # ---------------------------------------------------------------- report
    argv = [a for i, a in enumerate(sys.argv[1:])
            if not (a.startswith("--out") or (i and sys.argv[i] == "--out"))]
    body = [f"Command: `{shlex.join(['python', 'tools/bench_read.py'] + argv)}` (started "
            f"{started:%Y-%m-%d %H:%M} UTC, {(time.perf_counter() - t_start) / 60:.0f} min, of "
            f"which {waited / 60:.0f} min waiting for `{args.wait_for or '-'}` to finish).", "",
            f"Machine: {machine()}.", "", METHOD.format(reps=args.reps)]
    targets = []
    for name, title, _, _, contenders in suites:
        res = results[name]
        top = {p: max((c for c in res if c.startswith(p)), key=lambda c: res[c]["rate"],
                      default=None) for p in ("WebDataset", "shardpack")}
        body += [f"### {title}", ""] + speed_table(res, [c[0] for c in contenders],
                                                   top["WebDataset"]) + [""]
        if top["shardpack"]:
            rate = res[top["shardpack"]]["rate"]
            targets.append(f"| >= {TARGETS[name]:,} samples/s, {title} | {top['shardpack']}: "
                           f"{rate:,.0f} | {'**pass**' if rate >= TARGETS[name] else '**FAIL**'} |")
    if ttfb:
        t = statistics.median(t for t, _ in ttfb)
        body += [f"### Time to first batch, {args.big_count:,} samples (msgpack, "
                 f"{len(tar_urls(sets['big']))} shards)", "",
                 "Fresh Python process per run; after the imports, construct `ShardDataset("
                 f"batched=True)` + `DataLoader(num_workers={WORKERS})` and wait for the first "
                 f"batch. Warm page cache. Median **{t * 1000:.0f} ms**; runs: "
                 + ", ".join(f"{x * 1000:.0f} ms ({o:.0%})" for x, o in ttfb) + ".", ""]
        targets.append(f"| time to first batch < {TARGETS['ttfb']:.0f} s, {args.big_count:,} "
                       f"samples | {t * 1000:.0f} ms | "
                       f"{'**pass**' if t < TARGETS['ttfb'] else '**FAIL**'} |")
    body += ["### Targets", "", "| target | best shardpack | result |", "|---|---|---|"] + \
        targets + ["", f"### Shuffle quality ({args.images:,} samples in 10 tar shards of "
                       f"{-(-args.images // 10):,})", "", QUALITY_NOTE,
                   "| order | mean consecutive distance / N | distinct shards per batch | "
                   "single-shard batches | samples |", "|---|---:|---:|---:|---:|"]
    body += [f"| {name} | {d:.3f} | {s:.2f} | {f:.1%} | {n:,} |" for name, (d, s, f, n) in quality]
    text = "\n".join(body) + "\n"
    print("\n" + text)
    if args.out:
        write_section(args.out, text)
        print(f"wrote the '{HEADING}' section of {args.out}")


if __name__ == "__main__":
    main()
