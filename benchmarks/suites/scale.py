"""Scale: what one process pays to start an epoch of up to a billion samples (its own share of
the order, a manifest of 100,000 shards, a real 10M-sample dataset), and the bytes each rank of
a job fetches per epoch with and without shard affinity."""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks import common as c
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure

HERE = "benchmarks.suites.scale"
WORLD, WORKERS, SHARD = 64, 8, 10_000


def options(p) -> None:
    """The scale suite's options."""
    p.add_argument("--sizes", default="1e6,1e7,1e8,1e9", help="samples of the share() cases")
    p.add_argument("--no-real", action="store_true",
                   help="skip the 1M and 10M-sample datasets (and the 100,000-shard manifest)")
    p.add_argument("--manifest-shards", type=int, default=100_000)
    p.add_argument("--data", type=Path, default=Path("/dev/shm/shardpack-share"),
                   help="the generated datasets [/dev/shm/shardpack-share]")
    p.add_argument("--shards", type=int, default=256, help="egress cases: shards [256]")
    p.add_argument("--per-shard", type=int, default=40, help="egress cases: samples a shard")
    p.add_argument("--worlds", default="8,32", help="egress cases: ranks [8,32]")


# ------------------------------------------------------------------ children

def share_case(n: int, spans: int, how: str) -> dict:
    """Child: ``partition.share()`` (or the whole-epoch computation it replaces) for rank 0,
    worker 0 of WORLD x WORKERS; seconds and this process's peak RSS."""
    import numpy as np

    from shardpack.order import partition as P  # (the order's functions, not the loader)

    sizes = [SHARD] * (n // SHARD) + ([n % SHARD] if n % SHARD else [])
    t0 = time.perf_counter()
    if how == "share":
        got = P.share(sizes, P.Order(seed=1, affinity=spans > 1), 3, world=WORLD, rank=0,
                      num_workers=WORKERS, worker=0, batch_size=256)
    else:
        order = P.epoch_order(sizes, seed=1, epoch=3, spans=spans)
        got = P.worker_split(P.resume_sequences(order, [], WORLD)[0], WORKERS, 0, 256)
    secs = time.perf_counter() - t0
    assert len(got) > 0 and np.all(got.ids >= 0)
    return {"s": secs, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "ids": len(got)}


def manifest_case(folder: str) -> dict:
    """Child: open a manifest of many shards with ``DatasetReader`` (indexes load lazily)."""
    from shardpack import DatasetReader
    from shardpack import format as fmt
    t0 = time.perf_counter()
    reader = DatasetReader(folder)
    secs = time.perf_counter() - t0
    size = os.path.getsize(os.path.join(folder, fmt.MANIFEST_NAME))
    return {"s": secs, "shards": len(reader.shards), "mb": size / 1e6}


def real_case(path: str) -> dict:
    """Child: ShardDataset(batched) as rank 0 of 64 in a DataLoader with 2 workers: time to the
    first batch and each worker's peak RSS (VmHWM, shared pages of the parent included)."""
    from shardpack import ShardDataset
    from torch.utils.data import DataLoader

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
            rss += [int(hwm[0].split()[1]) / 1024] if hwm else []
    return {"first_s": first, "worker_rss_mb": sorted(rss), "samples": len(ds.reader)}


def egress(shards: int, per_shard: int, size: int, worlds: list) -> list:
    """Child: every rank of a W-rank job reads one epoch of a dataset on fsspec's in-process
    ``memory://`` store into a cache of its own (what is counted is exactly what the reader asks
    for, no server in the way); ranks one after another (the order and the cuts are pure
    functions of the rank). Rows: (world, affinity, shards per rank, bytes per rank, every
    sample once)."""
    import fsspec

    import shardpack

    tmp = Path(tempfile.mkdtemp())
    for i in range(shards * per_shard):
        d = tmp / "src" / f"{i // per_shard:05d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:08d}.bin").write_bytes(os.urandom(size))
    shardpack.pack(tmp / "src", tmp / "ds", max_samples=per_shard, workers=1, layout="files")
    fs = fsspec.filesystem("memory")
    for p in sorted((tmp / "ds").iterdir()):
        if not p.name.startswith("."):
            fs.pipe_file(f"/bench-scale/{p.name}", p.read_bytes())
    shutil.rmtree(tmp)
    url, n, rows = "memory:///bench-scale", shards * per_shard, []
    total = shardpack.DatasetReader(url).manifest.num_bytes
    for world in worlds:
        for affinity in (True, False):
            ranks = [_rank_epoch(url, world, rank, affinity) for rank in range(world)]
            rows.append(dict(world=world, affinity=affinity, total=total,
                             shards=[r["shards"] for r in ranks],
                             bytes=[r["bytes"] for r in ranks],
                             once=sorted(i for r in ranks for i in r["ids"]) == list(range(n))))
    return rows


def _rank_epoch(url, world, rank, affinity) -> dict:
    import shardpack
    cache = Path(tempfile.mkdtemp())
    try:
        ds = shardpack.ShardDataset(url, world_size=world, rank=rank, cache_dir=cache, seed=1,
                                    shard_affinity=affinity, batch_size=64, batched=True,
                                    prefetch_shards=0)
        ds.set_epoch(1)
        seen = [int(i) for b in ds
                for i, r in zip(b["__index__"], b["__repeat__"], strict=True) if not r]
        tars = list(cache.rglob("*.tar"))
        return {"ids": seen, "bytes": sum(p.stat().st_size for p in tars), "shards": len(tars)}
    finally:
        shutil.rmtree(cache)


# ------------------------------------------------------------------ data (parent side)

def prepare_real(data: Path) -> None:
    """d1m: 1,000,000 tiny msgpack samples converted from a Parquet file; d10m: its 10 shards
    hard-linked 10 times under new names (real shards and indexes, keys repeated)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    d1m, d10m = data / "d1m", data / "d10m"
    if not (d1m / "shardpack.json").exists():
        data.mkdir(parents=True, exist_ok=True)
        n, rng = 1_000_000, np.random.default_rng(0)
        table = pa.table({"__key__": pa.array([f"{i:09d}" for i in range(n)]),
                          "bin": pa.array([b"x" * 16] * n, type=pa.binary()),
                          "cls": pa.array(rng.integers(0, 1000, n))})
        pq.write_table(table, data / "t1m.parquet", row_group_size=100_000)
        shutil.rmtree(d1m, ignore_errors=True)
        subprocess.run(c.shardpack_cmd("convert", data / "t1m.parquet", d1m, "--format",
                                       "msgpack", "--label-column", "cls", "--check", "none",
                                       "-q"), check=True, env=c.child_env())
    if not (d10m / "shardpack.json").exists():
        shutil.rmtree(d10m, ignore_errors=True)
        d10m.mkdir()
        manifest = json.loads((d1m / "shardpack.json").read_text())
        shards = []
        for _ in range(10):
            for entry in manifest["shards"]:
                k = len(shards)
                new = dict(entry, name=f"shard-{k:05d}" + os.path.splitext(entry["name"])[1],
                           index=f"shard-{k:05d}.idx")
                os.link(d1m / entry["name"], d10m / new["name"])
                os.link(d1m / entry["index"], d10m / new["index"])
                shards.append(new)
        manifest["shards"] = shards
        for key in ("num_samples", "num_bytes"):
            if isinstance(manifest.get(key), int):
                manifest[key] *= 10
        (d10m / "shardpack.json").write_text(json.dumps(manifest))


def prepare_manifest(data: Path, count: int) -> Path:
    """A manifest of ``count`` shards made from d1m's first entry (fake hashes: only the
    manifest is read)."""
    folder = data / f"manifest-{count}"
    path = folder / "shardpack.json"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        base = json.loads((data / "d1m" / "shardpack.json").read_text())
        one = base["shards"][0]
        suffix = os.path.splitext(one["name"])[1]
        base["shards"] = [dict(one, name=f"shard-{i:05d}{suffix}", index=f"shard-{i:05d}.idx")
                          for i in range(count)]
        if "num_samples" in base:
            base["num_samples"] = one["samples"] * count
        path.write_text(json.dumps(base))
    return folder


# ------------------------------------------------------------------ the suite

def share_figures(sizes) -> list:
    """share() per size with shard affinity; without it and the whole-epoch computation in
    the note (each case in a fresh interpreter: peak RSS includes the interpreter and numpy)."""
    out = []
    for n in sizes:
        got = {spans: c.fresh(f"{HERE}:share_case", n, spans, "share", timeout=3600)
               for spans in (WORLD, 1)}
        whole = c.fresh(f"{HERE}:share_case", n, WORLD, "whole", timeout=3600) \
            if n <= 10**8 else None
        note = (f"peak RSS {got[WORLD]['rss_mb']:.0f} MB; without affinity "
                f"{got[1]['s']:.3f} s, {got[1]['rss_mb']:.0f} MB; this worker's samples "
                f"{got[WORLD]['ids']:,}")
        if whole:
            note += f"; the whole epoch it replaces: {whole['s']:.2f} s, {whole['rss_mb']:.0f} MB"
        out.append(figure(f"share(), {n:,} samples, world {WORLD} x {WORKERS} workers",
                          got[WORLD]["s"], "s", {}, {}, note))
    return out


def egress_figures(rows) -> list:
    """Bytes fetched per epoch over the dataset's size, with affinity; without as the peer."""
    out = []
    by = {(r["world"], r["affinity"]): r for r in rows}
    for world in sorted({r["world"] for r in rows}):
        on, off = by[(world, True)], by[(world, False)]
        ratio = {k: sum(r["bytes"]) / r["total"] for k, r in (("on", on), ("off", off))}
        out.append(figure(f"egress per epoch, {world} ranks each with its own cache",
                          ratio["on"], "x dataset", {"shard_affinity=False": ratio["off"]},
                          {"every byte once": 1.0},
                          f"shards a rank fetches: median {statistics.median(on['shards']):.0f}"
                          f" (without: {statistics.median(off['shards']):.0f}); every sample "
                          f"once: {'yes' if on['once'] and off['once'] else 'NO'}"))
    return out


@suite("scale", title="Scale: a billion samples, many ranks", options=options,
       quick=dict(sizes="1e5", no_real=True, shards=16, per_shard=10, worlds="2,4"),
       measures="""Seconds and peak memory of `partition.share()`, one DataLoader worker's share of
       an epoch (world 64, 8 workers, batch 256, shards of 10,000 samples), each case in a fresh
       interpreter, with the whole-epoch computation it replaced beside it up to 10^8; opening
       a manifest of 100,000 shards; the first batch of 1M- and 10M-sample datasets as rank 0
       of 64 with 2 workers; and the bytes every rank of a job fetches per epoch from an
       in-process memory:// store into its own cache, with and without shard affinity.""",
       bounds="""The share's own samples: its cost follows the share, not the epoch (10^9
       samples: ~0.3 s, ~200 MB; the whole epoch would need ~16 GB). Without shard affinity a
       rank's windows touch most shards, so a job's egress grows with its rank count; with it
       the job fetches the dataset about once an epoch.""")
def run_scale(run) -> Outcome:
    """The scale suite."""
    a = run.args
    figures = share_figures([int(float(x)) for x in a.sizes.split(",")])
    raw = {}
    if not a.no_real:
        prepare_real(a.data)
        man = c.fresh(f"{HERE}:manifest_case", str(prepare_manifest(a.data, a.manifest_shards)))
        figures.append(figure(f"open a manifest of {man['shards']:,} shards "
                              f"({man['mb']:.0f} MB of JSON)", man["s"], "s", {},
                              {"target": 1.0}, f"DatasetReader; {c.verdict(man['s'] < 1)}"))
        for name in ("d1m", "d10m"):
            r = c.fresh(f"{HERE}:real_case", str(a.data / name))
            figures.append(figure(f"first batch, {r['samples']:,} samples, rank 0 of 64",
                                  r["first_s"], "s", {}, {}, "peak RSS per worker " + " / ".join(
                                      f"{x:.0f} MB" for x in r["worker_rss_mb"])))
            raw[name] = r
    rows = c.fresh(f"{HERE}:egress", a.shards, a.per_shard, 1000,
                   [int(w) for w in a.worlds.split(",")], timeout=3600)
    figures += egress_figures(rows)
    raw["egress"] = rows
    setup = (f"share(): shards of {SHARD:,} samples; egress: {a.shards * a.per_shard:,} samples "
             f"of 1,000 B in {a.shards} shards, worlds {a.worlds}; datasets in {a.data}.")
    return Outcome(figures, setup, raw=raw, part="no-real" if a.no_real else None)
