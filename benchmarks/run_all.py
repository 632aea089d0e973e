"""``python -m benchmarks all [--quick] [--skip a,b]``: every suite in page order, then ``report``.

Each suite runs in a process of its own (``python -m benchmarks SUITE``, its defaults), one after
the other so that none measures beside another; a suite that fails is named and the others still
run, and the command exits 1 at the end. The plan, with each suite's estimated time, is printed
first. ``--quick`` runs every suite's ``--quick`` into DATA_DIR/quick-results (or
``--results-dir``) and renders the page there, not into docs/.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common, registry, results

# Minutes of a full run on the page's machine (2 cores, local SSD) with the data already
# generated: fixed + per repetition x --reps, and what the first run adds to generate the data.
# Worked out from each suite's defaults, the times per run its last results imply and the rates
# its --quick prints; faults from its own page ("in 311 s"), decode from a full run (65 s at
# three repetitions, 10 s of it making the data). Rough: within a third either way.
ESTIMATES: dict[str, tuple[float, float, float, str]] = {
    # suite: (fixed, per rep, first run extra, what takes the time)
    "pack": (7.0, 2.7, 15.0, "20,000 JPEGs x 7 packers, cold + warm; 1M tiny files x 4, once"),
    "convert": (0.0, 1.4, 3.0, "20,000 samples x 3 converters, warm + cold"),
    "read": (0.5, 2.5, 6.0, "14 loaders x 2 epochs (20,000 JPEGs, 100,000 tiny); 1M-sample TTFB"),
    "decode": (0.1, 0.3, 0.2, "the loader and its ceiling, 2 epochs of 5,000 JPEGs each"),
    "peers": (1.0, 4.0, 3.0, "8 loaders x cold/warm x bytes/decode, 5,000 JPEGs"),
    "trees": (0.0, 5.6, 4.0, "6 loaders x 3 trees x 2 epochs; the 3000x2000 JPEGs most"),
    "stages": (0.0, 5.0, 2.0, "threads/processes x 2, 8 workers x 3 trees x 2 epochs"),
    "checks": (0.7, 0.5, 0.3, "4 readings x 2 modes, epochs of 5,000 JPEGs"),
    "remote": (0.5, 1.2, 1.0, "7 cases over a 30 ms link, 3,000 JPEGs (--budget-s caps it)"),
    "fastlink": (0.5, 1.5, 1.0, "9 server cases, 6,000 samples, then the CPU ceiling"),
    "mix": (0.2, 0.25, 0.5, "2 cases, 6,000 samples in /dev/shm"),
    "scale": (3.0, 0.0, 3.0, "share() to 1e9 samples, real 1M/10M datasets, egress"),
    "engines": (1.0, 1.0, 0.0, "packs of 20,000 JPEGs on 3 engines; the walk"),
    "checkpoint": (0.0, 1.2, 0.0, "3 save modes x 30 training steps"),
    "faults": (5.5, 0.0, 0.0, "~1,900 fault tries, each a process; bit flips"),
    "pixels": (3.0, 1.4, 2.0, "4-5 loaders x 3 trees x 4 epochs; crossover probe; HTTP"),
}
# --reps of every suite in ``all``: two (a median of two is their mean, the spread still shows)
# keeps the page within 90 minutes, where the suites' default of three would take ~105.
REPS = 2

# Options the page's runs add to a suite's defaults: the tiny tree of pack once, with the packers
# that are slower than MDS there left out (each run takes minutes, its spread is small).
PAGE_OPTIONS: dict[str, list[str]] = {
    "pack": ["--tiny-reps", "1", "--tiny-skip", "webdataset,litdata,shardpack-msgpack"],
}
# Pages of their own a suite also writes: (option, file in the repository); with --results-dir
# the file goes there instead.
PAGE_FILES: dict[str, tuple[str, str]] = {"faults": ("--out", "docs/reliability.md")}
HERE = Path(__file__).resolve().parents[1]  # the repository: the suites run from there

# Seconds of each suite's --quick here (one repetition; tests/tools/test_benchmarks.py runs them).
QUICK_S: dict[str, float] = {
    "pack": 11, "convert": 6, "read": 30, "decode": 7, "peers": 49, "trees": 74, "stages": 56,
    "checks": 7, "remote": 18, "fastlink": 31, "mix": 4, "scale": 3, "engines": 21,
    "checkpoint": 13, "faults": 87, "pixels": 31,
}


def parser() -> argparse.ArgumentParser:
    """The options of ``all``."""
    p = argparse.ArgumentParser(prog="python -m benchmarks all",
                                description="every suite in page order, then the page")
    p.add_argument("--quick", action="store_true",
                   help="each suite's --quick (a check that all of them run; the page goes to "
                        "the results folder)")
    p.add_argument("--skip", default="", help="suites to leave out, comma-separated")
    p.add_argument("--reps", type=int, default=REPS,
                   help=f"repetitions of every suite's measurements [{REPS}: the page in 90 min]")
    p.add_argument("--data-dir", type=Path, default=None, help="passed to every suite")
    p.add_argument("--results-dir", type=Path, default=None,
                   help="passed to every suite and to report [benchmarks/results; --quick: "
                        "DATA_DIR/quick-results]")
    p.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    return p


def estimate_s(name: str, quick: bool, reps: int = REPS) -> tuple[float, float]:
    """Seconds ``name`` is expected to take, and the extra seconds of its first run (when it
    generates its data)."""
    if quick:
        return QUICK_S.get(name, 60.0), 0.0
    fixed, per_rep, extra, _ = ESTIMATES.get(name, (10.0, 0.0, 0.0, ""))
    return 60 * (fixed + per_rep * reps), 60 * extra


def plan(names: list[str], skipped: list[str], quick: bool, first: bool, reps: int) -> str:
    """The table printed before the run: suite, estimate, first-run extra, what bounds it."""
    lines = [f"python -m benchmarks all{' --quick' if quick else f' --reps {reps}'}: "
             f"{len(names)} suites, then report"
             + (f"; skipped: {', '.join(skipped)}" if skipped else "")]
    total = extra = 0.0
    for name in names:
        s, more = estimate_s(name, quick, reps)
        total, extra = total + s, extra + more
        what = "" if quick else ESTIMATES.get(name, (0, 0, 0, "no estimate"))[3]
        lines.append(f"  {name:11s} {_minutes(s):>8s}  {'+' + _minutes(more) if more else '':>8s}"
                     f"  {what}".rstrip())
    lines.append(f"  {'total':11s} {_minutes(total):>8s}"
                 + (f"  +{_minutes(extra)} the first time, generating the data"
                    + (" (not there yet: this run)" if first else "") if extra else ""))
    return "\n".join(lines)


def _minutes(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"


def suite_command(name: str, args) -> list[str]:
    """The command line of one suite's run."""
    cmd = [sys.executable, "-m", "benchmarks", name]
    if args.quick:
        cmd.append("--quick")
    else:
        cmd += ["--reps", str(args.reps), *PAGE_OPTIONS.get(name, [])]
        if name in PAGE_FILES:
            option, page = PAGE_FILES[name]
            cmd += [option, str(args.results_dir / Path(page).name) if args.results_dir
                    else page]
    if args.data_dir:
        cmd += ["--data-dir", str(args.data_dir)]
    if args.results_dir:
        cmd += ["--results-dir", str(args.results_dir)]
    return cmd


def main(argv: list[str]) -> None:
    """Run every suite not skipped, each in turn, then the report; exit 1 if any failed."""
    args = parser().parse_args(argv)
    # the suites run with the package's root as their folder: paths given here stay where meant
    args.data_dir = args.data_dir and args.data_dir.resolve()
    args.results_dir = args.results_dir and args.results_dir.resolve()
    suites = list(registry.load_all())
    skip = [s for s in args.skip.split(",") if s]
    unknown = [s for s in skip if s not in suites]
    if unknown:
        raise SystemExit(f"--skip: unknown suites {', '.join(unknown)}; the suites: "
                         f"{', '.join(suites)}")
    names = [s for s in suites if s not in skip]
    data_dir = (args.data_dir or (common.DATA / "quick" if args.quick else common.DATA))
    print(plan(names, skip, args.quick, not data_dir.exists(), args.reps), flush=True)
    if args.dry_run:
        for name in names:
            print(" ".join(["python", *suite_command(name, args)[1:]]))
        return
    failed, took = [], {}
    for name in names:
        cmd = suite_command(name, args)
        print(f"\n== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.run(cmd, cwd=HERE).returncode
        took[name] = time.monotonic() - t0
        if rc != 0:
            failed.append(name)
            print(f"== {name} FAILED (exit {rc}) after {_minutes(took[name])}; going on",
                  flush=True)
    folder = args.results_dir or (data_dir / "quick-results" if args.quick else results.RESULTS)
    report = [sys.executable, "-m", "benchmarks", "report", "--results-dir", str(folder)]
    if args.quick or args.results_dir:  # docs/benchmarks.md is made from benchmarks/results only
        report += ["--out", str(Path(folder) / "benchmarks.md")]
    print(f"\n== report: {' '.join(report[1:])}", flush=True)
    if subprocess.run(report, cwd=HERE).returncode != 0:
        failed.append("report")
    print("\n" + "\n".join(f"  {n:11s} {_minutes(s):>8s}" + (" FAILED" if n in failed else "")
                           for n, s in took.items()))
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        raise SystemExit(1)
