#!/usr/bin/env python3
"""Packing-throughput benchmark: shardpack (tar, msgpack) vs GNU tar -cf, webdataset's
ShardWriter, MosaicML streaming's MDSWriter and LitData's optimize, on an ImageNet-like tree and
a tree of tiny files. Every contender runs as its own subprocess under /usr/bin/time; contenders
alternate within each repetition (rotated order); "cold" runs start with the source evicted from
the page cache (posix_fadvise DONTNEED, checked with mincore), "warm" runs with it fully read.

    python tools/bench_pack.py [--images 20000] [--tiny-count 1000000] [--reps 3]
                               [--out docs/benchmarks.md] [--skip mds,litdata] ...

The peers MDS and LitData run in .bench-venv (tools/bench_setup_peers.sh makes it).
Internally `bench_pack.py --peer NAME SRC OUT` is one peer's writer loop. Per-run logs and
raw records (runs.jsonl) go to DATA_DIR/logs.
"""
import argparse
import datetime
import functools
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, ".venv", "bin", "python")
PEER_PY = os.path.join(ROOT, ".bench-venv", "bin", "python")
SHARDPACK = os.path.join(ROOT, ".venv", "bin", "shardpack")
SHARD_BYTES = 256 * 10**6
PEERS = ("webdataset", "mds", "litdata")


# ---------------------------------------------------------------- peer writers (subprocess side)
def _single_ext(items):
    exts = {bc.split_key(rel)[1] for rel, _ in items}
    if len(exts) != 1:
        raise SystemExit(f"expected one file extension in the tree, found {sorted(exts)}")
    return exts.pop()


def peer_webdataset(src, out, items):
    import webdataset as wds
    t0 = time.perf_counter()
    # maxcount huge: shards are cut by size only, like the other contenders
    with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxsize=SHARD_BYTES,
                         maxcount=10**12, verbose=0) as sink:
        for rel, ci in items:
            key, ext = bc.split_key(rel)
            with open(os.path.join(src, rel), "rb") as f:
                sink.write({"__key__": key, ext: f.read(), "cls": str(ci).encode()})
    return t0


def _mds_writer_class():
    """streaming/__init__.py imports streaming.vision, hence torchvision, which is absent (or
    broken beside the CPU torch wheel); the writer needs neither. Register a bare `streaming`
    package object so that importing streaming.base skips that __init__."""
    import importlib.util
    import types
    spec = importlib.util.find_spec("streaming")
    pkg = types.ModuleType("streaming")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["streaming"] = pkg
    from streaming.base import MDSWriter
    return MDSWriter


def peer_mds(src, out, items):
    writer_cls = _mds_writer_class()
    ext = _single_ext(items)
    t0 = time.perf_counter()
    with writer_cls(out=out, columns={"key": "str", ext: "bytes", "cls": "int"},
                    compression=None, hashes=None, size_limit=SHARD_BYTES) as sink:
        for rel, ci in items:
            with open(os.path.join(src, rel), "rb") as f:
                sink.write({"key": bc.split_key(rel)[0], ext: f.read(), "cls": ci})
    return t0


def _litdata_sample(src, item):
    rel, ci = item
    key, ext = bc.split_key(rel)
    with open(os.path.join(src, rel), "rb") as f:
        return {"key": key, ext: f.read(), "cls": ci}


def peer_litdata(src, out, items):
    from litdata import optimize
    _single_ext(items)
    t0 = time.perf_counter()
    optimize(fn=functools.partial(_litdata_sample, src), inputs=items, output_dir=out,
             chunk_bytes="256MB", num_workers=2)
    return t0


def peer_main(name, src, out):
    """Imports happen inside the writer function; BENCH_INNER_S is the time after them
    (listing + reading + writing), the subprocess wall time also counts startup."""
    runner = {"webdataset": peer_webdataset, "mds": peer_mds, "litdata": peer_litdata}[name]
    t_list = time.perf_counter()
    items = bc.list_tree(src)
    t_list = time.perf_counter() - t_list
    t0 = runner(src, out, items)
    print(f"BENCH_INNER_S={time.perf_counter() - t0 + t_list:.3f}", flush=True)


# ---------------------------------------------------------------- harness side
def contenders():
    def py_peer(py, name):
        return lambda s, o: [py, os.path.abspath(__file__), "--peer", name, s, o]

    def sp(fmt):
        return lambda s, o: [SHARDPACK, "pack", s, o, "--format", fmt, "--workers", "2"]

    return {
        "shardpack-tar": sp("tar"),
        "shardpack-msgpack": sp("msgpack"),
        "tar-cf": lambda s, o: ["tar", "-cf", os.path.join(o, "data.tar"), "-C", s, "."],
        # the durable floor: the same archive, then fsync'ed (coreutils `sync FILE`), as
        # shardpack fsyncs every shard before publishing it
        "tar-cf+fsync": lambda s, o: ["sh", "-c", 'tar -cf "$1" -C "$2" . && sync "$1"', "sh",
                                      os.path.join(o, "data.tar"), s],
        "webdataset": py_peer(VENV_PY, "webdataset"),
        "mds": py_peer(PEER_PY, "mds"),
        "litdata": py_peer(PEER_PY, "litdata"),
    }


def _cmd_out(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def versions():
    meta = "import importlib.metadata as m, sys; print(*[m.version(p) for p in sys.argv[1:]])"
    peer = _cmd_out([PEER_PY, "-c", meta, "mosaicml-streaming", "litdata", "torch"]).split()
    return {
        "shardpack": (_cmd_out([SHARDPACK, "--version"]) or "not installed") + " (git "
        + _cmd_out(["git", "-C", ROOT, "describe", "--always", "--dirty"]) + ")",
        "tar-cf": _cmd_out(["tar", "--version"]).splitlines()[0],
        "tar-cf+fsync": "the same tar, then " + _cmd_out(["sync", "--version"]).splitlines()[0],
        "webdataset": "webdataset " + _cmd_out([VENV_PY, "-c", meta, "webdataset"]),
        "mds": f"mosaicml-streaming {peer[0]} (torch {peer[2]})" if peer else "missing",
        "litdata": f"litdata {peer[1]}" if peer else "missing",
    }


def ensure_tree(data_dir, kind, count):
    """Generate the tree with tools/make_images.py unless a finished one is there."""
    src = os.path.join(data_dir, f"{kind}-{count}")
    done = src + ".done"
    cmd = [VENV_PY, os.path.join(ROOT, "tools", "make_images.py"), src, "--count", str(count)]
    cmd += ["--tiny"] if kind == "tiny" else []
    shown = shlex.join(["python", "tools/make_images.py", os.path.relpath(src, ROOT)] + cmd[3:])
    if not os.path.exists(done):
        os.makedirs(data_dir, exist_ok=True)
        print("generating:", shown, flush=True)
        subprocess.run(cmd + ["--overwrite"], check=True)
        with open(done, "w") as f:
            f.write(shown + "\n")
    return src, shown


def fincore_check(paths):
    """Independent check of an eviction with util-linux fincore: resident bytes / size."""
    res = subprocess.run(["fincore", "-b", "-n", "-o", "RES,SIZE"] + paths,
                         capture_output=True, text=True).stdout.split()
    nums = [int(x) for x in res]
    return f"fincore: {sum(nums[0::2]):,} of {sum(nums[1::2]):,} bytes resident " \
           f"in {len(paths)} files right after the first eviction"


def bench_tree(tree, src, names, modes, reps, scratch, timeout, log_dir):
    items = bc.list_tree(src)
    paths = [os.path.join(src, rel) for rel, _ in items]
    src_bytes = sum(os.path.getsize(p) for p in paths)
    info = dict(files=len(paths), bytes=src_bytes, runs=[], failed={}, resid={})
    print(f"\n== {tree}: {len(paths):,} files, {src_bytes / 1e6:,.1f} MB", flush=True)
    cmds = contenders()
    for rep in range(reps):
        for mode in modes:
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                if name in info["failed"]:
                    continue
                out = os.path.join(scratch, name)
                shutil.rmtree(scratch, ignore_errors=True)
                os.makedirs(out)
                before = bc.resident_fraction(paths)
                (bc.evict if mode == "cold" else bc.warm)(paths)
                after = bc.resident_fraction(paths)
                info["resid"].setdefault(mode, []).append((before, after))
                if mode == "cold" and "fincore" not in info and shutil.which("fincore"):
                    info["fincore"] = fincore_check(paths[:: max(1, len(paths) // 20)])
                log = os.path.join(log_dir, f"{tree}-{name}-{mode}-{rep}.log")
                load = os.getloadavg()[0]  # noise indicator (shared machine), in runs.jsonl
                r = bc.run_measured(cmds[name](src, out), log, timeout=timeout)
                text = open(log, errors="replace").read()
                inner = [float(ln.split("=")[1]) for ln in text.splitlines()
                         if ln.startswith("BENCH_INNER_S=")]
                r.update(name=name, mode=mode, rep=rep, inner_s=inner[0] if inner else None,
                         out_bytes=bc.tree_bytes(out), resident=after)
                if name.startswith("shardpack"):
                    info.setdefault("summary", {})[name] = text.strip().splitlines()[-1:]
                shutil.rmtree(scratch, ignore_errors=True)
                os.sync()
                status = "ok"
                if r["rc"] != 0 or r["timeout"]:
                    tail = " | ".join(text.strip().splitlines()[-3:])
                    status = "TIMEOUT" if r["timeout"] else f"FAILED rc={r['rc']}"
                    info["failed"][name] = f"{status}: `{shlex.join(cmds[name](src, out))}`: {tail}"
                else:
                    info["runs"].append(r)
                with open(os.path.join(log_dir, "runs.jsonl"), "a") as f:
                    f.write(json.dumps(dict(r, tree=tree, files=len(paths), bytes=src_bytes,
                                            resident_before=before, load1=load, status=status))
                            + "\n")
                print(f"  rep {rep} {mode:4} {name:18} {r['wall_s']:8.2f} s  "
                      f"rss {r['maxrss_mb']:7.0f} MB  pss(tree) {r['tree_pss_mb']:7.0f} MB  "
                      f"resident {before:.0%}->{after:.0%}  {status}", flush=True)
    return info


def summarize(info, mode):
    rows = {}
    for r in info["runs"]:
        if r["mode"] == mode:
            rows.setdefault(r["name"], []).append(r)
    stats = {}
    for name, rs in rows.items():
        walls = [r["wall_s"] for r in rs]
        inner = [r["inner_s"] for r in rs if r["inner_s"] is not None]
        stats[name] = dict(med=statistics.median(walls), lo=min(walls), hi=max(walls), n=len(rs),
                           inner=statistics.median(inner) if inner else None,
                           rss=max(r["maxrss_mb"] for r in rs),
                           pss=max(r["tree_pss_mb"] for r in rs),
                           out_mb=statistics.median(r["out_bytes"] for r in rs) / 1e6)
    return stats


def table(info, stats):
    tar = stats.get("tar-cf", {}).get("med")
    durable = stats.get("tar-cf+fsync", {}).get("med")
    peer_meds = [stats[p]["med"] for p in PEERS if p in stats]
    fastest = min(peer_meds) if peer_meds else None

    def ratio(v, ref):
        return f"{v / ref:.2f}x" if ref else "n/a"

    lines = ["| contender | median s (min-max, n) | inner s | files/s | MB/s | vs tar -cf | "
             "vs tar -cf+fsync | vs fastest peer | peak RSS MB (largest proc / tree PSS) "
             "| output MB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in sorted(stats.items(), key=lambda kv: kv[1]["med"]):
        inner = f"{s['inner']:.2f}" if s["inner"] is not None else "-"
        lines.append(f"| {name} | {s['med']:.2f} ({s['lo']:.2f}-{s['hi']:.2f}, {s['n']}) | {inner} "
                     f"| {info['files'] / s['med']:,.0f} | {info['bytes'] / 1e6 / s['med']:,.1f} "
                     f"| {ratio(s['med'], tar)} | {ratio(s['med'], durable)} "
                     f"| {ratio(s['med'], fastest)} "
                     f"| {s['rss']:,.0f} / {s['pss']:,.0f} | {s['out_mb']:,.1f} |"
                     .replace(" / 0 |", " / - |"))
    return lines, tar, durable, fastest


def targets(tree, count, stats, tar, durable, fastest, mode):
    out = []
    for name in ("shardpack-tar", "shardpack-msgpack"):
        if name not in stats:
            continue
        s = stats[name]
        if fastest:
            ok = s["med"] <= 0.5 * fastest
            out.append(f"- {name}, {mode}: <= 0.5x fastest peer: {s['med'] / fastest:.2f}x "
                       f"-> **{'PASS' if ok else 'FAIL'}**")
        if tar:
            ok = s["med"] <= 1.5 * tar
            out.append(f"- {name}, {mode}: <= 1.5x tar -cf: {s['med'] / tar:.2f}x "
                       f"-> **{'PASS' if ok else 'FAIL'}**")
        if durable:  # not an issue target: the like-for-like reference (both fsync)
            out.append(f"  - for reference, vs tar -cf+fsync (same durability): "
                       f"{s['med'] / durable:.2f}x")
        if tree == "tiny":
            peak = max(s["rss"], s["pss"])  # the tree's summed PSS for multi-process packers
            verdict = ("PASS" if peak < 1024 else "FAIL") if count >= 1_000_000 else \
                f"not tested at 1M (ran {count:,})"
            out.append(f"- {name}, {mode}: {count:,} tiny files with peak RSS < 1 GB: "
                       f"{peak:,.0f} MB -> **{verdict}**")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=20000, help="ImageNet-like tree size")
    ap.add_argument("--tiny-count", type=int, default=1_000_000, help="tiny tree size (0: skip)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tiny-reps", type=int, default=None, help="default: --reps")
    ap.add_argument("--modes", default="cold,warm", help="page-cache modes, imagenet tree")
    ap.add_argument("--tiny-modes", default="cold", help="page-cache modes, tiny tree")
    ap.add_argument("--skip", default="", help="contenders to skip, comma separated: "
                    + ",".join(contenders()))
    ap.add_argument("--tiny-skip", default="", help="contenders to skip on the tiny tree only")
    ap.add_argument("--timeout", type=float, default=3600, help="per run, seconds")
    ap.add_argument("--data-dir", default=os.path.join(ROOT, "bench-data"))
    ap.add_argument("--scratch", default=None, help="default: DATA_DIR/scratch (deleted)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--peer", nargs=3, metavar=("NAME", "SRC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        return peer_main(*args.peer)

    skip = set(filter(None, args.skip.split(",")))
    unknown = (skip | set(filter(None, args.tiny_skip.split(",")))) - set(contenders())
    if unknown:
        ap.error(f"unknown contenders: {sorted(unknown)}")
    if not os.access(SHARDPACK, os.X_OK):
        print(f"warning: {SHARDPACK} missing; skipping shardpack", file=sys.stderr)
        skip |= {"shardpack-tar", "shardpack-msgpack"}
    if not os.access(PEER_PY, os.X_OK):
        print(f"warning: {PEER_PY} missing (tools/bench_setup_peers.sh); skipping mds, litdata",
              file=sys.stderr)
        skip |= {"mds", "litdata"}
    names = [n for n in contenders() if n not in skip]
    scratch = args.scratch or os.path.join(args.data_dir, "scratch")
    log_dir = os.path.join(args.data_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    plan = [("imagenet", args.images, args.modes, args.reps, names)]
    if args.tiny_count:
        tiny_skip = set(args.tiny_skip.split(","))
        plan.append(("tiny", args.tiny_count, args.tiny_modes, args.tiny_reps or args.reps,
                     [n for n in names if n not in tiny_skip]))
    command = "python tools/bench_pack.py " + shlex.join(sys.argv[1:])
    started = datetime.datetime.now()
    doc = [f"Made by `{command}` on {started:%Y-%m-%d %H:%M}.", ""]
    m = bc.machine_info(args.data_dir)
    doc += [f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']:.1f} GiB RAM, Linux "
            f"{m['kernel']}, Python {m['python']}, data on {m['fs']}. Shared and noisy.", "",
            "Versions: " + "; ".join(f"{k}: {v}" for k, v in versions().items()), ""]
    for tree, count, modes, reps, tnames in plan:
        if count <= 0:
            continue
        src, gen = ensure_tree(args.data_dir, tree, count)
        modes = [x for x in modes.split(",") if x]
        info = bench_tree(tree, src, tnames, modes, reps, scratch, args.timeout, log_dir)
        doc += [f"### {tree}: {info['files']:,} files, {info['bytes'] / 1e6:,.1f} MB "
                f"(avg {info['bytes'] / max(info['files'], 1) / 1e3:.1f} KB)", "",
                f"Data: `{gen}`; {reps} repetitions, "
                f"contenders in rotated order each repetition.", ""]
        goals = []
        for mode in modes:
            res = info["resid"].get(mode, [])
            doc += [f"**{mode}** (resident fraction of a 300-file sample: "
                    f"{min(b for b, _ in res):.0%}-{max(b for b, _ in res):.0%} before "
                    f"{'eviction' if mode == 'cold' else 'warming'}, "
                    f"{min(a for _, a in res):.1%}-{max(a for _, a in res):.1%} at start)", ""]
            stats = summarize(info, mode)
            lines, tar, durable, fastest = table(info, stats)
            doc += lines + [""]
            goals += targets(tree, count, stats, tar, durable, fastest, mode)
        if goals:
            doc += ["Targets:", ""] + goals + [""]
        if "fincore" in info:
            doc.append(f"- Eviction cross-check, {info['fincore']}.")
        for name, line in info.get("summary", {}).items():
            doc.append(f"- {name}, its last run, said: `{' '.join(line)}`")
        for name, why in info["failed"].items():
            doc.append(f"- **{name} failed** — {why}")
        skipped = [n for n in contenders() if n not in tnames]
        if skipped:
            doc.append(f"- not run on this tree: {', '.join(skipped)}")
        doc.append("")
    doc.append(f"Run took {(datetime.datetime.now() - started).total_seconds() / 60:.0f} min.")
    text = "\n".join(doc)
    print("\n" + text)
    if not args.no_write:
        bc.update_section(args.out, "## Packing", text + "\n\n" + METHOD)
        print(f"\nwrote the '## Packing' section of {args.out}")


METHOD = """#### Method

- Each run is one subprocess under `/usr/bin/time` (wall time from spawn to exit, so Python
  startup and imports count; "inner s" is the peer writers' own time after their imports).
  Peak RSS: the largest single process (GNU time `%M`) and the peak of the summed PSS of the
  whole process tree sampled every 0.2 s (counts shared pages of forked workers once).
- Cold: `os.sync()`, then `posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)` on every source file;
  mmap + mincore on a random 300-file sample checks the resident fraction. Directory entries and
  inodes stay cached (no `drop_caches` here). Warm: every source file read once beforehand.
  Output goes to a scratch folder that is deleted (and `sync`ed) after every run.
- Durability differs: shardpack fsyncs every shard and index before it renames them into place
  (the project's rule for writes), so its times include writing the output to disk; tar -cf and
  the three peers leave their output dirty in the page cache (2 GB stays under this machine's
  writeback threshold), so theirs do not. `tar-cf+fsync` (the same `tar -cf`, then `sync FILE`,
  which fsyncs the archive) is the like-for-like floor; its ratio is listed for reference, next
  to the issue's targets, which are against plain `tar -cf`.
- Shard size 256 MB for all; no compression. webdataset:
  `ShardWriter(maxsize=256e6, maxcount=10**12)` (size alone cuts shards), key = relative path
  without extension, field = extension, `cls` = class index as ASCII decimal.
  MDS: `MDSWriter(columns={'key': 'str', 'jpg': 'bytes', 'cls': 'int'}, size_limit=256e6,
  compression=None)`. LitData: `optimize(fn -> {'key', 'jpg': bytes, 'cls': int},
  chunk_bytes='256MB', num_workers=2)`. shardpack and webdataset run in `.venv`; MDS and LitData
  in `.bench-venv`, made by `tools/bench_setup_peers.sh`.
- `.bench-venv` workaround: mosaicml-streaming and litdata both require torchvision, and pip
  picks torchvision 0.28.0 from PyPI, built for the CUDA torch; beside the CPU wheel
  `torch==2.13.0+cpu` its import fails with `RuntimeError: operator torchvision::nms does not
  exist`, and `import streaming` fails with it (`streaming/__init__.py` imports
  `streaming.vision`). Neither writer needs torchvision, so the setup script installs torch
  2.13.0 first, keeps it pinned as a pip constraint (nothing can pull a CUDA torch), installs
  the peers, then uninstalls torchvision (`pip check` complains; expected). LitData imports
  torchvision only lazily for image serializers (unused: the benchmark writes bytes); the MDS
  runner imports `streaming.base.MDSWriter` after registering a bare `streaming` package
  object, so `streaming/__init__.py` and `streaming.vision` never run."""


if __name__ == "__main__":
    main()
