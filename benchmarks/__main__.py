"""The entry point: ``python -m benchmarks --list | SUITE [options] | ab ... | report ... | all``.

Regenerating the whole page (docs/benchmarks.md) in one go, on a clean commit of the machine the
page names::

    python -m benchmarks all --dry-run      # the plan: every suite, its estimated time
    python -m benchmarks all                # every suite in page order, then report
    python -m benchmarks all --skip remote,fastlink   # all but these (their old results stay)

``all`` runs the suites one after the other, each in a process of its own, then ``report``. A
suite that fails is named and the others still run; the command exits 1 at the end. Each suite
runs at its defaults but for two repetitions (``--reps 2``; the defaults' three would take ~105
minutes), pack's 1M-file tree once without the packers slower than MDS there, and faults also
rewriting docs/reliability.md (benchmarks/run_all.py: the options and each suite's estimate).
The estimates add up to about 80 minutes with the data already generated; the first run also
generates it (~40 minutes more). ``all --quick`` runs every suite's ``--quick`` instead (a few
minutes: the check that every suite still runs, which tests/tools/test_benchmarks.py also
makes) and renders its page into the quick results folder, not docs/. By hand: the commands
``all --dry-run`` lists, one after the other, then ``python -m benchmarks report``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from benchmarks import common, registry, results

USAGE = """python -m benchmarks --list
       python -m benchmarks SUITE [--reps N] [--quick] [--data-dir DIR] [--results-dir DIR] ...
       python -m benchmarks SUITE --help                  (the suite's own options)
       python -m benchmarks ab --base REF [--new REF] [--reps N] [--quick] SUITE... [-- OPTIONS]
       python -m benchmarks report [--results-dir DIR] [--out FILE]
       python -m benchmarks all [--reps N] [--quick] [--skip SUITE,...] [--dry-run]"""


def suite_parser(suite: registry.Suite) -> argparse.ArgumentParser:
    """The options of one suite: the common ones, then the suite's own."""
    p = argparse.ArgumentParser(prog=f"python -m benchmarks {suite.name}",
                                description=f"{suite.title}: {suite.measures}")
    p.add_argument("--reps", type=int, default=3, help="repetitions of each measurement [3]")
    p.add_argument("--quick", action="store_true",
                   help="tiny data, to check that the suite runs (results go to "
                        "DATA_DIR/quick-results unless --results-dir says otherwise); sets "
                        + ", ".join(f"--{k.replace('_', '-')} {v}"
                                    for k, v in quick_defaults(suite).items()))
    p.add_argument("--data-dir", type=Path, default=None,
                   help="generated data, kept between runs [bench-data; --quick: bench-data/quick]")
    p.add_argument("--results-dir", type=Path, default=None,
                   help="where the JSON result goes [benchmarks/results]")
    if suite.options:
        suite.options(p)
    return p


def quick_defaults(suite: registry.Suite) -> dict:
    """The option values ``--quick`` sets: one repetition (it proves the suite runs, it
    measures nothing worth repeating), then the suite's own tiny sizes."""
    return {"reps": 1, **suite.quick}


def without(argv: list[str], option: str) -> list[str]:
    """``argv`` less ``option`` and its value (where the result goes is not part of the command
    the page quotes)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == option:
            skip = True
        elif not a.startswith(option + "="):
            out.append(a)
    return out


def run_suite(name: str, argv: list[str]) -> Path:
    """Parse ``argv`` for suite ``name``, run it, write its JSON result; the file's path."""
    suite = registry.load_all()[name]
    parser = suite_parser(suite)
    if "--quick" in argv:
        parser.set_defaults(**quick_defaults(suite))
    args = parser.parse_args(argv)
    data_dir = (args.data_dir or (common.DATA / "quick" if args.quick else common.DATA)).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    folder = args.results_dir or (data_dir / "quick-results" if args.quick else results.RESULTS)
    run = results.Run(name, args, data_dir, shlex.join(["python", "-m", "benchmarks", name,
                                                        *without(argv, "--results-dir")]))
    outcome = suite.run(run)
    path = results.write(results.build(run, outcome), Path(folder))
    for f in outcome.figures:
        value = f"{f['value']:,}" if isinstance(f["value"], (int, float)) else f["value"]
        peers = "; ".join(f"{k} {v:,}" for k, v in f["peers"].items())
        print(f"{f['name']}: {value} {f['unit']}" + (f" (peers: {peers})" if peers else "")
              + (f"  {f['note']}" if f["note"] else ""))
    print(f"wrote {path}")
    return path


def main(argv: list[str] | None = None) -> None:
    """Dispatch: --list, ab, report, all, or a suite's name."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: " + USAGE)
        return
    if argv[0] == "--list":
        for name, suite in registry.load_all().items():
            print(f"{name:11s} {suite.title}")
        return
    if argv[0] == "ab":
        from benchmarks import ab
        ab.main(argv[1:])
        return
    if argv[0] == "report":
        from benchmarks import report
        report.main(argv[1:])
        return
    if argv[0] == "all":
        from benchmarks import run_all
        run_all.main(argv[1:])
        return
    suites = registry.load_all()
    if argv[0] not in suites:
        raise SystemExit(f"unknown suite {argv[0]!r}; the suites: {', '.join(suites)}\n"
                         f"usage: {USAGE}")
    run_suite(argv[0], argv[1:])


if __name__ == "__main__":
    main()
