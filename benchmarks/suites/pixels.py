"""Small images stored as raw pixels (``pack --pixels raw``) against the same images encoded:
48 px PNG icons, ~64 px photo tiles (JPEG and PNG) and 32x32 PNGs through a plain Pillow loader,
the README pipeline on the encoded pack and on the raw pack, and FFCV's raw mode; the bytes of
each form; and where raw starts to pay: the per-image decode time and bytes of each form by side,
the storage bandwidth per core above which raw wins, from the page cache and over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import common as c
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure
from benchmarks.suites import pixel_probe as probe
from benchmarks.suites import trees
from benchmarks.suites.remote import Servers

PROBE = "benchmarks.suites.pixel_probe"
TREES = ("icons", "tiles64", "cifar32")
# tree -> (its sources' formats, the output side of the crops, FFCV's raw mode runs on it)
SHAPES = {"icons": (("png",), 48, False), "tiles64": (("jpg", "png"), 64, True),
          "cifar32": (("png",), 32, True)}
ICONS_TARGET, FFCV_TARGET = 5.0, 1.0
PACK = ("--shard-size", "64MB")
FFCV: dict = {}  # FFCV's version (or why none), asked once a run


def options(p) -> None:
    """The pixels suite's options."""
    p.add_argument("--trees", default=",".join(TREES),
                   help=f"the trees to run, comma-separated [{','.join(TREES)}]")
    p.add_argument("--images", type=int, default=5000, help="images per tree [5000]")
    p.add_argument("--epochs", type=int, default=4,
                   help="epochs per measurement; the rate counts those after the first [4]")
    p.add_argument("--measure-s", type=float, default=2.0,
                   help="more epochs while the counted ones have run less than this, seconds "
                        "[2]")
    p.add_argument("--per-side", type=int, default=40,
                   help="tiles per side in the crossover probe [40]")
    p.add_argument("--min-s", type=float, default=0.3,
                   help="the crossover probe's shortest timed pass, seconds [0.3]")
    p.add_argument("--http-mbps", default="20,80",
                   help="bandwidth limits of the HTTP reads, MB/s, comma-separated; empty: "
                        "none [20,80]")


# ------------------------------------------------------------------------------ the data

def sources(run, tree: str) -> tuple[dict, str]:
    """{format: ImageFolder tree} of ``tree`` and what it holds, made where missing."""
    n = run.args.images
    if tree == "icons":
        src, what = trees.ensure_icons(run.data_dir, n)
        return {"png": src}, what
    base = run.data_dir / "pixels" / f"{tree}-{n}"
    fmts = SHAPES[tree][0]
    if not Path(f"{base}.done").exists():
        run.log(f"generating {n} {tree} images")
        lo, hi = (56, 72) if tree == "tiles64" else (32, 32)
        c.fresh(f"{PROBE}:make_tiles", str(base), n, lo, hi, list(fmts), timeout=3600)
        Path(f"{base}.done").write_text("")
    side = "56-72 px a side (each side drawn apart)" if tree == "tiles64" else "32x32"
    what = (f"{n:,} {side} LANCZOS crops of scikit-image's photos as "
            + " and as ".join({"jpg": "JPEG (quality 90, 4:2:0)", "png": "PNG"}[f] for f in fmts))
    return {f: Path(f"{base}-{f}") for f in fmts}, what


def datasets(run, tree: str, srcs: dict, notes: list) -> dict:
    """{contender: path}: the Pillow loader's files, the encoded packs, the raw pack (from the
    lossless source), FFCV's raw .beton where its venv is there."""
    fmts, _, ffcv = SHAPES[tree]
    base = run.data_dir / "pixels" / "packs"
    n = run.args.images
    out = {"pillow": srcs[fmts[0]]}
    for f in fmts:
        out[f"shardpack-{f}"] = c.ensure_pack(srcs[f], base / f"{tree}-{n}-{f}", *PACK)
    out["shardpack-raw"] = c.ensure_pack(srcs["png"], base / f"{tree}-{n}-raw", *PACK,
                                         "--pixels", "raw")
    out["shardpack-raw-threads"] = out["shardpack-raw"]  # execution="threads" (2 threads)
    if ffcv:
        if "v" not in FFCV:
            FFCV["v"], FFCV["why"] = ffcv_version()
        if FFCV["v"] is None:
            notes.append(f"FFCV: not measured on {tree} ({FFCV['why']})")
            return out
        beton = base / f"{tree}-{n}-ffcv-raw.beton"
        if not beton.exists():
            run.log(f"writing {beton.name}")
            try:
                c.fresh(f"{PROBE}:write_ffcv", str(srcs["png"]), str(beton),
                        python=c.LOADERS_PY, timeout=3600)
            except RuntimeError as exc:
                notes.append(f"FFCV: not measured on {tree} (its writer failed: {exc})")
                return out
        out["ffcv-raw"] = beton
    return out


def ffcv_version() -> tuple[str | None, str]:
    """(FFCV's version, or None and why it cannot run here)."""
    if not c.LOADERS_PY.exists():
        return None, "no .bench-loaders-venv: run benchmarks/suites/setup_loaders.sh"
    try:
        return c.fresh(f"{PROBE}:ffcv_version", python=c.LOADERS_PY, timeout=300), ""
    except (RuntimeError, OSError) as exc:
        return None, f"ffcv does not import in .bench-loaders-venv: {exc}"


def on_disk(path: Path) -> int:
    """Bytes of a dataset: a pack's shards and indexes from its manifest, else its files."""
    manifest = path / "shardpack.json" if path.is_dir() else None
    if manifest and manifest.exists():
        m = json.loads(manifest.read_text())
        return m["num_bytes"] + sum(s.get("index_bytes", 0) for s in m["shards"])
    return c.tree_bytes(path) if path.is_dir() else path.stat().st_size


# ------------------------------------------------------------------------------ the loaders

def measure_tree(run, tree: str, paths: dict) -> dict:
    """Every contender on one tree, each in a fresh interpreter, alternated: {kind: [results]}."""
    size = SHAPES[tree][1]
    c.warm([f for p in paths.values() for f in (c.files_under(p) if p.is_dir() else [p])])
    runs = {k: [] for k in paths}
    for rep in range(run.reps):
        for kind in c.rotated(list(paths), rep):
            py = c.LOADERS_PY if kind == "ffcv-raw" else None
            r = c.fresh(f"{PROBE}:epochs", kind, str(paths[kind]), size, run.args.epochs,
                        run.args.measure_s, python=py, timeout=1800)
            runs[kind].append(r)
            run.log(f"{tree} rep {rep} {kind:15s} {r['rate']:9.0f} images/s, "
                    f"{r['cpu_per_image'] * 1e6:7.1f} CPU-us/image on {r['cores']:.2f} cores")
    return runs


def ratio_note(rate: dict) -> str:
    """The raw pack's ratios to the others, side by side."""
    raw = rate.get("shardpack-raw")
    parts = [f"raw / {k} {raw / v:.2f}x" for k, v in rate.items()
             if raw and v and k != "shardpack-raw"]
    return "; ".join(parts)


def tree_figures(tree: str, runs: dict, sizes: dict, notes: list) -> list:
    """The figures of one tree (``notes``: why a contender is missing)."""
    rate = {k: c.med(r["rate"] for r in v) for k, v in runs.items()}
    cpu = {k: c.med(r["cpu_per_image"] * 1e6 for r in v) for k, v in runs.items()}
    head = "shardpack-raw"
    raw_runs = [r["rate"] for r in runs[head]]
    figures = [
        figure(f"{tree}: images/s, {head}", rate[head], "images/s",
               {k: v for k, v in rate.items() if k != head}, {},
               "; ".join([ratio_note(rate), f"raw runs {c.spread(raw_runs, '{:,.0f}')}"]
                         + [n for n in notes if f"on {tree} (" in n])),
        figure(f"{tree}: CPU per image, {head}", cpu[head], "CPU-us",
               {k: v for k, v in cpu.items() if k != head}, {},
               "CPU seconds of the loader's process, threads and workers over its images")]
    targets = [("pillow", ICONS_TARGET)] if tree == "icons" else [("ffcv-raw", FFCV_TARGET)]
    for other, target in targets:
        for mine in (head, f"{head}-threads"):
            if other in rate and mine in rate:
                x = rate[mine] / rate[other]
                figures.append(figure(f"{tree}: {mine} / {other}", x, "x", {},
                                      {"target": target},
                                      f"target >= {target:g}x: {c.verdict(x >= target)}"))
    sizes.pop("shardpack-raw-threads", None)  # the same pack
    raw_mb = sizes.pop("shardpack-raw") / 1e6
    figures.append(figure(f"{tree}: bytes on disk, raw pack", raw_mb, "MB",
                          {k: v / 1e6 for k, v in sizes.items()}, {},
                          "packs: shards + indexes from the manifest; pillow: the files; "
                          "ffcv-raw: the .beton"))
    return figures


# ------------------------------------------------------------------------------ the crossover

def crossing(raw: dict, encoded: dict) -> float | None:
    """The storage bandwidth per core (MB/s) above which raw pixels load faster than the encoded
    form, from each form's per-image seconds and bytes: 0 where raw is both smaller and faster,
    None where its decode is no faster (raw never wins)."""
    saved, extra = encoded["s"] - raw["s"], raw["bytes"] - encoded["bytes"]
    if saved <= 0:
        return None if extra >= 0 else 0.0
    return max(0.0, extra / saved / 1e6)


def crossover_figures(cross: dict, bandwidth: float, limits: list) -> list:
    """One figure a side (the JPEG crossover, the PNG one beside it) and the largest raw size
    that wins at each bandwidth: the page cache's and the HTTP limits'."""
    from shardpack.write.pixels import AUTO_BYTES

    figures, cross_mb = [], {}
    for side, forms in cross.items():
        raw = forms["raw"]
        row = {}
        for fmt in ("jpg", "png"):
            row[fmt] = crossing(raw, forms[fmt])
        cross_mb[int(side)] = row
        note = (f"per image: raw {raw['bytes'] / 1e3:.1f} kB {raw['s'] * 1e6:.0f} us, "
                + ", ".join(f"{f} {forms[f]['bytes'] / 1e3:.1f} kB {forms[f]['s'] * 1e6:.0f} us"
                            for f in ("jpg", "png")))
        figures.append(figure(f"crossover at {side}x{side}, vs JPEG", row["jpg"], "MB/s per core",
                              {"vs PNG": row["png"]}, {"page cache": bandwidth},
                              note + ("; None: raw never wins" if None in row.values() else "")))
    for name, bw in [("page cache", bandwidth)] + [(f"HTTP {m:g} MB/s", m) for m in limits]:
        side = {f: largest_winner(cross_mb, f, bw) for f in ("jpg", "png")}
        kib = {f: (s * s * 3 + 128) / 1024 if s else 0 for f, s in side.items()}
        top = max(cross_mb)
        figures.append(figure(
            f"auto threshold, {name}, vs JPEG", kib["jpg"], "KiB", {"vs PNG": kib["png"]},
            {"auto default": AUTO_BYTES / 1024},
            f"the raw bytes of the largest square side whose crossover is below {bw:,.0f} MB/s "
            f"per core: vs JPEG {side['jpg'] or 'none'}, vs PNG {side['png'] or 'none'} "
            f"(sides {min(cross_mb)}-{top} measured)"))
    return figures


def largest_winner(cross_mb: dict, fmt: str, bandwidth: float) -> int | None:
    """The largest side at which raw beats ``fmt`` at ``bandwidth`` MB/s per core."""
    wins = [s for s, row in cross_mb.items() if row[fmt] is not None and bandwidth > row[fmt]]
    return max(wins) if wins else None


def http_runs(run, packs: dict, limits: list) -> tuple[list, dict]:
    """tiles64's JPEG and raw packs read over HTTP at each bandwidth limit: figures, raw."""
    root = run.data_dir / "pixels" / "packs"
    figures, raw = [], {}
    for mbps in limits:
        server = Servers(f"{PROBE}:serve", str(root), mbps * 1e6)
        try:
            url = f"http://127.0.0.1:{server.ports['port']}"
            rates = {k: [] for k in packs}
            for rep in range(run.reps):
                for kind in c.rotated(list(packs), rep):
                    r = c.fresh(f"{PROBE}:http_epoch", f"{url}/{packs[kind].name}", 64,
                                timeout=1800)
                    rates[kind].append(r["rate"])
                    run.log(f"http {mbps:g} MB/s rep {rep} {kind:15s} {r['rate']:8.0f} images/s")
        finally:
            server.close()
        raw[f"{mbps:g}"] = rates
        med = {k: c.med(v) for k, v in rates.items()}
        figures.append(figure(f"tiles64 over HTTP at {mbps:g} MB/s, shardpack-raw",
                              med["shardpack-raw"], "images/s",
                              {k: v for k, v in med.items() if k != "shardpack-raw"}, {},
                              f"raw / JPEG {med['shardpack-raw'] / med['shardpack-jpg']:.2f}x; "
                              "one epoch from the loader's construction, FaultServer drip_bps "
                              "(a limit per response)"))
    return figures, raw


@suite("pixels", title="Pixels: raw pixels against encoded small images", options=options,
       quick=dict(images=200, reps=1, epochs=2, per_side=4, min_s=0.05, http_mbps="20",
                  measure_s=0.0),
       measures="""Three ImageFolder trees of small images: 48x48 PNG icons (the machine's own,
       /usr/share/icons), ~64 px tiles (56-72 px a side, LANCZOS crops of scikit-image's photos)
       stored as JPEG quality 90 and as PNG, and 32x32 PNG tiles. Each is read by a plain Pillow
       loader from its files (the trees suite's recipe: open, RGB, random-resized crop, bilinear
       resize, flip, uint8), by the README pipeline (`CpuDecode` in 2 DataLoader workers,
       `DeviceLoader(device="cpu", decode_on="cpu", normalize=False, dtype="uint8")`) on the pack
       of the encoded files (`shardpack-jpg`, `shardpack-png`) and on the `pack --pixels raw`
       pack (`shardpack-raw`; `shardpack-raw-threads`: the same pipeline with
       `execution="threads"`, 2 threads of the loading process and no DataLoader workers), and
       by FFCV on an `RGBImageField(write_mode="raw")` .beton with
       `RandomResizedCropRGBImageDecoder` + flip (`ffcv-raw`, tiles64 and cifar32). Crops come
       out at the tree's own side (48, 64, 32); batch 256, shuffled, warm page cache; images/s and
       CPU per image over the epochs after the first (at least 2 s of them: more epochs where
       3 took less; epoch starts included), each measurement in a fresh interpreter,
       the contenders alternated, medians. Bytes on disk of each form. The `auto` threshold:
       square tiles of sides 32-384 as JPEG, PNG and raw, one thread timing CpuDecode's decode
       of each form's tiles as one batch (`decode_samples`: the pipeline's crop + resize to
       min(side, 224); JPEG by the region decoder, raw by the batch crop) per image; raw wins
       where storage delivers more than (raw bytes - encoded bytes) / (encoded time - raw time)
       per core, the crossover, which is set against the page cache's read rate (one thread)
       and against HTTP limits; and tiles64's JPEG and raw packs read over HTTP from a server
       limited to those rates.""",
       bounds="""On 2 cores the CPU bounds every loader here (the notes give the ratios measured
       side by side): raw pixels take no decode, and a batch's headers, crop plans and resizes are
       one call of compiled code (as FFCV's are), so what is left is the resize itself and the
       per-batch work (reading and checking the samples, the worker's hand-off, each epoch's
       start, which a 5,000-image epoch of 32 px images feels: about a quarter of it). Against
       JPEG the bytes added grow with the pixels faster than the decode saved, so the crossover
       rises with the side; against PNG (a slower decode, larger files) it is far lower. Where
       storage delivers less than a side's crossover per core, the encoded form loads faster;
       from the page cache
       (one thread's read rate is the limit beside each crossover) the extra bytes cost next to
       nothing, and the threshold is a matter of disk space.""")
def run_pixels(run) -> Outcome:
    """The pixels suite: trees made and packed once, every contender alternated, the crossover
    probe, the HTTP reads."""
    chosen = [t.strip() for t in run.args.trees.split(",") if t.strip()]
    unknown = set(chosen) - set(TREES)
    if unknown:
        raise SystemExit(f"pixels: unknown tree {', '.join(sorted(unknown))}")
    limits = [float(x) for x in run.args.http_mbps.split(",") if x.strip()]
    figures, raw, notes, described, packs = [], {}, [], [], {}
    FFCV.clear()
    for tree in chosen:
        srcs, what = sources(run, tree)
        described.append(f"{tree}: {what}")
        paths = datasets(run, tree, srcs, notes)
        packs[tree] = paths
        raw[tree] = measure_tree(run, tree, paths)
        sizes = {k: on_disk(p) for k, p in paths.items()}
        raw[f"{tree}-bytes"] = dict(sizes)
        figures += tree_figures(tree, raw[tree], sizes, notes)
    run.log("crossover probe")
    cross = c.fresh(f"{PROBE}:crossover", list(probe.SIDES), run.args.per_side, run.args.min_s,
                    timeout=3600)
    shards = [f for p in packs.values() for f in c.shard_files(p["shardpack-raw"])]
    if not shards:
        shards = c.shard_files(c.ensure_pack(*sources(run, "cifar32")[0].values(),
                                             run.data_dir / "pixels" / "packs" / "cifar32-raw",
                                             *PACK, "--pixels", "raw"))
    c.warm(shards)
    bandwidth = c.fresh(f"{PROBE}:read_bandwidth", shards, run.args.min_s)["mb_s"]
    raw.update(crossover=cross, page_cache_mb_s=bandwidth)
    figures += crossover_figures(cross, bandwidth, limits)
    if limits and "tiles64" in packs:
        http, raw["http"] = http_runs(run, {k: packs["tiles64"][k] for k in
                                            ("shardpack-jpg", "shardpack-raw")}, limits)
        figures += http
    elif limits:
        notes.append("HTTP: not measured (it reads the tiles64 packs; --trees left it out)")
    counted = (f"the last {run.args.epochs - 1}, more while they had run under "
               f"{run.args.measure_s:g} s" if run.args.epochs > 1 else "one")
    setup = (f"{'; '.join(described)}. Batch {probe.BATCH}, {probe.WORKERS} workers, "
             f"{run.args.epochs} epochs ({counted} counted), {run.reps} repetitions; crossover "
             f"probe: {run.args.per_side} tiles a side, passes of {run.args.min_s:g} s. "
             + " ".join(notes))
    part = None if tuple(chosen) == TREES else "-".join(chosen)
    versions = {"ffcv": FFCV["v"]} if FFCV.get("v") else {}
    return Outcome(figures, setup, versions=versions, part=part, raw=raw)
