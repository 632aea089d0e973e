"""``shardpack export``: a dataset out to WebDataset tar shards, Parquet and files, and back."""

from __future__ import annotations

import importlib
import io
import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from shardpack import format as fmt
from shardpack.interop.convert import convert
from shardpack.core.errors import ShardpackError
from shardpack.interop.export import MARKER_NAME, export
from shardpack.write.pack import pack
from shardpack.read.reader import DatasetReader, open_reader

from testbed.helpers import make_tree, read_tree, run_cli

# the module: shardpack.export is the function
export_module = importlib.import_module("shardpack.interop.export")

pytestmark = pytest.mark.timeout(120)


def image_bytes(color, kind: str = "PNG", size=(8, 6)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, kind)
    return buf.getvalue()


def noisy_png(seed: int) -> bytes:
    """A PNG of ~1-2 KB (noise does not compress), so a few make several shards."""
    import random

    rng = random.Random(seed)
    img = Image.frombytes("RGB", (24, 24), bytes(rng.randrange(256) for _ in range(24 * 24 * 3)))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture
def imagefolder(tmp_path) -> Path:
    """An ImageFolder dataset (fields png/jpg + cls, class names) of several shards."""
    files = {f"cat/{i:04d}.png": noisy_png(i) for i in range(5)}
    files.update({f"dog/{i:04d}.jpg": image_bytes((i * 40, 90, 9), "JPEG") for i in range(5, 8)})
    files["dog/0005.json"] = b'{"note": "only this sample has it"}'
    make_tree(tmp_path / "src", files)
    out = tmp_path / "ds"
    summary = pack(tmp_path / "src", out, shard_size="6KB", workers=1)
    assert summary.shards > 1 and summary.classes == ["cat", "dog"]
    return out


@pytest.fixture
def filetree(tmp_path) -> tuple[Path, Path]:
    """A plain file tree (nested keys, multi-dot fields) and its dataset."""
    files = {"top.txt": b"hello", "a/0001.jpg": image_bytes("red", "JPEG"),
             "a/0001.seg.png": image_bytes("black"), "a/b/0002.png": image_bytes("blue"),
             "a/b/0002.cls": b"07", "a/b/0003.cls": b"3", "empty.bin": b""}
    src = make_tree(tmp_path / "tree", files)
    # check="none": samples without an image (top.txt, empty.bin) packed as they are
    pack(src, tmp_path / "ds_files", layout="files", workers=1, check="none")
    return src, tmp_path / "ds_files"


def samples_of(dataset) -> list[dict]:
    return [dict(s) for s in open_reader(dataset)]


def wds_samples(urls) -> list[dict]:
    import webdataset as wds

    got = []
    for sample in wds.WebDataset([str(u) for u in urls], shardshuffle=False):
        got.append({k: v for k, v in sample.items() if k in (fmt.KEY_FIELD,)
                    or not k.startswith("__")})
    return got


def test_webdataset(imagefolder, tmp_path):
    expected = samples_of(imagefolder)
    out = tmp_path / "wds"
    summary = export(imagefolder, out, to="webdataset", shard_size="5KB")
    shards = sorted(out.glob("shard-*.tar"))
    assert [p.name for p in shards] == [f"shard-{i:06d}.tar" for i in range(len(shards))]
    assert len(shards) > 1 and summary.files == len(shards)
    assert summary.samples == len(expected) == 8
    assert wds_samples(shards) == expected
    for shard in shards:
        with tarfile.open(shard) as tf:
            members = tf.getmembers()
            keys = {m.name.split(".", 1)[0] for m in members}
            assert all(m.isreg() and m.mtime == 0 and m.mode == 0o644 for m in members)
        assert shard.stat().st_size <= 5000 or len(keys) == 1  # a shard ends at shard_size
    with tarfile.open(shards[0]) as tf:
        names = tf.getnames()
    assert names[:2] == ["cat/0000.cls", "cat/0000.png"]
    marker = json.loads((out / MARKER_NAME).read_text())
    assert marker["to"] == "webdataset" and marker["files"] == [p.name for p in shards]
    assert marker["classes"] == ["cat", "dog"] and marker["samples"] == 8
    # deterministic: a second export is byte-identical
    export(imagefolder, tmp_path / "wds2", to="webdataset", shard_size="5KB")
    assert read_tree(tmp_path / "wds2") == read_tree(out)


def test_webdataset_round_trip(imagefolder, tmp_path):
    export(imagefolder, tmp_path / "wds", to="webdataset")
    convert(tmp_path / "wds", tmp_path / "back", workers=1)
    assert samples_of(tmp_path / "back") == samples_of(imagefolder)


def test_parquet(imagefolder, tmp_path, monkeypatch):
    monkeypatch.setattr(export_module, "ROW_GROUP_ROWS", 2)
    expected = samples_of(imagefolder)
    out = tmp_path / "pq"
    summary = export(imagefolder, out, to="parquet", shard_size="8KB")
    parts = sorted(out.glob("*.parquet"))
    assert [p.name for p in parts] == [f"part-{i:05d}.parquet" for i in range(len(parts))]
    assert len(parts) > 1 and summary.files == len(parts) and not summary.notes
    assert pq.ParquetFile(parts[0]).metadata.num_row_groups > 1
    table = pq.read_table(out)  # the marker (leading '_') is skipped by pyarrow
    assert table.schema.field("__key__").type == pa.string()
    assert table.schema.field("cls").type == pa.int64()
    assert table.schema.field("png").type == pa.binary()
    rows = table.to_pylist()
    assert [r["__key__"] for r in rows] == [s["__key__"] for s in expected]
    assert [r["cls"] for r in rows] == [int(s["cls"]) for s in expected]
    for row, sample in zip(rows, expected, strict=True):
        for name in ("png", "jpg", "json"):
            assert row[name] == sample.get(name)  # None where the sample lacks the field
    meta = table.schema.metadata
    assert json.loads(meta[b"shardpack"])["classes"] == ["cat", "dog"]
    features = json.loads(meta[b"huggingface"])["info"]["features"]
    assert features["cls"] == {"names": ["cat", "dog"], "_type": "ClassLabel"}


def test_parquet_read_by_hugging_face(imagefolder, tmp_path):
    import datasets

    export(imagefolder, tmp_path / "pq", to="parquet")
    ds = datasets.Dataset.from_parquet(str(tmp_path / "pq" / "part-00000.parquet"))
    assert ds.features["cls"].names == ["cat", "dog"]
    assert ds[0]["png"] == samples_of(imagefolder)[0]["png"]


def test_parquet_round_trip(imagefolder, tmp_path):
    export(imagefolder, tmp_path / "pq", to="parquet")
    summary = convert(tmp_path / "pq", tmp_path / "back", workers=1)
    assert samples_of(tmp_path / "back") == samples_of(imagefolder)
    back = json.loads((tmp_path / "back" / fmt.MANIFEST_NAME).read_text())
    assert back["classes"] == ["cat", "dog"] and summary.notes == []


def test_parquet_cls_not_integer(filetree, tmp_path):
    """`cls` = b"07" would come back as b"7" from int64: the column stays binary."""
    _, dataset = filetree
    summary = export(dataset, tmp_path / "pq", to="parquet", progress=True)
    table = pq.read_table(tmp_path / "pq")
    assert table.schema.field("cls").type == pa.binary()
    assert any("'cls'" in n for n in summary.notes)
    assert sorted(v for v in table.column("cls").to_pylist() if v) == [b"07", b"3"]
    assert sorted(p.name for p in (tmp_path / "pq").iterdir()) == [MARKER_NAME,
                                                                   "part-00000.parquet"]
    convert(tmp_path / "pq", tmp_path / "back", workers=1)
    assert samples_of(tmp_path / "back") == samples_of(dataset)


def test_files(filetree, tmp_path):
    src, dataset = filetree
    summary = export(dataset, tmp_path / "files", to="files")
    assert read_tree(tmp_path / "files") == read_tree(src)
    assert summary.files == 7 and summary.samples == len(samples_of(dataset))
    assert summary.bytes == sum(len(v) for v in read_tree(src).values())


def test_refuses_non_empty_out(imagefolder, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    for to in ("webdataset", "parquet", "files"):
        with pytest.raises(ShardpackError, match="not empty|not an empty"):
            export(imagefolder, out, to=to)
    with pytest.raises(ShardpackError, match="did not write"):
        export(imagefolder, out, to="parquet", overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]


def test_overwrite_replaces_an_earlier_export(imagefolder, tmp_path):
    out = tmp_path / "out"
    export(imagefolder, out, to="webdataset", shard_size="5KB")
    with pytest.raises(ShardpackError, match="not empty"):
        export(imagefolder, out, to="parquet")
    export(imagefolder, out, to="parquet", overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == [MARKER_NAME, "part-00000.parquet"]
    files = tmp_path / "files"
    files.mkdir()
    (files / "old.txt").write_text("old")
    export(imagefolder, files, to="files", overwrite=True)
    assert "old.txt" not in read_tree(files) and "cat/0000.png" in read_tree(files)
    with pytest.raises(ShardpackError, match="holds the dataset"):
        export(imagefolder, imagefolder, to="files", overwrite=True)
    assert (imagefolder / fmt.MANIFEST_NAME).exists()


@pytest.mark.parametrize("to", ["webdataset", "parquet"])
def test_error_leaves_nothing_published(imagefolder, tmp_path, monkeypatch, to):
    real = DatasetReader.iter_shard
    out = tmp_path / "out"
    seen_at_failure = []

    def failing(self, shard):
        if shard == len(self.shards) - 1:
            seen_at_failure.extend(p.name for p in out.iterdir() if not p.name.startswith("."))
            raise OSError("disk went away")
        yield from real(self, shard)

    monkeypatch.setattr(DatasetReader, "iter_shard", failing)
    with pytest.raises(OSError, match="disk went away"):
        export(imagefolder, out, to=to, shard_size="3KB")
    assert seen_at_failure  # complete files were there when it failed...
    assert not out.exists()  # ...and were removed, with the folder export made: no partial
    out.mkdir()              # export, no marker, no empty OUT; a folder the user made stays
    with pytest.raises(OSError, match="disk went away"):
        export(imagefolder, out, to=to, shard_size="3KB")
    assert out.is_dir() and list(out.iterdir()) == []


def test_bad_arguments(imagefolder, tmp_path):
    with pytest.raises(ShardpackError, match="unknown export format"):
        export(imagefolder, tmp_path / "o", to="tfrecord")
    with pytest.raises(ShardpackError, match="cannot read size"):
        export(imagefolder, tmp_path / "o", to="parquet", shard_size="big")
    with pytest.raises(ShardpackError, match="no shardpack dataset"):
        export(tmp_path, tmp_path / "o", to="parquet")
    assert not (tmp_path / "o").exists()


def test_cli_export(imagefolder, tmp_path):
    result = run_cli("export", imagefolder, tmp_path / "wds", "--to", "webdataset", "-q")
    assert "exported 8 samples" in result.output
    assert wds_samples(sorted((tmp_path / "wds").glob("*.tar"))) == samples_of(imagefolder)


@pytest.mark.parametrize("to", ["webdataset", "parquet"])
def test_remote_out_through_fsspec(imagefolder, tmp_path, to):
    """OUT written through the storage layer (an fsspec memory filesystem stands for S3):
    the same bytes as a local export."""
    import fsspec

    fs = fsspec.filesystem("memory")
    url = f"memory://shardpack-export-test/{to}"
    try:
        summary = export(imagefolder, url, to=to, shard_size="5KB")
        remote = {p.rsplit("/", 1)[-1]: fs.cat_file(p)
                  for p in fs.ls(f"/shardpack-export-test/{to}", detail=False)}
    finally:
        if fs.exists("/shardpack-export-test"):
            fs.rm("/shardpack-export-test", recursive=True)
    export(imagefolder, tmp_path / "local", to=to, shard_size="5KB")
    local = read_tree(tmp_path / "local")
    assert MARKER_NAME in remote and remote == local
    assert summary.files == len(local) - 1 > 1
