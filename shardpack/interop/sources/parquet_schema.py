"""Parquet schemas -> fields: which column becomes which field, encoded how, and what metadata
(Hugging Face features, class names) comes along; what has no place in a shardpack dataset is
noted (docs/convert.md, "Parquet")."""

from __future__ import annotations

import json

from shardpack.core.errors import SourceError
from shardpack.format import check_field_name
from shardpack.images.content import is_image_field

KEY_COLUMNS = ("__key__", "key")
LABEL_NAMES = ("label", "labels")  # plain columns that get a note suggesting --label-column


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
              and arrow_kind(schema.field(n).type) == "int"]
    label_col, label_kind, classes = _plan_label(schema, shown, note, label_column, key_col,
                                                 labels, features, meta_classes)
    columns, fields = [], {}
    for field in schema:
        col, kind = field.name, arrow_kind(field.type)
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
            if col in names and arrow_kind(schema.field(col).type) in ("int", "string"):
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
    kind = arrow_kind(t)
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


# (pyarrow.types tests, kind), in the order they are tried (the views are newer pyarrow's)
_KINDS = ((("is_binary", "is_large_binary", "is_fixed_size_binary", "is_binary_view"), "binary"),
          (("is_integer",), "int"),
          (("is_string", "is_large_string", "is_string_view"), "string"),
          (("is_boolean",), "bool"), (("is_floating",), "float"), (("is_decimal",), "decimal"),
          (("is_timestamp", "is_date", "is_time"), "time"), (("is_null",), "null"))
_JSON_CHILDREN = ("int", "string", "bool", "float", "decimal", "time", "null", "json")


def arrow_kind(t) -> str | None:
    """The encoding rule (a key of :data:`ENCODERS`, "file", "label", "null") of an Arrow type,
    None when it has none.

    Args:
        t: a pyarrow DataType.
    """
    import pyarrow as pa

    types = pa.types
    if types.is_dictionary(t):
        return arrow_kind(t.value_type)
    for tests, kind in _KINDS:
        if any(getattr(types, test, _never)(t) for test in tests):
            return kind
    if types.is_struct(t) and {t.field(i).name for i in range(t.num_fields)} == {"bytes", "path"} \
            and arrow_kind(t.field("bytes").type) == "binary":
        return "file"
    if types.is_struct(t) or types.is_map(t) or types.is_list(t) or types.is_large_list(t) \
            or types.is_fixed_size_list(t):
        children = [t.field(i).type for i in range(t.num_fields)]
        if all(arrow_kind(c) in _JSON_CHILDREN for c in children):
            return "json"
    return None


def _never(_) -> bool:
    return False
