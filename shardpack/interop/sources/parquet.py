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

import json
import os
import re
import sys
from collections.abc import Iterator

from shardpack.core.errors import SourceError
from shardpack.write.fields import FieldReader, open_container
from shardpack.format import check_field_name
from shardpack.images.content import is_image_field
from shardpack.write.samples import SourceField
from shardpack.interop.sources.base import ContainerSource, inline

BATCH_BYTES = 16 << 20   # target uncompressed bytes of one record batch
MAX_BATCH_ROWS = 1024
BUFFER_SIZE = 1 << 20    # pyarrow reads column chunks page by page through a buffer this size
KEY_COLUMNS = ("__key__", "key")
LABEL_NAMES = ("label", "labels")  # plain columns that get a note suggesting --label-column
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
    format = "parquet"
    suffixes = (".parquet",)

    def __init__(self, src, *, label_column: str | None = None, **kwargs):
        """``label_column``: a column that becomes the ``cls`` field (``--label-column``)."""
        super().__init__(src, **kwargs)
        self.label_column = label_column
        self._class_names = None  # pa.array of the sorted string labels, once read

    def files(self, suffixes=None) -> list[str]:
        if self.single is not None:
            return [self.single]
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
        return sorted(names)

    def samples(self) -> Iterator[tuple[str | None, list[SourceField], str]]:
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
                yield from self._rows(pf, columns, key_col, shown, name)

    def _label_classes(self, names: list[str]) -> tuple[list[str], str] | None:
        """Before any row: check ``label_column`` in every file (an error names the first file
        where it cannot be the label), and for a string column read that column alone from every
        file: the sorted distinct values are the class names.  Returns (class names, file) of a
        ClassLabel label, for the main pass to compare each file's with, else None."""
        pa, pq = import_pyarrow()
        import pyarrow.compute as pc

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
                try:
                    for batch in pf.iter_batches(batch_size=1 << 16, columns=[col],
                                                 use_threads=False):
                        values.update(pc.unique(batch.column(0)).to_pylist())
                except (pa.ArrowException, OSError, ValueError) as exc:
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

    def _rows(self, pf, columns, key_col, shown, name):
        """The file's samples, one record batch at a time.  Binary and ``{bytes, path}`` cells
        are not copied out here: only their lengths are taken, and the fields refer to (file,
        column, row) for the shard writers to read."""
        pa = import_pyarrow()[0]
        import pyarrow.compute as pc

        url, mtime = self.url(name), self.mtime_ns(name)
        meta = pf.metadata
        estimated = _estimated_sizes(meta, [c for c in columns if c[1] == "binary"])
        blocks = _row_group_starts(meta)  # first row of each row group -> its bytes
        wanted = [c[0] for c in columns if c[0] not in estimated] + ([key_col] if key_col else [])
        row_bytes = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        rows = max(1, min(MAX_BATCH_ROWS, BATCH_BYTES * max(1, meta.num_rows)
                          // max(1, row_bytes)))
        batches = pf.iter_batches(batch_size=rows, columns=wanted, use_threads=False)
        row = 0
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError, ValueError) as exc:
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
                values.append((col, kind, field, pc.binary_length(array).to_pylist(), None))
            elif kind == "file":
                data = pc.struct_field(array, "bytes")
                paths = pc.struct_field(array, "path").to_pylist()
                valid = array.is_valid().to_pylist()
                values.append((col, kind, field, pc.binary_length(data).to_pylist(),
                               (paths, valid)))
            elif kind == "classname":  # a string label -> its index among the classes
                if pa.types.is_dictionary(array.type):
                    array = array.dictionary_decode()
                index = pc.index_in(array, value_set=self._class_names.cast(array.type))
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


def _estimated_sizes(meta, binary_columns) -> dict[str, list[int]]:
    """For binary columns without nulls (the row groups' statistics say so), per-row sizes
    estimated from the metadata (each row group's uncompressed column bytes / rows), so this
    process need not read (decompress) the column at all: the shard writers read it once.  The
    plan only needs sizes to cut shards; the written bytes and counts are the real ones.  A
    column with nulls, or without statistics, is read here to know its exact rows."""
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
            if stats is None or not stats.has_null_count or stats.null_count != 0:
                break
            per_row = max(0, chunk.total_uncompressed_size - 8 * rows) // max(1, rows)
            sizes += [per_row] * rows
        else:
            out[col] = sizes
    return out


def _json_default(value):
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)  # Decimal


ENCODERS = {
    "binary": bytes,
    "int": lambda v: str(int(v)).encode(),
    "label": lambda v: str(int(v)).encode(),
    "string": lambda v: v.encode("utf-8"),
    "float": lambda v: repr(float(v)).encode(),
    "bool": lambda v: b"true" if v else b"false",
    "decimal": lambda v: str(v).encode(),
    "time": lambda v: v.isoformat().encode(),
    "json": lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":"),
                                 default=_json_default).encode(),
}


def plan_columns(schema, shown: str, note, label_column: str | None = None
                 ) -> tuple[list[tuple[str, str, str]], str | None, list[str] | None]:
    """``([(column, kind, field)], key column or None, class names or None)`` for one file's
    Arrow schema, or a :class:`SourceError` naming the column that cannot be carried.
    ``label_column`` (``--label-column``) becomes field ``cls``: kind ``label`` (integers) or
    ``classname`` (strings, indexed by the source's sorted class names)."""
    features, meta_classes = read_metadata(schema.metadata, note)
    names = schema.names
    key_col = next((k for k in KEY_COLUMNS if k in names), None)
    labels = [n for n in names if _feature_type(features, n) == "ClassLabel"
              and _kind(schema.field(n).type) == "int"]
    label_col, label_kind, classes = _plan_label(schema, shown, note, label_column, key_col,
                                                 labels, features, meta_classes)
    columns, fields = [], {}
    for field in schema:
        col, kind = field.name, _kind(field.type)
        if col == key_col:
            if kind not in ("string", "int"):
                raise SourceError(f"key column {col!r} has type {field.type}: a key must be a "
                                  "string or an integer", path=shown)
            continue
        if col.startswith("__") and col != label_col:
            note(f"column {col!r} was skipped (names starting with '__' are reserved)")
            continue
        if kind == "null":
            continue
        if kind is None:
            raise SourceError(f"column {col!r} has type {field.type}, which cannot become a "
                              "field (binary, Image/Audio structs, numbers, strings, booleans, "
                              "dates and lists/structs without binary data can)", path=shown)
        if col == label_col:
            kind, name = label_kind, "cls"
        else:
            name = _field_name(col, kind, features)
        why = check_field_name(name)
        if why:
            raise SourceError(f"column {col!r}: {why}", path=shown)
        if name in fields:
            raise SourceError(f"columns {fields[name]!r} and {col!r} would both become field "
                              f"{name!r}", path=shown)
        fields[name] = col
        _note_feature(note, col, kind, name, _feature_type(features, col), col == label_col)
        columns.append((col, kind, name))
    return columns, key_col, classes


def _plan_label(schema, shown: str, note, label_column: str | None, key_col: str | None,
                labels: list[str], features, meta_classes
                ) -> tuple[str | None, str, list[str] | None]:
    """``(label column or None, its kind, class names or None)``: ``--label-column`` when
    given, else a single ClassLabel column (or a column ``cls`` with class names in the
    metadata); notes what could not be carried, or could be with ``--label-column``."""
    names = schema.names
    label_col, label_kind, classes = None, "label", None
    if label_column is not None:
        label_col, label_kind = _label_column(schema, shown, label_column, key_col, labels)
        if label_col in labels:
            classes = list(features[label_col].get("names") or [])
        elif label_col == "cls" and meta_classes is not None:
            classes = meta_classes
    elif len(labels) > 1:
        note(f"several ClassLabel columns ({', '.join(labels)}): the manifest holds one class "
             "list, so their class names were not carried")
    elif labels and labels[0] != "cls" and "cls" in names:
        note(f"ClassLabel column {labels[0]!r} kept its name (a column 'cls' exists): its class "
             "names were not carried")
    elif labels:
        label_col, classes = labels[0], list(features[labels[0]].get("names") or [])
    elif meta_classes is not None and "cls" in names:
        classes = meta_classes
    if label_col is None and not labels and "cls" not in names:
        for col in LABEL_NAMES:
            if col in names and _kind(schema.field(col).type) in ("int", "string"):
                note(f"column {col!r} became field {col!r}, not the class label field 'cls': "
                     f"pass --label-column {col} to make it the label")
    return label_col, label_kind, classes


def _field_name(col: str, kind: str, features) -> str:
    """The field name of a column that is not the label: its name, plus ``.image`` for a
    Hugging Face Image column whose name readers would not take for an image field, or
    ``.json`` for JSON values in a column without a dot."""
    if kind == "file" and _feature_type(features, col) == "Image" and not is_image_field(col):
        return f"{col}.image"  # readers find it as an image field, whatever each row holds
    if kind == "json" and "." not in col:
        return f"{col}.json"
    return col


def _note_feature(note, col: str, kind: str, name: str, feature: str | None,
                  is_label: bool) -> None:
    """Notes for a carried column: a Hugging Face feature type that is not carried, or
    ``{bytes, path}`` cells under a name readers do not take for an image field."""
    if feature not in (None, "Value", "ClassLabel", "Image") and not is_label:
        note(f"column {col!r}: the Hugging Face {feature} feature type is not carried "
             f"(the values are, as {'bytes' if kind == 'file' else kind})")
    elif kind == "file" and feature is None and not is_image_field(name):
        note(f"column {col!r} ({{bytes, path}} without a Hugging Face feature) became field "
             f"{name!r}, which readers do not take for an image field: if it holds images, "
             f"decode it with field={name!r}, or name the column image")


def _label_column(schema, shown: str, col: str, key_col: str | None,
                  labels: list[str]) -> tuple[str, str]:
    """(column, kind) of ``--label-column``, or a one-line :class:`SourceError`."""
    names = schema.names
    listed = ", ".join(names)
    if col not in names:
        raise SourceError(f"--label-column {col!r}: no such column (the columns are: {listed})",
                          path=shown)
    if col == key_col:
        raise SourceError(f"--label-column {col!r} is the sample key column", path=shown)
    others = [n for n in labels if n != col]
    if others:
        raise SourceError(f"--label-column {col!r}: the Hugging Face ClassLabel column "
                          f"{others[0]!r} already becomes field 'cls' (the columns are: "
                          f"{listed})", path=shown,
                          hint=f"drop --label-column, or pass --label-column {others[0]}")
    t = schema.field(col).type
    kind = _kind(t)
    if kind == "int":
        return col, "label"
    if kind == "string":
        return col, "classname"
    if kind == "null":
        raise SourceError(f"--label-column {col!r} holds only nulls", path=shown)
    raise SourceError(f"--label-column {col!r} has type {t}: a label column must hold integers "
                      "or strings", path=shown)


def _feature_type(features: dict, column: str) -> str | None:
    feature = features.get(column)
    return feature.get("_type") if isinstance(feature, dict) else None


def read_metadata(metadata: dict | None, note) -> tuple[dict, list[str] | None]:
    """(Hugging Face features by column, class names from ``shardpack`` metadata) of a schema's
    metadata; what has no place in a shardpack dataset is noted."""
    features, classes = {}, None
    for raw_key, raw in (metadata or {}).items():
        key = raw_key.decode("utf-8", "replace")
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if key == "huggingface" and isinstance(value, dict):
            info = value.get("info") if isinstance(value.get("info"), dict) else {}
            features = info.get("features") if isinstance(info.get("features"), dict) else {}
            dropped = sorted(k for k, v in info.items() if k != "features" and v)
            if dropped:
                note(f"Hugging Face dataset info ({', '.join(dropped)}) is not carried")
        elif key == "shardpack" and isinstance(value, dict) \
                and isinstance(value.get("classes"), list):
            classes = [str(c) for c in value["classes"]]
        else:
            note(f"Parquet schema metadata {key!r} is not carried")
    return features, classes


def _kind(t) -> str | None:
    """The encoding rule of an Arrow type, None when it has none."""
    import pyarrow as pa

    types = pa.types
    if types.is_dictionary(t):
        return _kind(t.value_type)
    if types.is_binary(t) or types.is_large_binary(t) or types.is_fixed_size_binary(t) \
            or getattr(types, "is_binary_view", lambda _: False)(t):
        return "binary"
    if types.is_integer(t):
        return "int"
    if types.is_string(t) or types.is_large_string(t) \
            or getattr(types, "is_string_view", lambda _: False)(t):
        return "string"
    if types.is_boolean(t):
        return "bool"
    if types.is_floating(t):
        return "float"
    if types.is_decimal(t):
        return "decimal"
    if types.is_timestamp(t) or types.is_date(t) or types.is_time(t):
        return "time"
    if types.is_null(t):
        return "null"
    if types.is_struct(t) and {t.field(i).name for i in range(t.num_fields)} == {"bytes", "path"} \
            and _kind(t.field("bytes").type) == "binary":
        return "file"
    if types.is_struct(t) or types.is_map(t) or types.is_list(t) or types.is_large_list(t) \
            or types.is_fixed_size_list(t):
        children = [t.field(i).type for i in range(t.num_fields)]
        if all(_kind(c) in ("int", "string", "bool", "float", "decimal", "time", "null", "json")
               for c in children):
            return "json"
    return None


class ParquetCells(FieldReader):
    """Reads Parquet cells this source deferred to the shard writer (``SourceField.column`` the
    column, ``offset`` the row), so the parent process never holds or pickles image bytes.  Rows
    are decoded in batches of about ``BATCH_BYTES``, every deferred column of the task at once,
    walking forward through a row group: small batches reuse the allocator's memory, where whole
    row groups had every forked writer zero fresh pages for each one (docs/benchmarks.md,
    "Converting")."""

    BATCH_BYTES = 2 << 20

    def __init__(self, fields, storage_options: dict | None = None):
        super().__init__(fields, storage_options)
        self.columns: dict[str, set] = {}
        for f in fields:
            self.columns.setdefault(f.path, set()).add(f.column)
        self.files: dict[str, tuple] = {}
        self.path = None
        self.group = -1
        self.batches = iter(())
        self.first = self.stop = 0   # rows of the current batch
        self.values: dict = {}

    def read(self, f) -> bytes:
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
        return f"{f.path} row {f.offset} column {'.'.join(f.column)}"

    def _load(self, f) -> None:
        import bisect

        pq = import_pyarrow()[1]  # the allocator setting, when this process imports it first
        if f.path not in self.files:
            storage, name = open_container(f, self.options)
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
            rows = max(1, self.BATCH_BYTES * meta.num_rows // max(1, meta.total_byte_size))
            top = sorted({c[0] for c in self.columns[f.path]})
            self.batches = pf.iter_batches(batch_size=rows, row_groups=[group], columns=top,
                                           use_threads=False)
            self.path, self.group = f.path, group
            self.first = self.stop = starts[group]
        while not self.first <= f.offset < self.stop:
            batch = next(self.batches, None)
            if batch is None:  # the file has fewer rows than its metadata says
                raise SourceError(f"row {f.offset} is missing from row group {group}",
                                  path=f.path, hint="convert again once the source is stable")
            self.values = {column: _cells(_struct_field(batch.column(column[0]), column[1:]))
                           for column in self.columns[f.path]}
            self.first, self.stop = self.stop, self.stop + batch.num_rows


def _struct_field(array, parts: tuple):
    """The struct field ``parts`` (a path of names) of an Arrow array."""
    import pyarrow.compute as pc

    for part in parts:
        array = pc.struct_field(array, part)
    return array


class _Cells:
    """The cells of an Arrow binary array without a copy each: slices of its data buffer."""

    def __init__(self, offsets, data: memoryview):
        self.offsets, self.data = offsets, data

    def __getitem__(self, i: int) -> memoryview:
        return self.data[int(self.offsets[i]):int(self.offsets[i + 1])]


def _cells(array):
    """Indexable cells of a binary Arrow array: zero-copy for plain binary without nulls."""
    import numpy as np
    import pyarrow as pa

    t = array.type
    if array.null_count == 0 and (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        width = 8 if pa.types.is_large_binary(t) else 4
        _, offsets, data = array.buffers()
        offsets = np.frombuffer(offsets, dtype=f"<i{width}", count=len(array) + 1,
                                offset=array.offset * width)
        return _Cells(offsets, memoryview(data) if data is not None else memoryview(b""))
    return array.to_pylist()
