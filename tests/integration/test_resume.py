"""A pack killed with SIGKILL at random points, then resumed, equals an uninterrupted pack."""

import random
import signal
import subprocess
import sys
import time

import pytest

import shardpack
from shardpack import format as fmt

from testbed.helpers import dataset_files, fake_jpeg, make_tree, run_cli


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    rng = random.Random(3)
    root = tmp_path_factory.mktemp("resume") / "src"
    return make_tree(root, {f"c{i % 4}/{i:05d}.jpg": fake_jpeg(rng.randint(20_000, 80_000), i)
                            for i in range(1500)})


def _pack_cmd(src, out, shard_format, *extra):
    return [sys.executable, "-m", "shardpack.cli", "pack", str(src), str(out), "--format",
            shard_format, "--shard-size", "1MB", "--workers", "2", "-q", *extra]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True).stdout
    return [int(x) for x in out.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\tZ" not in next(line for line in f if line.startswith("State:"))
    except (FileNotFoundError, StopIteration):
        return False


@pytest.mark.slow
@pytest.mark.parametrize("shard_format", ["tar", "msgpack"])
def test_sigkill_then_resume_is_byte_identical(src, tmp_path, shard_format):
    reference = tmp_path / "reference"
    shardpack.pack(src, reference, shard_format=shard_format, shard_size="1MB", workers=2)
    out = tmp_path / "out"
    rng = random.Random(11)
    kills = 0
    while kills < 5:
        extra = ("--resume",) if out.exists() else ()
        done_before = len(list(out.glob("*.idx"))) if out.exists() else 0
        proc = subprocess.Popen(_pack_cmd(src, out, shard_format, *extra),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # kill a random moment after a random number of further shards completed
        target = done_before + rng.randint(1, 4)
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None and \
                len(list(out.glob("*.idx"))) < target:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.05))
        workers = _children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if (out / fmt.MANIFEST_NAME).exists():
            break  # committed before the kill landed
        kills += 1
        deadline = time.time() + 10  # workers die with their parent (PR_SET_PDEATHSIG)
        while time.time() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.05)
        assert not any(_alive(w) for w in workers), "pool workers outlived the killed packer"
    assert kills >= 3, "the pack was too fast to be interrupted: raise the data size"
    if not (out / fmt.MANIFEST_NAME).exists():
        done = subprocess.run(_pack_cmd(src, out, shard_format, "--resume"),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "complete shards kept" in done.stdout
    assert dataset_files(out) == dataset_files(reference)
    assert run_cli("verify", out).exit_code == 0


def test_resume_refuses_other_options(src, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen(_pack_cmd(src, out, "tar"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.time() + 30
    while time.time() < deadline and not list(out.glob("*.idx")):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if (out / fmt.MANIFEST_NAME).exists():
        pytest.skip("pack finished before the kill")
    result = run_cli("pack", src, out, "--resume", "--format", "msgpack", ok=None)
    assert result.exit_code == 2 and "different options" in result.output
    result = run_cli("pack", src, out, "--resume", "--shard-size", "1MB", "-q")
    assert "kept from the interrupted run" in result.output  # "1 complete shard" or "N ..s"


def test_a_state_left_beside_a_published_manifest_is_removed(src, tmp_path):
    """A pack killed between writing its manifest and removing its state leaves both: the next
    pack run into OUT (here --resume, which has nothing to resume) removes the stale state."""
    out = tmp_path / "out"
    shardpack.pack(src, out, workers=1)
    (out / ".shardpack-pack.json").write_text("{}")
    result = run_cli("pack", src, out, "-q", "--resume", ok=None)
    assert result.exit_code == 2 and "nothing to resume" in result.output
    assert not (out / ".shardpack-pack.json").exists()
    assert len(shardpack.open_reader(out)) > 0
