"""The inspection commands: info, ls, cat, and --help that explains."""

import json

import pytest

from .conftest import run_cli


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


@pytest.mark.parametrize("command,needle", [
    ("pack", "--resume"), ("pack", "--skip-bad"), ("verify", "Exits 0"), ("unpack", "outside"),
    ("info", "--json"), ("ls", "--long"), ("cat", "--field"),
])
def test_help_explains(command, needle):
    assert needle in run_cli(command, "--help").output
