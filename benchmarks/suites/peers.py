"""Loading against the peers: shardpack (tar, msgpack) against raw files, webdataset, MDS,
LitData, FFCV and DALI (CPU), one epoch into PyTorch, bytes only and decoded, cold and warm.

The peers live in their own venvs, made by the scripts beside this module: .bench-venv (MDS,
LitData: benchmarks/suites/setup_peers.sh) and .bench-loaders-venv (FFCV, DALI:
benchmarks/suites/setup_loaders.sh)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

from benchmarks import common as c
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure

LOADERS = "benchmarks.suites.peer_loaders"
# name -> (python, dataset folder under DATA_DIR/peers/<tree>, or None for the tree itself)
CONTENDERS = {
    "shardpack-tar": (sys.executable, "shardpack-tar"),
    "shardpack-msgpack": (sys.executable, "shardpack-msgpack"),
    "files": (sys.executable, None), "webdataset": (sys.executable, "webdataset"),
    "mds": (c.PEER_PY, "mds"), "litdata": (c.PEER_PY, "litdata"),
    "ffcv": (c.LOADERS_PY, "ffcv"), "dali": (c.LOADERS_PY, None),
}


def options(p) -> None:
    """The peers suite's options."""
    p.add_argument("--images", type=int, default=5000, help="100 KB JPEGs [5000]")
    p.add_argument("--caches", default="cold,warm")
    p.add_argument("--modes", default="bytes,decode")
    p.add_argument("--skip", default="", help="contenders to skip: " + ",".join(CONTENDERS))
    p.add_argument("--steps", default="0,50,100,200", help="wait sweep step times, ms")
    p.add_argument("--plot", default=None, help="also draw the figures into this PNG")


def prepare(run, src, names) -> dict:
    """Convert the source once per dataset folder, each with its own writer; {name: path}."""
    paths, base = {}, run.data_dir / "peers" / src.name
    for name in names:
        folder = CONTENDERS[name][1]
        if folder is None:
            paths[name] = src
            continue
        out = base / folder
        if not os.path.exists(f"{out}.done"):
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            if name.startswith("shardpack"):
                cmd = c.shardpack_cmd("pack", src, out, "--format", name.split("-")[1],
                                      "--shard-size", "64MB", "--workers", 2, "--overwrite", "-q")
            else:
                cmd = c.child_cmd(f"{LOADERS}:convert", name, str(src), str(out),
                                  python=CONTENDERS[name][0])
            run.log(f"converting: {name}")
            subprocess.run(cmd, check=True, env=c.child_env(), stdout=subprocess.DEVNULL)
            open(f"{out}.done", "w").close()
        paths[name] = out
    return paths


def one_epoch(run, name, path, mode, cache, rep, expected) -> dict:
    """One loader's epoch in its own process, the data cold or warm."""
    files = c.files_under(path)
    (c.evict if cache == "cold" else c.warm)(files)
    resident = c.resident_fraction(files)
    log = run.data_dir / "logs" / "peers" / f"{name}-{cache}-{mode}-{rep}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = c.child_cmd(f"{LOADERS}:epoch", name, str(path), mode, python=CONTENDERS[name][0])
    r = c.run_measured(cmd, log, timeout=600)
    text = open(log, errors="replace").read()
    res = [json.loads(ln[7:]) for ln in text.splitlines() if ln.startswith("RESULT=")]
    r.update(name=name, mode=mode, cache=cache, resident=resident, rep=rep)
    if r["rc"] or not res:
        r["error"] = " | ".join(text.strip().splitlines()[-3:])
    elif res[0]["samples"] != expected:
        r["error"] = f"{res[0]['samples']} samples in the epoch, expected {expected}"
    else:
        r.update(res[0], rate=res[0]["samples"] / res[0]["epoch_s"])
    run.log(f"rep {rep} {cache:4} {mode:6} {name:17} {r.get('rate', 0):8,.0f} samples/s  "
            f"resident {resident:.0%}  {r.get('error', '')}")
    return r


def wait_sweep(dataset, src, steps) -> dict:
    """`shardpack bench --decode cpu --step-ms S` on the packed dataset and on the raw tree."""
    out = {}
    for label, target in (("shardpack-tar", [dataset]), ("files", ["--files", src])):
        c.warm(c.files_under(target[-1]))
        for s in steps:
            cmd = c.shardpack_cmd("bench", *target, "--decode", "cpu", "--device", "cpu", "-q",
                                  "--step-ms", s)
            text = subprocess.run(cmd, capture_output=True, text=True, env=c.child_env()).stdout
            wait = re.search(r"waiting\s+([\d.]+)%", text)
            rate = re.search(r"samples/s\s+([\d,]+)", text)
            out.setdefault(label, []).append(dict(
                step_ms=s, wait=float(wait.group(1)) / 100 if wait else (1.0 if s == 0 else None),
                rate=float(rate.group(1).replace(",", "")) if rate else None))
    return out


def stats(runs) -> dict:
    """{(name, cache, mode): medians} of the runs that delivered every sample."""
    groups = {}
    for r in runs:
        if "rate" in r:
            groups.setdefault((r["name"], r["cache"], r["mode"]), []).append(r)
    return {k: dict(rate=c.med(r["rate"] for r in rs), rates=[r["rate"] for r in rs],
                    first=c.med(r["first_batch_s"] for r in rs),
                    steady=c.med(r["steady"] or 0 for r in rs))
            for k, rs in groups.items()}


def peer_figures(st, names, caches, modes) -> list:
    """shardpack's rates per cache and mode with every peer's beside them; then the rates after
    the first batch (worker start-up, first reads and FFCV's JIT left out)."""
    out = []
    for cache in caches:
        for mode in modes:
            for name in ("shardpack-tar", "shardpack-msgpack"):
                s = st.get((name, cache, mode))
                if s is None:
                    continue
                peers = {p: st[(p, cache, mode)]["rate"] for p in names
                         if not p.startswith("shardpack") and (p, cache, mode) in st}
                out.append(figure(f"{mode}, {cache}: {name}", s["rate"], "samples/s", peers, {},
                                  f"first batch {s['first']:.2f} s; runs "
                                  f"{c.spread(s['rates'], '{:,.0f}')}"))
            s = st.get(("shardpack-tar", cache, mode))
            if s:
                peers = {p: st[(p, cache, mode)]["steady"] for p in names
                         if p != "shardpack-tar" and (p, cache, mode) in st}
                out.append(figure(f"{mode}, {cache}: shardpack-tar after the first batch",
                                  s["steady"], "samples/s", peers, {}, "median rate after it"))
    return out


def sweep_figures(sweep) -> list:
    """The wait fraction at each step time, shardpack against the raw tree."""
    out = []
    files = {p["step_ms"]: p for p in sweep.get("files", [])}
    for p in sweep.get("shardpack-tar", []):
        if p["step_ms"] == 0 or p["wait"] is None:
            continue  # (with no step, the consumer waits 100% by definition)
        other = files.get(p["step_ms"], {})
        out.append(figure(f"decode cpu, {p['step_ms']} ms steps: share of the time waiting",
                          p["wait"], "fraction", {"files": other.get("wait")}, {},
                          f"shardpack bench --decode cpu --step-ms {p['step_ms']}; "
                          f"{p['rate'] or 0:,.0f} samples/s (files {other.get('rate') or 0:,.0f})"))
    return out


@suite("peers", title="Loading: shardpack against its peers", options=options,
       quick=dict(images=200, steps="0,50"),
       measures="""Samples per second of one epoch into PyTorch (2 loader workers or threads,
       batch 256, shuffled), bytes only and decoded (JPEG decode, random-resized-crop 224,
       flip), from loader construction to the last batch (imports and interpreter start
       excluded). Each run a subprocess in the venv its loader needs; contenders rotated; cold
       runs after os.sync() and posix_fadvise(DONTNEED) of every file read, warm after reading
       them once. Inputs are converted once with each peer's own writer (64 MB shards or chunks,
       no compression); raw files and DALI read the ImageFolder tree. shardpack decodes with
       `CpuDecode` (libjpeg-turbo at a reduced DCT scale, only the crop's region: docs/device.md),
       FFCV and DALI with their own, the others
       with one shared Pillow function. Also the wait fraction of `shardpack bench --decode cpu`
       against a simulated training step.""",
       bounds="""Bytes only: per-sample Python work in the peers' loaders (shardpack moves batches
       whole); DALI's C++ reader and FFCV's numba pipeline after its JIT compilation (~2 s before
       the first batch) are faster still. Decoded: the CPU decode on 2 cores, for everyone, and
       in it Huffman decoding, which no loader can skip; shardpack's lead is its decoder (the
       crop's region only, resized by torch straight into the batch) more than its format.""")
def run_peers(run) -> Outcome:
    """The peers suite."""
    a = run.args
    skip = set(filter(None, a.skip.split(",")))
    names = [n for n in CONTENDERS if n not in skip and os.access(CONTENDERS[n][0], os.X_OK)]
    missing = [n for n in CONTENDERS if n not in skip and n not in names]
    run.log(f"contenders: {', '.join(names)}"
            + (f"; not run (venv missing): {', '.join(missing)}" if missing else "")
            + (f"; skipped (--skip): {', '.join(sorted(skip))}" if skip else ""))
    src, gen = c.ensure_images(run.data_dir, a.images)
    paths = prepare(run, src, names)
    caches, modes = a.caches.split(","), a.modes.split(",")
    expected = len(c.list_tree(src))
    fincore = ""
    if shutil.which("fincore") and "cold" in caches:
        c.evict(c.files_under(paths[names[0]]))
        fincore = c.fincore_check(c.files_under(paths[names[0]])[:50])
    runs = []
    for rep in range(run.reps):
        for cache in caches:
            for mode in modes:
                for name in c.rotated(names, rep):
                    runs.append(one_epoch(run, name, paths[name], mode, cache, rep, expected))
    sweep = {}
    if "shardpack-tar" in names and a.steps:
        sweep = wait_sweep(paths["shardpack-tar"], src, [int(s) for s in a.steps.split(",")])
    st = stats(runs)
    failed = sorted({f"{r['name']} ({r['cache']}/{r['mode']}: {r['error']})" for r in runs
                     if "error" in r})
    if a.plot:
        plot(a.plot, st, names, caches, modes, expected, sweep)
    setup = (f"{expected:,} JPEGs (`{gen}`); {run.reps} repetitions; {fincore or 'no fincore'}"
             + (f"; not run (venv missing): {', '.join(missing)}" if missing else "")
             + (f"; failed: {'; '.join(failed)}" if failed else "") + ".")
    return Outcome(peer_figures(st, names, caches, modes) + sweep_figures(sweep), setup,
                   versions=versions(), raw={"stats": {"|".join(k): v for k, v in st.items()},
                                             "sweep": sweep})


def versions() -> dict:
    """The loaders' versions in each venv."""
    meta = "import importlib.metadata as m, sys; print(*[m.version(p) for p in sys.argv[1:]])"

    def v(py, *pkgs):
        try:
            got = subprocess.run([str(py), "-c", meta, *pkgs], capture_output=True, text=True,
                                 timeout=120).stdout.split()
        except OSError:
            got = []
        return {p: x for p, x in zip(pkgs, got, strict=False)}
    return {**v(sys.executable, "webdataset", "pillow", "simplejpeg"),
            **v(c.PEER_PY, "mosaicml-streaming", "litdata"),
            **v(c.LOADERS_PY, "ffcv", "nvidia-dali-cuda120")}


def plot(png, st, names, caches, modes, files, sweep) -> None:
    """samples/s per contender (log scale) and the wait sweep, side by side, into ``png``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw=dict(width_ratios=[2.2, 1]))
    combos = [(k, m) for m in modes for k in caches]
    width = 0.8 / len(combos)
    for i, (cache, mode) in enumerate(combos):
        rates = [st.get((n, cache, mode), {}).get("rate", 0) for n in names]
        a1.bar([j + i * width for j in range(len(names))], rates, width, label=f"{mode}, {cache}")
    a1.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=25)
    a1.set_yscale("log")
    a1.set_ylabel("samples/s (median, one epoch, log scale)")
    a1.set_title(f"Loading {files:,} JPEGs: 2 workers, batch 256")
    a1.legend()
    for label, pts in sweep.items():
        pts = [p for p in pts if p["wait"] is not None]
        a2.plot([p["step_ms"] for p in pts], [p["wait"] for p in pts], "o-", label=label)
    a2.set_xlabel("simulated step time, ms per batch")
    a2.set_ylabel("wait fraction of wall time")
    a2.set_ylim(0, 1.05)
    a2.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
