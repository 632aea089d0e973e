"""shardpack merge: parts -> one dataset (hard links, store-side and streamed copies), the checks
on the parts, a failure mid-merge, --overwrite, part records of `pack --part`, the CLI."""

import errno
import importlib
import json
import os

import numpy as np
import pytest

import shardpack
from shardpack import format as fmt
from shardpack.core.errors import DatasetNotFoundError, FormatError, PackError, ShardpackError
from shardpack.storage import Storage
from shardpack.inspect.verify import verify

from testbed.helpers import dataset_files, fake_jpeg, make_tree, run_cli

merge_module = importlib.import_module("shardpack.write.merge")  # shardpack.merge is the function


def image_tree(root, start, n=3, classes=("cat", "dog"), extra=None):
    """An ImageFolder tree: per class, images ``<class>/<class>NNNN.jpg`` numbered from
    ``start`` (distinct numbers make distinct keys)."""
    files = {f"{c}/{c}{start + j:04d}.jpg": fake_jpeg(60 + (start + j) % 40, seed=start + j)
             for c in classes for j in range(n)}
    return make_tree(root, {**files, **(extra or {})})


def pack_part(tmp_path, name, start, n=3, extra=None, classes=("cat", "dog"), **kw):
    src = image_tree(tmp_path / f"src-{name}", start, n, classes, extra)
    out = tmp_path / name
    shardpack.pack(src, out, workers=1, max_samples=2, **kw)
    return out


@pytest.fixture
def parts(tmp_path):
    """Three parts packed from disjoint sub-trees: a hidden file in the first, a sidecar and an
    ignored file in the second, a broken image skipped by --skip-bad in the third."""
    a = pack_part(tmp_path, "a", 0, extra={"cat/.DS_Store": b"x"})
    b = pack_part(tmp_path, "b", 100, extra={"cat/cat0100.json": b'{"w": 1}',
                                             "dog/Thumbs.db": b"junk"})
    c = pack_part(tmp_path, "c", 200, n=2, extra={"dog/broken.jpg": b""}, on_error="skip")
    return [a, b, c]


def manifest(path):
    return json.loads((path / fmt.MANIFEST_NAME).read_text())


def samples(path):
    """Every sample of a dataset, by key, through MapDataset: {key: {field: bytes}}."""
    ds = shardpack.MapDataset(path)
    out = {}
    for i in range(len(ds)):
        s = ds[i]
        assert s["__key__"] not in out
        out[s["__key__"]] = {k: v for k, v in s.items() if not k.startswith("__")}
    return out


def shard_files(path):
    return sorted(p.name for p in path.iterdir() if p.name.startswith("shard-"))


def test_merge_three_parts(parts, tmp_path):
    before = [dataset_files(p) for p in parts]
    out = tmp_path / "out"
    summary = shardpack.merge(parts, out)
    entries = [(p, e) for p in parts for e in manifest(p)["shards"]]
    assert summary.parts == 3 and summary.shards == len(entries) > 3
    assert summary.linked == 2 * len(entries) and summary.server == summary.streamed == 0
    assert summary.line().startswith(f"merged 3 parts into {len(entries)} shards (")
    assert "hard-linked" in summary.line()

    report = verify(out)
    assert report.ok, report.problems
    m = manifest(out)
    assert m["merged_from"] == 3 and m["part"] is None
    assert m["num_samples"] == report.samples == sum(manifest(p)["num_samples"] for p in parts)
    assert m["fields"] == ["cls", "jpg", "json"] and m["classes"] == ["cat", "dog"]
    assert (m["hidden"], m["ignored"], m["skipped"]) == (1, 1, {"broken-image": 1})
    # the third part's skip report, carried over and checked by verify above
    assert (out / fmt.SKIPS_NAME).read_bytes() == (parts[2] / fmt.SKIPS_NAME).read_bytes()
    assert m["skip_report"]["entries"] == 1 and b"broken.jpg" in (out / fmt.SKIPS_NAME).read_bytes()
    # shards renumbered in the order given, each a hard link of its part's file
    for number, (part, entry) in enumerate(entries):
        new = m["shards"][number]
        assert new["name"] == fmt.shard_name(number, "tar")
        assert new["index"] == fmt.index_name(number)
        assert {k: new[k] for k in ("samples", "bytes", "hash", "index_bytes", "index_hash")} \
            == {k: entry[k] for k in ("samples", "bytes", "hash", "index_bytes", "index_hash")}
        for name, old in ((new["name"], entry["name"]), (new["index"], entry["index"])):
            assert os.stat(out / name).st_ino == os.stat(part / old).st_ino

    # every sample exactly once, byte-identical to its part's, through both datasets
    expected = {}
    for p in parts:
        expected.update(samples(p))
    assert samples(out) == expected
    streamed = [s for s in shardpack.ShardDataset(out, shuffle=False)]
    assert sorted(s["__key__"] for s in streamed) == sorted(expected)
    assert not any(s["__repeat__"] for s in streamed)
    for s in streamed:
        assert {k: v for k, v in s.items() if not k.startswith("__")} == expected[s["__key__"]]
    keys = [s["__key__"] for s in streamed]  # unshuffled: the parts' keys, in merge order
    assert keys == [k for p in parts for k in samples(p)]
    # the parts are untouched
    assert [dataset_files(p) for p in parts] == before
    assert all(verify(p).ok for p in parts)


def test_other_file_system_falls_back_to_a_checked_copy(parts, tmp_path, monkeypatch):
    def no_link(src, dst, **kw):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr("shardpack.storage.local.os.link", no_link)
    out = tmp_path / "out"
    summary = shardpack.merge(parts, out)
    assert summary.linked == 0 and summary.streamed == 2 * summary.shards
    assert "copied through this machine" in summary.line()
    first = manifest(parts[0])["shards"][0]["name"]
    assert os.stat(out / "shard-00000.tar").st_ino != os.stat(parts[0] / first).st_ino
    assert verify(out).ok


def test_a_streamed_copy_that_differs_is_refused(parts, tmp_path, monkeypatch):
    """A part whose shard changed after packing (same size): the copy is hashed on the way,
    found different, removed, and the merge publishes nothing."""
    monkeypatch.setattr("shardpack.storage.local.os.link",
                        lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EXDEV, "x")))
    shard = parts[1] / manifest(parts[1])["shards"][0]["name"]
    data = bytearray(shard.read_bytes())
    data[600] ^= 1
    shard.write_bytes(bytes(data))
    out = tmp_path / "out"
    with pytest.raises(ShardpackError, match="does not match the hash its manifest records"):
        shardpack.merge(parts, out)
    assert not (out / fmt.MANIFEST_NAME).exists() and shard_files(out) == []


@pytest.mark.parametrize("what", ["format", "classes"])
def test_parts_that_disagree_are_refused(parts, tmp_path, what):
    if what == "format":
        odd = pack_part(tmp_path, "odd", 300, shard_format="msgpack")
        needle = "shard_format is 'msgpack' here, but 'tar' in"
    else:
        odd = pack_part(tmp_path, "odd", 300, classes=("bird", "cat"))
        needle = "classes is ['bird', 'cat'] here, but ['cat', 'dog'] in"
    out = tmp_path / "out"
    with pytest.raises(ShardpackError) as info:
        shardpack.merge([parts[0], odd], out)
    text = str(info.value)
    assert text.startswith(f"{odd}: ") and needle in text and str(parts[0]) in text
    assert "\n" not in text
    assert not out.exists()  # refused before OUT is touched


def test_a_key_in_two_parts_is_refused(parts, tmp_path):
    twin = pack_part(tmp_path, "twin", 300, extra={"cat/cat0001.jpg": fake_jpeg(99, seed=7)})
    with pytest.raises(ShardpackError) as info:
        shardpack.merge([parts[0], parts[1], twin], tmp_path / "out")
    text = str(info.value)
    assert "sample key 'cat/cat0001' is in two parts" in text
    assert str(parts[0]) in text and str(twin) in text and str(parts[1]) not in text
    assert not (tmp_path / "out").exists()


def test_hash_collisions_are_confirmed_by_the_keys(parts, tmp_path, monkeypatch):
    """Every key hashing alike: disjoint parts still merge (the keys differ), and a real
    duplicate is still named."""
    monkeypatch.setattr(merge_module, "_key_hashes",
                        lambda index: np.zeros(index.num_samples, dtype=np.uint64))
    total = sum(manifest(p)["num_samples"] for p in parts)
    assert shardpack.merge(parts, tmp_path / "out").samples == total
    twin = pack_part(tmp_path, "twin", 300, extra={"dog/dog0201.jpg": fake_jpeg(99, seed=7)})
    with pytest.raises(ShardpackError, match=r"sample key 'dog/dog0201' is in two parts: "):
        shardpack.merge([parts[2], twin], tmp_path / "out2")


def test_failure_mid_merge_publishes_nothing_and_removes_what_it_put(parts, tmp_path,
                                                                      monkeypatch):
    real = Storage.copy_from

    def failing(self, source, name, dest, **kw):
        if dest == "shard-00001.tar":
            raise OSError(errno.EIO, "Input/output error")
        return real(self, source, name, dest, **kw)

    monkeypatch.setattr(Storage, "copy_from", failing)
    out = tmp_path / "out"
    with pytest.raises(PackError) as info:
        shardpack.merge(parts, out)
    assert "cannot link or copy" in str(info.value) and "Input/output error" in str(info.value)
    assert str(out / "shard-00001.tar") in str(info.value)
    assert not (out / fmt.MANIFEST_NAME).exists()
    assert shard_files(out) == [] and [p.name for p in out.iterdir()] == [".shardpack-lock"]
    assert all(verify(p).ok for p in parts)
    monkeypatch.setattr(Storage, "copy_from", real)
    assert shardpack.merge(parts, out).parts == 3  # nothing left behind: OUT counts as empty


def test_overwrite(parts, tmp_path):
    out = tmp_path / "out"
    first = shardpack.merge(parts, out)
    with pytest.raises(ShardpackError, match="output folder is not empty.*overwrite=True"):
        shardpack.merge(parts[:2], out)
    second = shardpack.merge(parts[:2], out, overwrite=True)
    assert second.shards < first.shards
    assert shard_files(out) == sorted(
        [fmt.shard_name(i, "tar") for i in range(second.shards)]
        + [fmt.index_name(i) for i in range(second.shards)])
    assert verify(out).ok and manifest(out)["merged_from"] == 2
    # a pack's dataset is replaced too
    shardpack.pack(image_tree(tmp_path / "other", 500), tmp_path / "packed", workers=1)
    shardpack.merge(parts, tmp_path / "packed", overwrite=True)
    assert verify(tmp_path / "packed").ok
    # files shardpack did not write are never touched
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ShardpackError, match="did not write \\('notes.txt'"):
        shardpack.merge(parts, out, overwrite=True)
    assert (out / fmt.MANIFEST_NAME).exists()


def test_out_and_parts_are_distinct(parts, tmp_path):
    before = dataset_files(parts[0])
    with pytest.raises(ShardpackError, match="OUT is the part .*: merge never writes into a part"):
        shardpack.merge(parts, parts[0], overwrite=True)
    with pytest.raises(ShardpackError, match="OUT is inside the part"):
        shardpack.merge(parts, parts[1] / "sub")
    assert dataset_files(parts[0]) == before and not (parts[1] / "sub").exists()
    with pytest.raises(ShardpackError, match="the same part is given twice"):
        shardpack.merge([parts[0], parts[1], str(parts[0]) + "/"], tmp_path / "out")


def test_a_part_must_be_a_finished_dataset(parts, tmp_path):
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "shard-00000.tar").write_bytes(b"")
    with pytest.raises(DatasetNotFoundError, match=f"{unfinished}: no shardpack dataset here"):
        shardpack.merge([parts[0], unfinished], tmp_path / "out")
    (unfinished / fmt.MANIFEST_NAME).write_text('{"format": "shardpack", "version": 7}')
    with pytest.raises(FormatError, match="expected one of \\(1, 2\\), found 7"):
        shardpack.merge([parts[0], unfinished], tmp_path / "out")


def test_manifest_part_and_merged_from_are_checked():
    good = {"format": "shardpack", "version": 2, "shard_format": "tar", "compression": "none",
            "hash": "xxh3-128", "shards": [], "fields": []}
    for extra in ({}, {"part": None, "merged_from": None}, {"part": {"index": 2, "count": 3}},
                  {"merged_from": 4}):
        fmt.decode_manifest(json.dumps({**good, **extra}).encode())
    for extra, needle in (({"part": {"index": 3, "count": 3}}, "'part' must be null or"),
                          ({"part": {"index": -1, "count": 3}}, "'part' must be null or"),
                          ({"part": "0/3"}, "'part' must be null or"),
                          ({"merged_from": 0}, "'merged_from' must be a positive integer"),
                          ({"merged_from": True}, "'merged_from' must be a positive integer")):
        with pytest.raises(FormatError, match=needle):
            fmt.decode_manifest(json.dumps({**good, **extra}).encode())


# -- parts of one split (pack --part I/N) ------------------------------------------------------

@pytest.fixture
def split(tmp_path):
    """A tree packed whole, and as the 3 parts of one split."""
    src = image_tree(tmp_path / "src", 0, n=8)
    shardpack.pack(src, tmp_path / "whole", workers=1, max_samples=3)
    parts = []
    for i in range(3):
        shardpack.pack(src, tmp_path / f"p{i}", workers=1, max_samples=3, part=(i, 3))
        parts.append(tmp_path / f"p{i}")
    return parts


def test_parts_of_a_split_merge_in_part_order(split, tmp_path):
    out = tmp_path / "out"
    shardpack.merge([split[2], split[0], split[1]], out)
    assert verify(out).ok
    m = manifest(out)
    assert m["part"] is None and m["merged_from"] == 3
    assert [e["hash"] for e in m["shards"]] == [e["hash"] for p in split
                                                for e in manifest(p)["shards"]]
    assert samples(out) == samples(tmp_path / "whole")


def test_a_split_must_be_whole(split, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ShardpackError, match=r"1 part of the split is missing: 1/3 \(given: 2 "
                                             r"of 3\)"):
        shardpack.merge([split[0], split[2]], out)
    src = tmp_path / "src"
    shardpack.pack(src, tmp_path / "again", workers=1, max_samples=3, part=(1, 3))
    with pytest.raises(ShardpackError, match=f"part 1/3 is given twice: {split[1]} and "
                                             f"{tmp_path / 'again'}"):
        shardpack.merge(split + [tmp_path / "again"], out)
    shardpack.pack(src, tmp_path / "half", workers=1, max_samples=3, part=(0, 2))
    with pytest.raises(ShardpackError, match="different numbers of parts"):
        shardpack.merge(split + [tmp_path / "half"], out)
    shardpack.pack(src, tmp_path / "plain", workers=1, max_samples=3)
    with pytest.raises(ShardpackError, match=f"is a part of a split \\(pack --part\\), "
                                             f"{tmp_path / 'plain'} is not"):
        shardpack.merge(split + [tmp_path / "plain"], out)
    assert not out.exists()


# -- remote (an fsspec memory filesystem stands for an object store) ---------------------------

def test_remote_parts_and_out(parts, tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    base = "memory://shardpack-merge-test"
    try:
        remote_parts = []
        for i in range(len(parts)):
            src = tmp_path / f"src-{'abc'[i]}"
            shardpack.pack(src, f"{base}/p{i}", workers=1, max_samples=2,
                           on_error="skip" if i == 2 else "raise")  # as the fixture packed them
            remote_parts.append(f"{base}/p{i}")
        expected = shardpack.merge(parts, tmp_path / "local")
        # one store: the store copies
        summary = shardpack.merge(remote_parts, f"{base}/out")
        assert summary.server == 2 * summary.shards == 2 * expected.shards
        assert "copied by the store" in summary.line()
        assert verify(f"{base}/out").ok
        assert samples(f"{base}/out") == samples(tmp_path / "local")
        assert fs.cat_file("/shardpack-merge-test/out/shardpack.json") == \
            (tmp_path / "local" / fmt.MANIFEST_NAME).read_bytes()
        # across stores: streamed, hashed on the way
        summary = shardpack.merge(parts, f"{base}/out2")
        assert summary.streamed == 2 * summary.shards and verify(f"{base}/out2").ok
        summary = shardpack.merge(remote_parts, tmp_path / "back")
        assert summary.streamed == 2 * summary.shards
        assert dataset_files(tmp_path / "back") == dataset_files(tmp_path / "local")
        with pytest.raises(ShardpackError, match="output folder is not empty"):
            shardpack.merge(remote_parts, f"{base}/out")
        assert shardpack.merge(remote_parts[:1], f"{base}/out", overwrite=True).parts == 1
        assert verify(f"{base}/out").ok
    finally:
        if fs.exists("/shardpack-merge-test"):
            fs.rm("/shardpack-merge-test", recursive=True)


# -- the command line ------------------------------------------------------------------------

def test_cli(parts, tmp_path):
    result = run_cli("merge", *parts, tmp_path / "out", "-q")
    assert result.output.startswith("merged 3 parts into ") and "hard-linked" in result.output
    assert run_cli("verify", tmp_path / "out").exit_code == 0
    result = run_cli("merge", *parts, tmp_path / "out", "-q", ok=None)
    assert result.exit_code == 2
    assert result.output == f"shardpack: error: {tmp_path / 'out'}: output folder is not empty " \
                            "(pass --overwrite to replace the dataset there, or choose an empty " \
                            "folder)\n"
    assert run_cli("merge", *parts[:2], tmp_path / "out", "--overwrite", "-q").exit_code == 0
    odd = pack_part(tmp_path, "odd", 300, shard_format="msgpack", compression="zstd")
    result = run_cli("merge", parts[0], odd, tmp_path / "out2", ok=None)
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert result.output.startswith(f"shardpack: error: {odd}: shard_format is 'msgpack'")
    result = run_cli("merge", parts[0], ok=None)  # no OUT
    assert result.exit_code == 2 and "Missing argument" in result.output


@pytest.mark.parametrize("needle", ["finished shardpack dataset", "hard-linked",
                                    "server-side", "left untouched", "--part I/N",
                                    "--overwrite"])
def test_help_explains(needle):
    assert needle in " ".join(run_cli("merge", "--help").output.split())
