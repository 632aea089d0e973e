"""Packing: round trips, determinism, interop with tar and webdataset, shard planning."""

import io
import json
import os
import subprocess
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardpack
from shardpack.read.reader import DatasetReader
from shardpack.interop.unpack import unpack

from testbed.helpers import dataset_files, make_tree, read_tree

MODES = [("tar", "none"), ("msgpack", "none"), ("msgpack", "zstd")]

name_chars = st.one_of(st.characters(min_codepoint=32, max_codepoint=0x2FF,
                                     blacklist_characters="/."), st.just("\n"))
stems = st.text(name_chars, min_size=1, max_size=12).filter(lambda s: not s.startswith("."))
exts = st.sampled_from(["jpg", "png", "json", "cls", "txt", "npy", "seg.png"])
trees = st.dictionaries(
    st.tuples(st.lists(stems, max_size=2), stems, exts).map(
        lambda t: "/".join(t[0] + [f"{t[1]}.{t[2]}"])),
    st.binary(max_size=3000), min_size=1, max_size=25)



@pytest.mark.parametrize("shard_format,compression", MODES)
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(tree=trees, max_samples=st.one_of(st.none(), st.integers(1, 4)))
def test_pack_unpack_round_trip(tmp_path_factory, shard_format, compression, tree, max_samples):
    root = tmp_path_factory.mktemp("rt")
    folders = {"/".join(p.split("/")[:i]) for p in tree for i in range(1, p.count("/") + 1)}
    tree = {p: d for p, d in tree.items() if p.rsplit(".", 1)[0] not in folders}
    src = make_tree(root / "src", tree)
    out = root / "out"
    # arbitrary bytes under image names: the image check is off (check="none")
    summary = shardpack.pack(src, out, shard_format=shard_format, compression=compression,
                             max_samples=max_samples, workers=1, layout="files", check="none")
    assert summary.files == len(tree)
    unpack(out, root / "back")
    assert read_tree(root / "back") == read_tree(src)
    reader = DatasetReader(out)
    assert len(reader) == summary.samples
    if len(reader):
        last = reader.read_sample(len(reader) - 1)
        assert last == list(reader)[-1]


@pytest.mark.parametrize("shard_format,compression", MODES)
def test_two_packs_are_byte_identical(small_tree, tmp_path, shard_format, compression):
    a, b = tmp_path / "a", tmp_path / "b"
    shardpack.pack(small_tree, a, shard_format=shard_format, compression=compression, max_samples=2,
                   workers=1)
    shardpack.pack(small_tree, b, shard_format=shard_format, compression=compression, max_samples=2,
                   workers=2)
    files = dataset_files(a)
    assert files == dataset_files(b)
    assert len([n for n in files if n.endswith(".idx")]) == 3  # 6 samples, 2 per shard


def test_imagefolder_labels_and_classes(small_tree, tmp_path):
    out = tmp_path / "out"
    summary = shardpack.pack(small_tree, out, workers=1)
    assert summary.classes == ["cat", "dog"]
    manifest = json.loads((out / "shardpack.json").read_text())
    assert manifest["classes"] == ["cat", "dog"] and manifest["layout"] == "imagefolder"
    assert manifest["fields"] == ["cls", "jpg", "json"]
    labels = {s["__key__"]: int(s["cls"]) for s in DatasetReader(out)}
    assert labels["cat/0001"] == 0 and labels["dog/empty"] == 1
    assert labels["cat/with space"] == 0 and labels["dog/ünïcödé"] == 1


def test_tar_shards_read_by_gnu_tar_and_webdataset(small_tree, tmp_path):
    import webdataset as wds

    out = tmp_path / "out"
    shardpack.pack(small_tree, out, workers=1)
    ours = {s["__key__"]: {k: v for k, v in s.items() if k != "__key__"}
            for s in DatasetReader(out)}
    shard = str(out / "shard-00000.tar")
    listed = subprocess.run(["tar", "tf", shard], capture_output=True, text=True, check=True)
    names = listed.stdout.splitlines()
    assert sorted(names) == sorted(f"{k}.{f}" for k, v in ours.items() for f in v)
    (tmp_path / "x").mkdir()
    subprocess.run(["tar", "xf", shard, "-C", str(tmp_path / "x")], check=True)
    assert (tmp_path / "x" / "cat" / "0001.jpg").read_bytes() == \
        (small_tree / "cat" / "0001.jpg").read_bytes()
    theirs = {}
    for s in wds.WebDataset(shard, shardshuffle=False, empty_check=False):
        theirs[s["__key__"]] = {k: v for k, v in s.items() if not k.startswith("__")}
    assert theirs == ours
    assert theirs["cat/0002"]["cls"] == b"0" and theirs["dog/empty"]["json"] == b""


def test_file_larger_than_shard_goes_alone(tmp_path):
    src = make_tree(tmp_path / "src", {"a.bin": b"a" * 100, "b.bin": b"b" * 5000,
                                       "c.bin": b"c" * 100, "d.bin": b"d" * 100})
    out = tmp_path / "out"
    shardpack.pack(src, out, shard_size="3KB", workers=1)
    shards = json.loads((out / "shardpack.json").read_text())["shards"]
    assert [s["samples"] for s in shards] == [1, 1, 2]
    assert [k for s in DatasetReader(out) for k in [s["__key__"]]] == ["a", "b", "c", "d"]


def test_grouping_by_key_is_contiguous(tmp_path):
    # 'a.k' sorts between 'a.jpg' and 'a.png' as a folder: the sample must stay whole
    src = make_tree(tmp_path / "src", {"a.jpg": b"1", "a.png": b"2", "a.k/x.txt": b"3",
                                       "a-b.jpg": b"4"})
    out = tmp_path / "out"
    shardpack.pack(src, out, workers=1, layout="files", check="none")
    samples = list(DatasetReader(out))
    assert [s["__key__"] for s in samples] == ["a", "a-b", "a.k/x"]
    assert samples[0]["jpg"] == b"1" and samples[0]["png"] == b"2"


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_listing_sources(tmp_path, kind):
    src = make_tree(tmp_path / "imgs", {"x/1.jpg": b"one", "x/2.jpg": b"two"})
    if kind == "csv":
        listing = tmp_path / "list.csv"
        listing.write_text("path,label,caption\nimgs/x/1.jpg,3,a cat\nimgs/x/2.jpg,5,\n")
    else:
        listing = tmp_path / "list.jsonl"
        listing.write_text(json.dumps({"path": str(src / "x/1.jpg"), "key": "k1", "label": 3,
                                       "meta": {"w": 1}}) + "\n" +
                           json.dumps({"path": "imgs/x/2.jpg", "label": 5}) + "\n")
    out = tmp_path / "out"
    shardpack.pack(listing, out, workers=1, check="none")
    samples = {s["__key__"]: s for s in DatasetReader(out)}
    if kind == "csv":
        assert samples["imgs/x/1"] == {"__key__": "imgs/x/1", "jpg": b"one", "label": b"3",
                                       "caption": b"a cat"}
        assert samples["imgs/x/2"] == {"__key__": "imgs/x/2", "jpg": b"two", "label": b"5"}
    else:
        assert samples["k1"]["meta"] == b'{"w":1}' and samples["k1"]["label"] == b"3"
        assert samples["imgs/x/2"]["jpg"] == b"two"


def _jpeg(w, h, seed=0):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    arr = (rng.random((h, w, 3)) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def test_resize_at_pack_time(tmp_path):
    from PIL import Image

    big, small = _jpeg(640, 480), _jpeg(100, 80, 1)
    png = io.BytesIO()
    Image.new("RGB", (300, 600), "red").save(png, "PNG")
    src = make_tree(tmp_path / "src", {"a.jpg": big, "b.jpg": small, "c.png": png.getvalue(),
                                       "a.json": b"{}"})
    out = tmp_path / "out"
    shardpack.pack(src, out, resize=128, quality=80, workers=1)
    s = {x["__key__"]: x for x in DatasetReader(out)}
    assert Image.open(io.BytesIO(s["a"]["jpg"])).size == (171, 128)
    assert s["b"]["jpg"] == small  # never upscaled, kept byte for byte
    c = Image.open(io.BytesIO(s["c"]["png"]))
    assert c.format == "PNG" and c.size == (128, 256)
    assert s["a"]["json"] == b"{}"
    assert json.loads((out / "shardpack.json").read_text())["preprocessing"]["resize"] == 128


def test_unpack_refuses_to_write_into_non_empty_folder(small_tree, tmp_path):
    out = tmp_path / "out"
    shardpack.pack(small_tree, out, workers=1)
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(shardpack.ShardpackError, match="not an empty folder"):
        unpack(out, target)
    assert os.listdir(target) == ["keep.txt"]


def test_index_opens_lazily(small_tree, tmp_path):
    out = tmp_path / "out"
    shardpack.pack(small_tree, out, workers=1, max_samples=1)
    reader = DatasetReader(out)
    assert reader._indexes == {}
    assert reader.read_sample(3)["__key__"] == list(DatasetReader(out))[3]["__key__"]
    assert list(reader._indexes) == [3]


def test_tar_member_names_follow_webdataset_convention(tmp_path):
    src = make_tree(tmp_path / "src", {"d/0001.seg.png": b"s", "d/0001.jpg": b"j",
                                       "e/IMG_2019.01.05.png": b"t", "e/100%.png": b"p"})
    out = tmp_path / "out"
    shardpack.pack(src, out, workers=1, layout="files", group="image", check="none")
    with tarfile.open(out / "shard-00000.tar") as tf:
        # key 'd/0001.seg' (one sample per image): its dot is escaped for WebDataset readers
        assert tf.getnames() == ["d/0001.jpg", "d/0001%2Eseg.png", "e/100%25.png",
                                 "e/IMG_2019%2E01%2E05.png"]
    assert [s["__key__"] for s in DatasetReader(out)] == ["d/0001", "d/0001.seg", "e/100%",
                                                          "e/IMG_2019.01.05"]


def test_readahead_hints_the_next_files_in_order_within_bounds(tmp_path, monkeypatch):
    from shardpack.write import fields
    from shardpack.core.errors import SourceError
    from shardpack.write.plan import PackOptions, ShardTask
    from shardpack.write.samples import SourceSample, file_field, value_field

    paths = []
    for i in range(10):
        p = tmp_path / f"{i}.bin"
        p.write_bytes(b"x" * 100)
        paths.append(str(p))
    gone = str(tmp_path / "gone.bin")  # vanished since the walk: skipped, the read reports it
    field = lambda p: file_field("bin", p, 100, os.stat(p).st_mtime_ns if p != gone else 0)  # noqa: E731
    samples = [SourceSample(str(i), (field(paths[i]), value_field("cls", b"1")))
               for i in range(10)]
    samples.insert(3, SourceSample("g", (field(gone),)))
    hinted = []
    real = os.posix_fadvise

    def spy(fd, offset, length, advice):
        assert advice == os.POSIX_FADV_WILLNEED
        hinted.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd, offset, length, advice)

    monkeypatch.setattr(fields.os, "posix_fadvise", spy)
    monkeypatch.setattr(fields.LocalFiles, "AHEAD_FILES", 3)
    monkeypatch.setattr(fields.LocalFiles, "AHEAD_BYTES", 250)  # 3 files of 100 bytes pass it
    readers = ShardTask(0, tuple(samples), PackOptions()).open_readers()
    assert set(readers) == {fields.LocalFiles, fields.InlineValue}
    ahead = readers[fields.LocalFiles]
    seen, window, got = [], [], []
    for sample in samples:
        try:
            got.append([bytes(readers[f.reader].read(f)) for f in sample.fields])
        except SourceError as exc:
            assert "vanished" in str(exc)
        seen.append(list(hinted))
        window.append(ahead.next - ahead.pos)
    assert got == [[b"x" * 100, b"1"]] * 10
    assert hinted == paths[1:]  # each file once, in order; never the one about to be read
    assert seen[0] == paths[1:3]  # the byte bound (the vanished file's 100 count) stops it
    assert max(window) <= 3  # never more than AHEAD_FILES past the file being read
