"""``python -m benchmarks ab --base REF [--new REF] SUITE... [-- SUITE OPTIONS]``: the same suites
on two versions of shardpack, alternated, in fresh processes; medians and ratios in one JSON.

The base (and ``--new``, when given; else the working tree) is extracted with ``git archive``
into a temporary folder, so nothing in the checkout changes. Each arm runs ``python -m
benchmarks SUITE --reps 1`` with PYTHONPATH holding a copy of this tree's benchmarks/ first (both
arms measure with the same code) and the arm's tree second (its shardpack, and its tests/ for
the servers); the arms alternate, the first of each repetition rotating. Data is generated once
in the shared data folder, by whichever arm needs it first. The result goes to
DATA_DIR/ab/ab-SUITES.json unless --results-dir says otherwise; ``report`` leaves it out of the
page: an A/B settles a change, it is not a figure of the project.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import common as c
from benchmarks import registry, results


def parser() -> argparse.ArgumentParser:
    """The options of ``ab``."""
    p = argparse.ArgumentParser(prog="python -m benchmarks ab",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the commit (any git revision) before the change")
    p.add_argument("--new", default=None, help="the commit after it [the working tree]")
    p.add_argument("--reps", type=int, default=5, help="runs of each suite per arm [5]")
    p.add_argument("--quick", action="store_true", help="pass --quick to the suites")
    p.add_argument("--data-dir", type=Path, default=None, help="[bench-data; --quick: "
                   "bench-data/quick]")
    p.add_argument("--results-dir", type=Path, default=None, help="[DATA_DIR/ab]")
    p.add_argument("suites", nargs="+", metavar="SUITE")
    return p


def extract(ref: str, dest: Path) -> str:
    """``git archive REF`` unpacked into ``dest``; the short commit id."""
    dest.mkdir(parents=True)
    commit = subprocess.run(["git", "-C", str(c.ROOT), "rev-parse", "--short", ref],
                            check=True, capture_output=True, text=True).stdout.strip()
    archive = subprocess.Popen(["git", "-C", str(c.ROOT), "archive", "--format=tar", commit],
                               stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"git archive {ref} failed")
    build_extensions(dest)
    return commit


def build_extensions(tree: Path) -> None:
    """Build an arm's optional C extensions in place, as its install would (else the arm would
    measure the fallbacks: JPEGs decoded whole).  Where they cannot be built (no compiler or
    headers), both arms go without, the same way, and a line says so."""
    if not (tree / "setup.py").exists():
        return
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                          cwd=tree, capture_output=True, text=True)
    if done.returncode != 0 or not list(tree.glob("shardpack/**/*.so")):
        print(f"ab: {tree.name}: the C extensions were not built; it runs without them",
              file=sys.stderr)


def arm_env(tree, label, harness) -> dict:
    """The environment of an arm: this tree's benchmarks/ first, the arm's tree second."""
    return dict(c.child_env(), PYTHONPATH=f"{harness}:{tree}", SHARDPACK_BENCH_ROOT=str(c.ROOT),
                SHARDPACK_BENCH_COMMIT=label)


def check_arm(tree, label, harness, cwd) -> None:
    """Refuse to measure an arm whose ``import shardpack`` would not find the arm's tree."""
    found = subprocess.run([sys.executable, "-c", "import shardpack; print(shardpack.__file__)"],
                           env=arm_env(tree, label, harness), cwd=cwd, capture_output=True,
                           text=True).stdout.strip()
    if not found.startswith(str(Path(tree).resolve())):
        raise SystemExit(f"{label}: shardpack was imported from {found or '?'}, not from {tree}")


def arm_run(suite, tree, label, harness, data_dir, out, args, extra) -> dict:
    """One run of ``suite`` with shardpack from ``tree``; its result."""
    cmd = [sys.executable, "-m", "benchmarks", suite, "--reps", "1", "--data-dir",
           str(data_dir), "--results-dir", str(out), *(["--quick"] if args.quick else []),
           *extra]
    # cwd: a folder holding neither shardpack/ nor benchmarks/ (`-m` puts it first on sys.path)
    subprocess.run(cmd, check=True, env=arm_env(tree, label, harness), cwd=out.parent)
    (path,) = [p for p in out.glob("*.json")]
    return json.loads(path.read_text())


def compare(suites, runs, labels) -> list:
    """Per suite and figure: the new arm's median, the base's beside it, the ratio."""
    out = []
    for suite in suites:
        names = {}
        for arm in ("base", "new"):
            for result in runs[(suite, arm)]:
                for f in result["figures"]:
                    names.setdefault(f["name"], {"unit": f["unit"], "base": [], "new": []})
                    names[f["name"]][arm].append(f["value"])
        for name, v in names.items():
            new, base = c.med(v["new"]), c.med(v["base"])
            ratio = f"new / base {new / base:.3f}; " if new is not None and base else ""
            out.append(results.figure(
                f"{suite}: {name}", new, v["unit"], {f"base {labels['base']}": base}, {},
                ratio + f"runs new {v['new']}, base {v['base']}"))
    return out


def main(argv: list[str]) -> None:
    """Parse, extract the trees, run the arms alternately, write the comparison."""
    argv, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    args = parser().parse_args(argv)
    known = registry.load_all()
    unknown = [s for s in args.suites if s not in known]
    if unknown:
        raise SystemExit(f"unknown suites {unknown}; the suites: {', '.join(known)}")
    data_dir = (args.data_dir or (c.DATA / "quick" if args.quick else c.DATA)).resolve()
    tmp = Path(tempfile.mkdtemp(prefix="shardpack-ab-"))
    try:
        harness = tmp / "harness"
        shutil.copytree(c.HARNESS / "benchmarks", harness / "benchmarks",
                        ignore=shutil.ignore_patterns("__pycache__", "results"))
        trees, labels = {}, {}
        labels["base"] = extract(args.base, tmp / "base")
        trees["base"] = tmp / "base"
        if args.new:
            labels["new"] = extract(args.new, tmp / "new")
            trees["new"] = tmp / "new"
        else:
            labels["new"] = results.commit()
            trees["new"] = c.ROOT
        for arm, tree in trees.items():
            check_arm(tree, labels[arm], harness, tmp)
        runs = {(s, arm): [] for s in args.suites for arm in trees}
        for rep in range(args.reps):
            for suite in args.suites:
                for arm in c.rotated(["base", "new"], rep):
                    out = tmp / "runs" / f"{suite}-{arm}-{rep}"
                    out.mkdir(parents=True)
                    runs[(suite, arm)].append(arm_run(suite, trees[arm], labels[arm], harness,
                                                      data_dir, out, args, extra))
                    print(f"rep {rep} {suite} {arm} ({labels[arm]}) done", file=sys.stderr)
        figures = compare(args.suites, runs, labels)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"suite": "ab", "part": "+".join(args.suites),
              "command": shlex.join(["python", "-m", "benchmarks", "ab", *argv,
                                     *(["--", *extra] if extra else [])]),
              "machine": results.machine(data_dir), "versions": {},
              "commit": f"{labels['new']} against {labels['base']}", "date": results.now(),
              "setup": f"{args.reps} runs of each suite per arm, alternated, fresh processes.",
              "figures": figures, "raw": {}}
    path = results.write(result, args.results_dir or data_dir / "ab")
    for f in figures:
        print(f"{f['name']}: {f['value']} {f['unit']}  {f['note']}")
    print(f"wrote {path}")
