"""Leftovers after kill -9: ``unpack`` and ``export --to files`` build OUT in a hidden work folder
``.OUT.tmp-*`` that records its owner process; a run killed with SIGKILL leaves it, and the next
run for the same OUT removes it once its owner is gone, never a live run's folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import shardpack
from shardpack.interop.export import export
from shardpack.interop.unpack import WORK_OWNER, WORK_TREE, owner_record, remove_stale, unpack

from testbed.helpers import ROOT, fake_jpeg, make_tree, read_tree, run_cli


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("leftovers")
    files = {f"c{i % 3}/{i:03d}.jpg": fake_jpeg(40 + i, seed=i) for i in range(40)}
    src = make_tree(root / "src", files)
    shardpack.pack(src, root / "ds", workers=1)
    return root / "ds", files


def _hidden(out: Path) -> list[str]:
    return sorted(n for n in os.listdir(out.parent) if n.startswith(f".{out.name}."))


def _work(out: Path, tag: str, record: dict | None, files: int = 1) -> Path:
    """A work folder as a run leaves it: its owner record (unless None) and a partial tree."""
    work = out.parent / f".{out.name}.tmp-{tag}"
    (work / WORK_TREE / "c0").mkdir(parents=True)
    for i in range(files):
        (work / WORK_TREE / "c0" / f"{i}.jpg").write_bytes(b"x")
    if record is not None:
        (work / WORK_OWNER).write_text(json.dumps(record))
    return work


def _dead_record() -> dict:
    """The owner record of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        record = owner_record(child.pid)
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert record is not None and record["pid"] == child.pid
    return record


def test_only_trees_whose_owner_is_gone_are_removed(ds, tmp_path):
    dataset, files = ds
    out = tmp_path / "out"
    mine = owner_record()
    assert mine is not None and mine["pid"] == os.getpid()
    gone = _dead_record()
    dead = _work(out, f"{gone['pid']}-00000001", gone)
    reused = _work(out, f"{os.getpid()}-00000002", dict(mine, start=mine["start"] - 1))
    live = _work(out, f"{os.getpid()}-00000003", mine)
    other_boot = _work(out, "1-00000004", dict(mine, pid=2 ** 22 + 7, boot="another-boot"))
    other_ns = _work(out, "1-00000005", dict(mine, pid=2 ** 22 + 7, pidns="pid:[1]"))
    unmarked = _work(out, "1-00000006", None)  # no record, not empty: cannot be judged
    empty = out.parent / f".{out.name}.tmp-{2 ** 22 + 7}-00000007"  # killed before its record
    empty.mkdir()
    os.utime(empty, (time.time() - 3600, time.time() - 3600))
    fresh = out.parent / f".{out.name}.tmp-{2 ** 22 + 7}-00000008"  # maybe being made now
    fresh.mkdir()
    target = make_tree(tmp_path / "keep", {"precious.txt": b"keep me"})
    link = out.parent / f".{out.name}.tmp-{2 ** 22 + 7}-00000009"
    link.symlink_to(target, target_is_directory=True)
    other_out = _work(tmp_path / "other", f"{2 ** 22 + 7}-0000000a", dict(mine, pid=2 ** 22 + 7))

    assert unpack(dataset, out) == len(files)
    assert read_tree(out) == files
    kept = {p.name for p in (reused, live, other_boot, other_ns, unmarked, fresh, link)}
    assert set(_hidden(out)) == kept - {reused.name}, _hidden(out)
    assert not dead.exists() and not empty.exists() and not reused.exists()
    assert (live / WORK_TREE / "c0" / "0.jpg").read_bytes() == b"x"
    assert (target / "precious.txt").read_bytes() == b"keep me"
    assert other_out.exists()  # another OUT's folder: not this run's business


def test_export_files_removes_them_too(ds, tmp_path):
    dataset, files = ds
    out = tmp_path / "out"
    make_tree(out, {"old.txt": b"an earlier export"})
    stale = _work(out, "1-0000000b", _dead_record(), files=3)
    live = _work(out, "1-0000000c", owner_record())
    summary = export(dataset, out, to="files", overwrite=True)
    assert summary.files == len(files) and read_tree(out) == files
    assert not stale.exists() and _hidden(out) == [live.name]
    assert remove_stale(str(out)) == []  # ours is alive


@pytest.mark.parametrize("command", ["unpack", "export"])
def test_a_refused_rerun_still_removes_stale_trees(ds, tmp_path, command):
    """A run killed after it published OUT leaves its work folder; every later run refuses the
    non-empty OUT, so the removal must come before that refusal."""
    dataset, files = ds
    out = tmp_path / "out"
    make_tree(out, {"published.txt": b"what the killed run had published"})
    stale = _work(out, "1-0000000d", _dead_record(), files=0)
    args = (("unpack", dataset, out) if command == "unpack"
            else ("export", dataset, out, "--to", "files"))
    result = run_cli(*args, ok=None)
    assert result.exit_code == 2 and "not an empty folder" in result.output
    assert not stale.exists() and _hidden(out) == []


def test_removing_a_work_folder_keeps_its_record_to_the_last(tmp_path):
    """A kill while a work folder is removed must leave one the next run can judge: the trees
    go first, the owner record last."""
    from shardpack.interop.unpack import WORK_OLD, remove_work

    out = tmp_path / "out"
    work = _work(out.parent / "x" / "out", "1-0000000e", owner_record(), files=2)
    (work / WORK_OLD / "a").mkdir(parents=True)
    order = []
    real_unlink = os.unlink

    def unlink(path, *a, **kw):
        order.append(os.path.basename(path))
        return real_unlink(path, *a, **kw)

    import shardpack.interop.unpack as unpack_module

    saved = unpack_module.os.unlink
    unpack_module.os.unlink = unlink
    try:
        remove_work(str(work))
    finally:
        unpack_module.os.unlink = saved
    assert not work.exists() and order[-1] == WORK_OWNER, order


def test_a_folder_without_its_record_is_judged_by_its_name(ds, tmp_path):
    """A kill between making the work folder and writing its record (or while a run removes
    it) leaves no owner.json: the name carries the owner's pid, start time and boot, so the
    next run removes it at once when that process is gone, never when it lives."""
    from shardpack.interop.workdir import name_tag as _name_tag

    dataset, files = ds
    out = tmp_path / "out"
    gone = _dead_record()
    dead = out.parent / f".{out.name}.tmp-{gone['pid']}-{gone['start']}-{gone['boot'][:8]}-0e"
    dead.mkdir(parents=True)
    alive = out.parent / f".{out.name}.tmp-{_name_tag()}-0f"
    alive.mkdir()
    (alive / WORK_TREE).mkdir()  # a live run's tree in the making
    boot = out.parent / f".{out.name}.tmp-{gone['pid']}-{gone['start']}-00000000-10"
    boot.mkdir()  # another boot's (NFS, a reboot): not judged here
    assert unpack(dataset, out) == len(files)
    assert not dead.exists() and alive.exists() and boot.exists()
    assert _name_tag().startswith(f"{os.getpid()}-")


# -- a real kill -9 ----------------------------------------------------------------------------

KILLED = textwrap.dedent("""
    import os, sys, time
    import shardpack.interop.unpack as u
    from shardpack.interop.export import export

    how, dataset, out, flag = sys.argv[1:5]

    def stop():
        open(flag, "w").close()
        time.sleep(120)  # the test kills this process with SIGKILL meanwhile

    if how == "build":  # stop in the middle of the tree
        write = u._Job.write
        def slow_write(self, rel, data):
            write(self, rel, data)
            if self.written == 5:
                stop()
        u._Job.write = slow_write
    else:  # export --overwrite: stop between moving OUT away and moving the new tree in
        rename = os.rename
        def slow_rename(src, dst):
            if os.fspath(src).endswith("/" + u.WORK_TREE) and os.path.exists(dst) is False:
                stop()
            rename(src, dst)
        u.os.rename = slow_rename
    if how == "build" and sys.argv[5] == "unpack":
        u.unpack(dataset, out)
    else:
        export(dataset, out, to="files", overwrite=True)
""")


def _kill_mid_run(how: str, command: str, dataset: Path, out: Path, flag: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", KILLED, how, str(dataset), str(out),
                              str(flag), command], cwd=ROOT, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert child.poll() is None, child.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the run never reached the kill point"
            time.sleep(0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL


@pytest.mark.parametrize("command", ["unpack", "export"])
def test_kill_9_mid_build_then_rerun(ds, tmp_path, command):
    dataset, files = ds
    out = tmp_path / "out"
    _kill_mid_run("build", command, dataset, out, tmp_path / "flag")
    # nothing published; export held OUT's lock (docs/packing.md), whose empty file stays
    assert not out.exists() if command == "unpack" else os.listdir(out) == [".shardpack-lock"]
    [left] = _hidden(out)
    assert len(read_tree(out.parent / left / WORK_TREE)) == 5  # what the killed run wrote
    args = ("unpack", dataset, out) if command == "unpack" else (
        "export", dataset, out, "--to", "files")
    run_cli(*args)
    assert read_tree(out) == files and _hidden(out) == []


def test_kill_9_mid_overwrite_then_rerun(ds, tmp_path):
    """Killed between the two renames of export --overwrite: OUT is missing, the old export and
    the new tree are in the work folder; the rerun makes OUT and removes them."""
    dataset, files = ds
    out = tmp_path / "out"
    make_tree(out, {"old.txt": b"an earlier export"})
    _kill_mid_run("swap", "export", dataset, out, tmp_path / "flag")
    assert not out.exists()
    [left] = _hidden(out)
    assert read_tree(out.parent / left / "old") == {"old.txt": b"an earlier export",
                                                     ".shardpack-lock": b""}  # the run's lock
    run_cli("export", dataset, out, "--to", "files", "--overwrite")
    assert read_tree(out) == files and _hidden(out) == []
