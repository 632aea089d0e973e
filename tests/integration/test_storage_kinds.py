"""One conformance suite for every storage kind: the same tests run against a local folder
(LocalStorage), S3 through ``rclone serve s3`` (RemoteStorage over s3fs) and HTTP through nginx
(HttpStorage, read-only), each on 127.0.0.1 (testbed/servers.py).  What every kind promises:
packs read back byte-identically; reads are exact or raise; an interrupted atomic write leaves
nothing; copies to and from a local folder keep size and bytes; folder walks list in code-point
order and leave datasets (and OUT inside SRC) out; a Storage pickles and works after a fork; a
merge of two parts verifies.  A new kind gets these tests by one more entry in ``KINDS``."""

from __future__ import annotations

import dataclasses
import multiprocessing
import pickle
import shutil
import time
from pathlib import Path
from typing import Callable

import pytest

import shardpack
from shardpack import format as fmt
from shardpack.core.errors import DatasetNotFoundError, IntegrityError, ShardpackError
from shardpack.inspect.verify import verify
from shardpack.storage import LocalStorage, RetryPolicy, Storage

from testbed.helpers import fake_jpeg, make_tree

PACK = {"workers": 1, "max_samples": 3}
# error paths retry twice, briefly: a remote read that comes back short is retried by design
FAST = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02, timeout=10.0)
# the walk tree's top-level names, in code-point order (not a locale's: "B" < "_" < "a" < "Ä")
ORDER = ["10.bin", "9.bin", "B.bin", "Z.bin", "_.bin", "a.bin", "inner", "packed", "sub",
         "z.bin", "Ä.bin", "é.bin"]
# ranges that end past the end of a file, relative to its size
PAST_THE_END = ((-10, 10), (0, 1), (100, 200))
TOP_FILES = [n for n in ORDER if n.endswith(".bin")]


@dataclasses.dataclass
class Kind:
    """One storage kind under test: ``base`` a writable URL there (None: a read-only kind),
    the storage_options its URLs need, ``put`` a local folder there (-> its URL), ``listing``
    whether its folders can be listed."""

    name: str
    base: str | None
    options: dict | None
    put: Callable[[Path, str], str]
    listing: bool = True
    mkdir: Callable[[str], None] = lambda name: None  # an empty folder there, where kept

    def url(self, name: str) -> str:
        """A writable URL ``name`` in this kind; the test skips on a read-only kind."""
        self.need_writes()
        return f"{self.base}/{name}"

    def need_writes(self) -> None:
        if self.base is None:
            pytest.skip(f"{self.name} is read-only: writes do not apply")

    def need_listing(self) -> None:
        if not self.listing:
            pytest.skip(f"{self.name} has no folder listing (nginx without autoindex)")

    def storage(self, url: str, **kwargs) -> Storage:
        return Storage(url, self.options, **kwargs)


def _local(request, root: Path) -> Kind:
    root.mkdir()

    def put(folder: Path, name: str) -> str:
        shutil.copytree(folder, root / name)
        return str(root / name)

    return Kind("local", str(root), None, put,
                mkdir=lambda name: (root / name).mkdir(parents=True, exist_ok=True))


def _s3(request, root: Path) -> Kind:
    server = request.getfixturevalue("s3_server")
    bucket = server.create_bucket()

    def put(folder: Path, name: str) -> str:
        server.upload_dir(folder, bucket, name)
        return f"s3://{bucket}/{name}"

    def mkdir(name: str) -> None:  # rclone serves folders: an empty one is a listed prefix
        (server.data_dir / bucket / name).mkdir(parents=True, exist_ok=True)
        parent, _, leaf = f"{bucket}/{name}".rpartition("/")
        fs, deadline = server.filesystem(), time.monotonic() + 10
        while leaf not in [p.rsplit("/", 1)[-1] for p in fs.ls(parent, refresh=True)]:
            assert time.monotonic() < deadline, f"rclone never listed {name}"
            time.sleep(0.05)  # (rclone caches listings for a second)

    return Kind("s3", f"s3://{bucket}", server.storage_options, put, mkdir=mkdir)


def _http(request, root: Path) -> Kind:
    root.mkdir()
    server = request.getfixturevalue("http_server")(root)

    def put(folder: Path, name: str) -> str:
        shutil.copytree(folder, root / name)
        return f"{server.url}/{name}"

    return Kind("http", None, None, put, listing=False)


KINDS = {"local": _local, "s3": _s3, "http": _http}


@pytest.fixture(params=list(KINDS))
def kind(request, tmp_path) -> Kind:
    """Each storage kind in turn, its servers started (and stopped) for the test."""
    return KINDS[request.param](request, tmp_path / "kind")


def stored_pack(kind: Kind, src: Path, tmp_path: Path, name: str = "ds") -> tuple[str, Path]:
    """(URL in the kind, local reference copy) of a pack of ``src``: packed straight into a
    writable kind, packed locally and put there for a read-only one."""
    ref = tmp_path / f"ref-{name}"
    shardpack.pack(src, ref, **PACK)
    if kind.base is None:
        return kind.put(ref, name), ref
    url = kind.url(name)
    shardpack.pack(src, url, storage_options=kind.options, **PACK)
    return url, ref


def dataset_names(ref: Path) -> list[str]:
    return sorted(p.name for p in ref.iterdir() if not p.name.startswith("."))


# -- packing and reading -------------------------------------------------------------------------

def test_a_pack_in_the_kind_reads_back_every_sample_byte_identically(kind, small_tree,
                                                                       tmp_path):
    url, ref = stored_pack(kind, small_tree, tmp_path)
    reader = shardpack.open_reader(url, storage_options=kind.options)
    local = shardpack.open_reader(ref)
    assert len(reader) == len(local) == 6
    got = {}
    for i in range(len(reader)):
        sample = reader.read_sample(i)
        assert sample == local.read_sample(i)
        got[sample["__key__"]] = sample
    files = [p for p in small_tree.rglob("*") if p.is_file()]
    for path in files:
        key, _, field = path.relative_to(small_tree).as_posix().rpartition(".")
        assert got[key][field] == path.read_bytes(), (key, field)
    storage = kind.storage(url)
    assert storage.exists(fmt.MANIFEST_NAME) and not storage.exists("nope.tar")
    for name in dataset_names(ref):  # what was stored is what a local pack writes
        assert storage.read_bytes(name) == (ref / name).read_bytes(), name


def test_reads_return_exactly_the_bytes_asked(kind, small_tree, tmp_path):
    url, ref = stored_pack(kind, small_tree, tmp_path)
    storage = kind.storage(url)
    shard, index = "shard-00000.tar", "shard-00001.idx"
    data, idx = (ref / shard).read_bytes(), (ref / index).read_bytes()
    n = len(data)
    assert storage.size(shard) == n and n > 1024
    assert storage.read_bytes(shard) == data
    assert storage.read_bytes(shard, size=n) == data
    assert storage.read_manifest() == (ref / fmt.MANIFEST_NAME).read_bytes()
    assert storage.read_bytes(shard, 0, 1) == data[:1]
    assert storage.read_bytes(shard, 513, n) == data[513:]
    assert storage.read_bytes(shard, 7, 7) == b""
    ranges = [(shard, 100, 612), (index, 0, len(idx)), (shard, 9, 9), (shard, n - 3, n),
              (shard, 0, n)]
    assert storage.read_ranges(ranges) == [data[100:612], idx, b"", data[-3:], data]
    assert storage.read_ranges([(shard, 5, 5)]) == [b""]


def _raises(kind_of_error, read, what) -> None:
    with pytest.raises(kind_of_error) as caught:
        read()
    assert isinstance(caught.value, ShardpackError), (what, caught.value)


def test_missing_short_and_long_reads_raise(kind, small_tree, tmp_path):
    url, ref = stored_pack(kind, small_tree, tmp_path)
    storage = kind.storage(url, retry=FAST)
    shard = "shard-00000.tar"
    n = (ref / shard).stat().st_size
    missing = {"read_bytes": lambda: storage.read_bytes("nope.tar"),
               "a range": lambda: storage.read_bytes("nope.tar", 0, 10),
               "read_ranges": lambda: storage.read_ranges([("nope.tar", 0, 10)]),
               "size": lambda: storage.size("nope.tar")}
    for what, read in missing.items():
        _raises(DatasetNotFoundError, read, what)
    for start, end in PAST_THE_END:
        _raises(ShardpackError, lambda s=start, e=end: storage.read_bytes(shard, n + s, n + e),
                f"read_bytes {n + start}-{n + end} of {n}")
    _raises(ShardpackError, lambda: storage.read_bytes(shard, size=n - 1), "longer than said")
    _raises(ShardpackError, lambda: storage.read_bytes(shard, size=n + 1), "shorter than said")


def test_read_ranges_past_the_end_raise(kind, small_tree, tmp_path, request):
    url, ref = stored_pack(kind, small_tree, tmp_path)
    storage = kind.storage(url, retry=FAST)
    shard = "shard-00000.tar"
    n = (ref / shard).stat().st_size
    for start, end in PAST_THE_END:
        _raises(ShardpackError, lambda s=start, e=end: storage.read_ranges(
            [(shard, 0, 10), (shard, n + s, n + e)]), f"read_ranges {n + start}-{n + end} of {n}")


# -- writing -------------------------------------------------------------------------------------

def test_an_interrupted_atomic_write_leaves_no_file(kind, request):
    storage = kind.storage(kind.url("atomic"))
    storage.makedirs()
    storage.write_atomic("kept.bin", b"old")
    assert storage.read_bytes("kept.bin") == b"old"
    for name in ("new.bin", "kept.bin"):
        with pytest.raises(RuntimeError, match="stopped"):
            with storage.open_atomic(name) as f:
                f.write(b"x" * 100_000)
                raise RuntimeError("stopped")
    assert not storage.exists("new.bin")
    assert storage.read_bytes("kept.bin") == b"old"  # replaced only by a write that ended
    assert storage.listdir() == ["kept.bin"]  # and no temp file left under another name


def test_copies_to_and_from_a_local_folder_keep_size_and_bytes(kind, small_tree, tmp_path):
    url, ref = stored_pack(kind, small_tree, tmp_path)
    there, here = kind.storage(url), LocalStorage(str(ref))
    back = LocalStorage(str(tmp_path / "back"))
    back.makedirs()
    shard = "shard-00000.tar"
    data = (ref / shard).read_bytes()
    size, digest = len(data), fmt.content_hash(data)
    how = back.copy_from(there, shard, "got.tar", size=size, content_hash=digest)
    assert how == ("linked" if kind.name == "local" else "streamed")
    assert (tmp_path / "back" / "got.tar").read_bytes() == data
    with pytest.raises(IntegrityError):  # a size the manifest does not record: refused
        back.copy_from(there, shard, "bad.tar", size=size + 1, content_hash=digest)
    assert not back.exists("bad.tar")
    if kind.base is None:
        return  # read-only: copies only come from it
    there.copy_from(here, shard, "put.tar", size=size, content_hash=digest)
    assert there.size("put.tar") == size and there.read_bytes("put.tar") == data
    with pytest.raises(IntegrityError):
        there.copy_from(here, shard, "bad.tar", size=size + 1, content_hash=digest)
    assert not there.exists("bad.tar")
    if kind.name != "local":  # a streamed copy is hashed on the way
        with pytest.raises(IntegrityError, match="hash"):
            there.copy_from(here, shard, "bad.tar", size=size, content_hash="0" * 32)
        assert not there.exists("bad.tar")


# -- folder walks --------------------------------------------------------------------------------

def walk_tree(tmp_path: Path) -> Path:
    """Files at the top (names that sort differently by locale), a subfolder, and a dataset
    folder ``inner`` that a walk must leave out."""
    tree = make_tree(tmp_path / "tree", {**{n: n.encode() for n in TOP_FILES},
                                         "sub/x.bin": b"x"})
    inner_src = make_tree(tmp_path / "inner-src", {"q/1.bin": b"1", "q/2.bin": b"2"})
    shardpack.pack(inner_src, tree / "inner", workers=1, layout="files")
    (tree / "inner" / ".shardpack-lock").unlink()  # (a store holds no lock file)
    (tree / "packed").mkdir()  # OUT of the pack below: empty, inside SRC
    return tree


def test_scan_and_entries_list_in_code_point_order_and_stop_at_a_dataset(kind, tmp_path):
    kind.need_listing()
    url = kind.put(walk_tree(tmp_path), "tree")
    kind.mkdir("tree/packed")
    storage = kind.storage(url)
    top = storage.location()
    entries = storage.entries(top)
    assert [e[0] for e in entries] == ORDER
    assert [e[0] for e in entries if e[2]] == ["inner", "packed", "sub"]
    assert all(path == f"{top}/{name}" and not link for name, path, _, link in entries)
    scanned = storage.scan(top, (fmt.MANIFEST_NAME,))
    assert [s[0] for s in scanned] == ORDER
    assert {s[0]: s[3] for s in scanned if s[2] == "file"} == \
        {n: len(n.encode()) for n in TOP_FILES}
    assert [s[0] for s in scanned if s[2] == "dir"] == ["inner", "packed", "sub"]
    assert storage.scan(f"{top}/inner", (fmt.MANIFEST_NAME,)) is None
    assert storage.scan(f"{top}/sub", (fmt.MANIFEST_NAME,))[0][:4] == \
        ("x.bin", f"{top}/sub/x.bin", "file", 1)
    assert storage.marked(f"{top}/inner", (fmt.MANIFEST_NAME,))
    assert not storage.marked(f"{top}/sub", (fmt.MANIFEST_NAME,))
    assert not storage.marked(top, (fmt.MANIFEST_NAME,))


def test_a_pack_walk_leaves_out_a_dataset_and_its_own_out(kind, tmp_path):
    kind.need_listing()
    src = kind.put(walk_tree(tmp_path), "tree")
    kind.mkdir("tree/packed")
    out = f"{src}/packed"
    assert kind.storage(src).contains(kind.storage(out), strictly=True) is not None
    summary = shardpack.pack(src, out, storage_options=kind.options, workers=1,
                             max_samples=2)
    assert [d.rstrip("/").rsplit("/", 1)[-1] for d in summary.datasets] == ["inner"]  # once
    assert any("left the output folder out of the walk" in n for n in summary.notes)
    reader = shardpack.open_reader(out, storage_options=kind.options)
    keys = [reader.read_sample(i)["__key__"] for i in range(len(reader))]
    assert sorted(keys) == sorted([n[:-4] for n in TOP_FILES] + ["sub/x"])
    assert verify(out, storage_options=kind.options).ok


# -- processes -----------------------------------------------------------------------------------

def _read_in_child(storage: Storage, name: str, conn) -> None:
    try:
        conn.send(storage.read_bytes(name, 3, 300))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        conn.send(f"{type(exc).__name__}: {exc}")
    conn.close()


def _read_after_fork(storage: Storage, name: str):
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_read_in_child, args=(storage, name, send))
    proc.start()
    send.close()
    got = receive.recv() if receive.poll(60) else "no answer within 60 s"
    proc.join(30)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
    return got, proc.exitcode


def test_a_storage_pickles_and_reads_the_same_bytes_after_a_fork(kind, small_tree, tmp_path):
    url, ref = stored_pack(kind, small_tree, tmp_path)
    storage = kind.storage(url)
    shard = "shard-00001.tar"
    data = (ref / shard).read_bytes()
    storage.read_manifest()  # its client in use, and sizes known, before the copies
    assert storage.read_bytes(shard, 3, 300) == data[3:300]
    copy = pickle.loads(pickle.dumps(storage))
    assert type(copy) is type(storage) and copy.url == storage.url
    assert copy.read_bytes(shard) == data
    assert copy.read_ranges([(shard, 3, 300), (shard, 0, 1)]) == [data[3:300], data[:1]]
    for each in (storage, copy):
        assert _read_after_fork(each, shard) == (data[3:300], 0)
    assert storage.read_bytes(shard, 3, 300) == data[3:300]  # the parent's still works


# -- merging -------------------------------------------------------------------------------------

def test_a_merge_of_two_parts_in_the_kind_verifies(kind, tmp_path):
    parts, keys = [], set()
    for i in range(2):
        files = {f"{c}/{c}{i}{j}.jpg": fake_jpeg(60 + 7 * j, seed=10 * i + j)
                 for c in ("cat", "dog") for j in range(3)}
        keys |= {f[:-4] for f in files}
        url, _ = stored_pack(kind, make_tree(tmp_path / f"src{i}", files), tmp_path, f"p{i}")
        parts.append(url)
    out = kind.url("merged") if kind.base else str(tmp_path / "merged")
    summary = shardpack.merge(parts, out, storage_options=kind.options)
    files = 2 * summary.shards  # a shard and its index each
    assert (summary.linked, summary.server, summary.streamed) == \
        {"local": (files, 0, 0), "s3": (0, files, 0), "http": (0, 0, files)}[kind.name]
    report = verify(out, storage_options=kind.options)
    assert report.ok, report.problems
    assert report.samples == summary.samples == 12 and report.shards == summary.shards
    reader = shardpack.open_reader(out, storage_options=kind.options)
    assert {reader.read_sample(i)["__key__"] for i in range(len(reader))} == keys


def test_verify_reads_a_large_shard_in_chunks_in_the_kind(kind, tmp_path, monkeypatch):
    """A shard over verify's whole-read limit is checked in one pass of ranged reads through
    the kind's storage, records over the record limit hashed in chunks: all of them pass."""
    from shardpack.inspect import chunked

    monkeypatch.setattr(chunked, "WHOLE_SHARD", 0)
    monkeypatch.setattr(chunked, "WHOLE_RECORD", 2048)
    monkeypatch.setattr(chunked, "CHUNK", 1000)
    large = []
    real = chunked.read_large_record
    monkeypatch.setattr(chunked, "read_large_record",
                        lambda index, row, chunks: large.append(row) or real(index, row, chunks))
    files = {f"{i}.bin": bytes([i]) * (500 + 1500 * i) for i in range(5)}
    url, _ = stored_pack(kind, make_tree(tmp_path / "src", files), tmp_path)
    report = verify(url, storage_options=kind.options)
    assert report.ok, report.problems
    assert report.samples == 5 and len(large) == 4  # the records over 2 KB: all but 0.bin


def test_large_source_files_in_the_kind_are_packed_in_chunks(kind, tmp_path, monkeypatch):
    """Source files over the streaming threshold are copied into the shard in chunks (ranged
    reads where remote), giving the shards a pack that reads them whole gives."""
    from shardpack.write import fields

    kind.need_listing()
    files = {f"{i}.bin": bytes(range(256)) * (2 + 9 * i) for i in range(4)}
    files["3.txt"] = b"small"
    src = kind.put(make_tree(tmp_path / "src", files), "tree")
    whole = tmp_path / "whole"
    shardpack.pack(src, whole, storage_options=kind.options, shard_format="msgpack", workers=1)
    monkeypatch.setattr(fields, "STREAM_SIZE", 1024)
    monkeypatch.setattr(fields, "STREAM_CHUNK", 1000)
    streamed = []
    real = fields.FileStream.chunks
    monkeypatch.setattr(fields.FileStream, "chunks",
                        lambda self: streamed.append(type(self).__name__) or real(self))
    out = tmp_path / "streamed"
    shardpack.pack(src, out, storage_options=kind.options, shard_format="msgpack", workers=1)
    assert streamed == 2 * 3 * ["FileStream" if kind.name == "local" else "RemoteStream"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == \
        {p.name: p.read_bytes() for p in whole.iterdir()}
