"""The example training script under torchrun (2 gloo processes on CPU): killed mid-epoch,
resumed, and every sample of each epoch seen exactly once across the interruption."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import shardpack

from .conftest import ROOT, proc_files


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmd(ds, out):
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_addr", "127.0.0.1", "--master_port", str(_port()),
            str(ROOT / "tools" / "train_example.py"), str(ds), "--out", str(out),
            "--epochs", "2", "--batch-size", "4", "--size", "32", "--workers", "1",
            "--checkpoint-every", "3", "--log-seen", "--step-sleep", "0.15"]


def _steps(out: Path) -> int:
    path = out / "seen-rank0.jsonl"
    if not path.exists():
        return 0
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    return json.loads(lines[-1])["step"] if lines else 0


def _kill_tree(proc) -> None:
    """SIGKILL torchrun and every process under it, then wait until they are gone.  Not just
    its process group: torchrun may start the ranks in sessions of their own, and ranks that
    outlive the kill keep training and writing checkpoints next to the resumed job."""
    kids: dict[int, list[int]] = {}
    for pid, stat in proc_files("stat").items():
        kids.setdefault(int(stat.rsplit(b")", 1)[1].split()[1]), []).append(pid)
    tree, todo = [], [proc.pid]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += kids.get(pid, [])
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    def alive(pid: int) -> bool:  # (a zombie waits for its parent: it runs no more)
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.time() + 30
    while time.time() < deadline and any(alive(pid) for pid in tree[1:]):
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_train_example_kill_and_resume(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_images", ROOT / "tools" / "make_images.py")
    make_images = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_images)
    make_images.make_images(tmp_path / "img", 101, classes=3, workers=1, tiny=True)
    ds = tmp_path / "ds"
    shardpack.pack(tmp_path / "img", ds, max_samples=30, workers=1)
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(_cmd(ds, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    deadline = time.time() + 200
    while time.time() < deadline and _steps(out) < 8 and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
    _kill_tree(proc)  # the whole job: torchrun and both ranks
    proc.wait()
    killed_at = _steps(out)
    assert 8 <= killed_at < 26  # mid first epoch (13 steps an epoch) or early in the second
    done = subprocess.run(_cmd(ds, out), capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "resumed at epoch" in done.stdout
    for epoch in (0, 1):
        seen = []
        for rank in (0, 1):
            for line in (out / f"seen-rank{rank}.jsonl").read_text().splitlines():
                record = json.loads(line)
                if record["epoch"] == epoch:
                    seen += record["ids"]
        assert sorted(seen) == list(range(101)), f"epoch {epoch}: not exactly once"
