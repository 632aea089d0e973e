"""The benchmark suites' entry point and the page made from their results (benchmarks/): every
suite is listed, the report renders docs/benchmarks.md from benchmarks/results/ within its limit,
and the page in the repository is the one the results make."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import registry

ROOT = Path(__file__).resolve().parents[2]
SUITES = {"pack", "read", "decode", "remote", "convert", "peers", "mix", "scale", "checkpoint",
          "faults", "trees", "stages", "pixels"}


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_list_names_every_suite():
    result = _run("--list")
    assert result.returncode == 0, result.stderr
    listed = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    assert SUITES <= listed, SUITES - listed
    assert listed == set(registry.MODULES), "test_every_suite_runs_quick runs registry.MODULES"


def test_the_page_is_generated_from_the_results(tmp_path):
    out = tmp_path / "benchmarks.md"
    result = _run("report", "--out", str(out))
    assert result.returncode == 0, result.stderr
    page = out.read_text()
    assert len(page.splitlines()) <= 400
    assert page == (ROOT / "docs" / "benchmarks.md").read_text(), \
        "docs/benchmarks.md is stale: run `python -m benchmarks report`"
    assert "stop " not in page.lower() and "issue " not in page.lower()


def test_every_figures_block_in_the_docs_is_the_results_own():
    """A table of a suite's figures in README.md or docs/ sits in a figures block that the report
    writes; none is stale."""
    from benchmarks import report, results

    stale = report.stale_pages(results.RESULTS)
    assert not stale, f"run `python -m benchmarks report`: stale figures in {stale}"
    blocks = [m["suite"] for page in report.pages()
              for m in report.BLOCK.finditer(page.read_text())]
    assert {"checkpoint", "scale", "peers"} <= set(blocks), blocks


CITED = re.compile(r"python -m benchmarks (?P<suite>[\w-]+)[^`]*` on (?P<commit>[0-9a-f]{7,40})")


def test_a_figure_quoted_in_the_docs_names_the_run_it_comes_from():
    """A sentence that quotes a suite's figures as "(`python -m benchmarks SUITE ...` on COMMIT)"
    names a commit that one of that suite's result files was measured on."""
    from benchmarks import report, results

    measured: dict = {}
    for run in results.load(results.RESULTS):
        measured.setdefault(run["suite"], set()).add(run["commit"])
    cited = []
    for page in report.pages():
        text = " ".join(page.read_text().split())  # a citation may break across lines
        for m in CITED.finditer(text):
            cited.append(m["suite"])
            commits = measured.get(m["suite"], set())
            assert any(c.startswith(m["commit"]) and not c.endswith("-dirty")
                       for c in commits), \
                f"{page.name} quotes {m['suite']} on {m['commit']}; its results: {commits}"
    assert cited, "no citation found: the pattern no longer matches the docs"


def test_an_unknown_suite_is_one_line_and_exit_2():
    result = _run("no-such-suite")
    assert result.returncode != 0
    assert "no-such-suite" in result.stderr and "Traceback" not in result.stderr


# 64 MB written by a parent, then two children forked that only sleep: the pages stay shared
SHARED_AFTER_FORK = """
import os, sys, time
block = bytearray(b"\\x01") * (64 << 20)
for _ in range(2):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
print("ready", flush=True)
time.sleep(60)
"""


def test_the_stages_memory_sampler_counts_pages_shared_after_fork_once():
    """The stages suite's memory figure is the job's: a page shared by three processes after a
    fork counts once in the summed PSS, three times in the sum of peak RSS beside it."""
    from benchmarks.suites.stages import MemorySampler

    proc = subprocess.Popen([sys.executable, "-c", SHARED_AFTER_FORK], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        sampler = MemorySampler()
        for _ in range(3):
            sampler.sample(proc.pid)
        got = sampler.result()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert got["processes"] == 3, got
    assert got["hwm_sum_mb"] > 3 * 64, got
    assert 64 < got["pss_mb"] < 64 + 0.5 * 2 * 64, got


def test_the_stages_rate_counts_from_the_first_round_of_batches():
    """8 worker processes hand in their first batches together at 4 s, the next 8 at 8 s: 512
    images/s from the round on (from the first batch it would read 960)."""
    from benchmarks.suites.stages import steady_rate

    arrivals = [(4.0, 256)] * 8 + [(4.0 + 0.5 * (k + 1), 256) for k in range(8)]
    assert steady_rate(arrivals, 8, 8.0) == 8 * 256 / 4.0
    assert steady_rate(arrivals[:8], 8, 4.0) is None


def test_the_pixels_crossover_is_the_bandwidth_at_which_the_extra_bytes_cost_the_decode_saved():
    """Raw pixels 10 kB read in 10 us against a 2 kB JPEG decoded in 30 us: past 8 kB / 20 us =
    400 MB/s per core raw is faster. A raw form both smaller and faster wins at any bandwidth
    (0); one no faster never wins (None). The threshold is the raw size of the largest side
    whose crossover is under the bandwidth."""
    from benchmarks.suites.pixels import crossing, crossover_figures

    raw = {"s": 10e-6, "bytes": 10_000}
    assert crossing(raw, {"s": 30e-6, "bytes": 2_000}) == pytest.approx(400.0)
    assert crossing(raw, {"s": 30e-6, "bytes": 12_000}) == 0.0
    assert crossing(raw, {"s": 10e-6, "bytes": 2_000}) is None
    cross = {"32": {"raw": raw, "jpg": {"s": 30e-6, "bytes": 2_000},
                    "png": {"s": 50e-6, "bytes": 12_000}},
             "64": {"raw": {"s": 20e-6, "bytes": 12_416}, "jpg": {"s": 40e-6, "bytes": 2_416},
                    "png": {"s": 90e-6, "bytes": 9_416}}}
    figures = {f["name"]: f for f in crossover_figures(cross, 1000.0, [450.0])}
    assert figures["crossover at 64x64, vs JPEG"]["value"] == pytest.approx(500.0)
    assert figures["auto threshold, page cache, vs JPEG"]["value"] == (64 * 64 * 3 + 128) / 1024
    assert figures["auto threshold, HTTP 450 MB/s, vs JPEG"]["value"] == (32 * 32 * 3 + 128) / 1024
    assert figures["auto threshold, HTTP 450 MB/s, vs JPEG"]["peers"]["vs PNG"] == \
        (64 * 64 * 3 + 128) / 1024


# -- every suite's --quick, so that none rots between regenerations of the page -------------------

def _tree_state(*folders: Path) -> dict:
    """Name -> (size, mtime) of every file under ``folders``: what a run must leave alone."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns)
            for folder in folders if folder.exists() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("suite", registry.MODULES)
def test_every_suite_runs_quick(suite, tmp_path):
    """``python -m benchmarks SUITE --quick`` into a temporary results and data folder: exit 0,
    a result of that suite there with at least one figure, and nothing written to
    benchmarks/results, docs/ or the default data folder. A suite that needs a GPU or a venv
    this machine lacks runs what it can and says what it left out (the peers suite: which
    contenders' venvs are missing)."""
    out, data = tmp_path / "results", tmp_path / "data"
    # the page's results, the docs, and --quick's default data folder (which --data-dir replaces)
    guarded = (ROOT / "benchmarks" / "results", ROOT / "docs", ROOT / "bench-data" / "quick")
    before, had_data = _tree_state(*guarded), (ROOT / "bench-data").exists()
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "benchmarks", suite, "--quick",
                             "--results-dir", str(out), "--data-dir", str(data)],
                            cwd=ROOT, capture_output=True, text=True, timeout=380)
    took = time.monotonic() - started
    assert result.returncode == 0, (f"{suite} --quick failed after {took:.0f} s:\n"
                                    + result.stdout[-3000:] + result.stderr[-5000:])
    written = sorted(out.glob("*.json"))
    assert written, f"{suite} --quick wrote no result into --results-dir:\n{result.stdout}"
    for path in written:
        got = json.loads(path.read_text())
        assert got["suite"] == suite and got["figures"], path
        assert "--results-dir" not in got["command"], got["command"]
    assert _tree_state(*guarded) == before, f"{suite} --quick wrote into the repository"
    assert had_data or not (ROOT / "bench-data").exists(), f"{suite} --quick made bench-data/"
    if suite == "peers":  # it says which contenders ran and which venvs it missed
        assert "contenders: " in result.stderr, result.stderr[-2000:]


def test_all_prints_its_plan_within_the_ninety_minutes():
    """``all --dry-run``: every suite in page order with an estimate, the total under the 90
    minutes the whole page may take (data already generated), then each suite's command; --skip
    leaves suites out."""
    result = _run("all", "--dry-run", "--skip", "pixels")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "skipped: pixels" in lines[0]
    table = [line.split() for line in lines[1:lines.index(next(x for x in lines if
                                                                 x.split()[0] == "total"))]]
    assert [r[0] for r in table] == [s for s in registry.MODULES if s != "pixels"]
    assert [line.split()[3] for line in lines[1:] if line.startswith("python -m benchmarks ")] == \
        [r[0] for r in table]
    result = _run("all", "--dry-run")
    total = next(line.split() for line in result.stdout.splitlines()
                 if line.split()[0] == "total")
    assert total[2] == "min" and int(total[1]) < 90, result.stdout
    assert _run("all", "--skip", "no-such-suite").returncode != 0


@pytest.mark.slow
def test_all_quick_runs_the_suites_then_the_report(tmp_path):
    """``all --quick`` with all but one suite skipped: that suite's result and the page made
    from it land in the results folder; docs/benchmarks.md is left alone."""
    out = tmp_path / "results"
    page = (ROOT / "docs" / "benchmarks.md").read_bytes()
    keep = "decode"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "all", "--quick", "--data-dir", str(tmp_path / "d"),
         "--results-dir", str(out), "--skip", ",".join(s for s in registry.MODULES if s != keep)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (out / f"{keep}.json").exists() and "== report" in result.stdout
    assert (out / "benchmarks.md").exists()
    assert (ROOT / "docs" / "benchmarks.md").read_bytes() == page


def test_all_names_the_suite_that_failed_runs_the_others_and_exits_1(monkeypatch, capsys):
    """A suite that fails does not stop the run: the next ones and the report still run, the
    summary and the exit status say which failed (the suites' processes replaced by stubs)."""
    from benchmarks import run_all

    ran = []

    def fake_run(cmd, cwd=None):
        ran.append(cmd[3])
        return subprocess.CompletedProcess(cmd, 1 if cmd[3] == "read" else 0)

    monkeypatch.setattr(run_all.subprocess, "run", fake_run)
    with pytest.raises(SystemExit) as exit_:
        run_all.main(["--quick", "--skip", "pack,convert,peers,trees,stages,checks,remote,"
                      "fastlink,mix,scale,engines,checkpoint,faults,pixels"])
    assert exit_.value.code == 1
    assert ran == ["read", "decode", "report"]
    captured = capsys.readouterr()
    assert "== read FAILED (exit 1)" in captured.out and "failed: read" in captured.err


def test_a_result_reads_as_its_commit_unless_code_changed(tmp_path, monkeypatch):
    """The suites' own outputs (results, the generated pages) leave a run's commit clean; any
    other change to a tracked file marks it dirty."""
    import subprocess

    from benchmarks import results

    repo = tmp_path / "repo"
    (repo / "shardpack").mkdir(parents=True)
    (repo / "benchmarks" / "results").mkdir(parents=True)
    (repo / "shardpack" / "__init__.py").write_text("")
    (repo / "benchmarks" / "results" / "x.json").write_text("{}")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    monkeypatch.delenv("SHARDPACK_BENCH_COMMIT", raising=False)
    monkeypatch.setattr("shardpack.__file__", str(repo / "shardpack" / "__init__.py"))
    head = results.commit()
    assert head and not head.endswith("-dirty")
    (repo / "benchmarks" / "results" / "x.json").write_text('{"new": 1}')
    assert results.commit() == head
    (repo / "shardpack" / "__init__.py").write_text("# changed")
    assert results.commit() == head + "-dirty"
