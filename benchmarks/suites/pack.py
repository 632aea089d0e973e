"""Packing throughput: shardpack (tar, msgpack) against GNU tar -cf (with and without an fsync)
and the peers' writers (webdataset, MDS, LitData) on an ImageNet-like tree and a tree of tiny
files, cold and warm."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from benchmarks import common as c
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure

PEERS = ("webdataset", "mds", "litdata")
SHARDPACK = ("shardpack-tar", "shardpack-msgpack")
FLOORS = {"tar-cf": "tar -cf", "tar-cf+fsync": "tar -cf + fsync"}


def options(p) -> None:
    """The pack suite's options."""
    p.add_argument("--images", type=int, default=20000, help="ImageNet-like tree size [20000]")
    p.add_argument("--tiny-count", type=int, default=1_000_000,
                   help="tiny tree size, 0 to skip [1000000]")
    p.add_argument("--tiny-reps", type=int, default=None, help="[--reps]")
    p.add_argument("--modes", default="cold,warm", help="page-cache modes, imagenet tree")
    p.add_argument("--tiny-modes", default="cold", help="page-cache modes, tiny tree")
    p.add_argument("--skip", default="", help="contenders to skip: " + ",".join(contenders()))
    p.add_argument("--tiny-skip", default="", help="contenders to skip on the tiny tree only")
    p.add_argument("--timeout", type=float, default=3600, help="per run, seconds")


def contenders() -> dict:
    """name -> function (src, out) -> command."""
    def peer(python, name):
        return lambda s, o: c.child_cmd("benchmarks.suites.writers:peer_main", name, s, o,
                                        python=python)

    def sp(fmt):
        return lambda s, o: c.shardpack_cmd("pack", s, o, "--format", fmt, "--workers", "2")

    return {
        "shardpack-tar": sp("tar"),
        "shardpack-msgpack": sp("msgpack"),
        "tar-cf": lambda s, o: ["tar", "-cf", os.path.join(o, "data.tar"), "-C", s, "."],
        # the durable floor: the same archive, then fsync'ed (coreutils `sync FILE`), as
        # shardpack fsyncs every shard before publishing it
        "tar-cf+fsync": lambda s, o: ["sh", "-c", 'tar -cf "$1" -C "$2" . && sync "$1"', "sh",
                                      os.path.join(o, "data.tar"), s],
        "webdataset": peer(None, "webdataset"),
        "mds": peer(c.PEER_PY, "mds"),
        "litdata": peer(c.PEER_PY, "litdata"),
    }


def one_run(run, tree, name, mode, rep, src, paths, info, scratch) -> None:
    """One contender's pack of the tree, cold or warm; recorded in ``info``."""
    out = scratch / name
    shutil.rmtree(scratch, ignore_errors=True)
    out.mkdir(parents=True)
    before = c.resident_fraction(paths)
    (c.evict if mode == "cold" else c.warm)(paths)
    after = c.resident_fraction(paths)
    info["resid"].setdefault(mode, []).append((before, after))
    if mode == "cold" and "fincore" not in info and shutil.which("fincore"):
        info["fincore"] = c.fincore_check(paths[:: max(1, len(paths) // 20)])
    log = run.data_dir / "logs" / f"{tree}-{name}-{mode}-{rep}.log"
    cmd = contenders()[name](str(src), str(out))
    r = c.run_measured(cmd, log, timeout=run.args.timeout)
    text = open(log, errors="replace").read()
    inner = [json.loads(ln[7:])["inner_s"] for ln in text.splitlines() if ln.startswith("RESULT=")]
    r.update(name=name, mode=mode, rep=rep, inner_s=inner[0] if inner else None,
             out_bytes=c.tree_bytes(out), resident=after, load1=os.getloadavg()[0])
    if name.startswith("shardpack"):
        info.setdefault("said", {})[name] = text.strip().splitlines()[-1:]
    shutil.rmtree(scratch, ignore_errors=True)
    os.sync()
    if r["rc"] != 0 or r["timeout"]:
        tail = " | ".join(text.strip().splitlines()[-3:])
        info["failed"][name] = f"{'timeout' if r['timeout'] else r['rc']}: {tail}"
    else:
        info["runs"].append(r)
    run.log(f"  rep {rep} {mode:4} {name:18} {r['wall_s']:8.2f} s  rss {r['maxrss_mb']:7.0f} MB"
            f"  pss(tree) {r['tree_pss_mb']:7.0f} MB  resident {before:.0%}->{after:.0%}")


def bench_tree(run, tree, src, names, modes, reps) -> dict:
    """Every contender on one tree, ``reps`` times, rotated; the raw runs."""
    items = c.list_tree(src)
    paths = [os.path.join(src, rel) for rel, _ in items]
    info = dict(files=len(paths), bytes=sum(os.path.getsize(p) for p in paths), runs=[],
                failed={}, resid={})
    (run.data_dir / "logs").mkdir(parents=True, exist_ok=True)
    run.log(f"== {tree}: {len(paths):,} files, {info['bytes'] / 1e6:,.1f} MB")
    for rep in range(reps):
        for mode in modes:
            for name in c.rotated(names, rep):
                if name not in info["failed"]:
                    one_run(run, tree, name, mode, rep, src, paths, info,
                            run.data_dir / "scratch")
    return info


def summarize(info, mode) -> dict:
    """Medians per contender for one mode."""
    rows = {}
    for r in info["runs"]:
        if r["mode"] == mode:
            rows.setdefault(r["name"], []).append(r)
    return {name: dict(med=c.med(r["wall_s"] for r in rs), walls=[r["wall_s"] for r in rs],
                       inner=c.med(r["inner_s"] for r in rs),
                       peak=max(max(r["maxrss_mb"], r["tree_pss_mb"]) for r in rs))
            for name, rs in rows.items()}


def tree_figures(tree, info, stats, mode, count) -> list:
    """The figures of one tree and mode: shardpack's times with the peers and floors beside."""
    out = []
    peers = {p: stats[p]["med"] for p in PEERS if p in stats}
    floors = {label: stats[k]["med"] for k, label in FLOORS.items() if k in stats}
    fastest = min(peers.values()) if peers else None
    for name in SHARDPACK:
        if name not in stats:
            continue
        s = stats[name]
        notes = [f"{info['files'] / s['med']:,.0f} files/s", f"runs {c.spread(s['walls'])}"]
        if "tar -cf + fsync" in floors:
            notes.append(f"{s['med'] / floors['tar -cf + fsync']:.2f}x tar -cf + fsync")
        if "tar -cf" in floors:
            r = s["med"] / floors["tar -cf"]
            notes.append(f"target <= 1.5x tar -cf: {r:.2f}x {c.verdict(r <= 1.5)}")
        if fastest:
            r = s["med"] / fastest
            notes.append(f"target <= 0.5x fastest peer: {r:.2f}x {c.verdict(r <= 0.5)}")
        out.append(figure(f"{tree} {info['files']:,} files, {mode}: {name}", s["med"], "s",
                          peers, floors, "; ".join(notes)))
        if tree == "tiny" and count >= 1_000_000:
            out.append(figure(f"{tree} {info['files']:,} files, {mode}: {name} peak memory",
                              s["peak"], "MB", {}, {"target": 1024},
                              "largest process or the tree's summed PSS: "
                              f"{c.verdict(s['peak'] < 1024)}"))
    return out


@suite("pack", title="Packing", quick=dict(images=200, tiny_count=500, skip="mds,litdata",
                                           timeout=300),
       options=options,
       measures="""Wall time of packing an ImageNet-like tree of generated 100 KB JPEGs and a
       tree of 1 KB files into 256 MB shards: `shardpack pack --workers 2` (tar and msgpack)
       against `tar -cf`, `tar -cf` followed by an fsync of the archive, webdataset's
       ShardWriter, MDSWriter and LitData's optimize. Each run is a subprocess under
       /usr/bin/time (Python start-up counts), contenders rotated each repetition; cold runs
       start after os.sync() and posix_fadvise(DONTNEED) of every source file (mmap + mincore
       checks the resident fraction), warm runs after reading every file once. Peak memory is the
       largest process or the summed PSS of the process tree, sampled every 0.2 s.""",
       bounds="""The durable write. shardpack fsyncs every shard before it renames it into place
       (pack --resume trusts what it finds after a crash only because of that), so its floor is
       `tar -cf` + fsync, not plain `tar -cf`, which (like the peers) leaves its output dirty in
       the page cache. On a disk that writes ~250-330 MB/s, 2 GB take ~6 s whatever the packer
       does. On the tiny tree, half of the fastest peer's time is less than `tar -cf` alone needs
       to read the files cold.""")
def run_pack(run) -> Outcome:
    """The pack suite: both trees, every contender, cold and warm."""
    args = run.args
    skip = set(filter(None, args.skip.split(",")))
    if not os.access(c.PEER_PY, os.X_OK):
        run.log(f"{c.PEER_PY} missing (benchmarks/suites/setup_peers.sh): skipping mds, litdata")
        skip |= {"mds", "litdata"}
    names = [n for n in contenders() if n not in skip]
    plan = [("imagenet", args.images, args.modes, args.reps, names)]
    if args.tiny_count:
        tiny_skip = set(args.tiny_skip.split(","))
        plan.append(("tiny", args.tiny_count, args.tiny_modes, args.tiny_reps or args.reps,
                     [n for n in names if n not in tiny_skip]))
    figures, setup, raw = [], [], {}
    for tree, count, modes, reps, tnames in plan:
        if count <= 0:
            continue
        src, gen = c.ensure_images(run.data_dir, count, tiny=tree == "tiny")
        modes = [m for m in modes.split(",") if m]
        info = bench_tree(run, tree, src, tnames, modes, reps)
        for mode in modes:
            figures += tree_figures(tree, info, summarize(info, mode), mode, count)
        resid = {m: f"{min(a for _, a in v):.1%}-{max(a for _, a in v):.1%}"
                 for m, v in info["resid"].items()}
        setup.append(f"{tree}: {info['files']:,} files, {info['bytes'] / 1e6:,.1f} MB "
                     f"(`{gen}`), {reps} repetitions; resident at start: "
                     + ", ".join(f"{m} {v}" for m, v in resid.items())
                     + (f"; {info['fincore']}" if "fincore" in info else "")
                     + "".join(f"; {n} FAILED ({why})" for n, why in info["failed"].items()))
        raw[tree] = {m: summarize(info, m) for m in modes} | {"said": info.get("said", {})}
    parts = [t for t, n, *_ in plan if n > 0]
    return Outcome(figures, ". ".join(setup) + ".", versions=versions(), raw=raw,
                   part=parts[0] if len(parts) == 1 else None)


def versions() -> dict:
    """tar's, webdataset's and the peer venv's versions."""
    def out(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                                  env=c.child_env()).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    meta = "import importlib.metadata as m, sys; print(*[m.version(p) for p in sys.argv[1:]])"
    peer = out([str(c.PEER_PY), "-c", meta, "mosaicml-streaming", "litdata"]).split()
    return {"tar": (out(["tar", "--version"]).splitlines() or ["?"])[0].split()[-1],
            "webdataset": out([sys.executable, "-c", meta, "webdataset"]),
            "mosaicml-streaming": peer[0] if peer else None,
            "litdata": peer[1] if len(peer) > 1 else None}
