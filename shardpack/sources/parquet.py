"""Parquet files (Hugging Face ``datasets`` exports included) -> samples.

SRC is one ``.parquet`` file or a folder searched recursively (``data/train-00000-of-00002.parquet``
and the like), files sorted by path; names with a part starting with '.' or '_' are skipped like
pyarrow skips them (counted as hidden).  Files are read through the storage layer in record
batches of about BATCH_BYTES, so memory holds one row group's pages and one batch, never a table.
Binary cells (and the bytes of Image structs) are not copied here: fields refer to (file, column,
row) and the shard writers read them in small record batches (``writer.RowReader``).

One row = one sample; column rules (docs/convert.md):

* ``__key__`` (else ``key``) is the sample key: string, or integer as decimal text; without one,
  keys are the sample's position (``0000000000``, ...);
* other columns starting with ``__`` (``__url__``, ``__index_level_0__``) are skipped, with a note;
* binary -> the bytes, field = column name;
* a ``{bytes, path}`` struct (a ``datasets`` Image or Audio feature) -> the bytes; field = column
  name plus the extension of ``path``, else sniffed from the bytes (``image`` -> ``image.jpg``);
  a column whose name has a dot or is an extension (``jpg``) keeps its name.  A value with a path
  but no bytes is a bad sample;
* the one ``ClassLabel`` column of the Hugging Face features -> field ``cls`` (ASCII decimal), its
  names -> the manifest's ``classes`` (also read from ``shardpack`` schema metadata, which
  ``shardpack export --to parquet`` writes);
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
import posixpath
import re
import sys
from collections.abc import Iterator

from ..errors import SourceError
from ..format import check_field_name
from ..samples import SourceField
from .base import ContainerSource, inline

BATCH_BYTES = 16 << 20   # target uncompressed bytes of one record batch
MAX_BATCH_ROWS = 1024
BUFFER_SIZE = 1 << 20    # pyarrow reads column chunks page by page through a buffer this size
KEY_COLUMNS = ("__key__", "key")
_EXT_ALIASES = {"jpeg": "jpg", "jpe": "jpg", "tiff": "tif"}
_MAGIC = [(0, b"\xff\xd8\xff", "jpg"), (0, b"\x89PNG\r\n\x1a\n", "png"), (0, b"GIF8", "gif"),
          (8, b"WEBP", "webp"), (8, b"WAVE", "wav"), (0, b"II*\x00", "tif"),
          (0, b"MM\x00*", "tif"), (4, b"ftypavif", "avif"), (4, b"ftypheic", "heic"),
          (0, b"fLaC", "flac"), (0, b"OggS", "ogg"), (0, b"ID3", "mp3"), (0, b"BM", "bmp")]
_FILE_EXTS = {ext for _, _, ext in _MAGIC} | set(_EXT_ALIASES)
_SPLIT_FILE = re.compile(r"(?:^|/)([\w.]+?)-\d+-of-\d+\.parquet$")


def _pyarrow():
    if "pyarrow" not in sys.modules:
        # pyarrow's allocator (mimalloc) hands freed memory back to the OS after 10 ms, and the
        # shard writers decode batch after batch, faulting in and zeroing fresh pages each time.
        # Keep freed memory instead: with whole row groups that was 17% of a conversion's CPU;
        # with today's ~2 MB batches, 5.8-6.1 s against 5.9-7.0 s for the 20k-image Parquet
        # (4 alternating pairs).  A user's own setting wins.
        os.environ.setdefault("MIMALLOC_PURGE_DELAY", "-1")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise SourceError("--from parquet needs pyarrow",
                          hint="pip install 'shardpack[parquet]'") from None
    return pa, pq


class ParquetSource(ContainerSource):
    format = "parquet"
    suffixes = (".parquet",)

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
        pa, pq = _pyarrow()
        names = self.files()
        splits = sorted({m.group(1) for n in names if (m := _SPLIT_FILE.search(n))})
        if len(splits) > 1:
            self.note(f"the source holds several splits ({', '.join(splits)}); they were all "
                      "converted into one dataset (convert each split's files on their own to "
                      "keep them apart)")
        kinds: dict[str, tuple[str, str]] = {}  # column -> (kind, first file that had it)
        first_classes: tuple[list[str], str] | None = None
        for name in names:
            shown = self.storage.display(name)
            with self.storage.open_arrow(name) as f:
                try:
                    pf = pq.ParquetFile(f, buffer_size=BUFFER_SIZE)
                    schema = pf.schema_arrow
                except (pa.ArrowException, OSError, ValueError) as exc:
                    raise SourceError(f"not a readable Parquet file: {exc}", path=shown) from None
                columns, key_col, classes = plan_columns(schema, shown, self.note)
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

    def _rows(self, pf, columns, key_col, shown, name):
        """The file's samples, one record batch at a time.  Binary and ``{bytes, path}`` cells
        are not copied out here: only their lengths (and the first bytes, to name the field) are
        taken, and the fields refer to (file, column, row) for the shard writers to read."""
        pa = _pyarrow()[0]
        import pyarrow.compute as pc

        url, mtime = self.url(name), self.mtime_ns(name)
        meta = pf.metadata
        estimated = _estimated_sizes(meta, [c for c in columns if c[1] == "binary"])
        blocks, start = {}, 0  # first row of each row group -> its bytes (planner hint)
        for g in range(meta.num_row_groups):
            blocks[start] = meta.row_group(g).total_byte_size
            start += meta.row_group(g).num_rows
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
                    heads = pc.binary_slice(data, 0, 16).to_pylist()
                    paths = pc.struct_field(array, "path").to_pylist()
                    valid = array.is_valid().to_pylist()
                    values.append((col, kind, field, pc.binary_length(data).to_pylist(),
                                   (heads, paths, valid)))
                else:
                    values.append((col, kind, field, array.to_pylist(), None))
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
                fields = []
                for col, kind, field, data, extra in values:
                    value = data[i]
                    if kind == "binary":
                        if value is not None:
                            fields.append(SourceField(field, url, value, mtime, None, row + i,
                                                      (col,)))
                        continue
                    if kind != "file":
                        if value is not None:
                            fields.append(inline(field, ENCODERS[kind](value)))
                        continue
                    heads, paths, valid = extra
                    if not valid[i]:
                        continue
                    if value is not None:
                        name_of = file_field(field, {"path": paths[i], "bytes": heads[i]})
                        fields.append(SourceField(name_of, url, value, mtime, None, row + i,
                                                  (col, "bytes")))
                    elif paths[i] is not None:
                        self.bad(where, f"column {col!r} holds only a path "
                                        f"({paths[i]!r}), not the file's bytes", "no-bytes")
                        break
                else:
                    yield key, fields, where, blocks.get(row + i, 0)
            row += count


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


def file_field(column: str, value: dict) -> str:
    """The field name of one ``{bytes, path}`` value: the column name, plus the file's
    extension unless the name has a dot or is itself an extension (``jpg``, as in datasets
    made from WebDataset shards)."""
    if "." in column or column.lower() in _FILE_EXTS:
        return column
    ext = file_extension(value.get("path"), value["bytes"])
    return f"{column}.{ext}" if ext else column


def file_extension(path: str | None, data: bytes) -> str | None:
    """The extension of ``path`` (lower case, ``jpeg`` -> ``jpg``), else one sniffed from the
    first bytes; None when neither tells."""
    if path:
        ext = posixpath.splitext(posixpath.basename(path))[1][1:].lower()
        if re.fullmatch(r"[a-z0-9]{1,5}", ext):
            return _EXT_ALIASES.get(ext, ext)
    for offset, magic, ext in _MAGIC:
        if data[offset:offset + len(magic)] == magic:
            return ext
    return None


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


def plan_columns(schema, shown: str, note) -> tuple[list[tuple[str, str, str]], str | None,
                                                     list[str] | None]:
    """``([(column, kind, field)], key column or None, class names or None)`` for one file's
    Arrow schema, or a :class:`SourceError` naming the column that cannot be carried."""
    features, meta_classes = read_metadata(schema.metadata, note)
    names = schema.names
    key_col = next((k for k in KEY_COLUMNS if k in names), None)
    labels = [n for n in names if _feature_type(features, n) == "ClassLabel"
              and _kind(schema.field(n).type) == "int"]
    label_col, classes = None, None
    if len(labels) > 1:
        note(f"several ClassLabel columns ({', '.join(labels)}): the manifest holds one class "
             "list, so their class names were not carried")
    elif labels and labels[0] != "cls" and "cls" in names:
        note(f"ClassLabel column {labels[0]!r} kept its name (a column 'cls' exists): its class "
             "names were not carried")
    elif labels:
        label_col, classes = labels[0], list(features[labels[0]].get("names") or [])
    elif meta_classes is not None and "cls" in names:
        classes = meta_classes
    columns, fields = [], {}
    for field in schema:
        col, kind = field.name, _kind(field.type)
        if col == key_col:
            if kind not in ("string", "int"):
                raise SourceError(f"key column {col!r} has type {field.type}: a key must be a "
                                  "string or an integer", path=shown)
            continue
        if col.startswith("__"):
            note(f"column {col!r} was skipped (names starting with '__' are reserved)")
            continue
        if kind == "null":
            continue
        if kind is None:
            raise SourceError(f"column {col!r} has type {field.type}, which cannot become a "
                              "field (binary, Image/Audio structs, numbers, strings, booleans, "
                              "dates and lists/structs without binary data can)", path=shown)
        name = col
        if col == label_col:
            kind, name = "label", "cls"
        elif kind == "json" and "." not in col:
            name = f"{col}.json"
        why = check_field_name(name)
        if why:
            raise SourceError(f"column {col!r}: {why}", path=shown)
        if name in fields:
            raise SourceError(f"columns {fields[name]!r} and {col!r} would both become field "
                              f"{name!r}", path=shown)
        fields[name] = col
        feature = _feature_type(features, col)
        if feature not in (None, "Value", "ClassLabel", "Image") and col != label_col:
            note(f"column {col!r}: the Hugging Face {feature} feature type is not carried "
                 f"(the values are, as {'bytes' if kind == 'file' else kind})")
        columns.append((col, kind, name))
    return columns, key_col, classes


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
