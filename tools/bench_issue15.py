#!/usr/bin/env python3
"""Issue 15 benchmark (image checks, one sample per image): the code at --base against the
working tree.  Three parts, each selectable with --parts:

  pack    `shardpack pack SRC OUT --workers 2 -q` on the clean ImageFolder tree of JPEGs
          (tools/make_images.py; bench_pack.py's DATA_DIR/imagenet-N): before (--base, its
          default options), after --check quick (the default), none and full, optionally
          `tar -cf` + fsync; contenders alternate (rotated order) each repetition; warm page
          cache, --cold adds runs with the source evicted.  Wall and CPU seconds, ratios.
  checks  check_image / check_image_full per image: a sample of the tree's JPEGs held in
          memory, and the quick check per format on tests/imagegen.py's ALL_VALID / ALL_BROKEN.
  index   manifest index bytes per sample, tar and msgpack, of the clean tree and of a messy
          tree (tests/test_messy.py's build_tree repeated into many class folders), packed by
          the base (its default grouping folds dotted names), the working tree, and the working
          tree with --group webdataset.

    .venv/bin/python tools/bench_issue15.py [--images 20000] [--reps 5] [--cold] [--json PATH]

Both code trees are copies (git archive of --base; a snapshot of ./shardpack taken at start)
put first on PYTHONPATH of each `python -m shardpack.cli` subprocess.  Markdown tables go to
stdout, progress to stderr, per-run logs to DATA_DIR/logs-issue15.  Nothing is written to docs.
"""
import argparse
import contextlib
import datetime
import glob
import hashlib
import json
import os
import random
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)
import bench_common as bc  # noqa: E402
import bench_pack  # noqa: E402 - its ensure_tree (tree location) and tar-cf+fsync contender

PY = os.path.join(ROOT, ".venv", "bin", "python")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def code_trees(base, tmp):
    """{'before': dir, 'after': dir} each holding a shardpack/ package, checked by importing it."""
    trees = {"before": os.path.join(tmp, "before"), "after": os.path.join(tmp, "after")}
    os.makedirs(trees["before"])
    archive = subprocess.run(["git", "-C", ROOT, "archive", base, "shardpack"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", trees["before"]], input=archive, check=True)
    shutil.copytree(os.path.join(ROOT, "shardpack"), os.path.join(trees["after"], "shardpack"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    digest = hashlib.sha256()
    for p in sorted(glob.glob(os.path.join(trees["after"], "shardpack", "**", "*.py"),
                              recursive=True)):
        digest.update(p.encode() + open(p, "rb").read())
    for tree in trees.values():
        subprocess.run([PY, "-m", "compileall", "-q", tree], check=True)  # no compile in runs
        got = subprocess.run([PY, "-c", "import shardpack; print(shardpack.__file__)"],
                             env=env_for(tree), capture_output=True, text=True).stdout.strip()
        if not got.startswith(tree + os.sep):
            raise SystemExit(f"shardpack imported from {got!r}, not from {tree}")
    return trees, dict(base=git("rev-parse", "--short", base), head=git("describe", "--always",
                       "--dirty"), after_sha256=digest.hexdigest()[:12])


def env_for(tree):
    # PYTHONSAFEPATH: `python -m` must not put the cwd (maybe this checkout) before the tree
    return dict(os.environ, PYTHONPATH=tree, PYTHONSAFEPATH="1")


@contextlib.contextmanager
def stdout_to_stderr():  # at the fd level: for subprocesses too
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def pack_cmd(src, out, *extra):
    return [PY, "-m", "shardpack.cli", "pack", src, out, "--workers", "2", "-q", *extra]


def run(cmd, logfile, env=None, timeout=None):
    """bc.run_measured plus the CPU seconds of the whole process tree (RUSAGE_CHILDREN grows by
    /usr/bin/time's rusage, which includes its reaped descendants) and the log's last line."""
    def cpu():
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime
    c0 = cpu()
    r = bc.run_measured(cmd, logfile, timeout=timeout, env=env)
    lines = open(logfile, errors="replace").read().strip().splitlines()
    return dict(r, cpu_s=cpu() - c0, said=lines[-1] if lines else "")


def part_pack(args, src, trees, scratch, logs):
    paths = [os.path.join(src, rel) for rel, _ in bc.list_tree(src)]
    cmds = {"before": lambda o: (pack_cmd(src, o), trees["before"])}
    for check in ("quick", "none", "full"):
        cmds[check] = lambda o, c=check: (pack_cmd(src, o, "--check", c), trees["after"])
    if args.tar:
        cmds["tar-cf+fsync"] = lambda o: (bench_pack.contenders()["tar-cf+fsync"](src, o), None)
    modes = ["warm"] + (["cold"] if args.cold else [])
    runs, names = [], list(cmds)
    for rep in range(args.reps):
        for mode in modes:
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                shutil.rmtree(scratch, ignore_errors=True)
                out = os.path.join(scratch, "out")
                os.makedirs(out)
                (bc.evict if mode == "cold" else bc.warm)(paths)
                resident = bc.resident_fraction(paths)
                cmd, tree = cmds[name](out)
                r = run(cmd, os.path.join(logs, f"pack-{name}-{mode}-{rep}.log"),
                        env_for(tree) if tree else None, args.timeout)
                shutil.rmtree(scratch, ignore_errors=True)
                os.sync()
                ok = r["rc"] == 0 and not r["timeout"]
                runs.append(dict(r, name=name, mode=mode, rep=rep, resident=resident, ok=ok,
                                 cmd=shlex.join(cmd)))
                log(f"  pack rep {rep} {mode} {name:12} {r['wall_s']:7.2f} s wall "
                    f"{r['cpu_s']:7.2f} s cpu  resident {resident:.0%}  "
                    f"{'ok' if ok else 'FAILED: ' + r['said']}")
    md = [f"Tree: {len(paths):,} files, {bc.tree_bytes(src) / 1e6:,.1f} MB; {args.reps} "
          "repetitions, contenders in rotated order. Wall: spawn to exit (imports count); CPU: "
          "user+sys of the whole process tree.", ""]
    for mode in modes:
        got = {n: [r for r in runs if r["mode"] == mode and r["name"] == n and r["ok"]]
               for n in names}
        res = [r["resident"] for r in runs if r["mode"] == mode]
        md += [f"**{mode}** (resident fraction at start: {min(res):.0%}-{max(res):.0%})", "",
               "| contender | median wall s (min-max, n) | median CPU s | files/s |",
               "|---|---|---|---|"]
        med = {}
        for n, rs in got.items():
            if not rs:
                said = [r["said"] for r in runs if r["name"] == n][-1]
                md.append(f"| {n} | FAILED: `{said}` | | |")
                continue
            w = [r["wall_s"] for r in rs]
            med[n] = (statistics.median(w), statistics.median(r["cpu_s"] for r in rs))
            md.append(f"| {n} | {med[n][0]:.2f} ({min(w):.2f}-{max(w):.2f}, {len(w)}) | "
                      f"{med[n][1]:.2f} | {len(paths) / med[n][0]:,.0f} |")
        md.append("")
        for a, b, goal in (("quick", "before", 0), ("quick", "none", 1.05), ("full", "none", 0)):
            if a in med and b in med:
                wall, cpu = med[a][0] / med[b][0], med[a][1] / med[b][1]
                verdict = goal and f" (target <= {goal}: **{'PASS' if wall <= goal else 'FAIL'}**)"
                md.append(f"- {a}/{b}, {mode}: wall {wall:.3f}x{verdict or ''}, CPU {cpu:.3f}x")
        md.append("")
    return md, runs


def per_call(fn, datas, field, runs):
    """Median over `runs` of the seconds per call of fn over all of datas."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for d in datas:
            fn(d, field)
        times.append((time.perf_counter() - t0) / len(datas))
    return statistics.median(times)


def part_checks(args, src, trees):
    sys.path[:0] = [trees["after"], ROOT]  # the snapshot's shardpack; ROOT for tests.imagegen
    from shardpack.images import content as im
    from tests import imagegen
    if not im.__file__.startswith(trees["after"] + os.sep):
        raise SystemExit(f"shardpack.images imported from {im.__file__}, not the snapshot")
    rels = [rel for rel, _ in bc.list_tree(src) if rel.lower().endswith((".jpg", ".jpeg"))]
    rels = random.Random(0).sample(rels, min(args.check_sample, len(rels)))
    datas = [open(os.path.join(src, rel), "rb").read() for rel in rels]
    bad = sum(im.check_image_full(d, "jpg") is not None for d in datas)
    log(f"  checks: {len(datas)} JPEGs in memory ({bad} fail the full check)")
    quick = per_call(im.check_image, datas, "jpg", args.check_runs)
    full = per_call(im.check_image_full, datas, "jpg", args.check_runs)
    size = statistics.mean(map(len, datas))
    md = [f"{len(datas):,} JPEGs of the tree (random sample, mean {size / 1e3:.1f} KB) held in "
          f"memory; median of {args.check_runs} passes over all of them; {bad} failed.", "",
          "| check | per image | images/s (one core) |", "|---|---|---|",
          f"| check_image (quick) | {quick * 1e6:.2f} µs | {1 / quick:,.0f} |",
          f"| check_image_full | {full * 1e3:.2f} ms | {1 / full:,.0f} |", ""]
    rows = {}
    for kind, table in (("valid", imagegen.ALL_VALID), ("broken", imagegen.ALL_BROKEN)):
        for data, ext in table.values():
            fmt = im.sniff(data) or "no image magic"
            q = per_call(im.check_image, [data] * 1000, ext, args.check_runs) * 1e6
            f = per_call(im.check_image_full, [data] * 20, ext, args.check_runs) * 1e6 \
                if kind == "valid" else None
            rows.setdefault(fmt, {"valid": [], "broken": [], "full": []})[kind].append(q)
            if f is not None:
                rows[fmt]["full"].append(f)
    def span(v):
        return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" if v else "-"

    md += [f"tests/imagegen.py images ({imagegen.SIZE[0]}x{imagegen.SIZE[1]}), by format of the "
           "bytes; µs per call, median over the images (min-max), each the median of "
           f"{args.check_runs} passes:", "",
           "| format | valid n | quick µs, valid | full µs, valid | broken n | quick µs, "
           "broken |", "|---|---|---|---|---|---|"]
    for fmt, v in sorted(rows.items()):
        md.append(f"| {fmt} | {len(v['valid'])} | {span(v['valid'])} | {span(v['full'])} | "
                  f"{len(v['broken'])} | {span(v['broken'])} |")
    return md + [""], dict(jpeg_quick_s=quick, jpeg_full_s=full, n=len(datas), failed=bad,
                           per_format=rows)


def build_messy(root, samples):
    """tests/test_messy.build_tree (no broken images) repeated into class folders CLS_NNN."""
    sys.path.insert(0, ROOT)
    from pathlib import Path
    from tests import test_messy
    shutil.rmtree(root, ignore_errors=True)
    per = len(test_messy.IMAGE_NAMES)
    for i in range(-(-samples // per)):
        one = Path(root + ".tmp")
        test_messy.build_tree(one)
        for cls in test_messy.CLASSES:
            os.renames(one / cls, os.path.join(root, f"{cls}_{i:03d}"))
        shutil.rmtree(one, ignore_errors=True)  # os.renames prunes it when empty
    return len(bc.files_under(root))


def part_index(args, clean, trees, scratch, logs):
    messy = os.path.join(args.data_dir, "issue15-messy")
    files = build_messy(messy, args.messy_samples)
    log(f"  index: messy tree {messy}: {files} files")
    variants = [("before", []), ("after", []), ("after", ["--group", "webdataset"])]
    skip = [("before", ["--skip-bad"]), ("after", ["--group", "webdataset", "--skip-bad"])]
    md = [f"Messy tree: tests/test_messy.py's build_tree repeated into "
          f"{len(os.listdir(messy))} class folders ({files:,} files: images, sidecars, junk). "
          "Index bytes: the sum of the manifest's shards[].index_bytes. Every pack "
          "`--workers 2 -q --format FORMAT` plus the options shown; before = the base's default "
          "grouping (key = path up to the first dot of the name); after = --group image.", "",
          "| tree | format | code, options | samples | index bytes | bytes/sample | fields | "
          "skipped; ignored | result |", "|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for tree_name, src in (("clean", clean), ("messy", messy)):
        for fmt in ("tar", "msgpack"):
            for code, extra in variants + (skip if tree_name == "messy" else []):
                shutil.rmtree(scratch, ignore_errors=True)
                out = os.path.join(scratch, "out")
                label = " ".join([code] + extra)
                name = f"index-{tree_name}-{fmt}-{label.replace(' ', '')}"
                r = run(pack_cmd(src, out, "--format", fmt, *extra),
                        os.path.join(logs, name + ".log"), env_for(trees[code]), args.timeout)
                row = dict(tree=tree_name, format=fmt, code=label, rc=r["rc"], said=r["said"])
                if r["rc"] == 0:
                    m = json.load(open(os.path.join(out, "shardpack.json")))
                    idx = sum(s["index_bytes"] for s in m["shards"])
                    row.update(samples=m["num_samples"], index_bytes=idx, fields=m["fields"],
                               per_sample=idx / max(1, m["num_samples"]),
                               skipped=m.get("skipped") or {}, ignored=m.get("ignored", 0))
                shutil.rmtree(scratch, ignore_errors=True)
                rows.append(row)
                log(f"  index {tree_name} {fmt} {label}: rc {r['rc']} {r['said'][:90]}")
                if r["rc"]:
                    md.append(f"| {tree_name} | {fmt} | {label} | - | - | - | - | - | "
                              f"rc {r['rc']}: `{r['said'][:150]}` |")
                    continue
                skipped = ", ".join(f"{v:,} {k}" for k, v in sorted(row["skipped"].items()))
                md.append(f"| {tree_name} | {fmt} | {label} | {row['samples']:,} | "
                          f"{idx:,} | {row['per_sample']:.1f} | {len(m['fields'])} | "
                          f"{skipped or '-'}; {row['ignored']:,} | ok |")
    return md + [""], rows


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="pack,checks,index",
                    help="comma-separated parts to run: pack, checks, index (default: all)")
    ap.add_argument("--images", type=int, default=20000,
                    help="clean tree size; made once as DATA_DIR/imagenet-N (default 20000)")
    ap.add_argument("--base", default="990da69", help="git revision of the 'before' code "
                    "(default 990da69, the last commit before issue 15)")
    ap.add_argument("--reps", type=int, default=5, help="pack part: repetitions (default 5)")
    ap.add_argument("--cold", action="store_true",
                    help="pack part: also cold runs (source evicted with posix_fadvise "
                         "DONTNEED, checked with mincore) besides the warm ones")
    ap.add_argument("--tar", action="store_true", help="pack part: add `tar -cf` + `sync "
                    "FILE` of the same tree (the durable floor, as in bench_pack.py)")
    ap.add_argument("--check-sample", type=int, default=2000,
                    help="checks part: JPEGs of the tree held in memory (default 2000)")
    ap.add_argument("--check-runs", type=int, default=5,
                    help="checks part: timed passes, median reported (default 5)")
    ap.add_argument("--messy-samples", type=int, default=2000,
                    help="index part: images in the messy tree, rounded up to whole copies of "
                         "test_messy's 18 (default 2000)")
    ap.add_argument("--data-dir", default=os.path.join(ROOT, "bench-data"),
                    help="trees, scratch output and logs (default bench-data)")
    ap.add_argument("--timeout", type=float, default=1800, help="per pack, seconds (default 1800)")
    ap.add_argument("--json", metavar="PATH", help="also write every figure and run as JSON")
    args = ap.parse_args()
    parts = set(filter(None, args.parts.split(",")))
    if parts - {"pack", "checks", "index"} or not parts:
        ap.error(f"--parts: pack, checks, index; got {args.parts!r}")
    logs = os.path.join(args.data_dir, "logs-issue15")
    scratch = os.path.join(args.data_dir, "scratch-issue15")
    os.makedirs(logs, exist_ok=True)
    started = datetime.datetime.now()
    with stdout_to_stderr():  # make_images' output is progress
        src, gen = bench_pack.ensure_tree(args.data_dir, "imagenet", args.images)
    result = dict(args=vars(args), started=started.isoformat(), data=gen,
                  machine=bc.machine_info(args.data_dir))
    with tempfile.TemporaryDirectory(prefix="bench-issue15-") as tmp:
        trees, code = code_trees(args.base, tmp)
        result["code"] = code
        m = result["machine"]
        emit(args, result, [
            f"Made by `python tools/bench_issue15.py {shlex.join(sys.argv[1:])}` on "
            f"{started:%Y-%m-%d %H:%M}. Before: {code['base']} (`git archive`); after: the "
            f"working tree at {code['head']} (snapshot of shardpack/, sha256 "
            f"{code['after_sha256']}).", "",
            f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']:.1f} GiB RAM, Linux "
            f"{m['kernel']}, Python {m['python']}, data on {m['fs']}. Data: `{gen}`.", ""])
        if "pack" in parts:
            log("pack part")
            md, result["pack"] = part_pack(args, src, trees, scratch, logs)
            emit(args, result, ["### Pack time, before/after (clean tree)", ""] + md + [
                "The pack fsyncs every shard before publishing it, so its wall time is bound by "
                "the durable write to disk (docs/benchmarks.md, Packing; compare `--tar`); the "
                "check's cost shows more plainly in the CPU column.", ""])
        if "checks" in parts:
            log("checks part")
            md, result["checks"] = part_checks(args, src, trees)
            emit(args, result, ["### Image check cost per image (in memory, one core)", ""] + md)
        if "index" in parts:
            log("index part")
            md, result["index"] = part_index(args, src, trees, scratch, logs)
            emit(args, result, ["### Index bytes per sample", ""] + md)
    result["minutes"] = (datetime.datetime.now() - started).total_seconds() / 60
    emit(args, result, [f"Run took {result['minutes']:.1f} min."])


def emit(args, result, lines):
    """Print a finished section (a later failure loses nothing) and rewrite the JSON so far."""
    print("\n".join(lines), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)

if __name__ == "__main__":
    main()
