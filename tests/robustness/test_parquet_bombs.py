"""Parquet files whose cells decode to far more than the file holds (one large value repeated
by a dictionary-encoded column, metadata claiming huge uncompressed pages): ``convert`` refuses
them in one line naming the file, row group and column, in bounded memory (a child process
under an address-space limit, its peak RSS measured), and converts repeated values within the
expansion cap exactly (docs/convert.md, "Parquet", "Expansion")."""

from __future__ import annotations

import os
import resource

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardpack import format as fmt
from shardpack.core.errors import SourceError
from shardpack.interop.convert import convert
from shardpack.interop.sources import parquet_bounds
from shardpack.interop.sources.parquet import ParquetSource
from shardpack.read.reader import open_reader

from testbed.helpers import peak_rss

MIB = 1 << 20
AS_LIMIT = 2 << 30   # the child's address space: pyarrow and shardpack fit in it with room
RSS_LIMIT = 600 * MIB


def _repeated(rows: int, value, nulls: bool = False) -> pa.DictionaryArray:
    """``rows`` references to the one dictionary entry ``value`` (the last one null when
    ``nulls``)."""
    indices = [0] * rows
    if nulls:
        indices[-1] = None
    kind = pa.string() if isinstance(value, str) else pa.binary()
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array([value], kind))


def _bomb(path, case: str, rows: int, size: int = MIB):
    """A Parquet file of ``rows`` rows that all refer to one ``size``-byte value."""
    store, groups = True, None
    if case == "arrow-dictionary":  # the column's Arrow type is stored: pyarrow reads a dictionary
        table = pa.table({"data": _repeated(rows, b"\0" * size)})
    elif case == "plain-read":      # no Arrow schema stored: pyarrow decodes the values per row
        table, store = pa.table({"data": _repeated(rows, b"\0" * size)}), False
    elif case == "string":
        table = pa.table({"txt": _repeated(rows, "a" * size)})
    elif case == "image-struct":
        table = pa.table({"image": pa.StructArray.from_arrays(
            [_repeated(rows, b"\0" * size), pa.array(["x.png"] * rows)], ["bytes", "path"])})
    elif case == "nulls":
        table = pa.table({"data": _repeated(rows, b"\0" * size, nulls=True)})
    elif case == "list":            # one row whose list refers to the value ``rows`` times
        offsets = pa.array([0, rows], pa.int32())
        table = pa.table({"tags": pa.ListArray.from_arrays(offsets, _repeated(rows, "t" * size))})
    elif case == "image-path":      # the path beside the bytes
        table = pa.table({"image": pa.StructArray.from_arrays(
            [pa.array([b"x"] * rows), _repeated(rows, "p" * size)], ["bytes", "path"])})
    elif case == "row-groups":
        table, groups = pa.table({"data": _repeated(rows, b"\0" * size)}), 100
    pq.write_table(table, path, compression="zstd", store_schema=store, row_group_size=groups)
    return path


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def _convert_limited(src, out, tmp_path) -> tuple[int, str, int]:
    """(exit status, stderr, peak RSS in bytes) of ``shardpack convert`` in a child process
    whose address space is limited to AS_LIMIT."""
    result, peak = peak_rss("convert", src, out, "--workers", "1", preexec_fn=_limited)
    return result.returncode, result.stderr, peak if peak is not None else 1 << 62


@pytest.mark.parametrize("case, rows, where", [
    ("arrow-dictionary", 20_000, "row group 0 column 'data'"),  # 20 GB of cells
    ("arrow-dictionary", 2_000, "row group 0 column 'data'"),   # 2 GB
    ("plain-read", 20_000, "row group 0 column 'data'"),
    ("string", 2_000, "row group 0 column 'txt'"),
    ("image-struct", 2_000, "row group 0 column 'image.bytes'"),
    ("nulls", 2_000, "row group 0 column 'data'"),
    ("list", 2_000, "row group 0 column 'tags.list.element'"),
    ("image-path", 2_000, "row group 0 column 'image.path'"),
    ("row-groups", 20_000, "column 'data'"),
])
def test_a_dictionary_bomb_is_refused_in_one_line_in_bounded_memory(tmp_path, case, rows,
                                                                     where):
    src = _bomb(tmp_path / "bomb.parquet", case, rows)
    assert src.stat().st_size < 50_000
    rc, err, peak = _convert_limited(src, tmp_path / "out", tmp_path)
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"shardpack: error: {src}: "), lines[0]
    assert where in lines[0] and "refused (at most 1024x" in lines[0], lines[0]
    assert "Traceback" not in err and "MemoryError" not in err
    assert peak < RSS_LIMIT, peak
    assert not (tmp_path / "out" / fmt.MANIFEST_NAME).exists()


def test_metadata_claiming_too_much_is_refused_before_reading(tmp_path, monkeypatch):
    """A chunk whose metadata claims more uncompressed bytes than the cap for its compressed
    bytes is refused from the metadata alone (here a plain column of zeros, the floor lowered
    so a small file shows it)."""
    monkeypatch.setattr(parquet_bounds, "EXPANSION_FLOOR", MIB)
    src = tmp_path / "zeros.parquet"
    pq.write_table(pa.table({"data": pa.array([b"\0" * (4 * MIB)])}), src,
                   compression="zstd", use_dictionary=False)
    read = []
    monkeypatch.setattr(pq.ParquetFile, "iter_batches",
                        lambda *a, **kw: read.append(1) or iter(()))
    with pytest.raises(SourceError) as info:
        convert(src, tmp_path / "out", workers=1)
    message = str(info.value)
    claim = pq.ParquetFile(src).metadata.row_group(0).column(0).total_uncompressed_size
    assert message.startswith(f"{src}: row group 0 column 'data' claims {claim} "
                              "uncompressed bytes for"), message
    assert "refused" in message and "\n" not in message and not read


def test_repeated_values_within_the_cap_are_measured_and_converted(tmp_path, monkeypatch):
    """A column that repeats each of a few values in many rows (a question per row, one image
    for many) is a valid dataset: when its worst case could pass the cap it is measured
    exactly (the plan cuts shards by the real sizes, not the metadata's), then converted
    byte for byte."""
    monkeypatch.setattr(parquet_bounds, "EXPANSION_FLOOR", MIB)
    values = [os.urandom(10_000) for _ in range(10)]
    rows = 2_000
    data = pa.DictionaryArray.from_arrays(pa.array([i % 10 for i in range(rows)], pa.int32()),
                                          pa.array(values, pa.binary()))
    src = tmp_path / "repeated.parquet"
    pq.write_table(pa.table({"__key__": [f"k{i:05d}" for i in range(rows)], "data": data}), src)
    sizes = {f.size for s in ParquetSource(src) for f in s.fields}
    assert sizes == {10_000}  # measured: the metadata estimate would be ~50 bytes a row
    out = tmp_path / "out"
    summary = convert(src, out, workers=1, shard_size="2MB")
    assert summary.samples == rows and summary.shards >= 10
    got = {s["__key__"]: bytes(s["data"]) for s in open_reader(out)}
    assert got == {f"k{i:05d}": values[i % 10] for i in range(rows)}


def test_a_list_leaf_is_measured_by_its_values(tmp_path, monkeypatch):
    """A dictionary leaf inside a list column (a JSON field) counts every value of every
    list: measured with the dictionary kept, its total is exact."""
    monkeypatch.setattr(parquet_bounds, "EXPANSION_FLOOR", MIB)
    words = [os.urandom(5_000).hex() for _ in range(4)]  # 10,000 bytes each
    refs = pa.DictionaryArray.from_arrays(pa.array([i % 4 for i in range(3_000)], pa.int32()),
                                          pa.array(words))
    tags = pa.ListArray.from_arrays(pa.array(range(0, 3_001, 3), pa.int32()), refs)
    src = tmp_path / "tags.parquet"
    pq.write_table(pa.table({"tags": tags}), src)
    pf = pq.ParquetFile(src)
    meta = pf.metadata
    leaves = parquet_bounds.read_leaves(meta, ["tags"])
    assert leaves == {"tags.list.element": "tags"}
    expansion = parquet_bounds.Expansion(meta, str(src))
    pf_dict = pq.ParquetFile(src, read_dictionary=list(leaves))
    measured = parquet_bounds.measure(pf_dict, meta, leaves, expansion, None)
    assert measured == {}  # three values a row: no per-row lengths
    assert expansion.total == 3_000 * 10_000  # exact, where the worst case is past the cap
    assert 3_000 * meta.row_group(0).column(0).total_uncompressed_size > expansion.cap
    summary = convert(src, tmp_path / "out", workers=1)
    assert summary.samples == 1_000


def test_the_same_file_past_the_cap_is_refused_naming_the_group(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_bounds, "EXPANSION_FLOOR", MIB)
    monkeypatch.setattr(parquet_bounds, "MAX_EXPANSION", 4)
    values = [os.urandom(10_000) for _ in range(10)]
    data = pa.DictionaryArray.from_arrays(pa.array([i % 10 for i in range(2_000)], pa.int32()),
                                          pa.array(values, pa.binary()))
    src = tmp_path / "repeated.parquet"
    pq.write_table(pa.table({"data": data}), src, row_group_size=500)
    with pytest.raises(SourceError) as info:
        convert(src, tmp_path / "out", workers=1)
    assert "row group 0 column 'data': the cells decode to more than" in str(info.value)


def test_dictionary_cells_are_slices_of_one_stored_value():
    """The shard writer's cells of a dictionary array refer to the dictionary's buffer: a value
    repeated in every row is never copied out per row."""
    array = _repeated(1_000, b"x" * 1_000)
    cells = parquet_bounds.cells(array)
    assert bytes(cells[0]) == bytes(cells[999]) == b"x" * 1_000
    assert cells[0].obj is cells[999].obj  # one buffer
    with_null = parquet_bounds.cells(_repeated(1_000, b"y" * 1_000, nulls=True))
    assert with_null[0] is with_null[998] and with_null[999] is None


def test_string_labels_repeated_past_the_cap_are_read_once(tmp_path):
    """``--label-column`` reads a string column up front: a repeated 1 MiB label costs its
    dictionary, not one copy per row (then the file is refused by the cap)."""
    src = tmp_path / "labels.parquet"
    pq.write_table(pa.table({"y": _repeated(20_000, "c" * MIB),
                             "data": pa.array([b"d"] * 20_000)}), src, compression="zstd")
    source = ParquetSource(src, label_column="y")
    with pytest.raises(SourceError) as info:
        list(source)
    assert source.report.classes == ["c" * MIB]
    assert "row group 0 column 'y'" in str(info.value)
