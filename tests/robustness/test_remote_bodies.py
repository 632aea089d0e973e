"""Remote bodies that misbehave, through the project's fault HTTP server on 127.0.0.1: a
whole-file body that ends early, a 206 for another range, an endless body, a server that drips,
redirects to another host; and a local path holding "::" (docs/remote.md, "Bounded requests")."""

import contextlib
import errno
import json
import os
import pickle
import time

import pytest

import shardpack
from shardpack import ShardDataset
from shardpack import format as fmt
from shardpack.storage import base as storage_module
from shardpack.core.errors import FormatError, IntegrityError, RemoteError
from shardpack.read.reader import DatasetReader
from shardpack.storage import BadResponseError, RetryPolicy, Storage, StorageOptionError
from shardpack.storage.http import same_host
from shardpack.storage.local import local_url_path

from testbed.helpers import make_tree, run_cli
from testbed.servers import FaultServer

N = 60
SHARD = "shard-00001.tar"


@pytest.fixture(scope="module")
def local_ds(tmp_path_factory):
    """A dataset at ROOT/ds (5 shards of 12 samples); ROOT lets a server redirect to /ds."""
    root = tmp_path_factory.mktemp("bodies")
    files = {f"c{i % 3}/{i:03d}.bin": os.urandom(1000 + 37 * i) for i in range(N)}
    shardpack.pack(make_tree(root / "src", files), root / "ds", max_samples=12, workers=1)
    return root / "ds"


@pytest.fixture(scope="module")
def truth(local_ds):
    return {s["__key__"]: bytes(s["bin"]) for s in DatasetReader(local_ds)}


@pytest.fixture(autouse=True)
def fast_retry(monkeypatch):
    """Retries without the real backoff: 3 attempts, 10-50 ms apart."""
    policy = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05, timeout=5.0)
    original = Storage.__init__

    def init(self, url, storage_options=None, retry=None):
        original(self, url, storage_options, retry or policy)

    monkeypatch.setattr(Storage, "__init__", init)


@pytest.fixture
def serve():
    """Factory: ``serve(root, **mode) -> FaultServer`` (testbed/servers.py), started; stopped
    after the test."""
    started = []

    def start(root, **mode) -> FaultServer:
        started.append(FaultServer(root, **mode).start())
        return started[-1]

    yield start
    for server in reversed(started):
        server.stop()


def _read_all(url, **kw) -> dict:
    return {s["__key__"]: bytes(s["bin"]) for s in ShardDataset(url, shuffle=False, **kw)}


def _cached_files(cache) -> list[str]:
    return [n for _, _, names in os.walk(cache) for n in names if n != ".lock"]


# -- a whole-file body that ends early ---------------------------------------------------------
def test_short_whole_file_body_is_retried(local_ds, serve):
    """A server that serves a truncated copy (its Content-Length says so: nothing looks cut)
    was taken at its word by a whole-file read; now the size the manifest records decides: short
    is retried like a short ranged read, and after the retries it is one line naming the URL,
    the attempts and the cause."""
    data = (local_ds / SHARD).read_bytes()
    server = serve(local_ds, short_body=100, times=2, only=[SHARD])
    storage = Storage(server.url)
    storage.read_bytes(fmt.MANIFEST_NAME)  # (the sizes it records bound later reads)
    assert storage.read_bytes(SHARD) == data
    assert server.requests_for(SHARD) == 3 and storage.stats["retries"] == 2
    server.set_mode(short_body=100, times=2, only=[SHARD])
    assert Storage(server.url).read_bytes(SHARD, size=len(data)) == data  # a size given
    reader = DatasetReader(server.url)
    server.set_mode(short_body=100, times=2, only=[SHARD])
    assert len(list(reader.iter_shard(1))) == 12  # the whole-shard read of unpack and verify
    server.set_mode(short_body=100, only=[SHARD])
    with pytest.raises(RemoteError, match=rf"^{server.url}/{SHARD}: read failed after 3 "
                                          rf"attempt\(s\): ShortReadError: .*100 bytes.*"
                                          rf"{len(data)}$"):
        storage.read_bytes(SHARD)


# -- a 206 for another range than asked ---------------------------------------------------------
@pytest.mark.parametrize("how", ["to_end", "from_zero"])
def test_206_for_another_range_is_cut_by_its_content_range(local_ds, truth, serve,
                                                             monkeypatch, how):
    """A 206 running from the start asked to the end of the file (or from byte 0) holds the
    range: it is cut out by its Content-Range.  It used to pass for a server that ignored Range
    (the whole file), so the wrong bytes came back: a corrupt shard, or with trust_storage
    wrong samples."""
    monkeypatch.setattr(shardpack.read.access, "CHUNK_BYTES", 4096)  # ranges that start mid-shard
    server = serve(local_ds, content_range=how, only=["*.tar"])
    assert _read_all(server.url, trust_storage=True) == truth
    data = (local_ds / SHARD).read_bytes()
    storage = Storage(server.url)
    spans = [(SHARD, 700, 2100), (SHARD, 5, 6), (SHARD, len(data) - 10, len(data))]
    assert storage.read_ranges(spans) == [data[700:2100], data[5:6], data[-10:]]
    assert storage.read_bytes(SHARD, 512, 1024) == data[512:1024]
    assert storage.stats["sliced_range"] >= 3 and storage.stats["ignored_range"] == 0


def test_206_that_does_not_hold_the_range_is_refused(local_ds, serve):
    """A 206 whose Content-Range misses part of the range asked is refused at once, in one
    line (not retried: the server answers what it answers); a 206 to a request for the whole
    file is taken only when it is the whole file."""
    server = serve(local_ds, content_range="short", only=[SHARD])
    storage = Storage(server.url)
    with pytest.raises(RemoteError, match=rf"^{server.url}/{SHARD}: read failed after 1 "
                                          r"attempt\(s\): BadResponseError: the server "
                                          r"answered 206 with Content-Range 'bytes 100-199/"
                                          r"\d+' to a request for bytes 100-299: refused$"):
        storage.read_bytes(SHARD, 100, 300)
    assert server.requests_for(SHARD) == 1
    with pytest.raises(RemoteError, match=rf"{SHARD}: read failed after 1 attempt\(s\): "
                                          rf"BadResponseError: {server.url}/{SHARD}: the "
                                          r"server answered 206"):
        storage.read_ranges([(SHARD, 0, 10), ("shard-00002.tar", 0, 10)])
    # what fsspec reads for other stores (S3) is checked the same way, by length: a body longer
    # than the range that is not the whole file either is refused, not cut up
    assert storage._exact(b"x" * 50, 10, 20, size=50) == b"x" * 10
    with pytest.raises(BadResponseError, match="not the whole file either"):
        storage._exact(b"x" * 40, 10, 20, size=50)


# -- bodies that never end -------------------------------------------------------------------------
def test_endless_manifest_is_cut_at_the_cap(local_ds, serve, monkeypatch):
    """An endless manifest used to be buffered whole (2 GB an attempt); it is read up to
    MANIFEST_CAP and refused in one line, not retried.  A Content-Length over the cap is refused
    before a byte of the body is read."""
    server = serve(local_ds, endless="length", only=[fmt.MANIFEST_NAME])
    with pytest.raises(FormatError, match=rf"^{server.url}/shardpack.json: manifest is longer "
                                          rf"than {storage_module.MANIFEST_CAP:,} bytes"):
        DatasetReader(server.url)
    monkeypatch.setattr(storage_module, "MANIFEST_CAP", 1 << 20)  # (1 MiB: a fast test)
    server.set_mode(endless="chunked", only=[fmt.MANIFEST_NAME])
    start = time.monotonic()
    with pytest.raises(FormatError, match=r"shardpack.json: manifest is longer than 1,048,576"):
        ShardDataset(server.url)
    assert time.monotonic() - start < 5 and server.requests_for(fmt.MANIFEST_NAME) == 2
    local = Storage(local_ds)  # a local manifest is read against the cap too
    assert local.read_bytes(fmt.MANIFEST_NAME) == (local_ds / fmt.MANIFEST_NAME).read_bytes()
    monkeypatch.setattr(storage_module, "MANIFEST_CAP", 100)
    with pytest.raises(FormatError, match="manifest is longer than 100 bytes"):
        local.read_bytes(fmt.MANIFEST_NAME)


@pytest.mark.parametrize("how", ["chunked", "length"])
def test_endless_index_and_shard_are_cut_at_the_manifest_size(local_ds, serve, tmp_path,
                                                              how):
    """An endless index used to write 2 GiB into the cache.  Downloads into the cache and
    whole-file reads without one stop at the size the manifest records, and refuse the body in
    one line, not retried; nothing enters the cache."""
    index = SHARD.replace(".tar", ".idx")
    size = (local_ds / index).stat().st_size
    server = serve(local_ds, endless=how, only=[index])
    said = "1099511627776 bytes, the manifest says" if how == "length" else \
        f"longer than the {size} bytes the manifest says"
    for cache in (None, tmp_path / "cache"):
        with pytest.raises(IntegrityError, match=rf"^{server.url}/{index}: remote file is "
                                                 rf"{said}"):
            list(ShardDataset(server.url, shuffle=False, cache_dir=cache))
    assert not [f for f in _cached_files(tmp_path / "cache") if index in f]  # (nor its temp)
    storage = Storage(server.url)
    before = server.requests_for(index)
    with pytest.raises(IntegrityError, match=rf"{index}: remote file is {said}"):
        storage.download(index, str(tmp_path / "idx"), size)
    assert server.requests_for(index) == before + 1  # not retried
    server.set_mode(endless=how, only=["*.tar"])
    data = (local_ds / SHARD).read_bytes()
    with pytest.raises(IntegrityError, match=rf"{SHARD}: remote file is"):
        storage.download(SHARD, str(tmp_path / "dl"), len(data))
    assert (tmp_path / "dl").stat().st_size <= len(data)
    storage.read_bytes(fmt.MANIFEST_NAME)
    with pytest.raises(IntegrityError, match=rf"{SHARD}: remote file is"):
        storage.read_bytes(SHARD)
    assert storage.read_bytes(SHARD, 10, 300) == data[10:300]  # a range is cut out of it


# -- a server that drips ------------------------------------------------------------------
def test_drip_ends_at_the_request_deadline(local_ds, serve, tmp_path):
    """One byte every 5 s never trips the per-read timeout; the request deadline (storage
    option request_deadline) ends the request, retries included, in one line naming the URL."""
    server = serve(local_ds, drip_bps=0.2, only=[fmt.MANIFEST_NAME])
    start = time.monotonic()
    with pytest.raises(RemoteError, match=rf"^{server.url}/shardpack.json: read failed after 1 "
                                          r"attempt\(s\): DeadlineError: no complete answer "
                                          r"within the request deadline of 0.5 s \(storage "
                                          r"option request_deadline\); 1 byte\(s\)"):
        ShardDataset(server.url, storage_options={"request_deadline": 0.5},
                     cache_dir=tmp_path / "c")
    assert time.monotonic() - start < 4  # (one attempt of 0.5 s: no retry past the deadline)
    # a ranged read of a shard, through the CLI's -o
    server.set_mode(drip_bps=0.2, only=["*.tar"])
    result = run_cli("cat", server.url, "c1/004", "-o", "request_deadline=0.5", ok=None)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "read failed after 1 attempt(s): DeadlineError: no complete answer within the " \
           "request deadline of 0.5 s" in result.output
    for bad in (0, -1, "soon", True):
        with pytest.raises(StorageOptionError, match="request_deadline must be a number"):
            Storage(server.url, {"request_deadline": bad})


def test_ranges_waiting_for_a_connection_share_one_deadline(local_ds, serve, monkeypatch):
    """read_ranges sends its ranges a few at a time: a range that waited for its turn has only
    what is left of the request deadline, so the whole read ends at the deadline (each range
    alone would take 0.4 s of 0.6 s, four of them one after another 1.6 s)."""
    from shardpack.storage.http import HttpStorage

    server = serve(local_ds, delay_s=0.4, only=["*.tar"])
    monkeypatch.setattr(HttpStorage, "RANGES_AT_ONCE", 1)
    storage = Storage(server.url, {"request_deadline": 0.6, "retry_attempts": 1})
    start = time.monotonic()
    with pytest.raises(RemoteError, match="request deadline of 0.6 s"):
        storage.read_ranges([(SHARD, 512 * i, 512 * i + 100) for i in range(4)])
    assert time.monotonic() - start < 1.4


# -- redirects ------------------------------------------------------------------------------------
def test_same_host_redirect_is_followed(local_ds, truth, serve):
    server = serve(local_ds.parent)  # ROOT: the dataset is at /ds
    server.set_mode(redirect_to=f"{server.url}/ds", only=["shard*"])
    assert _read_all(server.url) == truth
    assert server.requests_for("ds/shardpack.json") == 1


def test_redirect_to_another_host_is_refused(local_ds, truth, serve, tmp_path):
    """Another port is another host (another server, maybe another service on the same
    machine); 127.0.0.2 is another host.  Nothing is sent there unless the storage option
    follow_redirects_to_other_hosts allows it."""
    other = serve(local_ds)
    server = serve(local_ds, redirect_to=other.url)
    with pytest.raises(RemoteError, match=rf"^{server.url}/shardpack.json: read failed after 1 "
                                          r"attempt\(s\): RedirectRefusedError: redirected to "
                                          rf"another host: {server.url}/shardpack.json -> "
                                          rf"{other.url}/shardpack.json \(storage option "
                                          r"follow_redirects_to_other_hosts\)$"):
        ShardDataset(server.url)
    server.set_mode(redirect_to=other.url, only=["*.tar"])  # the shards' downloads, too
    with pytest.raises(RemoteError, match=r"shard-0000\d.tar: download failed after 1 "
                                          r"attempt\(s\): RedirectRefusedError"):
        list(ShardDataset(server.url, shuffle=False, cache_dir=tmp_path / "c"))
    server.set_mode(redirect_to=f"http://127.0.0.2:{server.port}")
    storage = Storage(server.url)
    for call in (lambda: storage.read_bytes(SHARD, 0, 10), lambda: storage.size(SHARD),
                 lambda: storage.exists(SHARD)):
        with pytest.raises(RemoteError, match=r"failed after 1 attempt\(s\): RedirectRefused"
                                              r"Error: .* -> http://127.0.0.2:"):
            call()
    assert other.requests_for("shardpack.json") == 0 and not other.requests_for(SHARD)
    server.set_mode(redirect_to=other.url)
    assert _read_all(server.url, storage_options={"follow_redirects_to_other_hosts": True}) \
        == truth
    assert other.requests_for("shardpack.json") == 1
    # from the command line "-o follow_redirects_to_other_hosts=False" is the string 'False':
    # refused in one line, never read as yes
    from shardpack.cli.common import parse_storage_options as _parse_options
    from shardpack.storage import StorageOptionError

    for text in ("False", "no", "0"):
        options = _parse_options([f"follow_redirects_to_other_hosts={text}"])
        with pytest.raises(StorageOptionError, match="must be true or false"):
            Storage(server.url, options)
    assert not Storage(server.url, _parse_options(["follow_redirects_to_other_hosts=false"])
                       ).other_hosts


def test_same_host_rule():
    from yarl import URL

    def same(a, b):
        return same_host(URL(a), URL(b))

    assert same("http://h:8000/a", "http://H:8000/b") and same("http://h/a", "https://h/a")
    assert not same("http://h:8000/a", "http://h:8001/a")  # another port: another host
    assert not same("https://h/a", "http://h/a")           # never down to http
    assert not same("http://127.0.0.1/a", "http://127.0.0.2/a")
    assert not same("http://127.0.0.1/a", "http://localhost/a")  # names, not addresses


# -- what travels to workers ---------------------------------------------------------------------
def test_storage_pickles_with_its_bounds(local_ds, serve):
    """A pickled storage (a spawned DataLoader worker's) keeps the manifest's sizes (not its
    bytes) and its options: the redirect check and the deadline."""
    server = serve(local_ds)
    storage = Storage(server.url, {"request_deadline": 7})
    storage.read_bytes(fmt.MANIFEST_NAME)
    copy = pickle.loads(pickle.dumps(storage))
    assert copy._manifest is None and copy._sizes[SHARD] == (local_ds / SHARD).stat().st_size
    assert copy.deadline == 7
    server.set_mode(short_body=100, only=[SHARD])
    with pytest.raises(RemoteError, match="ShortReadError"):
        copy.read_bytes(SHARD)
    server.set_mode(redirect_to="http://127.0.0.2:1")
    with pytest.raises(RemoteError, match="RedirectRefusedError"):
        copy.read_bytes(SHARD, 0, 10)


def test_manifest_cap_fits_a_billion_samples():
    """MANIFEST_CAP (docs/format.md) holds 10^6 shard entries of the widest kind: 10^9 samples
    at 1,000 a shard, each shard up to 999 GB."""
    entry = {"name": "shard-999999.spk", "index": "shard-999999.idx", "samples": 100_000,
             "bytes": 999_999_999_999, "hash": "f" * 32, "index_bytes": 99_999_999_999,
             "index_hash": "f" * 32}
    one = len(fmt.encode_manifest({"format": "shardpack", "shards": [entry]}))
    two = len(fmt.encode_manifest({"format": "shardpack", "shards": [entry, entry]}))
    assert two - one <= 256 and storage_module.MANIFEST_CAP >= 10**6 * 256
    assert storage_module.MANIFEST_CAP == 289_554_432


# -- a local path holding "::" -------------------------------------------------------------------
def test_local_path_with_double_colon(tmp_path, monkeypatch):
    """fsspec reads "a::b" as the chain of URLs a and b: "/data/x::y" became "/data/x".  A
    local path is a local path: packed into, read, verified, and nothing lands in x."""
    src = make_tree(tmp_path / "src", {f"a/{i}.bin": os.urandom(300 + i) for i in range(8)})
    out = tmp_path / "x::y"
    shardpack.pack(src, out, workers=1)
    assert (out / fmt.MANIFEST_NAME).is_file() and not (tmp_path / "x").exists()
    expected = {f"a/{i}": (src / "a" / f"{i}.bin").read_bytes() for i in range(8)}
    assert _read_all(str(out)) == expected
    assert run_cli("verify", out, "-q").output.startswith("OK: 1 shard, 8 samples")
    monkeypatch.chdir(tmp_path)
    assert _read_all("x::y") == expected and Storage("x::y").root == str(out)
    assert Storage(f"file://{out}").root == str(out)
    assert local_url_path("simplecache::s3://bucket/ds", "simplecache::s3") is None
    assert local_url_path("memory::ds", "file") is None  # a chain whose first piece is a protocol
    assert local_url_path(str(tmp_path / "new::z"), "file") == str(tmp_path / "new::z")
    # a file:// URL holding "::" that does not exist yet: packed there, not into its prefix
    shardpack.pack(src, f"file://{tmp_path}/ds::v2", workers=1)
    assert (tmp_path / "ds::v2" / fmt.MANIFEST_NAME).is_file() and not (tmp_path / "ds").exists()
    assert local_url_path("zip://member::s3://bucket/a.zip", "zip") is None


def test_bounded_reads_keep_stats_apart(local_ds, serve):
    """A server that ignores Range still counts as ignored_range (a 200 cut up), a 206 for more
    than asked as sliced_range."""
    server = serve(local_ds, ignore_range=True, only=[SHARD])
    storage = Storage(server.url)
    data = (local_ds / SHARD).read_bytes()
    assert storage.read_bytes(SHARD, 1000, 1100) == data[1000:1100]
    assert storage.stats["ignored_range"] == 1 and storage.stats["sliced_range"] == 0
    assert json.loads(storage.read_bytes(fmt.MANIFEST_NAME))["num_samples"] == N


def test_streamed_copy_stops_past_the_manifest_size(local_ds, tmp_path, monkeypatch):
    """copy_from (merge) streams a source through this process: one longer than its manifest
    says is not read on past the size (an endless source would fill the disk), and refused."""
    monkeypatch.setattr("shardpack.storage.local.os.link",
                        lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EXDEV, "x")))
    monkeypatch.setattr(Storage, "COPY_CHUNK", 1000)
    reads = []
    kind = type(Storage(local_ds))  # the local kind opens its files itself (regular files only)
    real_open = kind.open

    @contextlib.contextmanager
    def counted_open(self, name, mode="rb"):
        with real_open(self, name, mode) as f:
            real_read = f.read
            f.read = lambda n: reads.append(n) or real_read(n)
            yield f

    monkeypatch.setattr(kind, "open", counted_open)
    with pytest.raises(IntegrityError, match=rf"{SHARD}: is over 2500 bytes, its manifest says "
                                             r"2500$"):
        Storage(tmp_path).copy_from(Storage(local_ds), SHARD, "copy.tar", size=2500,
                                    content_hash="0" * 32)
    assert sum(reads) == 2501 and not (tmp_path / "copy.tar").exists()
