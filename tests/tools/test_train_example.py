"""The example training script: under torchrun (2 gloo processes on CPU) killed mid-epoch,
resumed, and every sample of each epoch seen exactly once across the interruption; killed in the
middle of a checkpoint write; and its asynchronous save writes the state of its own step."""

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

from testbed.helpers import ROOT, proc_files


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmd(ds, out):
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_addr", "127.0.0.1", "--master_port", str(_port()),
            str(ROOT / "examples" / "train_example.py"), str(ds), "--out", str(out),
            "--epochs", "2", "--batch-size", "4", "--size", "32", "--workers", "1",
            "--save-every-steps", "3", "--save-every-s", "1", "--log-seen",
            "--step-sleep", "0.15"]


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

    spec = importlib.util.spec_from_file_location("make_images",
                                                  ROOT / "scripts" / "make_images.py")
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


@pytest.fixture(scope="module")
def tiny_ds(tmp_path_factory):
    import importlib.util

    root = tmp_path_factory.mktemp("train")
    spec = importlib.util.spec_from_file_location("make_images",
                                                  ROOT / "scripts" / "make_images.py")
    make_images = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_images)
    make_images.make_images(root / "img", 40, classes=3, workers=1, tiny=True)
    shardpack.pack(root / "img", root / "ds", max_samples=12, workers=1)
    return root / "ds"


def _single(ds, out, *extra):
    return [sys.executable, str(ROOT / "examples" / "train_example.py"), str(ds), "--out", str(out),
            "--batch-size", "4", "--size", "32", "--workers", "1", *map(str, extra)]


def _checkpoints(out: Path) -> list[Path]:
    return sorted(out.glob("checkpoint-*.pt"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_during_a_checkpoint_write_keeps_the_previous_one(tiny_ds, tmp_path):
    """SIGKILL while the background thread is half-way through the second write: the first
    checkpoint is whole and the only one, the half-written one never got its name, and the
    resumed run starts from the first and sees every sample of each epoch exactly once."""
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = _single(tiny_ds, out, "--epochs", "2", "--save-every-steps", "3", "--log-seen",
                  "--async-save", "--keep", "5")
    proc = subprocess.Popen([*cmd, "--write-delay", "60", "--delay-write", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    deadline = time.time() + 150  # the second write is held 60 s: wait until it is under way
    # (the first one's temp file shows for a moment too: wait for the first checkpoint as well)
    while time.time() < deadline and not (_checkpoints(out) and
                                          list(out.glob("checkpoint-*.tmp"))):
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        time.sleep(0.05)
    _kill_tree(proc)
    proc.wait()
    import torch

    assert [p.name for p in _checkpoints(out)] == ["checkpoint-000000003.pt"]
    assert torch.load(_checkpoints(out)[0], weights_only=True)["step"] == 3
    assert list(out.glob("checkpoint-*.tmp"))  # the killed write: a temp file, no name
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "resumed at epoch 0, step 3" in done.stdout
    assert not list(out.glob("checkpoint-*.tmp"))
    for epoch in (0, 1):
        seen = [i for line in (out / "seen-rank0.jsonl").read_text().splitlines()
                for i in json.loads(line)["ids"] if json.loads(line)["epoch"] == epoch]
        assert sorted(seen) == list(range(40)), f"epoch {epoch}: not exactly once"


def test_unreadable_checkpoint_is_set_aside_and_pruning_keeps_what_loads(tiny_ds, tmp_path):
    """A newest checkpoint that does not load is renamed .bad and the run resumes from the one
    before; with --keep 1 the new checkpoints replace only older ones."""
    import torch

    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.run(_single(tiny_ds, out, "--epochs", "1", "--save-every-steps", "3",
                                   "--max-steps", "6", "--keep", "5"),
                           capture_output=True, text=True, timeout=200, env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    newest = out / "checkpoint-000000006.pt"
    newest.write_bytes(b"not a checkpoint")
    again = subprocess.run(_single(tiny_ds, out, "--epochs", "1", "--save-every-steps", "3",
                                   "--max-steps", "8", "--keep", "1"),
                           capture_output=True, text=True, timeout=200, env=env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resumed at epoch 0, step 3" in again.stdout
    assert (out / "checkpoint-000000006.pt.bad").exists()
    names = [p.name for p in _checkpoints(out)]
    assert names == ["checkpoint-000000008.pt"], names
    assert torch.load(out / names[0], weights_only=True)["step"] == 8


@pytest.mark.timeout(300)
def test_async_save_writes_the_state_of_its_step(tiny_ds, tmp_path):
    """The background write is held 1 s while training changes the weights: the file must still
    equal a synchronous save of the same step."""
    import torch

    env = dict(os.environ, OMP_NUM_THREADS="1")
    runs = {}
    for mode, extra in (("sync", []), ("async", ["--async-save", "--write-delay", "1"])):
        out = tmp_path / mode
        done = subprocess.run(_single(tiny_ds, out, "--epochs", "1", "--optimizer", "adam",
                                      "--save-every-steps", "3", "--max-steps", "7",
                                      "--keep", "5", *extra),
                              capture_output=True, text=True, timeout=200, env=env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        runs[mode] = {p.name: torch.load(p, weights_only=True) for p in _checkpoints(out)}
    assert sorted(runs["sync"]) == sorted(runs["async"]) == [
        "checkpoint-000000003.pt", "checkpoint-000000006.pt", "checkpoint-000000007.pt"]
    for name, sync in runs["sync"].items():
        got = runs["async"][name]
        assert got["step"] == sync["step"] and got["loader"] == sync["loader"]
        for key, value in sync["model"].items():
            assert torch.equal(got["model"][key], value), (name, key)
        for pid, st in sync["optimizer"]["state"].items():
            for key, value in st.items():
                assert torch.equal(got["optimizer"]["state"][pid][key], value), (name, pid, key)
    first, later = (runs["sync"][n]["model"] for n in ("checkpoint-000000003.pt",
                                                        "checkpoint-000000006.pt"))
    assert any(not torch.equal(first[k], later[k]) for k in first)  # training moved on


def test_save_by_time(tiny_ds, tmp_path):
    """--save-every-s alone: steps of ~0.15 s and a save every 0.4 s give a checkpoint every
    2-4 steps (by wall time, not by step count), plus the one after the last step."""
    import torch

    out = tmp_path / "run"
    done = subprocess.run(_single(tiny_ds, out, "--epochs", "1", "--save-every-steps", "0",
                                  "--save-every-s", "0.4", "--step-sleep", "0.15",
                                  "--max-steps", "9", "--keep", "20"),
                          capture_output=True, text=True, timeout=200,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = [torch.load(p, weights_only=True)["step"] for p in _checkpoints(out)]
    assert steps[-1] == 9 and 3 <= len(steps) <= 9, steps
    gaps = [b - a for a, b in zip(steps[:-2], steps[1:-1], strict=True)]
    # by time: never more than 0.4 s apart (4 steps of 0.15 s), and not at every step unless
    # every step took over 0.4 s (a heavily loaded machine)
    assert all(1 <= g <= 4 for g in gaps) and max(gaps) >= 2, steps


def _train_example_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_example",
                                                  ROOT / "examples" / "train_example.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ranks_share_gpus_when_there_are_fewer_than_ranks():
    import torch

    pick = _train_example_module().pick_device
    assert pick(0, 2, 0) == (torch.device("cpu"), "gloo")
    assert pick(1, 2, 2) == (torch.device("cuda", 1), "nccl")    # one GPU per rank
    assert pick(1, 2, 1) == (torch.device("cuda", 0), "gloo")    # NCCL refuses a shared GPU
    assert pick(3, 4, 2) == (torch.device("cuda", 1), "gloo")
    assert pick(0, 1, 8) == (torch.device("cuda", 0), "nccl")


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
@pytest.mark.timeout(240)
def test_two_ranks_on_the_gpus_there_are(tiny_ds, tmp_path):
    """torchrun with 2 ranks on a CUDA machine, whatever its GPU count (a 1-GPU machine: both
    share it): every sample of each epoch seen once; GPU decode where torchvision imports."""
    import importlib.util

    import torch

    decode = "gpu" if importlib.util.find_spec("torchvision") else "cpu"
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_port()),
           str(ROOT / "examples" / "train_example.py"), str(tiny_ds), "--out", str(out),
           "--epochs", "2", "--batch-size", "4", "--size", "32", "--workers", "1",
           "--decode", decode, "--log-seen", "--save-every-steps", "4"]
    # shardpack from this tree, installed or not (the GPU machine runs the working tree)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=200,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "done: " in done.stdout and "on cuda:" in done.stdout, done.stdout[-2000:]
    if torch.cuda.device_count() < 2:
        assert "2 ranks share 1 GPU(s): gloo" in done.stdout
    for epoch in (0, 1):
        seen = [i for rank in (0, 1)
                for line in (out / f"seen-rank{rank}.jsonl").read_text().splitlines()
                for i in json.loads(line)["ids"] if json.loads(line)["epoch"] == epoch]
        assert sorted(seen) == list(range(40)), f"epoch {epoch}: not exactly once"
