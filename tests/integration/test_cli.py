"""The inspection commands: info, ls, cat, and --help that explains."""

import json

import pytest

from testbed.helpers import make_tree, run_cli, run_subprocess


@pytest.fixture
def packed(small_tree, tmp_path):
    out = tmp_path / "out"
    result = run_cli("pack", small_tree, out, "--max-samples", "4", "-q")
    assert "packed 6 samples (6 image files found, 8 files read" in result.output
    assert "into 2 shards" in result.output
    return out


def test_info_human_and_json(packed):
    text = run_cli("info", packed).output
    assert "samples   6 in 2 shards" in text and "fields    cls, jpg, json" in text
    assert "classes   2: cat, dog" in text and "format    tar, compression none" in text
    data = json.loads(run_cli("info", packed, "--json").output)
    assert data["num_samples"] == 6 and data["num_shards"] == 2 and data["version"] == 2
    assert "bytes per sample" in text
    assert data["index_bytes_per_sample"] == pytest.approx(data["index_bytes"] / 6)
    assert data["classes"] == ["cat", "dog"] and "shards" not in data


def test_ls_and_cat(packed, small_tree):
    keys = run_cli("ls", packed).output.splitlines()
    assert keys[:3] == ["cat/0001", "cat/0002", "cat/with space"] and len(keys) == 6
    long = run_cli("ls", "--long", packed).output.splitlines()
    assert long[1] == "cat/0002\tshard-00000.tar\tcls:1 jpg:40 json:8"
    got = run_subprocess_bytes("cat", packed, "cat/0001", "-f", "jpg")
    assert got == (small_tree / "cat" / "0001.jpg").read_bytes()
    result = run_cli("cat", packed, "cat/0002", ok=None)
    assert result.exit_code == 2 and "choose one with --field" in result.output
    result = run_cli("cat", packed, "nope", ok=None)
    assert result.exit_code == 2 and "no sample with key 'nope'" in result.output


def run_subprocess_bytes(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "shardpack.cli", *map(str, args)],
                          capture_output=True, check=True).stdout


def test_not_a_dataset(tmp_path):
    result = run_cli("info", tmp_path, ok=None)
    assert result.exit_code == 2 and "shardpack.json is missing" in result.output
    (tmp_path / "shardpack.json").write_text('{"format": "shardpack", "version": 9}')
    result = run_cli("verify", tmp_path, ok=None)
    assert result.exit_code == 2
    assert "unsupported manifest version: expected one of (1, 2), found 9" in result.output


def test_no_dataset_says_why_and_suggests_resume_only_where_it_helps(tmp_path):
    missing = run_cli("info", tmp_path / "nothing", ok=None)
    assert missing.exit_code == 2
    assert missing.stderr == (f"shardpack: error: {tmp_path / 'nothing'}: no shardpack dataset "
                              "here (the path does not exist)\n")
    (tmp_path / "file").write_bytes(b"x")
    assert "(a file, not a dataset folder)" in run_cli("info", tmp_path / "file", ok=None).stderr
    empty = run_cli("info", tmp_path, ok=None).stderr
    assert "(shardpack.json is missing)" in empty and "resume" not in empty
    (tmp_path / ".shardpack-pack.json").write_text("{}")  # what an unfinished pack leaves
    unfinished = run_cli("ls", tmp_path, ok=None).stderr
    assert "(shardpack.json is missing)" in unfinished
    assert "has not finished" in unfinished and "again with --resume" in unfinished


@pytest.mark.parametrize("command,needle", [
    ("pack", "--resume"), ("pack", "--skip-bad"), ("verify", "Exits 0"), ("unpack", "outside"),
    ("info", "--json"), ("ls", "--long"), ("cat", "--field"),
])
def test_help_explains(command, needle):
    assert needle in run_cli(command, "--help").output


@pytest.mark.parametrize("command,module,hint", [
    ("pack", "write.pack", True), ("convert", "interop.convert", True),
    ("verify", "inspect.verify", False),
])
def test_interrupt_says_how_to_finish(command, module, hint, small_tree, tmp_path, monkeypatch):
    """Ctrl-C: one line, exit 130; a command that has --resume says to rerun with it."""
    import importlib

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module(f"shardpack.{module}"), command, interrupted)
    args = [small_tree] if command == "verify" else [small_tree, tmp_path / "out"]
    result = run_cli(command, *args, ok=None)
    assert result.exit_code == 130
    want = (f"shardpack: interrupted; to finish it, run the same `shardpack {command}` command "
            "again with --resume\n" if hint else "shardpack: interrupted\n")
    assert result.stderr == want


def test_ctrl_c_during_a_real_pack_then_resume(tmp_path):
    """SIGINT while a pack runs: the hint line alone on stderr, exit 130, and the hinted
    --resume finishes the pack."""
    import signal
    import subprocess
    import sys
    import time

    from testbed import imagegen

    data = imagegen.png("RGB", size=(160, 120))  # --check full decodes each: ~1 ms an image
    src = make_tree(tmp_path / "src", {f"a/{i:04d}.png": data for i in range(1000)})
    out = tmp_path / "out"
    args = ["pack", src, out, "--check", "full", "--workers", "1", "--max-samples", "20", "-q"]
    proc = subprocess.Popen([sys.executable, "-m", "shardpack.cli", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (out / ".shardpack-pack.json").exists() and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0, "the pack was too fast to be interrupted: raise the data size"
    assert proc.returncode == 130, stderr
    assert stderr == ("shardpack: interrupted; to finish it, run the same `shardpack pack` "
                      "command again with --resume\n")
    result = run_cli("info", out, ok=None)  # what is there says so too
    assert result.exit_code == 2 and "has not finished" in result.output
    assert "again with --resume" in result.output
    result = run_subprocess(*args, "--resume")
    assert result.returncode == 0, result.stderr
    assert "packed 1,000 samples" in result.stdout
    assert (out / "shardpack.json").exists()
