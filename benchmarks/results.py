"""What a suite run writes: one JSON file per run in benchmarks/results/.

The schema (one object per file)::

    {"suite": "pack", "part": null, "command": "python -m benchmarks pack --reps 3",
     "machine": {"cpus": 2, "cpu": "...", "ram_gib": 23.5, "kernel": "...", "python": "3.11.7",
                 "torch": "2.13.0+cpu", "fs": "ext4 on /dev/vda (/)"},
     "versions": {"shardpack": "0.1.0", ...}, "commit": "6ca0c71", "date": "2026-11-30 05:36 UTC",
     "setup": "what data, what method (one paragraph)",
     "figures": [{"name": ..., "value": 8.19, "unit": "s", "peers": {"webdataset": 14.83},
                  "limit": {"tar -cf + fsync": 9.47}, "note": "..."}],
     "raw": {...}}

``peers`` are the other tools' figures for the same measurement, ``limit`` what bounds it (a
ceiling, a floor, a reference the suite compares with), both in the figure's unit. A run that
covers only part of a suite (``part``) is written beside the full one; the page takes each
figure from the newest file that has it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


@dataclasses.dataclass
class Run:
    """What a suite function gets: its options and where it works.

    Args:
        suite: the suite's name.
        args: the parsed options (common ones and the suite's own).
        data_dir: where the suite keeps its generated data between runs.
        command: the command line that started the run, as the page quotes it.
        commit: the commit under test, taken when the run starts (a suite that writes its
            own page into the tree, as faults does, would otherwise read as ``-dirty``).
    """

    suite: str
    args: argparse.Namespace
    data_dir: Path
    command: str
    commit: str = dataclasses.field(default_factory=lambda: commit())

    @property
    def reps(self) -> int:
        """Repetitions of each measurement."""
        return self.args.reps

    @property
    def quick(self) -> bool:
        """True for ``--quick``: tiny data, a check that the suite runs."""
        return self.args.quick

    def log(self, *parts) -> None:
        """Progress on stderr (the figures go to the JSON)."""
        print(*parts, file=sys.stderr, flush=True)


@dataclasses.dataclass
class Outcome:
    """What a suite function returns.

    Args:
        figures: the measured figures (:func:`figure` makes one).
        setup: one paragraph: the data and the method details of this run.
        versions: versions of the peers it ran (shardpack's own is added).
        part: set when the run covered only part of the suite (its file is then
            ``SUITE-PART.json``).
        raw: anything worth keeping beside the figures (per-repetition values).
    """

    figures: list
    setup: str = ""
    versions: dict = dataclasses.field(default_factory=dict)
    part: str | None = None
    raw: dict = dataclasses.field(default_factory=dict)


def figure(name: str, value, unit: str, peers: dict | None = None, limit: dict | None = None,
           note: str = "") -> dict:
    """One figure of a result.

    Args:
        name: what was measured, unique within the suite.
        value: the figure (a median unless the note says otherwise).
        unit: its unit ("s", "samples/s", "MB/s", ...); peers and limit share it.
        peers: other tools' figures for the same measurement, by name.
        limit: what bounds it (ceiling, floor, reference), by name.
        note: a ratio, a target and its verdict, the spread: one line.
    """
    return {"name": name, "value": _round(value), "unit": unit,
            "peers": {k: _round(v) for k, v in (peers or {}).items() if v is not None},
            "limit": {k: _round(v) for k, v in (limit or {}).items() if v is not None},
            "note": note}


def _round(value):
    if isinstance(value, float):
        return float(f"{value:.5g}")
    return value


def machine(data_dir: Path | None = None) -> dict:
    """The machine's facts: CPUs, RAM, kernel, Python, torch, the data's file system."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "unknown")
    with open("/proc/meminfo") as f:
        ram = int(f.readline().split()[1]) / 2**20
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    return {"cpus": os.cpu_count(), "cpu": cpu, "ram_gib": round(ram, 1),
            "kernel": platform.release(), "python": platform.python_version(), "torch": torch,
            "fs": _file_system(data_dir) if data_dir else None}


def _file_system(path: Path) -> str:
    real, best, fs = os.path.realpath(path), "", "?"
    with open("/proc/mounts") as f:
        for line in f:
            dev, mnt, typ = line.split()[:3]
            if (real + "/").startswith(mnt.rstrip("/") + "/") and len(mnt) >= len(best):
                fs, best = f"{typ} on {dev} ({mnt})", mnt
    return fs


# What suites write: a change there is a result, not a change to the code under test, so that the
# suites of one `benchmarks all` run (each writing its result before the next starts) all read as
# the clean commit they ran on.
OUTPUTS = ("benchmarks/results", "docs/benchmarks.md", "docs/reliability.md")


def commit() -> str:
    """The commit of the shardpack under test (its short hash, ``-dirty`` where a tracked file
    other than the suites' :data:`OUTPUTS` differs from it), or what the A/B harness says it is
    (SHARDPACK_BENCH_COMMIT: its trees are not checkouts)."""
    if os.environ.get("SHARDPACK_BENCH_COMMIT"):
        return os.environ["SHARDPACK_BENCH_COMMIT"]
    import shardpack
    tree = Path(shardpack.__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    if not head:
        return "unknown"
    changed = subprocess.run(["git", "-C", str(tree), "status", "--porcelain",
                              "--untracked-files=no", "--", "."]
                             + [f":(exclude){p}" for p in OUTPUTS],
                             capture_output=True, text=True).stdout.strip()
    return f"{head}-dirty" if changed else head


def shardpack_version() -> str:
    """The version of the shardpack that ``import shardpack`` finds here."""
    import shardpack
    return shardpack.__version__


def now() -> str:
    """The date line of a result: UTC, to the minute."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def build(run: Run, outcome: Outcome) -> dict:
    """The JSON object of one suite run."""
    return {"suite": run.suite, "part": outcome.part, "command": run.command,
            "machine": machine(run.data_dir),
            "versions": {"shardpack": shardpack_version(), **outcome.versions},
            "commit": run.commit, "date": now(), "setup": " ".join(outcome.setup.split()),
            "figures": outcome.figures, "raw": outcome.raw}


def write(result: dict, folder: Path) -> Path:
    """Write ``result`` as SUITE[-PART].json in ``folder``; files of the same suite whose every
    figure the new one has are removed (superseded: git keeps them)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = result["suite"] + (f"-{result['part']}" if result.get("part") else "")
    path = folder / f"{name}.json"
    names = {f["name"] for f in result["figures"]}
    for old in load(folder):
        if old["suite"] == result["suite"] and old["_path"] != path \
                and {f["name"] for f in old["figures"]} <= names:
            old["_path"].unlink()
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def load(folder: Path) -> list[dict]:
    """Every result in ``folder`` (each with ``_path``), oldest first."""
    out = []
    for path in sorted(Path(folder).glob("*.json")):
        data = json.loads(path.read_text())
        data["_path"] = path
        out.append(data)
    return sorted(out, key=lambda r: r.get("date", ""))
