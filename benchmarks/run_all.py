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

# Minutes of a full run at the suite's defaults on the reference machine (2 cores, 8 GB, local
# SSD), with the data already generated: what bounds each one (the first run also makes the
# data: add the "first" minutes once). Worked out from each suite's defaults and the per-run
# times its --quick prints; faults from its own page's "in 311 s".
ESTIMATES: dict[str, tuple[float, float, str]] = {
    # suite: (minutes a run, extra minutes the first time, what the time is)
    "pack": (0, 0, ""),
}

# The time of each suite's --quick here (tests/tools/test_benchmarks.py runs them all), seconds.
QUICK_S: dict[str, float] = {}

# Options the page's own commands add to a suite's defaults.
PAGE_OPTIONS: dict[str, list[str]] = {"faults": ["--out", "docs/reliability.md"]}


def parser() -> argparse.ArgumentParser:
    """The options of ``all``."""
    p = argparse.ArgumentParser(prog="python -m benchmarks all",
                                description="every suite in page order, then the page")
    p.add_argument("--quick", action="store_true",
                   help="each suite's --quick (a check that all of them run; the page goes to "
                        "the results folder)")
    p.add_argument("--skip", default="", help="suites to leave out, comma-separated")
    p.add_argument("--data-dir", type=Path, default=None, help="passed to every suite")
    p.add_argument("--results-dir", type=Path, default=None,
                   help="passed to every suite and to report [benchmarks/results; --quick: "
                        "DATA_DIR/quick-results]")
    p.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    return p


def estimate_s(name: str, quick: bool, first: bool) -> float:
    """Seconds ``name`` is expected to take (``first``: its data is not generated yet)."""
    if quick:
        return QUICK_S.get(name, 60.0)
    run, extra, _ = ESTIMATES.get(name, (10.0, 0.0, "no estimate"))
    return 60 * (run + (extra if first else 0))


def plan(names: list[str], skipped: list[str], quick: bool, first: bool) -> str:
    """The table printed before the run: suite, estimate, what bounds the time."""
    lines = [f"python -m benchmarks all{' --quick' if quick else ''}: {len(names)} suites, then "
             "report" + (f"; skipped: {', '.join(skipped)}" if skipped else "")]
    total = 0.0
    for name in names:
        s = estimate_s(name, quick, first)
        total += s
        what = "" if quick else ESTIMATES.get(name, (0, 0, "no estimate"))[2]
        lines.append(f"  {name:11s} {_minutes(s):>8s}  {what}")
    lines.append(f"  {'total':11s} {_minutes(total):>8s}"
                 + ("" if quick else "  (data generated the first time: "
                    + ("included)" if first else "already there)")))
    return "\n".join(lines)


def _minutes(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"


def suite_command(name: str, args) -> list[str]:
    """The command line of one suite's run."""
    cmd = [sys.executable, "-m", "benchmarks", name]
    if args.quick:
        cmd.append("--quick")
    else:
        cmd += PAGE_OPTIONS.get(name, [])
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
    print(plan(names, skip, args.quick, first=not data_dir.exists()), flush=True)
    if args.dry_run:
        return
    failed, took = [], {}
    for name in names:
        cmd = suite_command(name, args)
        print(f"\n== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.run(cmd, cwd=common.ROOT).returncode
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
    if subprocess.run(report, cwd=common.ROOT).returncode != 0:
        failed.append("report")
    print("\n" + "\n".join(f"  {n:11s} {_minutes(s):>8s}" + (" FAILED" if n in failed else "")
                           for n, s in took.items()))
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        raise SystemExit(1)
