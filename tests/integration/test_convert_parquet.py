"""``convert --from parquet``: Parquet files written by pyarrow and by Hugging Face ``datasets``."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from shardpack import format as fmt
from shardpack.interop.convert import convert, detect_format
from shardpack.core.errors import SourceError
from shardpack.read.reader import open_reader
from shardpack.interop.sources import parquet as parquet_source
from shardpack.interop.sources.parquet import ParquetSource

from testbed.helpers import make_tree, run_cli

pytestmark = pytest.mark.timeout(120)


def image_bytes(color, kind: str = "PNG", size=(6, 5)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, kind)
    return buf.getvalue()


def samples_of(out: Path) -> list[dict]:
    return list(open_reader(out))


def manifest_of(out: Path) -> dict:
    with open(out / fmt.MANIFEST_NAME) as f:
        return json.load(f)


def count_batches(monkeypatch) -> list[int]:
    """Spy on pyarrow's ParquetFile.iter_batches: the returned list gets each batch's row count."""
    pulled = []
    real = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        for batch in real(self, *args, **kwargs):
            pulled.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    return pulled


def test_pyarrow_columns(tmp_path):
    jpgs = [image_bytes(c, "JPEG") for c in ("red", "green", "blue")]
    table = pa.table({
        "__key__": ["a/one", "a/two", "b/three"],
        "jpg": pa.array(jpgs, pa.binary()),
        "label": pa.array([3, -1, 12], pa.int32()),
        "caption": ["café", None, ""],
        "score": [0.1, float("nan"), 2.0],
        "ok": [True, False, None],
        "tags": [["x", "y"], [], None],
        "meta": [{"w": 6, "h": 5}, None, {"w": 1, "h": 2}],
    })
    src = tmp_path / "train.parquet"
    pq.write_table(table, src)
    assert detect_format(src) == "parquet"
    summary = convert(src, tmp_path / "out", workers=1)
    assert summary.samples == 3
    got = samples_of(tmp_path / "out")
    assert [s["__key__"] for s in got] == ["a/one", "a/two", "b/three"]
    assert [s["jpg"] for s in got] == jpgs
    assert [s["label"] for s in got] == [b"3", b"-1", b"12"]
    assert got[0]["caption"] == "café".encode()
    assert "caption" not in got[1]                     # null: the field is missing
    assert got[2]["caption"] == b""                    # empty string: an empty field
    assert got[0]["score"] == b"0.1" and got[2]["score"] == b"2.0"
    assert math.isnan(float(got[1]["score"]))
    assert (got[0]["ok"], got[1]["ok"]) == (b"true", b"false") and "ok" not in got[2]
    assert json.loads(got[0]["tags.json"]) == ["x", "y"] and got[1]["tags.json"] == b"[]"
    assert json.loads(got[0]["meta.json"]) == {"w": 6, "h": 5} and "meta.json" not in got[1]
    manifest = manifest_of(tmp_path / "out")
    assert manifest["classes"] is None
    assert manifest["layout"] == "parquet"
    assert manifest["source"]["from"] == "parquet"


def test_position_keys_and_key_column(tmp_path):
    pq.write_table(pa.table({"txt": ["a", "b"]}), tmp_path / "nokey.parquet")
    convert(tmp_path / "nokey.parquet", tmp_path / "o1", workers=1)
    assert [s["__key__"] for s in samples_of(tmp_path / "o1")] == ["0000000000", "0000000001"]
    pq.write_table(pa.table({"key": [7, 9], "txt": ["a", "b"]}), tmp_path / "intkey.parquet")
    convert(tmp_path / "intkey.parquet", tmp_path / "o2", workers=1)
    got = samples_of(tmp_path / "o2")
    assert [s["__key__"] for s in got] == ["7", "9"]
    assert "key" not in got[0]  # the key column is the key, not a field


def hf_dataset(images, labels, names):
    import datasets

    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=names),
                                  "text": datasets.Value("string")})
    return datasets.Dataset.from_dict(
        {"image": images, "label": labels, "text": [f"t{i}" for i in range(len(labels))]},
        features=features)


def test_hugging_face_image_and_classlabel(tmp_path):
    png, jpg, webp = image_bytes("red"), image_bytes("blue", "JPEG"), image_bytes("lime", "WEBP")
    images = [{"bytes": png, "path": None}, {"bytes": jpg, "path": "photos/x.JPEG"},
              {"bytes": webp, "path": None}]
    ds = hf_dataset(images, [2, 0, 1], ["cat", "dog", "emu"])
    ds.to_parquet(str(tmp_path / "hf.parquet"))
    summary = convert(tmp_path / "hf.parquet", tmp_path / "out", from_="parquet", workers=1)
    got = samples_of(tmp_path / "out")
    # one field named after the column, whatever format each row holds
    assert [s["image"] for s in got] == [png, jpg, webp]
    assert [s["cls"] for s in got] == [b"2", b"0", b"1"]
    assert "label" not in got[0]                 # the ClassLabel column became `cls`
    assert [s["text"] for s in got] == [b"t0", b"t1", b"t2"]
    assert manifest_of(tmp_path / "out")["classes"] == ["cat", "dog", "emu"]
    assert summary.classes == ["cat", "dog", "emu"]
    # the writer decodes `cls` like an ImageFolder label
    assert summary.fields == ["cls", "image", "text"]


def test_hugging_face_folder_layout(tmp_path):
    """``data/<split>-0000N-of-0000M.parquet`` in a sub-folder: found recursively, sorted by
    path; several splits give a note."""
    names = ["cat", "dog"]
    images = [{"bytes": image_bytes((i * 20, 0, 0)), "path": None} for i in range(6)]
    ds = hf_dataset(images, [i % 2 for i in range(6)], names)
    data = tmp_path / "repo" / "data"
    data.mkdir(parents=True)
    ds.select(range(3)).to_parquet(str(data / "train-00000-of-00002.parquet"))
    ds.select(range(3, 5)).to_parquet(str(data / "train-00001-of-00002.parquet"))
    ds.select([5]).to_parquet(str(data / "test-00000-of-00001.parquet"))
    (data / ".cache.parquet").write_bytes(b"not parquet, hidden")
    assert detect_format(tmp_path / "repo") == "parquet"
    (tmp_path / "repo" / "README.md").write_text("card")  # not a .parquet file: ignored
    summary = convert(tmp_path / "repo", tmp_path / "out", from_="parquet", workers=1)
    got = samples_of(tmp_path / "out")
    # test-* sorts before train-*: image 5 first, then 0..4
    assert [s["image"] for s in got] == [images[i]["bytes"] for i in (5, 0, 1, 2, 3, 4)]
    assert [s["cls"] for s in got] == [str(i % 2).encode() for i in (5, 0, 1, 2, 3, 4)]
    assert manifest_of(tmp_path / "out")["classes"] == names
    assert any("several splits (test, train)" in n for n in summary.notes)
    assert manifest_of(tmp_path / "out")["source"]["notes"] == summary.notes


def test_webdataset_style_columns(tmp_path):
    """Datasets made from WebDataset shards: columns named by extension, ``__url__``."""
    import datasets

    jpg = image_bytes("red", "JPEG")
    features = datasets.Features({"__key__": datasets.Value("string"),
                                  "__url__": datasets.Value("string"),
                                  "jpg": datasets.Image(), "seg.png": datasets.Image(),
                                  "cls": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict({"__key__": ["s/1"], "__url__": ["x.tar"],
                                     "jpg": [{"bytes": jpg, "path": None}],
                                     "seg.png": [{"bytes": image_bytes("red"), "path": None}],
                                     "cls": [4]}, features=features)
    ds.to_parquet(str(tmp_path / "w.parquet"))
    summary = convert(tmp_path / "w.parquet", tmp_path / "out", workers=1)
    [got] = samples_of(tmp_path / "out")
    assert sorted(got) == ["__key__", "cls", "jpg", "seg.png"]
    assert got["__key__"] == "s/1" and got["jpg"] == jpg and got["cls"] == b"4"
    assert any("'__url__' was skipped" in n for n in summary.notes)


def test_metadata_that_cannot_be_carried_is_noted(tmp_path):
    import pandas as pd

    frame = pd.DataFrame({"txt": ["a", "b"]}, index=pd.Index([10, 11], name="idx"))
    pq.write_table(pa.Table.from_pandas(frame), tmp_path / "pd.parquet")
    summary = convert(tmp_path / "pd.parquet", tmp_path / "out", workers=1)
    assert any("'pandas'" in n for n in summary.notes)
    got = samples_of(tmp_path / "out")
    assert [s["txt"] for s in got] == [b"a", b"b"]
    # the pandas index column ('idx') is an ordinary integer column here
    assert [s["idx"] for s in got] == [b"10", b"11"]


def test_record_batches_bound_memory(tmp_path, monkeypatch):
    """A file of several row groups is read in bounded record batches, lazily, never as a
    whole table, and every row comes out in order."""
    rows = 50
    blobs = [bytes([i]) * 100 for i in range(rows)]
    pq.write_table(pa.table({"__key__": [f"k{i:03d}" for i in range(rows)], "bin": blobs}),
                   tmp_path / "rg.parquet", row_group_size=10)
    assert pq.ParquetFile(tmp_path / "rg.parquet").metadata.num_row_groups == 5
    monkeypatch.setattr(parquet_source, "MAX_BATCH_ROWS", 4)
    pulled = count_batches(monkeypatch)

    def whole_table(*args, **kwargs):
        raise AssertionError("read the whole table")

    monkeypatch.setattr(pq.ParquetFile, "read", whole_table)
    monkeypatch.setattr(pq, "read_table", whole_table)
    stream = iter(ParquetSource(tmp_path / "rg.parquet"))
    first = next(stream)
    assert first.key == "k000" and pulled == [4]       # one batch read so far, not the file
    rest = list(stream)
    assert max(pulled) <= 4 and sum(pulled) == rows and len(pulled) >= rows // 4
    assert [s.key for s in [first, *rest]] == [f"k{i:03d}" for i in range(rows)]
    # binary cells are referred to (file, column, row), for the shard writers to read; with
    # no nulls (row group statistics) their sizes are estimates from the metadata
    assert [(s.fields[0].column, s.fields[0].offset, s.fields[0].value)
            for s in [first, *rest]] == [(("bin",), i, None) for i in range(rows)]
    out = tmp_path / "out"
    convert(tmp_path / "rg.parquet", out, workers=1, max_samples=7)  # shards across row groups
    assert [bytes(s["bin"]) for s in open_reader(out)] == blobs


def test_batch_rows_follow_row_size(tmp_path, monkeypatch):
    big = [bytes([i]) * 10 + bytes(range(i, i + 200)) * 5 for i in range(20)]
    pq.write_table(pa.table({"bin": big}), tmp_path / "big.parquet", row_group_size=20)
    monkeypatch.setattr(parquet_source, "BATCH_BYTES", 3000)
    sizes = []
    real = pq.ParquetFile.iter_batches
    monkeypatch.setattr(pq.ParquetFile, "iter_batches",
                        lambda self, *a, **kw: (sizes.append(kw["batch_size"]) or
                                                real(self, *a, **kw)))
    assert len(list(ParquetSource(tmp_path / "big.parquet"))) == len(big)
    assert sizes and sizes[0] <= 3  # ~1 KB rows, 3 KB batches


# -- bad input -----------------------------------------------------------------------------

def convert_error(src, tmp_path, **kw) -> str:
    with pytest.raises(SourceError) as info:
        convert(src, tmp_path / "out", from_="parquet", workers=1, **kw)
    return str(info.value)


def test_not_parquet(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"this is not parquet at all")
    message = convert_error(tmp_path / "bad.parquet", tmp_path)
    assert "bad.parquet" in message and "not a readable Parquet file" in message
    assert "\n" not in message
    assert not (tmp_path / "out" / fmt.MANIFEST_NAME).exists()


def test_empty_folder(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "notes.txt").write_text("x")
    assert "no .parquet files" in convert_error(tmp_path / "src", tmp_path)


@pytest.mark.parametrize("column, kind", [
    (pa.array([[b"a"], [b"b"]], pa.list_(pa.binary())), "list<"),
    (pa.array([1, 2], pa.duration("s")), "duration[s]"),
])
def test_unsupported_type(tmp_path, column, kind):
    pq.write_table(pa.table({"ok": ["x", "y"], "weird": column}), tmp_path / "t.parquet")
    message = convert_error(tmp_path / "t.parquet", tmp_path)
    assert "t.parquet" in message and "'weird'" in message and kind in message


def test_mixed_kinds_between_files(tmp_path):
    (tmp_path / "src").mkdir()
    pq.write_table(pa.table({"label": [1, 2]}), tmp_path / "src" / "a.parquet")
    pq.write_table(pa.table({"label": ["one"]}), tmp_path / "src" / "b.parquet")
    message = convert_error(tmp_path / "src", tmp_path)
    assert "b.parquet" in message and "a.parquet" in message and "'label'" in message
    assert "int" in message and "string" in message


def test_class_names_must_agree(tmp_path):
    (tmp_path / "src").mkdir()
    img = [{"bytes": image_bytes("red"), "path": None}]
    hf_dataset(img, [0], ["cat", "dog"]).to_parquet(str(tmp_path / "src" / "a.parquet"))
    hf_dataset(img, [0], ["dog", "cat"]).to_parquet(str(tmp_path / "src" / "b.parquet"))
    message = convert_error(tmp_path / "src", tmp_path)
    assert "b.parquet" in message and "class names differ" in message


def test_null_key_and_path_only_image(tmp_path):
    file_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({
        "__key__": ["a", None, "c", "d"],
        "img": pa.array([{"bytes": image_bytes("red"), "path": None},
                         {"bytes": image_bytes("red"), "path": None},
                         {"bytes": None, "path": "/elsewhere/c.jpg"},
                         {"bytes": image_bytes("red", "JPEG"), "path": None}], file_type),
    })
    pq.write_table(table, tmp_path / "t.parquet")
    message = convert_error(tmp_path / "t.parquet", tmp_path)
    assert "t.parquet: row 1" in message and "null" in message
    summary = convert(tmp_path / "t.parquet", tmp_path / "out2", from_="parquet", workers=1,
                      on_error="skip")
    assert summary.samples == 2 and summary.skipped == {"bad-key": 1, "no-bytes": 1}
    assert any("row 2" in s and "only a path" in s for s in summary.first_skips)
    assert [s["__key__"] for s in samples_of(tmp_path / "out2")] == ["a", "d"]


def test_field_name_clash(tmp_path):
    pq.write_table(pa.table({"seq": [[1]], "seq.json": [b"[1]"]}), tmp_path / "t.parquet")
    message = convert_error(tmp_path / "t.parquet", tmp_path)
    assert "'seq'" in message and "'seq.json'" in message


def test_bad_key_column(tmp_path):
    pq.write_table(pa.table({"__key__": [1.5], "x": [b"1"]}), tmp_path / "t.parquet")
    message = convert_error(tmp_path / "t.parquet", tmp_path)
    assert "key column '__key__'" in message and "double" in message


def test_remote_source_through_fsspec(tmp_path):
    """SRC read through the storage layer (an fsspec memory filesystem stands for S3/HTTP)."""
    import fsspec

    fs = fsspec.filesystem("memory")
    blobs = [b"one", b"two", b"three"]
    buf = io.BytesIO()
    pq.write_table(pa.table({"bin": blobs}), buf, row_group_size=1)
    with fs.open("/shardpack-test/ds/data/train-00000-of-00001.parquet", "wb") as f:
        f.write(buf.getvalue())
    try:
        convert("memory://shardpack-test/ds", tmp_path / "out", from_="parquet", workers=1)
    finally:
        fs.rm("/shardpack-test", recursive=True)
    assert [s["bin"] for s in samples_of(tmp_path / "out")] == blobs


def test_shards_do_not_split_row_groups_when_avoidable(tmp_path):
    """A row group is read whole by a shard writer: the planner ends a shard before a group
    that would not fit (once the shard is half full), so no group is decoded by two writers."""
    blobs = [bytes([i % 251]) * 1000 for i in range(60)]
    pq.write_table(pa.table({"__key__": [f"k{i:03d}" for i in range(60)], "bin": blobs}),
                   tmp_path / "g.parquet", row_group_size=10)  # 6 groups of ~10 KB
    out = tmp_path / "out"
    convert(tmp_path / "g.parquet", out, workers=1, shard_size="30KB", shard_format="msgpack")
    manifest = json.loads((out / fmt.MANIFEST_NAME).read_text())
    # without the rule: 30 KB shards of ~1.2 KB (estimated) samples cut groups at 24; with it,
    # every shard holds whole groups
    assert [s["samples"] for s in manifest["shards"]] == [20, 20, 20]
    assert [bytes(s["bin"]) for s in open_reader(out)] == blobs


def test_writer_reads_cells_in_small_batches_in_any_order(tmp_path, monkeypatch):
    """The shard writer decodes a row group in batches of about ParquetCells.BATCH_BYTES, walking
    forward, and still serves rows asked for out of order (it restarts the group), across row
    groups and struct columns."""
    from shardpack.write.samples import SourceField
    from shardpack.interop.sources.parquet import ParquetCells

    blobs = [bytes([i]) * 1000 for i in range(30)]
    pq.write_table(pa.table({"bin": blobs, "img": [{"bytes": b[:10]} for b in blobs]}),
                   tmp_path / "s.parquet", row_group_size=10)
    url = str(tmp_path / "s.parquet")
    monkeypatch.setattr(ParquetCells, "BATCH_BYTES", 2500)  # ~2 rows of ~1 KB
    pulled = count_batches(monkeypatch)
    order = [0, 1, 5, 9, 3, 12, 29, 28, 10]

    def cell(row, column):
        return SourceField("x", url, 1000, 0, offset=row, column=column, reader=ParquetCells)

    fields = [f for row in order for f in (cell(row, ("bin",)), cell(row, ("img", "bytes")))]
    reader = ParquetCells(fields)
    got = [bytes(reader.read(f)) for f in fields]
    assert got == [v for row in order for v in (blobs[row], blobs[row][:10])]
    assert pulled and max(pulled) <= 3   # never a whole 10-row group at once
    with pytest.raises(SourceError, match="past the end"):
        reader.read(cell(30, ("bin",)))


# -- image columns as one field, --label-column ---------------------------------------------

def test_image_column_is_one_field_whatever_each_row_holds(tmp_path):
    """An HF Image column whose rows hold JPEG, PNG and WebP (paths that disagree with the
    bytes, or none) is one field named after the column (``.image`` added when the name is no
    image field name); every cell byte for byte, read by the shard writers in two processes
    across several shards."""
    import datasets

    kinds = ["JPEG", "PNG", "WEBP"]
    blobs = [image_bytes((i * 8, 255 - i, 90), kinds[i % 3], size=(5 + i % 4, 6))
             for i in range(30)]
    paths = [None, "a/b.JPEG", "c.gif", "d"]  # ignored: neither names nor splits the field
    photos = [image_bytes((0, i * 8, 0), kinds[(i + 1) % 3]) for i in range(30)]
    features = datasets.Features({"image": datasets.Image(), "photo": datasets.Image(),
                                  "label": datasets.ClassLabel(names=["a", "b", "c"])})
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": paths[i % 4]} for i, b in enumerate(blobs)],
         "photo": [{"bytes": b, "path": None} for b in photos],
         "label": [i % 3 for i in range(30)]}, features=features)
    ds.to_parquet(str(tmp_path / "hf.parquet"))
    out = tmp_path / "out"
    summary = convert(tmp_path / "hf.parquet", out, workers=2, max_samples=7)
    assert summary.samples == 30 and summary.shards == 5
    assert summary.fields == ["cls", "image", "photo.image"]
    got = samples_of(out)
    assert all(sorted(s) == ["__key__", "cls", "image", "photo.image"] for s in got)
    assert [bytes(s["image"]) for s in got] == blobs
    assert [bytes(s["photo.image"]) for s in got] == photos
    assert {bytes(s["image"])[:4] for s in got} == {b"\xff\xd8\xff\xe0", b"\x89PNG", b"RIFF"}
    assert [s["cls"] for s in got] == [str(i % 3).encode() for i in range(30)]
    assert not summary.notes
    # a {bytes, path} struct without a Hugging Face feature keeps its name, with a note unless
    # readers take that name for an image field
    file_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    pq.write_table(pa.table({"img": pa.array([{"bytes": blobs[0], "path": "x.png"}], file_type),
                             "pic": pa.array([{"bytes": blobs[1], "path": None}], file_type)}),
                   tmp_path / "plain.parquet")
    summary = convert(tmp_path / "plain.parquet", tmp_path / "plain", workers=1)
    [one] = samples_of(tmp_path / "plain")
    assert (one["img"], one["pic"]) == (blobs[0], blobs[1]) and summary.fields == ["img", "pic"]
    assert len(summary.notes) == 1 and "'pic'" in summary.notes[0]
    assert "field='pic'" in summary.notes[0]


def test_label_column_integers(tmp_path):
    jpgs = [image_bytes(c, "JPEG") for c in ("red", "green", "blue", "white")]
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"__key__": ["k0", "k1", "k2", "k3"], "jpg": jpgs,
                             "label": pa.array([3, 0, 7, -1], pa.int16())}), src)
    # without the option the column keeps its name, and a note suggests the option
    summary = convert(src, tmp_path / "plain", workers=1)
    got = samples_of(tmp_path / "plain")
    assert [s["label"] for s in got] == [b"3", b"0", b"7", b"-1"]
    assert not any("cls" in s for s in got)
    assert any("pass --label-column label" in n for n in summary.notes)
    summary = convert(src, tmp_path / "out", workers=1, label_column="label")
    got = samples_of(tmp_path / "out")
    assert [s["cls"] for s in got] == [b"3", b"0", b"7", b"-1"]
    assert [s["jpg"] for s in got] == jpgs
    assert summary.fields == ["cls", "jpg"]
    assert manifest_of(tmp_path / "out")["classes"] is None
    assert not any("--label-column" in n for n in summary.notes)
    # the CLI passes it through
    run_cli("convert", src, tmp_path / "cli", "--label-column", "label", "-q")
    assert [s["cls"] for s in samples_of(tmp_path / "cli")] == [b"3", b"0", b"7", b"-1"]


def test_label_column_strings(tmp_path, monkeypatch):
    """String labels: classes = the sorted distinct values of the whole source (read up front,
    that column alone), cls = the index; a class seen only in a later file still counts."""
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"bin": [b"a", b"b", b"c"], "species": ["emu", "cat", "emu"]}),
                   src / "a.parquet")
    pq.write_table(pa.table({"bin": [b"d", b"e"],
                             "species": pa.array(["dog", "ant"]).dictionary_encode()}),
                   src / "b.parquet")
    asked = []
    real = pq.ParquetFile.iter_batches
    monkeypatch.setattr(pq.ParquetFile, "iter_batches",
                        lambda self, *a, **kw: (asked.append(kw.get("columns")) or
                                                real(self, *a, **kw)))
    summary = convert(src, tmp_path / "out", workers=1, label_column="species")
    assert asked[:2] == [["species"], ["species"]]  # both files' labels before any row
    got = samples_of(tmp_path / "out")
    assert [s["cls"] for s in got] == [b"3", b"1", b"3", b"2", b"0"]
    assert [s["bin"] for s in got] == [b"a", b"b", b"c", b"d", b"e"]
    assert all("species" not in s for s in got)
    assert summary.classes == ["ant", "cat", "dog", "emu"]
    assert manifest_of(tmp_path / "out")["classes"] == ["ant", "cat", "dog", "emu"]


def test_label_column_errors(tmp_path):
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"bin": [b"a", b"b", b"c"], "y": ["p", None, "q"],
                             "score": [0.5, 1.0, 2.0]}), src)
    missing = convert_error(src, tmp_path / "e1", label_column="lable")
    assert "\n" not in missing and "t.parquet" in missing
    assert "--label-column 'lable': no such column" in missing and "bin, y, score" in missing
    typed = convert_error(src, tmp_path / "e2", label_column="score")
    assert "'score'" in typed and "double" in typed and "\n" not in typed
    null = convert_error(src, tmp_path / "e3", label_column="y")
    assert "\n" not in null and "t.parquet: row 1" in null and "label column 'y' is null" in null
    summary = convert(src, tmp_path / "skip", workers=1, label_column="y", on_error="skip")
    assert summary.samples == 2 and summary.skipped == {"no-label": 1}
    assert [s["cls"] for s in samples_of(tmp_path / "skip")] == [b"0", b"1"]
    assert summary.classes == ["p", "q"]
    # a ClassLabel column already becomes `cls`: naming another column is refused
    hf = tmp_path / "hf.parquet"
    hf_dataset([{"bytes": image_bytes("red"), "path": None}] * 2, [1, 0],
               ["cat", "dog"]).to_parquet(str(hf))
    both = convert_error(hf, tmp_path / "e4", label_column="text")
    assert "\n" not in both and "hf.parquet" in both
    assert "'text'" in both and "ClassLabel column 'label'" in both
    assert "image, label, text" in both
    # naming the ClassLabel column itself is the same as not naming one
    summary = convert(hf, tmp_path / "same", workers=1, label_column="label")
    assert summary.classes == ["cat", "dog"]
    assert [s["cls"] for s in samples_of(tmp_path / "same")] == [b"1", b"0"]


def test_label_column_only_for_parquet(tmp_path):
    import tarfile

    make_tree(tmp_path / "folders", {"cat/1.jpg": b"a", "dog/2.jpg": b"b"})
    bad = run_cli("convert", tmp_path / "folders", tmp_path / "out", "--label-column", "label",
                  ok=None)
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1
    assert "--label-column is only for Parquet, CSV and JSONL sources (this source is " \
        "imagefolder)" in bad.output
    assert not (tmp_path / "out").exists()
    with tarfile.open(tmp_path / "w.tar", "w") as tar:
        info = tarfile.TarInfo("a.jpg")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(SourceError, match="only for Parquet, CSV and JSONL sources.*webdataset"):
        convert(tmp_path / "w.tar", tmp_path / "o2", workers=1, label_column="cls")
    assert "--label-column" in run_cli("convert", "--help").output
