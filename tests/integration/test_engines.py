"""Packing on real engines: a Dask LocalCluster of 2 worker processes and a local Ray
of 2 workers.  Each must give the bytes a local pack gives, from a relative path in another
working directory, with a worker killed mid-pack, and from and to the S3 server; the parallel
walk must give the same samples in the same order as the single walk.  Also: a missing engine
is a one-line error naming the extra, and `--part` splits a tree into disjoint parts."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import shardpack
from shardpack.write import engine as engine_mod
from shardpack import format as fmt
from shardpack.core.errors import ShardpackError
from shardpack.write.plan import part_of
from shardpack.write.packsource import PackSource

from testbed.helpers import make_tree, proc_files

ROOT = Path(__file__).resolve().parents[2]
OPTS = dict(shard_size="16KB", check="full", resize=24)  # many small, slowish tasks


def _tree(root: Path, classes: int = 3, per_class: int = 30) -> Path:
    files = {}
    for c in range(classes):
        for i in range(per_class):
            files[f"class{c}/img_{i:03d}.{('jpg', 'JPEG')[i % 2]}"] = _jpeg(c * 1000 + i)
        files[f"class{c}/img_000.json"] = b'{"c": %d}' % c
        files[f"class{c}/.DS_Store"] = b"junk"
    return make_tree(root, files)


_JPEGS: dict[int, bytes] = {}


def _jpeg(seed: int) -> bytes:
    """A real JPEG (resize and the full check decode it)."""
    if seed not in _JPEGS:
        import io

        import numpy as np
        from PIL import Image

        rng = np.random.default_rng(seed)
        pixels = rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=80)
        _JPEGS[seed] = buf.getvalue()
    return _JPEGS[seed]


def _files(out) -> dict[str, str]:
    """Name -> md5 of every file of a local dataset (the lock file and nothing hidden)."""
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(Path(out).iterdir())
            if not p.name.startswith(".")}


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return _tree(tmp_path_factory.mktemp("engines") / "src")


@pytest.fixture(scope="module")
def reference(tree, tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("ref") / "out"
    shardpack.pack(tree, out, workers=1, **OPTS)
    files = _files(out)
    assert len([n for n in files if n.endswith(".tar")]) >= 8
    return files


@pytest.fixture(scope="module")
def dask_cluster():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, host="127.0.0.1")
    client = distributed.Client(cluster)
    yield cluster, client
    client.close()
    cluster.close()


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield ray
    ray.shutdown()


# -- the engine as a strategy ---------------------------------------------------------------------
def test_unknown_or_missing_engine_is_one_line(tree, tmp_path, monkeypatch):
    with pytest.raises(ShardpackError, match="unknown engine 'spark'"):
        shardpack.pack(tree, tmp_path / "a", engine="spark")
    real = __import__("importlib").import_module

    def no_ray(name, *a, **kw):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real(name, *a, **kw)

    monkeypatch.setattr("importlib.import_module", no_ray)
    with pytest.raises(ShardpackError, match=r"the ray engine needs ray, which is not installed "
                                             r"\(pip install 'shardpack\[ray\]'\)"):
        shardpack.pack(tree, tmp_path / "b", engine="ray")
    with pytest.raises(ShardpackError, match="--address is for the dask and ray engines"):
        shardpack.pack(tree, tmp_path / "c", address="tcp://127.0.0.1:1")
    result = subprocess.run([sys.executable, "-m", "shardpack.cli", "pack", str(tree),
                             str(tmp_path / "d"), "--engine", "spark"], capture_output=True,
                            text=True)
    assert result.returncode == 2 and "spark" in result.stderr


class _Recorder(engine_mod.Engine):
    """An engine that runs tasks in threads and records how many were in flight at most."""

    def __init__(self, workers: int):
        from concurrent.futures import ThreadPoolExecutor

        self.workers, self.pool = workers, ThreadPoolExecutor(8)
        self.running = self.most = 0
        self.lock = threading.Lock()

    def submit(self, fn, *args):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        future = self.pool.submit(fn, *args)
        future.add_done_callback(lambda _: self._done())
        return future

    def _done(self):
        with self.lock:
            self.running -= 1


def test_tasks_in_flight_follow_the_engines_workers(tree, tmp_path, monkeypatch, reference):
    """Twice the engine's workers, not the driver's cores (2 here): 5 workers -> up to 10
    shard tasks, plus the walk's 3 (one per class folder) while they overlap."""
    pack_mod = sys.modules["shardpack.write.pack"]

    made = []

    def fake(engine, address, workers, executor):
        made.append(_Recorder(5))
        return made[-1]

    monkeypatch.setattr(pack_mod, "engine_of", fake)
    shardpack.pack(tree, tmp_path / "out", **OPTS)
    assert _files(tmp_path / "out") == reference
    assert 8 <= made[0].most <= 10 + 3


def test_parallel_walk_gives_the_single_walks_samples_in_order(tree, tmp_path):
    """The walk as pieces on an engine (one per class folder, or per top folder) yields what
    the one-process walk yields, in the same order, with the same counts."""
    from concurrent.futures import ProcessPoolExecutor

    single = PackSource(tree)
    one = [(s.key, s.fields) for s in single]
    with ProcessPoolExecutor(2) as pool:
        parallel = PackSource(tree)
        parallel.use_engine(engine_mod.ExecutorEngine(pool, workers=2))
        two = [(s.key, s.fields) for s in parallel]
    assert one == two and len(one) == 90
    assert (single.report.hidden, single.report.images) == \
        (parallel.report.hidden, parallel.report.images) == (3, 90)
    files = make_tree(tmp_path / "files", {"top.bin": b"t", "a/1.bin": b"1", "a/b/2.bin": b"2",
                                           "c/3.bin": b"3", "c/.hidden": b""})
    with ProcessPoolExecutor(2) as pool:
        parallel = PackSource(files)
        parallel.use_engine(engine_mod.ExecutorEngine(pool, workers=2))
        assert [s.key for s in parallel] == [s.key for s in PackSource(files)] == \
            ["top", "a/1", "a/b/2", "c/3"]
        assert parallel.report.hidden == 1


# -- Dask -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_dask_local_cluster_started_by_pack_is_byte_identical(tree, tmp_path, reference):
    pytest.importorskip("distributed")
    summary = shardpack.pack(tree, tmp_path / "out", engine="dask", workers=2, **OPTS)
    assert summary.samples == 90 and _files(tmp_path / "out") == reference


@pytest.mark.slow
def test_dask_from_a_relative_path_in_another_folder(tree, tmp_path, reference, dask_cluster):
    """The driver runs in another folder than the workers, with relative SRC and OUT: both
    are made absolute before tasks leave the driver."""
    cluster, _ = dask_cluster
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rel_src = os.path.relpath(tree, elsewhere)
    result = subprocess.run([sys.executable, "-m", "shardpack.cli", "pack", rel_src, "out",
                             "--engine", "dask", "--address", cluster.scheduler_address, "-q",
                             "--shard-size", OPTS["shard_size"], "--check", "full",
                             "--resize", "24"], cwd=elsewhere, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert _files(elsewhere / "out") == reference


def _in_thread(pack):
    """Start ``pack()`` in a thread: (thread, errors it raised, event set when it ends)."""
    errors, done = [], threading.Event()

    def run():
        try:
            pack()
        except BaseException as exc:  # (reported by the caller)
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run, daemon=True)  # (a hung pack must not hang pytest)
    thread.start()
    return thread, errors, done


def _joined(thread: threading.Thread, errors: list) -> None:
    thread.join(240)
    assert not thread.is_alive(), "the pack did not end within 240 s"
    assert not errors, errors


def _children(pids: set[int]) -> set[int]:
    """Every process below ``pids`` (children, their children, ...), from /proc."""
    parent = {}
    for pid, stat in proc_files("stat").items():
        parent[pid] = int(stat.rsplit(b")", 1)[1].split()[1])
    found, frontier = set(), set(pids)
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


@pytest.mark.slow
def test_dask_worker_killed_mid_pack_is_rerun(tree, tmp_path, reference, dask_cluster):
    """A worker that is running pack tasks is killed mid-pack: the pack is still the local one,
    byte for byte (the scheduler reruns the lost tasks; the nanny restarts the worker)."""
    cluster, client = dask_cluster
    for attempt in range(3):  # (packed again if it ended before the kill: a busy machine)
        out = tmp_path / f"out{attempt}"
        thread, errors, done = _in_thread(
            lambda out=out: shardpack.pack(tree, out, engine="dask",
                                           address=cluster.scheduler_address, **OPTS))
        try:
            killed = _kill_a_busy_dask_worker(client, done)
            mid_pack = killed and not done.is_set()
        finally:
            _joined(thread, errors)
        assert _files(out) == reference
        client.wait_for_workers(2, timeout=60)  # the nanny restarted it
        if mid_pack:
            break
    assert mid_pack, "every pack ended before a worker running its tasks was killed"


def _kill_a_busy_dask_worker(client, done: threading.Event, timeout: float = 120) -> bool:
    """SIGKILL a worker the scheduler has pack tasks on, before ``done`` is set; False if the
    pack ended first."""
    pids = client.run(os.getpid)  # {worker address: pid}
    deadline = time.monotonic() + timeout
    while not done.is_set() and time.monotonic() < deadline:
        busy = [addr for addr, keys in client.processing().items() if keys and addr in pids]
        if busy:
            os.kill(pids[busy[0]], signal.SIGKILL)
            return True
        time.sleep(0.005)
    return False


def _wait_for_shards(out: Path, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if out.is_dir() and len(list(out.glob("shard-*.tar"))) >= n:
            return
        time.sleep(0.01)
    raise AssertionError("no shards appeared")


@pytest.mark.slow
def test_dask_from_and_to_s3(tree, tmp_path, reference, dask_cluster, s3_server):
    _from_and_to_s3(tree, tmp_path, reference, s3_server,
                    dict(engine="dask", address=dask_cluster[0].scheduler_address))


def _from_and_to_s3(tree, tmp_path, reference, s3_server, engine: dict) -> None:
    """SRC and OUT on the S3 server: the shards are the local pack's shards (byte for byte);
    indexes differ only by the source mtimes their digest covers, so the samples are compared."""
    bucket = s3_server.create_bucket()
    s3_server.upload_dir(tree, bucket, "src")
    options = s3_server.storage_options
    url = f"s3://{bucket}/out"
    summary = shardpack.pack(f"s3://{bucket}/src", url, storage_options=options, **engine,
                             **OPTS)
    assert summary.samples == 90 and summary.hidden == 3
    fs = s3_server.filesystem()
    shards = {p.rsplit("/", 1)[-1]: hashlib.md5(fs.cat_file(p)).hexdigest()
              for p in fs.ls(f"{bucket}/out") if p.endswith(".tar")}
    assert shards == {k: v for k, v in reference.items() if k.endswith(".tar")}
    from shardpack.inspect.verify import verify
    assert verify(url, storage_options=options).ok


# -- Ray ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_ray_is_byte_identical_and_survives_a_killed_worker(tree, tmp_path, reference,
                                                            ray_local):
    """On the Ray this test started (pack connects to it and leaves it running): a pack is
    byte-identical to a local one, and so is a pack during which a worker running a task
    is killed (Ray reruns its task)."""
    out = tmp_path / "plain"
    shardpack.pack(tree, out, engine="ray", **OPTS)
    assert _files(out) == reference
    # A worker shows ``ray::_call`` only while it runs a task, and a task here takes tens of ms:
    # poll for one from the start of the pack.  A pack that ends before one is caught (a busy
    # machine can starve the poller) is packed again; the kill itself is asserted below.
    for attempt in range(3):
        out = tmp_path / f"killed{attempt}"
        thread, errors, done = _in_thread(
            lambda out=out: shardpack.pack(tree, out, engine="ray", **OPTS))
        try:
            killed = _kill_a_ray_task_worker(done)
            mid_pack = killed and not done.is_set()
        finally:
            _joined(thread, errors)
        assert _files(out) == reference
        if mid_pack:
            break
    assert mid_pack, "no Ray worker was caught running a task in 3 packs"


def _kill_a_ray_task_worker(done: threading.Event, timeout: float = 120) -> bool:
    """SIGKILL the first worker of this test's Ray (below the raylet this process started)
    seen running a task (its title is ``ray::_call``) before ``done`` is set; False if the pack
    ended first."""
    deadline = time.monotonic() + timeout
    while not done.is_set() and time.monotonic() < deadline:
        victims = [pid for pid, cmd in proc_files("cmdline").items()
                   if cmd.startswith(b"ray::_call")]
        if victims:  # (another Ray on the machine is not ours to kill)
            ours = _children({os.getpid()})
            victims = [pid for pid in victims if pid in ours]
        if victims:
            os.kill(victims[0], signal.SIGKILL)
            return True
        time.sleep(0.002)
    return False


@pytest.mark.slow
def test_ray_from_a_relative_path_and_from_and_to_s3(tree, tmp_path, reference, ray_local,
                                                     s3_server, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # (the Ray workers were started in the first folder)
    shardpack.pack(os.path.relpath(tree, elsewhere), "out", engine="ray", **OPTS)
    assert _files(elsewhere / "out") == reference
    _from_and_to_s3(tree, tmp_path, reference, s3_server, dict(engine="ray"))


# -- parts ----------------------------------------------------------------------------------------
def test_parts_are_disjoint_and_cover_the_tree(tree, tmp_path):
    keys = set()
    for i in range(3):
        out = tmp_path / f"part{i}"
        summary = shardpack.pack(tree, out, part=(i, 3), workers=1, shard_size="16KB")
        manifest = fmt.decode_manifest((out / fmt.MANIFEST_NAME).read_bytes())
        assert manifest.part == fmt.Part(index=i, count=3)
        assert manifest.classes == ("class0", "class1", "class2")
        got = [s["__key__"] for s in shardpack.ShardDataset(out, shuffle=False)]
        assert got and all(part_of(k, 3) == i for k in got) and not keys & set(got)
        keys |= set(got)
        assert summary.samples == len(got)
    assert keys == {s.key for s in PackSource(tree)}
    for bad in ("3/3", "x", (1, 0), "-1/2"):
        with pytest.raises(ShardpackError, match="--part"):
            shardpack.pack(tree, tmp_path / "bad", part=bad)


def test_parallel_walk_splits_deep_trees_and_counts_the_same(tmp_path):
    """A deep tree is split folder by folder until each worker has pieces; samples, order and
    every count (hidden, skipped bad entries, a symlink loop deep down) are the single walk's."""
    from concurrent.futures import ProcessPoolExecutor

    files = {f"{a}/{b}/{c}/{i}.bin": bytes([i]) for a in "xy" for b in "pq" for c in "uv"
             for i in range(3)}
    files.update({"top.bin": b"t", "x/p/.hidden": b"", "y/q/v/.DS_Store": b"", "x/mid.bin": b"m"})
    root = make_tree(tmp_path / "deep", files)
    os.symlink("../..", root / "x" / "p" / "u" / "loop")  # back to x: a loop
    one = PackSource(root, skip_bad=True)
    single = [(s.key, s.fields) for s in one]
    with ProcessPoolExecutor(2) as pool:
        source = PackSource(root, skip_bad=True)
        source.use_engine(engine_mod.ExecutorEngine(pool, workers=2))
        units = source.units()
        assert sum(u[3] for u in units) >= 8 and len(units) > 8  # split below the top level
        parallel = [(s.key, s.fields) for s in source]
    assert parallel == single and len(single) == 26
    for what in ("hidden", "skipped", "images", "ignored"):
        assert getattr(source.report, what) == getattr(one.report, what), what
    assert one.report.skipped == {"link-loop": 1} and one.report.hidden == 2


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["dask", "ray"])
def test_a_task_error_is_the_one_line_error(engine, tmp_path, request):
    """A broken image stops the pack on a cluster as it does locally: the SourceError itself,
    one line naming the file (not the engine's wrapped traceback), nothing published."""
    from shardpack.core.errors import BrokenImageError

    request.getfixturevalue("dask_cluster" if engine == "dask" else "ray_local")
    address = (request.getfixturevalue("dask_cluster")[0].scheduler_address
               if engine == "dask" else None)
    src = _tree(tmp_path / "src", classes=2, per_class=4)
    (src / "class1" / "img_002.jpg").write_bytes(_jpeg(5)[:300])  # truncated
    with pytest.raises(BrokenImageError) as info:
        shardpack.pack(src, tmp_path / "out", engine=engine, address=address, **OPTS)
    text = str(info.value)
    assert "\n" not in text and "img_002.jpg" in text and "Traceback" not in text
    assert not (tmp_path / "out" / fmt.MANIFEST_NAME).exists()


def test_cli_part_and_engine_options(tree, tmp_path):
    from testbed.helpers import run_cli

    out = run_cli("pack", tree, tmp_path / "p1", "--part", "1/2", "-q", "--workers", "1").output
    manifest = fmt.decode_manifest((tmp_path / "p1" / fmt.MANIFEST_NAME).read_bytes())
    assert manifest.part == fmt.Part(1, 2) and "packed" in out
    bad = run_cli("pack", tree, tmp_path / "p2", "--part", "2/2", ok=False)
    assert "--part 2/2: I must be at least 0 and less than N" in bad.output
    help_text = run_cli("pack", "--help").output
    for words in ("--engine [local|dask|ray]", "--address ADDR", "--part I/N"):
        assert words in help_text


# -- what the review found ------------------------------------------------------------------------
def _memory_tree(name: str, files: dict[str, bytes], markers: bool = False) -> str:
    import fsspec

    fs = fsspec.filesystem("memory")
    for path, data in files.items():
        fs.pipe_file(f"/{name}/{path}", data)
    return f"memory://{name}"


def test_remote_src_with_a_slash_markers_and_out_inside(tmp_path, monkeypatch):
    """SRC URL with a trailing slash; folder-marker objects ("tree/") in listings; OUT inside a
    remote SRC is left out of the walk, as it is locally (the shards written during the walk
    would otherwise be packed too)."""
    import fsspec

    url = _memory_tree("rv-src", {f"{c}/{i}.bin": bytes([i]) * 3000 for c in "abcdefgh"
                                  for i in range(3)})
    fs = fsspec.filesystem("memory")
    real_ls = type(fs).ls

    def ls_with_markers(self, path, detail=True, **kw):  # as the AWS console leaves them
        out = real_ls(self, path, detail=detail, **kw)
        marker = {"name": path.rstrip("/") + "/", "size": 0, "type": "file"}
        return [marker, *out] if detail else [marker["name"], *out]

    monkeypatch.setattr(type(fs), "ls", ls_with_markers)
    summary = shardpack.pack(url + "/", url + "/out", workers=1, shard_size="4KB",
                             layout="files")
    assert summary.samples == 24 and summary.fields == ["bin"]
    got = sorted(s["__key__"] for s in shardpack.ShardDataset(url + "/out"))
    assert got == sorted(f"{c}/{i}" for c in "abcdefgh" for i in range(3))


def test_one_changed_remote_file_costs_only_its_own_sample(tmp_path, monkeypatch):
    import fsspec

    from shardpack.write import fields

    url = _memory_tree("rv-changed", {f"{i:02d}.bin": bytes(10) for i in range(6)})
    real = fields.RemoteFiles.__init__

    def shrink_then_init(self, *args, **kwargs):  # after the walk, before the shard reads
        fsspec.filesystem("memory").pipe_file("/rv-changed/04.bin", b"abc")  # its files
        real(self, *args, **kwargs)

    monkeypatch.setattr(fields.RemoteFiles, "__init__", shrink_then_init)
    summary = shardpack.pack(url, tmp_path / "out", workers=1, on_error="skip")
    assert summary.samples == 5 and summary.skipped == {"read-failed": 1}
    assert "04.bin" in summary.first_skips[0] and "size 10 -> 3" in summary.first_skips[0]


def test_walk_counts_are_counted_once_in_a_merge_of_parts(tmp_path):
    files = {f"{i:02d}.bin": b"x" for i in range(30)}
    files.update({".hidden": b"", "bad name.": b""})
    src = make_tree(tmp_path / "src", files)
    parts = [tmp_path / f"p{i}" for i in range(3)]
    for i, out in enumerate(parts):
        shardpack.pack(src, out, part=(i, 3), workers=1, on_error="skip")
    merged = shardpack.merge(parts, tmp_path / "m")
    whole = shardpack.pack(src, tmp_path / "w", workers=1, on_error="skip")
    m = fmt.decode_manifest((tmp_path / "m" / fmt.MANIFEST_NAME).read_bytes())
    w = fmt.decode_manifest((tmp_path / "w" / fmt.MANIFEST_NAME).read_bytes())
    assert merged.samples == whole.samples == 30
    assert (m.skipped, m.hidden) == (w.skipped, w.hidden) == ({"bad-name": 1}, 1)


def test_an_empty_part_is_published_and_merged(tmp_path):
    src = make_tree(tmp_path / "src", {f"{k}.bin": k.encode() for k in "abc"})
    counts = [part_of(k, 4) for k in "abc"]
    empty = next(i for i in range(4) if i not in counts)
    parts = [tmp_path / f"p{i}" for i in range(4)]
    for i, out in enumerate(parts):
        assert shardpack.pack(src, out, part=(i, 4), workers=1).samples == counts.count(i)
    assert len(shardpack.ShardDataset(parts[empty])) == 0
    shardpack.merge(parts, tmp_path / "m")
    assert sorted(s["__key__"] for s in shardpack.ShardDataset(tmp_path / "m")) == list("abc")


def test_no_task_of_a_failed_pack_writes_after_it(tmp_path):
    """With an executor whose tasks are still running when one fails, pack waits for them
    before it lets go of OUT: nothing appears in OUT after pack raised."""
    from concurrent.futures import ThreadPoolExecutor

    from shardpack.write import writer

    src = make_tree(tmp_path / "src", {f"{i:03d}.bin": bytes(200) for i in range(40)})
    real = writer.write_shard

    def slow(task, *args):
        if task.number == 0:
            raise ShardpackError("x: bad input")
        time.sleep(0.3)
        return real(task, *args)

    pack_mod = sys.modules["shardpack.write.pack"]
    original = pack_mod.write_shard
    pack_mod.write_shard = slow
    try:
        with ThreadPoolExecutor(4) as pool, pytest.raises(ShardpackError, match="bad input"):
            shardpack.pack(src, tmp_path / "out", executor=pool, max_samples=4)
        after = sorted(p.name for p in (tmp_path / "out").iterdir())
        time.sleep(1.0)
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == after
        assert not [n for n in after if ".tmp-" in n]
    finally:
        pack_mod.write_shard = original


def test_a_dead_walk_task_is_one_line_and_marks_the_run_failed(tree, tmp_path):
    from concurrent.futures import ProcessPoolExecutor

    def die(*_):
        os._exit(3)

    from shardpack.write import packsource as samples_mod

    with ProcessPoolExecutor(2) as pool:
        real = samples_mod.walk_unit
        samples_mod.walk_unit = die
        try:
            with pytest.raises(ShardpackError, match="listing this folder on the engine failed"):
                shardpack.pack(tree, tmp_path / "out", executor=pool, **OPTS)
        finally:
            samples_mod.walk_unit = real
    # the same command (once the cause is gone) starts afresh: the run was marked failed
    assert shardpack.pack(tree, tmp_path / "out", workers=1, **OPTS).samples == 90


def test_bad_engine_choices_leave_out_untouched(tree, tmp_path):
    with pytest.raises(ShardpackError, match="--address is for the dask and ray engines"):
        shardpack.pack(tree, tmp_path / "out", address="tcp://127.0.0.1:1")
    assert not (tmp_path / "out").exists()


def test_a_failed_pack_never_cancels_ray_tasks():
    """Engine.stop() waits for queued Ray tasks instead of ray.cancel: a cancel racing a task's
    end aborted the whole driver process in Ray 2.60 (a failed CHECK in its task manager)."""
    class Ray:
        def cancel(self, *args, **kwargs):
            raise AssertionError("ray.cancel was called")

    assert engine_mod._RayFuture(Ray(), ref=None).cancel() is False
