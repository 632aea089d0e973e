"""The skip audit and the required servers (testbed/skips.py, testbed/plugin.py): where
scripts/test.sh sets SHARDPACK_CI_SKIPS=1 a skip off the allowlist fails the run, naming the test
and its reason; where it sets SHARDPACK_REQUIRE_SERVERS=1 a server that cannot start fails its
test instead of skipping it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import skips

ROOT = Path(__file__).resolve().parents[2]

SKIPPING = '''
import pytest

def test_runs():
    pass

@pytest.mark.skipif(True, reason="needs CUDA")
def test_on_a_gpu():
    pass

def test_without_a_piece():
    pytest.skip("the frobnicator is not installed")

@pytest.mark.xfail(reason="known", strict=True)
def test_known_failure():
    assert False
'''


def _pytest(folder: Path, **env) -> subprocess.CompletedProcess:
    (folder / "conftest.py").write_text('pytest_plugins = ["testbed.plugin"]\n')
    (folder / "test_some.py").write_text(SKIPPING)
    environ = {k: v for k, v in os.environ.items() if k != skips.ENV}
    environ.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-c", os.devnull, "--rootdir", str(folder), str(folder)],
                          cwd=folder, capture_output=True, text=True, timeout=120, env=environ)


def test_a_skip_off_the_allowlist_fails_the_run_where_ci_asks(tmp_path):
    result = _pytest(tmp_path, **{skips.ENV: "1"})
    assert result.returncode == 1, result.stdout
    assert "skips CI must not have" in result.stdout
    assert "test_without_a_piece: the frobnicator is not installed" in result.stdout
    assert "test_on_a_gpu" not in result.stdout.split("skips CI must not have")[1]


def test_skips_pass_where_ci_does_not_ask(tmp_path):
    result = _pytest(tmp_path)
    assert result.returncode == 0, result.stdout
    assert "skips CI must not have" not in result.stdout


@pytest.mark.parametrize("reason", [
    "needs CUDA", "a CUDA device exists", "checks the refusal without CUDA",
    "needs 15 GiB free disk", "THP is off in the kernel",
    "cannot bind-mount a folder read-only here: mount: permission denied",
    "cannot mount a small tmpfs here (needs root)", "pack finished before the kill",
    "https is read-only: writes do not apply", "msgpack records carry their own CRC",
])
def test_reasons_a_fresh_ci_machine_may_have(reason):
    assert skips.allowed(reason)


@pytest.mark.parametrize("reason", [
    "nginx is not installed (scripts/setup.sh installs it: apt-get install nginx)",
    "S3 test server (rclone serve s3) cannot start: exited",
    "the region decode extension is not built here",
    "SHARDPACK_REQUIRE_JPEGCROP is not set (scripts/test.sh sets it)",
    "could not import 'pyarrow': No module named 'pyarrow'",
    "no Adwaita icon theme on this machine", "mknod needs root", "needs GNU tar",
    "numpy's huge-page madvise is off (NUMPY_MADVISE_HUGEPAGE=0)",
])
def test_reasons_ci_must_not_have(reason):
    assert skips.allowed(reason) is None


def test_a_missing_server_fails_where_required(monkeypatch):
    monkeypatch.delenv(skips.REQUIRE_SERVERS, raising=False)
    with pytest.raises(pytest.skip.Exception, match="nginx is not installed"):
        skips.skip_or_fail("nginx is not installed", skips.REQUIRE_SERVERS)
    monkeypatch.setenv(skips.REQUIRE_SERVERS, "1")
    with pytest.raises(pytest.fail.Exception, match="SHARDPACK_REQUIRE_SERVERS=1 but nginx"):
        skips.skip_or_fail("nginx is not installed", skips.REQUIRE_SERVERS)
