"""The shared shard cache under faults: a cache folder this process cannot write (warm and
cold), a file in its place, several readers finding one corrupt cached file at once, and its
size limit (dead downloads, many processes, ``shardpack cache prune``)."""
# ruff: noqa: F811 - testbed/servers.py's fixtures are imported by name and taken as arguments

import multiprocessing
import os
import signal
import subprocess
import threading
import time

import pytest

import shardpack
from shardpack import ShardDataset
from shardpack.storage import cache as cache_module
from shardpack import format as fmt
from shardpack.storage.cache import CacheItem, ShardCache
from shardpack.core.errors import CacheError, IntegrityError
from shardpack.read.reader import DatasetReader

from testbed.helpers import make_tree, run_cli

N = 40


@pytest.fixture(scope="module")
def local_ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache-faults")
    files = {f"c{i % 2}/{i:03d}.bin": os.urandom(800 + 31 * i) for i in range(N)}
    shardpack.pack(make_tree(root / "src", files), root / "ds", max_samples=10, workers=1)
    return root / "ds"


def _expected(local_ds) -> dict:
    return {s["__key__"]: s["bin"] for s in DatasetReader(local_ds)}


def _read(url, cache, **kw) -> dict:
    ds = ShardDataset(url, cache_dir=cache, shuffle=False, **kw)
    return {s["__key__"]: s["bin"] for s in ds}


def _cached(cache, suffix=".tar") -> list[str]:
    return sorted(os.path.join(d, n) for d, _, names in os.walk(cache) for n in names
                  if n.endswith(suffix) and not n.startswith("."))


def _flip(path, at=100) -> None:
    """One byte flipped in place (the write moves the file's mtime: its stamp no longer holds)."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


def _disk_bytes(root) -> int:
    """Everything the cache folder holds but its lock file: cached files and temp files."""
    total = 0
    for d, _, names in os.walk(root):
        for n in names:
            if n != cache_module.LOCK_NAME:
                try:
                    total += os.path.getsize(os.path.join(d, n))
                except FileNotFoundError:
                    pass
    return total


# -- a cache folder this process cannot write ---------------------------------------------------

@pytest.fixture
def read_only_view(tmp_path):
    """``read_only_view(folder)``: a read-only bind mount of ``folder`` (writes there fail with
    EROFS, also as root, where chmod stops nothing), unmounted afterwards.  Skipped where
    mounting is not allowed."""
    mounts = []

    def make(folder):
        view = tmp_path / f"ro-{len(mounts)}"
        view.mkdir()
        done = subprocess.run(["mount", "--bind", "-o", "ro", str(folder), str(view)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot bind-mount a folder read-only here: {done.stderr.strip()}")
        mounts.append(view)
        if os.access(view, os.W_OK):
            pytest.skip("a read-only bind mount is still writable here")
        return view

    yield make
    for view in mounts:
        subprocess.run(["umount", "-l", str(view)], capture_output=True)


def _spy_writes(monkeypatch, root) -> list:
    """Every write this process attempts under ``root`` (opens for writing or creating, access
    times, stamps, deletes, renames, folders), even one whose failure is caught."""
    root, attempts = str(root), []

    def under(target, dir_fd=None) -> bool:
        if isinstance(target, int) or dir_fd is not None:  # (a name relative to dir_fd)
            try:
                folder = os.readlink(f"/proc/self/fd/{dir_fd if dir_fd is not None else target}")
            except OSError:
                return False
            target = folder if isinstance(target, int) else os.path.join(folder, target)
        return os.fspath(target).startswith(root)

    def spy(name, real, writes=lambda *a, **k: True):
        def call(target, *args, **kwargs):
            where = kwargs.get("dir_fd", kwargs.get("src_dir_fd"))
            if under(target, where) and writes(*args, **kwargs):
                attempts.append((name, os.fspath(target) if not isinstance(target, int)
                                 else target))
            return real(target, *args, **kwargs)
        monkeypatch.setattr(os, name, call)

    spy("open", os.open, lambda flags=0, *a, **k: bool(
        flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)))
    for name in ("utime", "setxattr", "unlink", "replace", "rename", "mkdir", "rmdir"):
        spy(name, getattr(os, name))
    return attempts


def test_warm_read_only_cache_serves_what_it_holds_and_writes_nothing(
        local_ds, http_server, tmp_path, read_only_view, monkeypatch):
    """A node cache filled ahead and mounted read-only: every sample comes from it, with no
    request for a shard or index, and the reader attempts no write at all (no lock file,
    access time, stamp or temp file), whether it trusts the files' stamps or re-hashes them."""
    server = http_server(local_ds)
    cache = tmp_path / "cache"
    expected = _expected(local_ds)
    assert _read(server.url, cache, prefetch_shards=0) == expected
    view = read_only_view(cache)
    before = {p: server.requests_for(p) for p in os.listdir(local_ds) if p != fmt.MANIFEST_NAME}
    attempts = _spy_writes(monkeypatch, view)
    for boot in (cache_module._BOOT_ID, "another-boot"):  # stamps trusted / all re-hashed
        monkeypatch.setattr(cache_module, "_BOOT_ID", boot)
        ds = ShardDataset(server.url, cache_dir=view, shuffle=True, seed=3, prefetch_shards=2)
        assert {s["__key__"]: s["bin"] for s in ds} == expected
        assert ds.reader.cache.read_only
        stats = ds.reader.cache.stats
        assert stats["downloads"] == 0 and stats["stamped" if boot != "another-boot" else
                                                     "rehashed"] >= 8  # (4 shards, 4 indexes)
    assert attempts == []
    assert {p: server.requests_for(p) for p in before} == before  # no shard, no index asked
    assert "4 shards" in run_cli("cache", "info", "--cache-dir", view).output
    for command in ("prune", "clear"):
        result = run_cli("cache", command, "--cache-dir", view, ok=False)
        assert result.exit_code == 2 and result.output == (
            f"shardpack: error: {view}: cannot {command} it: the cache folder is read-only\n")


def test_cold_read_only_cache_is_one_line_naming_the_folder(local_ds, http_server, tmp_path,
                                                            read_only_view):
    """Missing from a read-only cache: a CacheError naming the folder and the shard, one line;
    the shards it holds were served before it.  A corrupt file there cannot be fetched again:
    one line naming the file."""
    server = http_server(local_ds)
    empty = tmp_path / "empty"
    empty.mkdir()
    view = read_only_view(empty)
    with pytest.raises(CacheError) as err:
        _read(server.url, view)
    text = str(err.value)
    assert text.startswith(f"{view}: cannot fetch shard-00000.")  # (the index, or the shard)
    assert "the cache folder is read-only" in text and "\n" not in text

    cache = tmp_path / "cache"
    assert _read(server.url, cache, prefetch_shards=0) == _expected(local_ds)
    shards = {p[-9:-4]: p for p in _cached(cache)}  # "00002": its cached file
    os.unlink(shards["00002"])  # (through the writable path)
    view = read_only_view(cache)
    ds = ShardDataset(server.url, cache_dir=view, shuffle=False, prefetch_shards=0)
    got = []
    with pytest.raises(CacheError, match=rf"^{view}: cannot fetch shard-00002.tar into the "
                                         r"cache: the cache folder is read-only, and the file is "
                                         r"not in it \(fill the cache"):
        for sample in ds:
            got.append(sample["__key__"])
    assert got == list(_expected(local_ds))[:20]

    _flip(shards["00001"])
    ds = ShardDataset(server.url, cache_dir=view, shuffle=False, prefetch_shards=0)
    with pytest.raises(IntegrityError, match=r"/ro-1/[0-9a-f]+/[0-9a-f]+-shard-00001.tar: cached "
                                             r"file does not match the manifest's size or hash, "
                                             r"and the cache folder is read-only"):
        list(ds)


def test_a_file_as_cache_dir_is_one_line(local_ds, http_server, tmp_path):
    server = http_server(local_ds)
    file = tmp_path / "not-a-folder"
    file.write_bytes(b"x")
    for where, message in ((file, "cache_dir is not a folder (a file is in its place)"),
                           (file / "sub", "cannot create the cache folder: Not a directory")):
        with pytest.raises(CacheError) as err:
            _read(server.url, where)
        assert str(err.value).startswith(f"{where}: {message}") and "\n" not in str(err.value)
        for command in ("info", "prune", "clear"):
            result = run_cli("cache", command, "--cache-dir", where, ok=False)
            assert result.exit_code == 2
            assert result.output.startswith(f"shardpack: error: {where}: {message}")
            assert result.output.count("\n") == 1
    assert file.read_bytes() == b"x"


# -- several readers, one corrupt cached file ---------------------------------------------------

def _gate_first_check(monkeypatch, barrier, target_hash: str):
    """Every reader stops at its first check of the file with ``target_hash`` (found corrupt:
    its stamp is gone) until all of them hold it open; then the leader goes on at once and the
    others 0.3 s later, when the leader has removed the file and is fetching it again."""
    local = threading.local()
    real = cache_module._stamp_ok

    def gated(fd, content_hash):
        if content_hash == target_hash and getattr(local, "gate", True):
            local.gate = False
            barrier.wait(30)
            if not getattr(local, "leader", False):
                time.sleep(0.3)
        return real(fd, content_hash)

    monkeypatch.setattr(cache_module, "_stamp_ok", gated)
    return local


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_readers_finding_one_corrupt_file_at_once_all_get_it_right(tmp_path, monkeypatch, kind):
    """Several readers open the same corrupt cached file at once.  The first to check it removes
    it and fetches it again; the others check the copy they hold open (no FileNotFoundError:
    the path is gone by then), find it corrupt too and wait for that one download."""
    readers = 4
    root = tmp_path / "c"
    blob = os.urandom(2 << 20)
    meta = CacheItem("s.tar", fmt.content_hash(blob), len(blob))
    log = tmp_path / "downloads"

    def download(path):
        with open(log, "a") as f:
            f.write("x")
        time.sleep(0.6)  # still fetching when the others check
        with open(path, "wb") as f:
            f.write(blob)

    ShardCache(root, 1 << 30).open("u", meta, download).close()
    log.unlink()
    _flip(_cached(root)[0], at=12345)
    ctx = multiprocessing.get_context("fork")
    barrier = (threading.Barrier if kind == "threads" else ctx.Barrier)(readers)
    local = _gate_first_check(monkeypatch, barrier, meta.hash)

    def reader(i: int) -> None:
        local.leader = i == 0
        out = tmp_path / f"result-{i}"
        try:
            cache = ShardCache(root, 1 << 30)  # one per reader, as in separate processes
            entry = cache.open("u", meta, download)
            try:
                with open(entry.path, "rb") as f:
                    ok = f.read() == blob and os.pread(entry.fd, len(blob), 0) == blob
            finally:
                entry.close()
            out.write_text(f"ok {ok} {cache.stats['refetches']}")
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out.write_text(f"error {type(exc).__name__}: {exc}")

    if kind == "threads":
        workers = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
    else:
        workers = [ctx.Process(target=reader, args=(i,)) for i in range(readers)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    results = [(tmp_path / f"result-{i}").read_text() for i in range(readers)]
    assert results == ["ok True 1"] * readers  # each found it corrupt once, none died
    assert log.read_text() == "x"  # one download for them all
    assert [n for n in os.listdir(os.path.dirname(_cached(root)[0])) if n.startswith(".")] == []


def test_processes_reading_a_dataset_with_one_corrupt_cached_shard(local_ds, fault_server,
                                                                   tmp_path, monkeypatch):
    """The same through the reader: processes read a dataset over HTTP whose cached
    shard-00001.tar was flipped; all get every byte right, with one fetch of that shard."""
    server = fault_server(local_ds)
    cache = tmp_path / "cache"
    expected = _expected(local_ds)
    assert _read(server.url, cache, prefetch_shards=0) == expected
    target = next(s for s in fmt.decode_manifest((local_ds / fmt.MANIFEST_NAME).read_bytes(),
                                                 "m").shards if s.name == "shard-00001.tar")
    _flip(next(p for p in _cached(cache) if p.endswith("shard-00001.tar")))
    server.set_mode(delay_s=0.6, only=["shard-00001.tar"])  # the refetch takes a while
    before = server.requests_for("shard-00001.tar", "GET")
    readers = 3
    ctx = multiprocessing.get_context("fork")
    local = _gate_first_check(monkeypatch, ctx.Barrier(readers), target.hash)

    def reader(i: int) -> None:
        local.leader = i == 0
        out = tmp_path / f"result-{i}"
        try:
            out.write_text(str(_read(server.url, cache, prefetch_shards=0) == expected))
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out.write_text(f"error {type(exc).__name__}: {exc}")

    workers = [ctx.Process(target=reader, args=(i,)) for i in range(readers)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [(tmp_path / f"result-{i}").read_text() for i in range(readers)] == ["True"] * readers
    assert server.requests_for("shard-00001.tar", "GET") == before + 1


# -- the size limit -------------------------------------------------------------------------------

def _items(count: int, size: int) -> list[tuple[CacheItem, bytes]]:
    out = []
    for i in range(count):
        blob = os.urandom(size)
        out.append((CacheItem(f"shard-{i:05d}.tar", fmt.content_hash(blob), size), blob))
    return out


def _writer(blob: bytes, pause: float = 0.0):
    def download(path):
        with open(path, "wb") as f:
            for at in range(0, len(blob), 1 << 16):  # in pieces: a partial file in flight
                f.write(blob[at:at + (1 << 16)])
                f.flush()
                time.sleep(pause)
    return download


def test_a_killed_download_is_not_left_over_the_limit(tmp_path):
    """A downloader killed mid-file leaves its temp file; nobody asks for that shard again (its
    dataset is not read any more), so only eviction can remove it: the next publish does, and
    the cache stays within its limit."""
    size = 200_000
    root = tmp_path / "c"
    victim_item, victim_blob = _items(1, 5 * size)[0]
    ready = tmp_path / "started"

    def stuck(path):
        with open(path, "wb") as f:
            f.write(victim_blob[:4 * size])
        ready.write_text("1")
        time.sleep(60)

    pid = os.fork()
    if pid == 0:  # a reader of another dataset, killed while downloading
        try:
            ShardCache(root, 10**9).open("other-dataset", victim_item, stuck)
        finally:
            os._exit(1)
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert _disk_bytes(root) == 4 * size  # the dead download's temp file
    cache = ShardCache(root, 3 * size)
    for item, blob in _items(5, size):
        cache.open("dataset", item, _writer(blob)).close()
        assert _disk_bytes(root) <= cache.limit
    assert cache.usage()["files"] == 3
    assert not [n for _, _, names in os.walk(root) for n in names if ".tmp-" in n]


def test_many_processes_stay_within_limit_plus_one_shard_each_in_flight(tmp_path):
    """Four processes read overlapping shards through one cache (each holds the shard it reads,
    and downloads the next one in pieces); a killed download left a big temp file.  Sampled
    all along, the folder never holds more than the limit plus one shard per process."""
    size, procs = 100_000, 4
    root = tmp_path / "c"
    items = _items(10, size)
    dead = root / "old-dataset" / ".shard-00009.tar.tmp-1-1"  # (no lock: its writer is dead)
    dead.parent.mkdir(parents=True)
    dead.write_bytes(b"x" * (procs * size))
    limit = procs * size
    ctx = multiprocessing.get_context("fork")

    def reader(i: int) -> None:
        cache = ShardCache(root, limit)
        for item, blob in (items[(i * 2 + k) % len(items)] for k in range(6)):
            entry = cache.open("dataset", item, _writer(blob, pause=0.005))
            assert os.pread(entry.fd, size, 0) == blob
            time.sleep(0.02)  # reading it
            entry.close()

    peak, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], _disk_bytes(root))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    workers = [ctx.Process(target=reader, args=(i,)) for i in range(procs)]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
    finally:
        stop.set()
        watcher.join()
    assert [w.exitcode for w in workers] == [0] * procs
    assert not dead.exists()
    assert 0 < peak[0] <= limit + procs * size, (peak[0], limit)
    assert _disk_bytes(root) <= limit


def test_cache_prune_evicts_least_recently_used_files_nobody_holds(tmp_path):
    size = 100_000
    root = tmp_path / "c"
    cache = ShardCache(root, 10**9)
    items, paths = _items(5, size), []
    for i, (item, blob) in enumerate(items):
        entry = cache.open("dataset", item, _writer(blob))
        os.utime(entry.fd, ns=(10**18 + i * 10**9, os.fstat(entry.fd).st_mtime_ns))  # LRU order
        paths.append(entry.path)
        entry.close()
    reader = cache.open("dataset", items[0][0], None)  # a reader holds shard 0 (the oldest)
    dead = os.path.join(os.path.dirname(paths[0]), ".shard-00007.tar.tmp-1-1")
    with open(dead, "wb") as f:
        f.write(b"x" * 5000)
    assert "prune" in run_cli("cache", "--help").output

    out = run_cli("cache", "prune", "--cache-dir", root, "--limit", "260KB").output.splitlines()
    assert out[:-1] == [f"removed {dead} (0.0 MB)"] + [f"removed {p} (0.1 MB)"
                                                        for p in paths[1:4]]
    assert out[-1] == ("4 files removed (0.3 MB); the cache holds 2 files, 0.2 MB, "
                       "limit 0.3 MB")
    assert sorted(_cached(root)) == sorted([paths[0], paths[4]])

    out = run_cli("cache", "prune", "--cache-dir", root, "--limit", "100KB").output.splitlines()
    assert out == [f"removed {paths[4]} (0.1 MB)",
                   "1 file removed (0.1 MB); the cache holds 1 file, 0.1 MB, limit 0.1 MB"]
    out = run_cli("cache", "prune", "--cache-dir", root, "--limit", "50KB").output
    assert out == ("0 files removed (0.0 MB); the cache holds 1 file, 0.1 MB, limit 0.1 MB; the "
                   "files over the limit are in use by a reading process, try again later\n")
    reader.close()
    out = run_cli("cache", "prune", "--cache-dir", root, "--limit", "50KB").output.splitlines()
    assert out[0] == f"removed {paths[0]} (0.1 MB)" and _cached(root) == []
    assert os.listdir(root) == [cache_module.LOCK_NAME]  # the emptied folder went too
    assert ShardCache(root, 1).prune()["removed"] == []
    result = run_cli("cache", "prune", "--cache-dir", root, "--limit", "0", ok=False)
    assert result.exit_code == 2 and result.output == ("shardpack: error: size must be positive, "
                                                       "got '0'\n")


def test_other_readers_of_the_cache_do_not_make_its_copies_look_changed(tmp_path):
    """The cache stamps a file's access time when any reader opens it, which moves its ctime:
    a cached copy's identity leaves ctime out, or every epoch would re-map (and re-parse the
    labels of) every shard another reader had opened."""
    import fsspec

    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(30):
        (src / "a" / f"{i}.bin").write_bytes(os.urandom(1000))
    shardpack.pack(src, tmp_path / "ds", workers=1, max_samples=5)
    fs = fsspec.filesystem("memory")
    root = f"/ctime-{os.getpid()}-{tmp_path.name}"
    for path in (tmp_path / "ds").iterdir():
        if not path.name.startswith("."):
            fs.pipe(f"{root}/{path.name}", path.read_bytes())
    try:
        readers = [shardpack.DatasetReader(f"memory://{root}", cache_dir=tmp_path / "cache")
                   for _ in range(2)]
        for reader in readers:
            for i in range(len(reader)):
                reader.read_sample(i)
        assert readers[0].revalidate() == 0
    finally:
        fs.rm(root, recursive=True)
