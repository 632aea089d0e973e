"""Reading, bytes only: shardpack against WebDataset (on the same tar shards) and raw files,
the DataLoader alone as a ceiling, the time to the first batch of 1,000,000 samples, and the
shuffle quality of both orders."""

from __future__ import annotations

import os
import resource
import subprocess
import time

from benchmarks import common as c
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure

BATCH, WORKERS, WDS_BUFFER = 256, 2, 1000
HERE = "benchmarks.suites.read"
TARGETS = {"img": 10_000, "tiny": 300_000}


def options(p) -> None:
    """The read suite's options."""
    p.add_argument("--images", type=int, default=20_000, help="100 KB JPEGs [20000]")
    p.add_argument("--tiny-count", type=int, default=100_000,
                   help="1 KB JPEGs, 0 to skip [100000]")
    p.add_argument("--big-count", type=int, default=1_000_000,
                   help="samples of the time-to-first-batch set, 0 to skip [1000000]")


# ------------------------------------------------------------------ loaders (child process side)

class RawFiles:
    """Map-style dataset over an ImageFolder tree: item i is (file bytes, class index)."""

    def __init__(self, root):
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.items = [(os.path.join(root, k, f), ci) for ci, k in enumerate(classes)
                      for f in sorted(os.listdir(os.path.join(root, k)))]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, ci = self.items[i]
        with open(path, "rb") as f:
            return f.read(), ci


def replay(batch, count):
    """One batch yielded ``count`` times in all, spread over the workers: the DataLoader alone."""
    import torch

    class Replay(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            mine = range(count)[info.id::info.num_workers] if info else range(count)
            return (batch for _ in mine)
    return Replay()


def collate_raw(samples):
    """Raw files' collate: a list of bytes and a list of classes."""
    return [s[0] for s in samples], [s[1] for s in samples]


def wds_pipeline(path):
    """WebDataset over the tar shards of a shardpack dataset, as the page quotes it."""
    import webdataset as wds
    # empty_check=False: with 1 shard and 2 workers, worker 1 legitimately gets no shard
    return wds.WebDataset(c.shard_files(path), shardshuffle=100, seed=0,
                          nodesplitter=wds.single_node_only, workersplitter=wds.split_by_worker,
                          empty_check=False).shuffle(WDS_BUFFER, seed=0)


def make_loader(kind, path):
    """(dataset, loader, count) for one contender; count(batch) -> (samples, jpg bytes)."""
    from torch.utils.data import DataLoader
    common = dict(num_workers=WORKERS, persistent_workers=True)
    if kind in ("sp-batched", "sp-sample", "replay"):
        import shardpack
        ds = shardpack.ShardDataset(path, batch_size=BATCH, batched=kind != "sp-sample",
                                    shuffle=True, seed=0)
        if kind == "replay":  # transport only: a real batch of this dataset, over and over
            ds = replay(next(iter(ds)), len(ds) // BATCH)
        loader = DataLoader(ds, batch_size=BATCH, collate_fn=shardpack.collate, **common) \
            if kind == "sp-sample" else DataLoader(ds, batch_size=None, **common)
        return ds, loader, lambda b: (len(b["cls"]), b["jpg"].data.numel())
    if kind == "wds":  # batched inside the workers; the loader only transports
        loader = DataLoader(wds_pipeline(path).to_tuple("jpg", "cls").batched(BATCH),
                            batch_size=None, **common)
    else:
        loader = DataLoader(RawFiles(path), batch_size=BATCH, shuffle=True,
                            collate_fn=collate_raw, **common)
    return None, loader, lambda b: (len(b[0]), sum(map(len, b[0])))


def run_one(kind, path, epochs=2) -> list:
    """Child: time ``epochs`` full passes; epoch 0 starts before the dataset is constructed."""
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


def run_ttfb(path) -> float:
    """Child: seconds from constructing ShardDataset + DataLoader to the first batch (imports
    done)."""
    import shardpack
    from torch.utils.data import DataLoader
    t0 = time.perf_counter()
    ds = shardpack.ShardDataset(path, batch_size=BATCH, batched=True, shuffle=True, seed=0)
    next(iter(DataLoader(ds, batch_size=None, num_workers=WORKERS)))
    return time.perf_counter() - t0


# ------------------------------------------------------------------ measurement (parent side)

def child(func, *args, quiet=True):
    """One measurement in a fresh process, at a quiet moment -> (its result, the CPU share
    other processes used meanwhile)."""
    if quiet:
        c.quiet_moment()
    busy0, t0 = c.machine_busy(), time.perf_counter()
    mine0 = _children_cpu()
    result = c.fresh(f"{HERE}:{func}", *args)
    wall = time.perf_counter() - t0
    other = max(0.0, (c.machine_busy() - busy0) - (_children_cpu() - mine0))
    return result, other / (wall * os.cpu_count())


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def bench_contenders(run, contenders, expected) -> dict:
    """contenders: [(label, kind, path)]; {label: medians and runs} over the repetitions."""
    runs = {label: [] for label, _, _ in contenders}
    for rep in range(run.reps):
        for label, kind, path in c.rotated(contenders, rep):
            try:
                (first, steady), other = child("run_one", kind, str(path), quiet=not run.quick)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                run.log(f"  rep {rep} {label} FAILED: {exc}")
                continue
            if kind != "replay" and {first["n"], steady["n"]} != {expected}:
                run.log(f"  WRONG COUNT: {label}: {first['n']}, {steady['n']} samples, "
                        f"expected {expected}")
            runs[label].append((first, steady, other))
            run.log(f"  rep {rep} {label:48s} {steady['n'] / steady['seconds']:9,.0f} "
                    f"samples/s, 1st batch {first['first']:.3f} s, others {other:.0%}")
    return {label: dict(rate=c.med(s["n"] / s["seconds"] for _, s, _ in rs),
                        mbs=c.med(s["bytes"] / s["seconds"] / 1e6 for _, s, _ in rs),
                        first_rate=c.med(f["n"] / f["seconds"] for f, _, _ in rs),
                        ttfb=c.med(f["first"] for f, _, _ in rs),
                        runs=[round(s["n"] / s["seconds"]) for _, s, _ in rs],
                        others=[round(o, 3) for _, _, o in rs])
            for label, rs in runs.items() if rs}


def speed_figures(title, res, target) -> list:
    """shardpack's rows, each with WebDataset's and raw files' rates as peers and the
    replayed batch as the limit."""
    peers = {k: v["rate"] for k, v in res.items() if not k.startswith(("shardpack", "DataLoader"))}
    limit = {k: v["rate"] for k, v in res.items() if k.startswith("DataLoader")}
    best = max((k for k in res if k.startswith("shardpack")), key=lambda k: res[k]["rate"],
               default=None)
    out = []
    for label, r in res.items():
        if not label.startswith("shardpack"):
            continue
        note = (f"{r['mbs']:,.1f} MB/s; 1st epoch {r['first_rate']:,.0f}/s; 1st batch "
                f"{r['ttfb'] * 1000:.0f} ms; runs {', '.join(f'{x:,}' for x in r['runs'])}")
        if label == best:
            note += f"; target >= {target:,}/s: {c.verdict(r['rate'] >= target)}"
        out.append(figure(f"{title}: {label}", r["rate"], "samples/s", peers, limit, note))
    return out


# ------------------------------------------------------------------ shuffle quality

def order_metrics(batches, shard_of):
    """batches: lists of packed positions -> (mean |consecutive distance| / N, mean distinct
    shards per batch, fraction of batches from one shard, samples)."""
    import numpy as np
    batches = [np.asarray(b) for b in batches if len(b) > 1]
    dist = np.concatenate([np.abs(np.diff(b)) for b in batches]).mean() / len(shard_of)
    shards = [len(np.unique(shard_of[b])) for b in batches]
    return (float(dist), float(np.mean(shards)), float(np.mean([s == 1 for s in shards])),
            sum(map(len, batches)))


def shuffle_quality(path) -> list:
    """Child: [(order, metrics)] of shardpack's and WebDataset's orders, 0 and 2 workers, and of
    a full random permutation."""
    import numpy as np
    import shardpack
    from torch.utils.data import DataLoader
    reader = shardpack.open_dataset(path).reader  # key -> position in packed order, and shard
    keys = [(k, s) for s in range(len(reader.shards)) for k in reader.index(s).keys()]
    pos, shard_of = {k: i for i, (k, _) in enumerate(keys)}, np.array([s for _, s in keys])
    rows = []
    for name, make, get_keys in (
            ("shardpack", lambda: shardpack.ShardDataset(
                path, batch_size=BATCH, batched=True, shuffle=True, seed=0, fields=["cls"]),
             lambda b: b["__key__"]),
            ("WebDataset", lambda: wds_pipeline(path).to_tuple("__key__").batched(BATCH),
             lambda b: b[0])):
        for workers in (0, WORKERS):
            loader = DataLoader(make(), batch_size=None, num_workers=workers)
            batches = [[pos[k] for k in get_keys(b)] for b in loader]
            rows.append((f"{name}, {workers} workers", order_metrics(batches, shard_of)))
    perm = np.random.default_rng(0).permutation(len(shard_of))
    ideal = order_metrics([perm[i:i + BATCH] for i in range(0, len(perm), BATCH)], shard_of)
    return rows + [("ideal", ideal)]


def quality_figures(rows, n) -> list:
    """Two figures per worker count: shardpack's mixing, WebDataset's as the peer, a random
    permutation as the limit."""
    got = dict(rows)
    out = []
    for workers in (0, WORKERS):
        sp, wds = got[f"shardpack, {workers} workers"], got[f"WebDataset, {workers} workers"]
        for i, (what, unit) in enumerate((("mean consecutive distance / N", "fraction of N"),
                                          ("distinct shards per batch", "shards"))):
            out.append(figure(f"shuffle, {n:,} samples in 10 shards, {workers} workers: {what}",
                              sp[i], unit, {"WebDataset": wds[i]}, {"random permutation":
                                                                     got["ideal"][i]},
                              f"single-shard batches: shardpack {sp[2]:.1%}, WebDataset "
                              f"{wds[2]:.1%}"))
    return out


# ------------------------------------------------------------------ the suite

def prepare(run) -> tuple[dict, list]:
    """Generate and pack what is missing -> ({set: path}, [(name, title, samples, tree,
    [(label, kind, path)])])."""
    a, base = run.args, run.data_dir / "read"
    n_img, n_tiny = a.images, a.tiny_count
    img, _ = c.ensure_images(run.data_dir, n_img)
    sets = {"img-tar": c.ensure_pack(img, base / f"img{n_img}-tar", "--format", "tar"),
            "img-msgpack": c.ensure_pack(img, base / f"img{n_img}-msgpack", "--format", "msgpack"),
            "img-tar-10": c.ensure_pack(img, base / f"img{n_img}-tar-10", "--format", "tar",
                                        "--max-samples", -(-n_img // 10))}
    n = {k: len(c.shard_files(v)) for k, v in sets.items()}
    suites = [("img", f"{n_img:,} x 100 KB", n_img, img, [
        (f"shardpack tar, batched ({n['img-tar']} shards)", "sp-batched", sets["img-tar"]),
        (f"shardpack msgpack, batched ({n['img-msgpack']} shards)", "sp-batched",
         sets["img-msgpack"]),
        ("shardpack tar, sample path + collate", "sp-sample", sets["img-tar"]),
        (f"WebDataset ({n['img-tar']} shards)", "wds", sets["img-tar"]),
        ("raw files", "raw", img)])]
    if n_tiny:
        tiny, _ = c.ensure_images(run.data_dir, n_tiny, tiny=True)
        sets["tiny-tar-10"] = c.ensure_pack(tiny, base / f"tiny{n_tiny}-tar-10", "--format",
                                            "tar", "--max-samples", -(-n_tiny // 10))
        for fmt in ("tar", "msgpack"):  # one shard whatever the size
            sets[f"tiny-{fmt}-1"] = c.ensure_pack(tiny, base / f"tiny{n_tiny}-{fmt}-1",
                                                  "--format", fmt, "--shard-size", "1TB")
        suites.append(("tiny", f"{n_tiny:,} x 1 KB", n_tiny, tiny, [
            ("shardpack tar, batched, 10 shards", "sp-batched", sets["tiny-tar-10"]),
            ("shardpack tar, batched, 1 shard", "sp-batched", sets["tiny-tar-1"]),
            ("shardpack msgpack, batched, 1 shard", "sp-batched", sets["tiny-msgpack-1"]),
            ("shardpack tar, sample path + collate, 10 shards", "sp-sample",
             sets["tiny-tar-10"]),
            ("WebDataset, 10 shards", "wds", sets["tiny-tar-10"]),
            ("WebDataset, 1 shard", "wds", sets["tiny-tar-1"]),
            ("raw files", "raw", tiny),
            ("DataLoader alone: one shardpack batch replayed", "replay", sets["tiny-tar-1"])]))
    if a.big_count:
        big, _ = c.ensure_images(run.data_dir, a.big_count, tiny=True)
        sets["big"] = c.ensure_pack(big, base / f"tiny{a.big_count}-msgpack", "--format",
                                    "msgpack")
    return sets, suites


@suite("read", title="Reading", options=options,
       quick=dict(images=300, tiny_count=600, big_count=1000),
       measures="""Samples per second of bytes-only epochs (no decode), batch 256, 2 DataLoader
       workers, shuffle on, page cache warm: each run a fresh process doing 2 epochs with
       persistent workers; the figure is the 2nd epoch (steady state). Contenders rotate within
       each repetition, each run waits for a moment when other processes use under 15% of the
       CPUs. WebDataset reads the same tar shards (`shardshuffle=100`, `.shuffle(1000)`, batched
       in the pipeline: the faster of two configurations), raw files are a map-style dataset
       doing `open().read()`. Also: the time to the first batch of a 1,000,000-sample msgpack
       set, and how well each order mixes (position distance of consecutive samples in a batch,
       distinct shards per batch).""",
       bounds="""The DataLoader's own transport: one shardpack batch replayed through the same
       loader (the limit column) is what the tiny-sample rows can reach; shardpack's 1 KB rows
       run at 77-89% of it. For 100 KB samples, the copy of every batch out of the page cache.
       The first batch of a large set waits for the manifest, the indexes a worker needs and the
       permutation of the first window.""")
def run_read(run) -> Outcome:
    """The read suite."""
    sets, suites = prepare(run)
    figures, raw = [], {}
    for name, title, count, tree, contenders in suites:
        run.log(f"== {title}: warming the page cache")
        for path in {tree} | {p for _, _, p in contenders}:
            c.warm(c.files_under(path))
        raw[name] = bench_contenders(run, contenders, count)
        figures += speed_figures(title, raw[name], TARGETS[name])
    if "big" in sets:
        run.log("== time to first batch")
        c.warm(c.files_under(sets["big"]))
        ttfb = [child("run_ttfb", str(sets["big"]), quiet=not run.quick)
                for _ in range(run.reps)]
        t = c.med(t for t, _ in ttfb)
        raw["ttfb"] = ttfb
        figures.append(figure(f"time to first batch, {run.args.big_count:,} samples (msgpack, "
                              f"{len(c.shard_files(sets['big']))} shards)", t, "s", {},
                              {"target": 1.0}, f"runs {c.spread([x for x, _ in ttfb])}; "
                              f"target < 1 s: {c.verdict(t < 1)}"))
    run.log("== shuffle quality")
    quality = c.fresh(f"{HERE}:shuffle_quality", str(sets["img-tar-10"]))
    figures += quality_figures(quality, run.args.images)
    setup = (f"Generated JPEGs (scripts/make_images.py) packed with `shardpack pack` (tar and "
             f"msgpack; 10-shard sets with --max-samples); {run.reps} repetitions; MB/s counts "
             "`jpg` bytes; the others' CPU share during each run is in the raw results.")
    return Outcome(figures, setup, versions=_versions(), raw=raw)


def _versions() -> dict:
    import importlib.metadata as md
    return {p: md.version(p) for p in ("webdataset", "numpy")}
