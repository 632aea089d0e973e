#!/usr/bin/env python3
"""Reading benchmark: shardpack (tar, msgpack; batched and sample path) vs WebDataset over the
same tar shards vs raw files, bytes only, batch 256, 2 workers, warm page cache; each timed run is
a fresh subprocess (`--one KIND PATH`) doing 2 epochs, contenders alternating within each
repetition. Also time to first batch on 1M samples (`--ttfb PATH`) and shuffle quality.

    python tools/bench_read.py [--reps 3] [--skip-tiny] [--skip-1m] [--out docs/benchmarks.md]

Data lives under bench-data/: trees are reused when their `.done` marker exists, packs when their
shardpack.json exists.
"""
import argparse
import datetime
import resource
import importlib.metadata as md
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "bench-data")
READ = os.path.join(DATA, "read")
SHARDPACK = os.path.join(os.path.dirname(sys.executable), "shardpack")
BATCH, WORKERS, WDS_BUFFER = 256, 2, 1000
HEADING = "## Reading"
TARGETS = {"img": 10_000, "tiny": 300_000, "ttfb": 1.0}
METHOD = f"""Method: bytes only (no decode), batch {BATCH}, {WORKERS} DataLoader workers, shuffling
on, page cache warm (every file read once before the first run). Each run is a fresh process doing 2
full epochs with persistent workers: **samples/s and MB/s are the 2nd epoch** (steady state); *1st
epoch samples/s* and *time to 1st batch* count from constructing the dataset and loader.
Contenders alternate within each of the {{reps}} repetitions (rotated order); figures are medians.
MB/s counts the `jpg` bytes delivered. WebDataset reads the shardpack tar shards unchanged:
`WebDataset(shards, shardshuffle=100, nodesplitter=single_node_only,
workersplitter=split_by_worker, empty_check=False).shuffle({WDS_BUFFER}).to_tuple("jpg", "cls")`,
batched in the pipeline (`.batched({BATCH})`, loader `batch_size=None`) or by the DataLoader. Raw
files: map-style Dataset, `open().read()` per file, `DataLoader(shuffle=True)`, collate to a list
of bytes.
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


class RawFiles:
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


def wds_pipeline(path, shardshuffle=100, seed=0):
    import webdataset as wds
    # empty_check=False: with 1 shard and 2 workers, worker 1 legitimately gets no shard
    return wds.WebDataset(tar_urls(path), shardshuffle=shardshuffle, seed=seed,
                          nodesplitter=wds.single_node_only, workersplitter=wds.split_by_worker,
                          empty_check=False).shuffle(WDS_BUFFER, seed=seed)


def make_loader(kind, path):
    """(dataset, loader, count) for one contender; count(batch) -> (samples, jpg bytes)."""
    from torch.utils.data import DataLoader
    common = dict(num_workers=WORKERS, persistent_workers=True)
    if kind.startswith("sp-") or kind == "replay":
        import shardpack
        if kind in ("sp-batched", "replay"):
            ds = shardpack.ShardDataset(path, batch_size=BATCH, batched=True, shuffle=True, seed=0)
            if kind == "replay":  # transport only: a real batch of this dataset, over and over
                ds = Replay(next(iter(ds)), len(ds) // BATCH)
            loader = DataLoader(ds, batch_size=None, **common)
        else:
            ds = shardpack.ShardDataset(path, batch_size=BATCH, shuffle=True, seed=0)
            loader = DataLoader(ds, batch_size=BATCH, collate_fn=shardpack.collate, **common)
        return ds, loader, lambda b: (len(b["cls"]), b["jpg"].data.numel())
    if kind == "wds":  # batched inside the workers; the loader only transports
        ds = wds_pipeline(path).to_tuple("jpg", "cls").batched(BATCH)
        loader = DataLoader(ds, batch_size=None, **common)
    elif kind == "wds-loader":  # per-sample pipeline, the DataLoader batches (default collate)
        ds = wds_pipeline(path).to_tuple("jpg", "cls")
        loader = DataLoader(ds, batch_size=BATCH, **common)
    elif kind == "raw":
        ds = RawFiles(path)
        loader = DataLoader(ds, batch_size=BATCH, shuffle=True, collate_fn=collate_raw, **common)
    else:
        raise SystemExit(f"unknown contender kind {kind!r}")
    return ds, loader, lambda b: (len(b[0]), sum(map(len, b[0])))


def run_one(kind, path, epochs=2):
    """Time `epochs` full passes; epoch 0 starts before the dataset is constructed."""
    import torch  # noqa: F401  (import outside the timed region, as a trainer would have it)
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


def run_ttfb(path, batched):
    t_import = time.perf_counter()
    import shardpack
    from torch.utils.data import DataLoader
    t0 = time.perf_counter()
    ds = shardpack.ShardDataset(path, batch_size=BATCH, batched=batched, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=None if batched else BATCH, num_workers=WORKERS,
                        collate_fn=None if batched else shardpack.collate)
    batch = next(iter(loader))
    t1 = time.perf_counter()
    assert len(batch["cls"]) == BATCH
    return dict(ttfb=t1 - t0, imports=t0 - t_import)


# ------------------------------------------------------------------ data preparation
def ensure_tree(count, tiny):
    path = os.path.join(DATA, f"{'tiny' if tiny else 'imagenet'}-{count}")
    if not os.path.exists(path + ".done"):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_images.py"), path,
                        "--count", str(count), "--overwrite"] + (["--tiny"] if tiny else []),
                       check=True)
        with open(path + ".done", "w") as f:
            f.write(f"make_images.py {path} --count {count}{' --tiny' if tiny else ''}\n")
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


def wait_quiet(pattern, poll=30, limit=2400):
    t0 = time.time()
    while True:
        out = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
        pids = [l.split()[0] for l in out.splitlines() if "bench_read.py" not in l]
        if not pids or time.time() - t0 > limit:
            print(f"warning: {pattern} still running after {limit} s" if pids else "", end="")
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


def child(args, timeout=900):
    """Run this script in a subprocess; returns (its JSON, share of the CPUs that other
    processes of the machine used meanwhile)."""
    cmd = [sys.executable, os.path.abspath(__file__)] + args
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
                r, other = child(["--one", kind, path])
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"  rep {rep} {label} FAILED: {exc}", flush=True)
                continue
            bad = [e["n"] for e in r if e["n"] != expected]
            if bad and kind != "replay":
                print(f"  WRONG COUNT: {label} yielded {bad} samples, expected {expected}")
            runs[label].append(r + [other])
            print(f"  rep {rep} {label:48s} {r[1]['n'] / r[1]['seconds']:9,.0f} samples/s, "
                  f"1st batch {r[0]['first']:.3f} s, other processes {other:.0%} CPU", flush=True)
    med = statistics.median
    return {label: dict(rate=med(r[1]["n"] / r[1]["seconds"] for r in rs),
                        mbs=med(r[1]["bytes"] / r[1]["seconds"] / 1e6 for r in rs),
                        first_rate=med(r[0]["n"] / r[0]["seconds"] for r in rs),
                        ttfb=med(r[0]["first"] for r in rs),
                        rates=[r[1]["n"] / r[1]["seconds"] for r in rs],
                        other=[r[2] for r in rs])
            for label, rs in runs.items() if rs}


def speed_table(res, labels, ref):
    rows = ["| contender | samples/s | MB/s | vs best WebDataset | 1st epoch samples/s | "
            "time to 1st batch | runs: samples/s (CPU used by other processes) |",
            "|---|---:|---:|---:|---:|---:|---|"]
    for label in labels:
        r = res.get(label)
        if r is None:
            rows.append(f"| {label} | failed (see the run's output) | | | | | |")
            continue
        ratio = f"{r['rate'] / res[ref]['rate']:.2f}x" if ref in res else "-"
        rows.append(f"| {label} | {r['rate']:,.0f} | {r['mbs']:,.1f} | {ratio} | "
                    f"{r['first_rate']:,.0f} | {r['ttfb'] * 1000:.0f} ms | "
                    f"{', '.join(f'{x:,.0f} ({o:.0%})' for x, o in zip(r['rates'], r['other']))}"
                    " |")
    return rows


# ------------------------------------------------------------------ shuffle quality
def key_positions(path):
    """{key: position in packed order} and the shard of each position, from shardpack's index."""
    import shardpack
    reader = shardpack.open_dataset(path).reader
    pos, shard_of = {}, []
    for s in range(len(reader.shards)):
        for k in reader.index(s).keys():
            pos[k] = len(pos)
            shard_of.append(s)
    return pos, np.array(shard_of)


def order_metrics(batches, shard_of):
    """batches: lists of packed positions. (mean |consecutive distance| / N, mean distinct
    shards per batch, fraction of batches from one shard)."""
    n = len(shard_of)
    batches = [np.asarray(b) for b in batches if len(b) > 1]
    dist = np.concatenate([np.abs(np.diff(b)) for b in batches]).mean() / n
    shards = [len(np.unique(shard_of[b])) for b in batches]
    return dist, float(np.mean(shards)), float(np.mean([s == 1 for s in shards])), \
        sum(map(len, batches))


def shuffle_quality(path):
    from torch.utils.data import DataLoader
    import shardpack
    pos, shard_of = key_positions(path)
    rows = []
    for name, make, keys in (
            ("shardpack (block 256 + window 4096)", lambda: shardpack.ShardDataset(
                path, batch_size=BATCH, batched=True, shuffle=True, seed=0, fields=["cls"]),
             lambda b: b["__key__"]),
            (f"WebDataset (shardshuffle=100 + .shuffle({WDS_BUFFER}))",
             lambda: wds_pipeline(path).to_tuple("__key__").batched(BATCH), lambda b: b[0])):
        for workers in (0, WORKERS):
            loader = DataLoader(make(), batch_size=None, num_workers=workers)
            batches = [[pos[k] for k in keys(b)] for b in loader]
            rows.append((f"{name}, {workers} workers", order_metrics(batches, shard_of)))
    perm = np.random.default_rng(0).permutation(len(shard_of))
    ideal = order_metrics([perm[i:i + BATCH] for i in range(0, len(perm), BATCH)], shard_of)
    rows.append(("ideal: full random permutation", ideal))
    return rows


# ------------------------------------------------------------------ report
def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "unknown")
    mem = int(open("/proc/meminfo").readline().split()[1]) / 2**20
    vers = ", ".join(f"{p} {md.version(p)}" for p in ("shardpack", "torch", "webdataset", "numpy"))
    git = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty=+uncommitted",
                          "--exclude", "*"], capture_output=True, text=True).stdout.strip()
    return (f"{os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB RAM, Linux {platform.release()}, "
            f"Python {platform.python_version()}, {vers}; repository at {git or '?'}")


def write_section(md_path, body):
    """Replace (or append) this benchmark's section; re-reads the file just before an atomic
    rename so that other sections written meanwhile are kept."""
    lines = open(md_path).read().splitlines() if os.path.exists(md_path) else ["# Benchmarks"]
    new = [HEADING, ""] + body.rstrip("\n").splitlines()
    if HEADING in lines:
        start = lines.index(HEADING)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        lines = lines[:start] + new + ([""] + lines[end:] if end < len(lines) else [])
    else:
        lines += [""] + new
    tmp = f"{md_path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, md_path)


def prepare(args):
    """Generate / pack what is missing; returns ({name: dataset path}, image tree, tiny tree)."""
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
    return sets, img, tiny


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
    ap.add_argument("--ttfb", nargs=2, metavar=("PATH", "BATCHED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return print(json.dumps(run_one(*args.one)))
    if args.ttfb:
        return print(json.dumps(run_ttfb(args.ttfb[0], args.ttfb[1] == "1")))

    started, t_start = datetime.datetime.now(datetime.timezone.utc), time.perf_counter()
    waited = wait_quiet(args.wait_for) if args.wait_for else 0.0
    sets, img, tiny = prepare(args)
    shards = {k: len(tar_urls(v)) for k, v in sets.items()}
    print("shards:", shards, flush=True)
    n_img, n_tiny, n_big = args.images, args.tiny_count, args.big_count
    suites = [("img", f"{n_img:,} JPEGs of ~100 KB", n_img, img, [
        (f"shardpack tar, batched ({shards['img-tar']} shards)", "sp-batched", sets["img-tar"]),
        (f"shardpack msgpack, batched ({shards['img-msgpack']} shards)", "sp-batched",
         sets["img-msgpack"]),
        ("shardpack tar, sample path + collate", "sp-sample", sets["img-tar"]),
        ("WebDataset, .batched(256)", "wds", sets["img-tar"]),
        ("WebDataset, DataLoader batch_size=256", "wds-loader", sets["img-tar"]),
        ("raw files", "raw", img)])]
    if tiny:
        suites.append(("tiny", f"{n_tiny:,} tiny JPEGs of ~1 KB", n_tiny, tiny, [
            ("shardpack tar, batched, 10 shards", "sp-batched", sets["tiny-tar-10"]),
            ("shardpack tar, batched, 1 shard", "sp-batched", sets["tiny-tar-1"]),
            ("shardpack msgpack, batched, 1 shard", "sp-batched", sets["tiny-msgpack-1"]),
            ("shardpack tar, sample path + collate, 10 shards", "sp-sample", sets["tiny-tar-10"]),
            ("WebDataset, .batched(256), 10 shards", "wds", sets["tiny-tar-10"]),
            ("WebDataset, DataLoader batch_size=256, 10 shards", "wds-loader",
             sets["tiny-tar-10"]),
            ("WebDataset, .batched(256), 1 shard", "wds", sets["tiny-tar-1"]),
            ("raw files", "raw", tiny),
            ("DataLoader alone: one shardpack batch replayed", "replay", sets["tiny-tar-1"])]))
    results = {}
    for name, title, count, tree, contenders in suites:
        print(f"== {title}: warming the page cache", flush=True)
        for path in {tree} | {p for _, _, p in contenders}:
            warm(path)
        results[name] = bench_suite(contenders, args.reps, count)
    ttfb = {}
    if not args.skip_1m:
        print("== time to first batch, 1M msgpack", flush=True)
        warm(sets["big"])
        for label, batched in (("batched=True", "1"), ("sample path + collate", "0")):
            ttfb[label] = [child(["--ttfb", sets["big"], batched])[0] for _ in range(args.reps)]
            print(f"  {label}: {[round(r['ttfb'], 3) for r in ttfb[label]]}", flush=True)
    print("== shuffle quality", flush=True)
    quality = shuffle_quality(sets["img-tar-10"])

    # ---------------------------------------------------------------- report
    med = statistics.median
    argv = [a for i, a in enumerate(sys.argv[1:])
            if not (a.startswith("--out") or (i and sys.argv[i] == "--out"))]
    body = [f"Command: `{shlex.join(['python', 'tools/bench_read.py'] + argv)}` (started "
            f"{started:%Y-%m-%d %H:%M} UTC, {(time.perf_counter() - t_start) / 60:.0f} min, of "
            f"which {waited / 60:.0f} min waiting for `{args.wait_for or '-'}` to finish).", "",
            f"Machine: {machine()}.", "", METHOD.format(reps=args.reps)]
    targets = []
    for name, title, count, tree, contenders in suites:
        res = results[name]
        ref = max((l for l in res if l.startswith("WebDataset")), key=lambda l: res[l]["rate"],
                  default=None)
        body += [f"### {title}", ""] + speed_table(res, [c[0] for c in contenders], ref) + [""]
        best = max((l for l in res if l.startswith("shardpack")), key=lambda l: res[l]["rate"],
                   default=None)
        if best is None:
            continue
        ok = res[best]["rate"] >= TARGETS[name]
        targets.append(f"| >= {TARGETS[name]:,} samples/s, {title} | {best}: "
                       f"{res[best]['rate']:,.0f} | {'**pass**' if ok else '**FAIL**'} |")
    if ttfb:
        body += [f"### Time to first batch, {n_big:,} samples (msgpack, {shards['big']} shards)",
                 "", "A fresh Python process per run: after `import shardpack, torch`, construct "
                 f"`ShardDataset` + `DataLoader(num_workers={WORKERS})` and wait for the first "
                 "batch. Warm page cache.", "",
                 "| path | time to first batch (median) | runs | imports (not counted) |",
                 "|---|---:|---|---:|"]
        for label, runs in ttfb.items():
            each = ", ".join(f"{r['ttfb'] * 1000:.0f}" for r in runs)
            body.append(f"| {label} | {med(r['ttfb'] for r in runs) * 1000:.0f} ms | {each} ms | "
                        f"{med(r['imports'] for r in runs) * 1000:.0f} ms |")
        t = med(r["ttfb"] for r in ttfb["batched=True"])
        targets.append(f"| time to first batch < {TARGETS['ttfb']:.0f} s, {n_big:,} samples | "
                       f"batched=True: {t * 1000:.0f} ms | "
                       f"{'**pass**' if t < TARGETS['ttfb'] else '**FAIL**'} |")
        body.append("")
    body += ["### Targets", "", "| target | best shardpack | result |", "|---|---|---|"] + \
        targets + [""]
    body += [f"### Shuffle quality ({n_img:,} samples in 10 tar shards of {-(-n_img // 10):,})",
             "", QUALITY_NOTE, "| order | mean consecutive distance / N | distinct shards per "
             "batch | single-shard batches | samples |", "|---|---:|---:|---:|---:|"]
    body += [f"| {name} | {d:.3f} | {s:.2f} | {f:.1%} | {n:,} |" for name, (d, s, f, n) in quality]
    text = "\n".join(body) + "\n"
    print("\n" + text)
    if args.out:
        write_section(args.out, text)
        print(f"wrote the '{HEADING}' section of {args.out}")


if __name__ == "__main__":
    main()
