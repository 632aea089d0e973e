"""The benchmark suites' entry point and the page made from their results (benchmarks/): every
suite is listed, the report renders docs/benchmarks.md from benchmarks/results/ within its limit,
and the page in the repository is the one the results make."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITES = {"pack", "read", "decode", "remote", "convert", "peers", "mix", "scale", "checkpoint",
          "faults", "trees"}


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_list_names_every_suite():
    result = _run("--list")
    assert result.returncode == 0, result.stderr
    listed = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    assert SUITES <= listed, SUITES - listed


def test_the_page_is_generated_from_the_results(tmp_path):
    out = tmp_path / "benchmarks.md"
    result = _run("report", "--out", str(out))
    assert result.returncode == 0, result.stderr
    page = out.read_text()
    assert len(page.splitlines()) <= 400
    assert page == (ROOT / "docs" / "benchmarks.md").read_text(), \
        "docs/benchmarks.md is stale: run `python -m benchmarks report`"
    assert "stop " not in page.lower() and "issue " not in page.lower()


def test_an_unknown_suite_is_one_line_and_exit_2():
    result = _run("no-such-suite")
    assert result.returncode != 0
    assert "no-such-suite" in result.stderr and "Traceback" not in result.stderr
