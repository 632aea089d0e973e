"""``pack`` of a CSV or JSONL listing: each row names a local file (one sample), its other columns
become fields of that sample, and one column may be the class label (docs/packing.md,
"Listings").

Keys follow the tree walk's image rule: a listed file's key is its path without the last
extension, dots kept (``pics/shot.00.v2.jpg`` -> ``pics/shot.00.v2``, field ``jpg``), so two
distinct files are two samples.  The label column (``label_column``) becomes field ``cls``:
integers as they are, names as their index among the sorted distinct names (ImageFolder's rule
for folders), the names then being the dataset's classes.  A ``cls`` or ``label`` column holding
names without ``label_column`` is refused: it would give a field training cannot read as a label.
"""

from __future__ import annotations

import csv
import json
import os
import re
import stat
from typing import Iterator

from shardpack.core.errors import SourceError, option_hint
from shardpack.format import check_field_name
from shardpack.images.content import is_image_field
from shardpack.write.samples import (NO_IMAGE_HINT, SourceSample, check_key, file_field,
                                     value_field)

LISTING_SUFFIXES = (".csv", ".jsonl")
LABEL_NAMES = ("cls", "label")  # columns that read as class labels without --label-column
_INTEGER = re.compile(r"[+-]?[0-9]+")
INT64 = 2 ** 63


class Listing:
    """A CSV or JSONL listing: its label plan (from one pass over the rows, made here) and its
    samples (:meth:`samples`, a second pass).

    Args:
        path: the listing's local path.
        label_column: the column that becomes the class label ``cls``, or None.
        need_images: a listed file that is no image, in a listing of images, is a bad row
            (``no-image``).
    """

    def __init__(self, path: str, label_column: str | None = None, need_images: bool = True):
        self.path = path
        self.label_column = label_column
        self.need_images = need_images
        self.classes: list[str] | None = None  # class names, when the labels are names
        self.images = False  # whether any listed file is an image (an image dataset)
        self.notes: list[str] = []
        self._scan()

    def _scan(self) -> None:
        """One pass over the rows: whether the listed files are images, and what the label
        column (or a column that looks like one) holds."""
        watched = ([self.label_column] if self.label_column is not None
                   else [c for c in LABEL_NAMES])
        names: dict[str, set] = {c: set() for c in watched}
        integers: set[str] = set()  # the label column's integer values, as text
        first: dict[str, tuple[int, str]] = {}
        present: set[str] = set()
        for lineno, row in listing_rows(self.path):
            path = row.get("path")
            if isinstance(path, str) and is_image_field(path.rpartition(".")[2]):
                self.images = True
            for col in watched:
                value = row.get(col)
                if value is None or value == "":
                    continue
                present.add(col)
                if _label_int(value) is not None:
                    if col == self.label_column:
                        integers.add(str(value))
                else:
                    names[col].add(str(value))
                    first.setdefault(col, (lineno, str(value)))
        if self.label_column is not None:
            if self.label_column not in present:
                raise SourceError(f"--label-column {self.label_column!r}: no row has a value "
                                  "in that column", path=self.path)
            if names[self.label_column]:  # names: integers among them are names too ("1")
                self.classes = sorted(names[self.label_column] | integers)
            return
        self._refuse_name_labels(first)
        if "label" in present:
            # a note is no error: printed and recorded as it is, so both spellings
            self.notes.append("column 'label' holds integers: kept as field 'label'; pass "
                              "--label-column label (label_column=\"label\") to make it the "
                              "class label cls")

    def _refuse_name_labels(self, first: dict) -> None:
        """A ``cls`` or ``label`` column of names, without ``label_column``: refused."""
        for col in LABEL_NAMES:
            if col in first:
                lineno, value = first[col]
                raise SourceError(
                    f"column {col!r} holds class names (e.g. {value!r}), not integer labels "
                    "that fit int64",
                    path=f"{self.path}:{lineno}",
                    hint=f"pass {option_hint('label_column', col)} to make the names class "
                         "indices (sorted by name, as ImageFolder), or rename the column to "
                         "keep it as text")

    def samples(self, bad) -> Iterator[SourceSample]:
        """The samples of the listing, in row order.

        Args:
            bad: ``bad(path, reason, kind)``: raises, or counts a bad row or listed file.
        """
        base = os.path.dirname(os.path.abspath(self.path))
        seen: set[str] = set()
        index = {name: str(i) for i, name in enumerate(self.classes or ())}
        for lineno, row in listing_rows(self.path):
            where = f"{self.path}:{lineno}"
            sample = self._sample(row, where, base, seen, index, bad)
            if sample is not None:
                yield sample

    def _sample(self, row: dict, where: str, base: str, seen: set, index: dict,
                bad) -> SourceSample | None:
        file_path = row.pop("path", None)
        if not isinstance(file_path, str) or not file_path:
            raise SourceError("row has no 'path' value", path=where)
        full = file_path if os.path.isabs(file_path) else os.path.join(base, file_path)
        stem, dot, fname = os.path.basename(file_path).rpartition(".")
        if not dot or not stem:  # no extension: no field name
            stem, fname = os.path.basename(file_path), ""
        key = row.pop("key", None)
        if key is None:
            rel = os.path.dirname(file_path).lstrip("/")
            key = f"{rel}/{stem}" if rel else stem
        key = str(key)
        why = check_field_name(fname)
        problem = check_key(key, seen)
        if why or (problem and problem[1] != "duplicate"):
            bad(where, why or problem[0], "bad-name")
            return None
        if problem:
            raise SourceError(problem[0], path=where)
        seen.add(key)
        label = self._label(row, where, index, bad)
        if label is False:
            return None
        field = _listed_file(full, fname, bad)
        if field is None:
            return None
        fields = [field] + _columns(row, fname, where)
        if label is not None:
            if any(f.name == "cls" for f in fields):
                raise SourceError("column 'cls' clashes with the label of --label-column "
                                  f"{self.label_column!r}", path=where)
            fields.append(value_field("cls", label.encode()))
        if self.need_images and self.images and not any(is_image_field(f.name) for f in fields):
            bad(full, f"sample {key!r} has no image (fields: "
                      f"{', '.join(f.name for f in fields)}) in a listing of images", "no-image",
                NO_IMAGE_HINT)
            return None
        return SourceSample(key, tuple(sorted(fields)))

    def _label(self, row: dict, where: str, index: dict, bad):
        """The row's ``cls`` text, None without a label column, False after a bad row."""
        if self.label_column is None:
            return None
        value = row.pop(self.label_column, None)
        if value is None or value == "":
            bad(where, f"row has no value in the label column {self.label_column!r}",
                "no-label")
            return False
        if index:
            number = index.get(str(value))
            if number is None:  # read twice: a name the first pass did not see
                raise SourceError(f"label {value!r} was not in the listing when its classes "
                                  "were read: the listing changed during the pack",
                                  path=where, hint="pack again once it is stable")
            return number
        number = _label_int(value)
        if number is None:
            bad(where, f"label {value!r} in column {self.label_column!r} is not an integer "
                       "that fits int64", "bad-label")
            return False
        return str(number)


def _label_int(value) -> int | None:
    """An integer label that fits int64 (JSON number or decimal text), else None: a name, or
    nothing training could read as a label."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        value = int(value)
    if isinstance(value, int) and -INT64 <= value < INT64:
        return value
    return None


def _listed_file(full: str, fname: str, bad):
    """The listed file as the sample's field, or None after a bad entry."""
    try:
        st = os.stat(full)
    except OSError as exc:
        bad(full, f"listed file cannot be read: {exc.strerror}", "missing")
        return None
    if not stat.S_ISREG(st.st_mode):
        bad(full, "listed path is not a regular file", "special")
        return None
    return file_field(fname, full, st.st_size, st.st_mtime_ns)


def _columns(row: dict, fname: str, where: str) -> list:
    """The row's other columns as fields holding their values as UTF-8 text (JSON for
    non-scalar JSONL values)."""
    fields = []
    for col, value in row.items():
        if value is None or value == "":
            continue
        why = check_field_name(col)
        if why or col == fname:
            raise SourceError(why or f"column {col!r} clashes with the file's field",
                              path=where)
        data = (value if isinstance(value, str)
                else json.dumps(value, separators=(",", ":"), sort_keys=True)).encode()
        fields.append(value_field(col, data))
    return fields


def listing_rows(path: str):
    """(line number, row as a dict) of each row of the listing at ``path``.

    Args:
        path: a .csv (header row) or .jsonl listing.
    """
    with open(path, newline="", encoding="utf-8") as f:
        if path.endswith(".csv"):
            reader = csv.DictReader(f)
            if not reader.fieldnames or "path" not in reader.fieldnames:
                raise SourceError("CSV listing needs a header row with a 'path' column",
                                  path=path)
            for row in reader:
                yield reader.line_num, row
        else:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SourceError(f"bad JSON: {exc.msg}", path=f"{path}:{lineno}") from None
                if not isinstance(row, dict):
                    raise SourceError("each JSONL line must be an object", path=f"{path}:{lineno}")
                yield lineno, row
