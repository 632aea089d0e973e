"""``export`` holds the OUT lock ``pack`` holds: a second run into the same OUT is refused at once
and the first completes intact (docs/convert.md, "Export"; docs/packing.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shardpack.core.errors import PackError
from shardpack.interop.export import export
from shardpack.storage import Storage
from shardpack.write.outdir import LOCK_NAME, OutLock
from shardpack.write.pack import pack

from testbed.helpers import make_tree, read_tree

ROOT = Path(__file__).resolve().parents[2]
FORMATS = ["webdataset", "parquet", "files"]

pytestmark = pytest.mark.timeout(120)

# an export that stops right after taking OUT's lock until the test lets it go on
PAUSED = textwrap.dedent("""
    import os, sys, time
    from shardpack.write import outdir
    from shardpack.interop.export import export

    dataset, out, to, ready, go = sys.argv[1:6]
    enter = outdir.OutLock.__enter__

    def paused(self):
        held = enter(self)
        open(ready, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)
        return held

    outdir.OutLock.__enter__ = paused
    export(dataset, out, to=to)
""")


@pytest.fixture
def dataset(tmp_path) -> Path:
    files = {f"c{i % 2}/{i:03d}.bin": os.urandom(700 + i) for i in range(12)}
    make_tree(tmp_path / "src", files)
    pack(tmp_path / "src", tmp_path / "ds", shard_size="3KB", workers=1)
    return tmp_path / "ds"


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardpack.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=90)


@pytest.mark.parametrize("to", FORMATS)
def test_concurrent_export_into_one_out_is_refused(dataset, tmp_path, to):
    out, ready, go = tmp_path / "out", tmp_path / "ready", tmp_path / "go"
    first = subprocess.Popen([sys.executable, "-c", PAUSED, dataset, out, to, ready, go],
                             cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert first.poll() is None, first.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the first export never took the lock"
            time.sleep(0.01)
        second = _cli("export", dataset, out, "--to", to, "--shard-size", "4KB")
        assert second.returncode != 0
        [line] = second.stderr.strip().splitlines()  # one line, no traceback
        assert str(out) in line and "another shardpack run" in line and "right now" in line
        also = _cli("pack", tmp_path / "src", out)  # pack's lock is the same one
        assert also.returncode != 0 and "another shardpack run" in also.stderr
    finally:
        go.touch()
        _, err = first.communicate(timeout=90)
    assert first.returncode == 0, err[-3000:]
    export(dataset, tmp_path / "alone", to=to)  # the same export, run alone
    assert read_tree(out) == read_tree(tmp_path / "alone")  # intact, and no lock file left
    assert not (out / LOCK_NAME).exists()


@pytest.mark.parametrize("to", FORMATS)
def test_export_refused_while_a_pack_holds_out(dataset, tmp_path, to):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_bytes(b"the pack's")
    with OutLock(Storage(out)):
        with pytest.raises(PackError, match="another shardpack run") as info:
            export(dataset, out, to=to, overwrite=True)
    assert str(out) in str(info.value)
    assert sorted(os.listdir(out)) == [LOCK_NAME, "keep.txt"]  # untouched, the lock file kept


def test_export_into_a_missing_out_leaves_no_lock_file(dataset, tmp_path):
    for to in FORMATS:
        export(dataset, tmp_path / to, to=to)
        assert not (tmp_path / to / LOCK_NAME).exists()
    (tmp_path / "made").mkdir()
    (tmp_path / "made" / LOCK_NAME).touch()  # a pack's or a killed run's: not this run's
    export(dataset, tmp_path / "made", to="parquet")
    assert (tmp_path / "made" / LOCK_NAME).exists()


def test_a_lock_file_removed_by_its_holder_is_not_used(tmp_path):
    """A run that opened the lock file just before its holder removed it (and released it)
    locks the file OUT holds now, never the removed one: else two runs could hold OUT at once."""
    storage = Storage(tmp_path / "out")
    path = tmp_path / "out" / LOCK_NAME
    with OutLock(storage, remove=True):
        stale = os.open(path, os.O_RDWR)  # what the next run opened meanwhile
    assert not path.exists()
    opened = []
    real = storage.lock_file

    def lock_file(name):
        opened.append(name)
        return stale if len(opened) == 1 else real(name)

    storage.lock_file = lock_file
    with OutLock(storage) as lock:
        assert len(opened) == 2 and os.fstat(lock.fd).st_ino == path.stat().st_ino
        with pytest.raises(PackError, match="another shardpack run"):
            with OutLock(Storage(tmp_path / "out")):
                pass
