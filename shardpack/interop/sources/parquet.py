"""Parquet files (Hugging Face ``datasets`` exports included) -> samples.

SRC is one ``.parquet`` file or a folder searched recursively (``data/train-00000-of-00002.parquet``
and the like), files sorted by path; names with a part starting with '.' or '_' are skipped like
pyarrow skips them (counted as hidden).  Files are read through the storage layer in record
batches of about BATCH_BYTES, so memory holds one row group's pages and one batch, never a table.
Binary cells (and the bytes of Image structs) are not copied here: fields refer to (file, column,
row) and the shard writers read them in small record batches (:class:`ParquetCells`).

One row = one sample; column rules (docs/convert.md):

* ``__key__`` (else ``key``) is the sample key: string, or integer as decimal text; without one,
  keys are the sample's position (``0000000000``, ...);
* other columns starting with ``__`` (``__url__``, ``__index_level_0__``) are skipped, with a note;
* binary -> the bytes, field = column name;
* a ``{bytes, path}`` struct (a ``datasets`` Image or Audio feature) -> the bytes, one field per
  column whatever format each row holds: the column name (``image``, ``img``, ``jpg``,
  ``seg.png``), except that a Hugging Face ``Image`` column whose name is no image field name
  gets ``.image`` (``photo`` -> ``photo.image``) so readers find it.  A struct without a feature
  keeps its name (with a note unless it is an image field name).  A value with a path but no
  bytes is a bad sample;
* the one ``ClassLabel`` column of the Hugging Face features -> field ``cls`` (ASCII decimal), its
  names -> the manifest's ``classes`` (also read from ``shardpack`` schema metadata, which
  ``shardpack export --to parquet`` writes);
* ``label_column`` (``--label-column``) -> field ``cls``: integers as ASCII decimal; strings as
  the index of the value among the sorted distinct values of the whole source (read up front,
  that column only), which become the manifest's ``classes``.  A null label is a bad sample;
  without the option a plain ``label``/``labels`` column keeps its name, with a note;
* integers -> ASCII decimal; strings -> UTF-8; floats -> shortest round-trip text (``0.1``,
  ``nan``); booleans -> ``true``/``false``; decimals -> text; dates and times -> ISO 8601;
* lists, structs and maps -> compact JSON, field ``<column>.json``; ones holding binary data are
  refused (a field is one flat byte string);
* a null is a missing field for that sample;
* any other type, or a column whose kind differs between files, is a :class:`SourceError` naming
  the file, column and type.  Metadata without a place in the manifest is reported as notes.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator

from shardpack.core.errors import SourceError
from shardpack.storage import storage_options_by_keyword
from shardpack.write.fields import FieldReader, open_container
from shardpack.write.samples import SourceField
from shardpack.interop.sources.base import ContainerSource, inline
from shardpack.interop.sources.parquet_bounds import (Expansion, cells, check_claims,
                                                      dictionary_chunks, distinct_values,
                                                      index_in, lengths, measure, read_leaves,
                                                      struct_field)
from shardpack.interop.sources.parquet_schema import ENCODERS, plan_columns

BATCH_BYTES = 16 << 20   # target uncompressed bytes of one record batch
MAX_BATCH_ROWS = 1024
BUFFER_SIZE = 1 << 20    # pyarrow reads column chunks page by page through a buffer this size
_SPLIT_FILE = re.compile(r"(?:^|/)([\w.]+?)-\d+-of-\d+\.parquet$")


def import_pyarrow():
    """``(pyarrow, pyarrow.parquet)``, imported with shardpack's allocator setting (below) when
    this process imports pyarrow first; a SourceError with an install hint when it is missing."""
    if "pyarrow" not in sys.modules:
        # pyarrow's allocator (mimalloc) hands freed memory back to the OS soon after, and the
        # shard writers decode batch after batch, faulting in and zeroing fresh pages each time:
        # keep freed memory instead (docs/benchmarks.md, "Converting").  A user's own setting
        # wins.
        os.environ.setdefault("MIMALLOC_PURGE_DELAY", "-1")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise SourceError("--from parquet needs pyarrow",
                          hint="pip install 'shardpack[parquet]'") from None
    return pa, pq


def _open(pq, f, shown: str):
    """(ParquetFile, Arrow schema) of an open file, or a :class:`SourceError`."""
    import pyarrow as pa

    try:
        pf = pq.ParquetFile(f, buffer_size=BUFFER_SIZE)
        return pf, pf.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise SourceError(f"not a readable Parquet file: {exc}", path=shown) from None


class ParquetSource(ContainerSource):
    """Parquet files (one, or a folder of them, sub-folders included): one sample per row,
    one field per column (see the module docstring).

    Args:
        src: the file, folder or URL.
        label_column: a column that becomes the ``cls`` field (``--label-column``).
        **kwargs: :class:`~shardpack.interop.sources.base.ContainerSource`'s arguments.
    """

    format = "parquet"
    suffixes = (".parquet",)

    def __init__(self, src, *, label_column: str | None = None, **kwargs):
        """``label_column``: a column that becomes the ``cls`` field (``--label-column``)."""
        super().__init__(src, **kwargs)
        self.label_column = label_column
        self._class_names = None  # pa.array of the sorted string labels, once read

    def files(self, suffixes=None) -> list[str]:
        """Names of the source's Parquet files, sorted, sub-folders included (hidden ones and
        names starting with '_' are left out and counted).

        Args:
            suffixes: unused (always ``.parquet``).
        """
        if self.single is not None:
            return [self.single] if self.source_file(self.single) else []
        root = self.storage.root.rstrip("/")
        try:
            found = self.storage.fs.find(root)
        except Exception as exc:  # noqa: BLE001 - one clear line instead of a client traceback
            raise SourceError(f"cannot list the source: {type(exc).__name__}: {exc}",
                              path=self.src) from None
        names = []
        for path in found:
            rel = path[len(root) + 1:] if path.startswith(root + "/") else path
            if not rel.endswith(".parquet"):
                continue
            if any(part.startswith((".", "_")) for part in rel.split("/")):
                self.report.hidden += 1
                continue
            names.append(rel)
        if not names:
            raise SourceError("no .parquet files found (searched sub-folders too)",
                              path=self.src, hint="check SRC and --from")
        return [n for n in sorted(names) if self.source_file(n)]

    def samples(self) -> Iterator[tuple[str | None, list[SourceField], str]]:
        """``(key or None, fields, where[, block bytes])`` of each row of each file; a row
        group's first row carries the group's estimated bytes."""
        pq = import_pyarrow()[1]
        names = self.files()
        splits = sorted({m.group(1) for n in names if (m := _SPLIT_FILE.search(n))})
        if len(splits) > 1:
            self.note(f"the source holds several splits ({', '.join(splits)}); they were all "
                      "converted into one dataset (convert each split's files on their own to "
                      "keep them apart)")
        kinds: dict[str, tuple[str, str]] = {}  # column -> (kind, first file that had it)
        first_classes: tuple[list[str], str] | None = None
        if self.label_column is not None:
            first_classes = self._label_classes(names)
        for name in names:
            shown = self.storage.display(name)
            with self.storage.open_arrow(name) as f:
                pf, schema = _open(pq, f, shown)
                columns, key_col, classes = plan_columns(schema, shown, self.note,
                                                         self.label_column)
                for col, kind, _ in columns:
                    seen = kinds.setdefault(col, (kind, shown))
                    if seen[0] != kind:
                        raise SourceError(f"column {col!r} is {kind} here but {seen[0]} in "
                                          f"{seen[1]}: one column must hold one kind of value",
                                          path=shown)
                if classes is not None:
                    if first_classes is None:
                        first_classes = (classes, shown)
                        self.report.classes = list(classes)
                    elif classes != first_classes[0]:
                        raise SourceError(f"class names differ from those of {first_classes[1]}",
                                          path=shown)
                if not columns:
                    raise SourceError("no column can become a field", path=shown)
                yield from self._rows(pf, columns, key_col, shown, name, f)

    def _label_classes(self, names: list[str]) -> tuple[list[str], str] | None:
        """Before any row: check ``label_column`` in every file (an error names the first file
        where it cannot be the label), and for a string column read that column alone from every
        file: the sorted distinct values are the class names.  Returns (class names, file) of a
        ClassLabel label, for the main pass to compare each file's with, else None."""
        pa, pq = import_pyarrow()

        col = self.label_column
        values: set = set()
        first_kind: tuple[str, str] | None = None
        named: tuple[list[str], str] | None = None
        for name in names:
            shown = self.storage.display(name)
            with self.storage.open_arrow(name) as f:
                pf, schema = _open(pq, f, shown)
                columns, _, classes = plan_columns(schema, shown, lambda _: None, col)
                kind = next(k for c, k, _ in columns if c == col)
                first_kind = first_kind or (kind, shown)
                if kind != first_kind[0]:
                    what = {"label": "integers", "classname": "strings"}
                    raise SourceError(f"label column {col!r} holds {what[kind]} here but "
                                      f"{what[first_kind[0]]} in {first_kind[1]}", path=shown)
                if kind == "label":
                    if classes is not None and named is None:
                        named = (classes, shown)
                    continue
                check_claims(pf.metadata, shown)
                # read with its dictionary kept, a row group at a time: a value repeated in
                # many rows is made once (a dictionary chunk decoded whole could be a bomb)
                pf = pq.ParquetFile(f, metadata=pf.metadata, buffer_size=BUFFER_SIZE,
                                    read_dictionary=[col])
                try:
                    for g in range(pf.metadata.num_row_groups):
                        table = pf.read_row_group(g, columns=[col], use_threads=False)
                        for chunk in table.column(0).chunks:
                            values.update(distinct_values(chunk))
                except (pa.ArrowException, OSError, ValueError, MemoryError) as exc:
                    raise SourceError(f"cannot read label column {col!r}: {exc}",
                                      path=shown) from None
        if first_kind and first_kind[0] == "classname":
            values.discard(None)
            self.report.classes = sorted(values)
            self._class_names = pa.array(self.report.classes, pa.string())
            return None
        if named is not None:
            self.report.classes = list(named[0])
        return named

    def _rows(self, pf, columns, key_col, shown, name, f):
        """The file's samples, one record batch at a time.  Binary and ``{bytes, path}`` cells
        are not copied out here: only their lengths are taken, and the fields refer to (file,
        column, row) for the shard writers to read."""
        pa = import_pyarrow()[0]
        import pyarrow.compute as pc

        url, mtime = self.url(name), self.mtime_ns(name)
        estimated, wanted, rows = _read_plan(pf, f, columns, key_col, shown)
        blocks = _row_group_starts(pf.metadata)  # first row of each row group -> its bytes
        batches = pf.iter_batches(batch_size=rows, columns=wanted, use_threads=False)
        row = 0
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError, ValueError, MemoryError) as exc:
                raise SourceError(f"cannot read the rows after row {row}: {exc}",
                                  path=shown) from None
            if batch is None:
                return
            keys = batch.column(key_col).to_pylist() if key_col else None
            count = batch.num_rows
            values = self._column_values(batch, columns, estimated, row, pa, pc)
            del batch
            for i in range(count):
                where = f"{shown}: row {row + i}"
                key = None
                if keys is not None:
                    key = keys[i]
                    if key is None:
                        self.bad(where, f"sample key column {key_col!r} is null", "bad-key")
                        continue
                    key = str(key)
                fields = self._row_fields(values, i, row + i, url, mtime, where)
                if fields is not None:
                    yield key, fields, where, blocks.get(row + i, 0)
            row += count

    def _column_values(self, batch, columns, estimated, row, pa, pc) -> list[tuple]:
        """``(column, kind, field, per-row values, extra)`` of each column for one record batch
        (starting at ``row``): lengths for binary and ``{bytes, path}`` cells (then ``extra`` is
        ``(paths, valid)``), class indexes for class names, Python values otherwise."""
        values = []
        count = batch.num_rows
        for col, kind, field in columns:
            if col in estimated:
                values.append((col, kind, field, estimated[col][row:row + count], None))
                continue
            array = batch.column(col)
            if kind == "binary":
                values.append((col, kind, field, lengths(array), None))
            elif kind == "file":
                data = pc.struct_field(array, "bytes")
                paths = pc.struct_field(array, "path").to_pylist()
                valid = array.is_valid().to_pylist()
                values.append((col, kind, field, lengths(data), (paths, valid)))
            elif kind == "classname":  # a string label -> its index among the classes
                index = index_in(array, self._class_names)
                values.append((col, "label", field, index.to_pylist(), None))
            else:
                values.append((col, kind, field, array.to_pylist(), None))
        return values

    def _row_fields(self, values, i: int, row: int, url, mtime, where: str
                    ) -> list[SourceField] | None:
        """The fields of row ``i`` of the batch (``row`` in the file), or None when the row is
        left out (a null label, a file cell with a path but no bytes: counted as bad)."""
        fields = []
        for col, kind, field, data, extra in values:
            value = data[i]
            if kind == "binary":
                if value is not None:
                    fields.append(SourceField(field, url, value, mtime, None, row, (col,),
                                              ParquetCells))
                continue
            if kind != "file":
                if value is not None:
                    fields.append(inline(field, ENCODERS[kind](value)))
                elif col == self.label_column:
                    self.bad(where, f"label column {col!r} is null", "no-label")
                    return None
                continue
            paths, valid = extra
            if not valid[i]:
                continue
            if value is not None:
                fields.append(SourceField(field, url, value, mtime, None, row, (col, "bytes"),
                                          ParquetCells))
            elif paths[i] is not None:
                self.bad(where, f"column {col!r} holds only a path "
                                f"({paths[i]!r}), not the file's bytes", "no-bytes")
                return None
        return fields


def _row_group_starts(meta) -> dict[int, int]:
    """First row of each row group -> the group's bytes (a hint for the planner)."""
    blocks, start = {}, 0
    for g in range(meta.num_row_groups):
        blocks[start] = meta.row_group(g).total_byte_size
        start += meta.row_group(g).num_rows
    return blocks


def _read_plan(pf, f, columns, key_col, shown) -> tuple[dict, list[str], int]:
    """``(estimated sizes, columns to read, rows per batch)`` of one open file, once its
    metadata claims are checked and what its cells decode to is counted against the expansion
    cap (``parquet_bounds``): batches are cut so that the largest measured cell of a column read
    here keeps a batch near BATCH_BYTES."""
    meta = pf.metadata
    check_claims(meta, shown)
    leaves = read_leaves(meta, [c for c, _, _ in columns] + ([key_col] if key_col else []))
    risky = dictionary_chunks(meta, leaves)
    pf_dict = None
    if risky:  # the same open file, read again with those leaves' dictionaries kept
        pq = import_pyarrow()[1]
        pf_dict = pq.ParquetFile(f, metadata=meta, buffer_size=BUFFER_SIZE,
                                 read_dictionary=list(risky))
    measured = measure(pf_dict, meta, leaves, Expansion(meta, shown),
                       lambda exc: SourceError(f"cannot read the file: {exc}", path=shown))
    estimated = _estimated_sizes(meta, [c for c in columns if c[1] == "binary"], measured)
    wanted = [c[0] for c in columns if c[0] not in estimated] + ([key_col] if key_col else [])
    largest = max((s or 0 for path, groups in measured.items() if leaves[path] in wanted
                   for sizes in groups.values() for s in sizes), default=0)
    row_bytes = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    rows = max(1, min(MAX_BATCH_ROWS, BATCH_BYTES * max(1, meta.num_rows) // max(1, row_bytes),
                      BATCH_BYTES // max(1, largest)))
    return estimated, wanted, rows


def _estimated_sizes(meta, binary_columns, measured) -> dict[str, list]:
    """For binary columns without nulls (the row groups' statistics say so), per-row sizes
    estimated from the metadata (each row group's uncompressed column bytes / rows), so this
    process need not read (decompress) the column at all: the shard writers read it once.  The
    plan only needs sizes to cut shards; the written bytes and counts are the real ones.  A
    dictionary chunk that was measured (``measured``: its exact lengths) may repeat values, so
    its sizes are the measured ones.  A column with nulls, or without statistics, is read here
    to know its exact rows."""
    index = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
    out = {}
    for col, _, _ in binary_columns:
        i = index.get(col)
        if i is None:
            continue
        sizes = []
        for g in range(meta.num_row_groups):
            chunk = meta.row_group(g).column(i)
            stats = chunk.statistics
            rows = meta.row_group(g).num_rows
            if g in measured.get(col, {}):
                sizes += measured[col][g]
                continue
            if stats is None or not stats.has_null_count or stats.null_count != 0:
                break
            per_row = max(0, chunk.total_uncompressed_size - 8 * rows) // max(1, rows)
            sizes += [per_row] * rows
        else:
            out[col] = sizes
    return out


class ParquetCells(FieldReader):
    """Reads Parquet cells this source deferred to the shard writer (``SourceField.column`` the
    column, ``offset`` the row), so the parent process never holds or pickles image bytes.  Rows
    are decoded in batches of about ``BATCH_BYTES``, every deferred column of the task at once,
    walking forward through a row group: small batches reuse the allocator's memory, where whole
    row groups had every forked writer zero fresh pages for each one (docs/benchmarks.md,
    "Converting")."""

    BATCH_BYTES = 2 << 20

    @storage_options_by_keyword
    def __init__(self, fields, *, storage_options: dict | None = None):
        super().__init__(fields, storage_options=storage_options)
        self.columns: dict[str, set] = {}
        self.largest: dict[str, int] = {}  # the largest cell of each file, as the plan says
        for f in fields:
            self.columns.setdefault(f.path, set()).add(f.column)
            self.largest[f.path] = max(self.largest.get(f.path, 0), f.size)
        self.files: dict[str, tuple] = {}
        self.path = None
        self.group = -1
        self.batches = iter(())
        self.first = self.stop = 0   # rows of the current batch
        self.values: dict = {}

    def read(self, f) -> bytes:
        """The cell's bytes, from the record batch that holds its row.

        Args:
            f: one of the fields this reader was opened on.
        """
        if f.path != self.path or not self.first <= f.offset < self.stop:
            self._load(f)
        data = self.values[f.column][f.offset - self.first]
        if data is None:  # (sizes may be estimates: see the module's docstring)
            raise SourceError(f"row {f.offset} of column {'.'.join(f.column)!r} is null, but "
                              "was not when it was indexed", path=f.path,
                              hint="convert again once the source is stable")
        return data

    @staticmethod
    def where(f) -> str:
        """The file, row and column of ``f``, for error messages.

        Args:
            f: a field.
        """
        return f"{f.path} row {f.offset} column {'.'.join(f.column)}"

    def _load(self, f) -> None:
        import bisect

        pa, pq = import_pyarrow()  # the allocator setting, when this process imports it first
        if f.path not in self.files:
            storage, name = open_container(f, storage_options=self.options)
            handle = storage.open_arrow(name)
            pf = pq.ParquetFile(handle)
            starts = [0]
            for i in range(pf.metadata.num_row_groups):
                starts.append(starts[-1] + pf.metadata.row_group(i).num_rows)
            self.files = {f.path: (pf, starts, handle)}  # one file open at a time
            self.path, self.group = None, -1
        pf, starts, _ = self.files[f.path]
        group = bisect.bisect_right(starts, f.offset) - 1
        if not 0 <= group < len(starts) - 1:
            raise SourceError(f"row {f.offset} is past the end of the file ({starts[-1]} rows)",
                              path=f.path)
        if f.path != self.path or group != self.group or f.offset < self.first:
            meta = pf.metadata.row_group(group)
            # the planned sizes count repeated dictionary values, the metadata does not
            rows = max(1, min(self.BATCH_BYTES * meta.num_rows // max(1, meta.total_byte_size),
                              self.BATCH_BYTES // max(1, self.largest[f.path])))
            top = sorted({c[0] for c in self.columns[f.path]})
            self.batches = pf.iter_batches(batch_size=rows, row_groups=[group], columns=top,
                                           use_threads=False)
            self.path, self.group = f.path, group
            self.first = self.stop = starts[group]
        while not self.first <= f.offset < self.stop:
            try:
                batch = next(self.batches, None)
            except (pa.ArrowException, OSError, ValueError, MemoryError) as exc:
                raise SourceError(f"cannot read row group {group}: {exc}", path=f.path) from None
            if batch is None:  # the file has fewer rows than its metadata says
                raise SourceError(f"row {f.offset} is missing from row group {group}",
                                  path=f.path, hint="convert again once the source is stable")
            self.values = {column: cells(struct_field(batch.column(column[0]), column[1:]))
                           for column in self.columns[f.path]}
            self.first, self.stop = self.stop, self.stop + batch.num_rows
