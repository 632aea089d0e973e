"""``pack`` of a CSV or JSONL listing: each row names a local file (one sample), its other columns
become fields of that sample."""

from __future__ import annotations

import csv
import json
import os
import stat
from typing import Iterator

from shardpack.core.errors import SourceError
from shardpack.format import check_field_name, split_name
from shardpack.write.samples import SourceSample, check_key, file_field, value_field

LISTING_SUFFIXES = (".csv", ".jsonl")


def read_listing(path: str, bad) -> Iterator[SourceSample]:
    """The samples of a CSV (header row) or JSONL listing: a ``path`` column/key, an optional
    ``key``, and any other columns become fields holding the value as UTF-8 text (JSON for
    non-scalar JSONL values).

    Args:
        path: the listing's local path.
        bad: ``bad(path, reason, kind)``: raises, or counts a bad row or listed file.
    """
    base = os.path.dirname(os.path.abspath(path))
    seen: set[str] = set()
    for lineno, row in listing_rows(path):
        where = f"{path}:{lineno}"
        file_path = row.pop("path", None)
        if not isinstance(file_path, str) or not file_path:
            raise SourceError("row has no 'path' value", path=where)
        full = file_path if os.path.isabs(file_path) else os.path.join(base, file_path)
        name = os.path.basename(file_path)
        stem, fname = split_name(name)
        key = row.pop("key", None)
        if key is None:
            rel = os.path.dirname(file_path).lstrip("/")
            key = f"{rel}/{stem}" if rel else stem
        key = str(key)
        why = check_field_name(fname)
        problem = check_key(key, seen)
        if why or (problem and problem[1] != "duplicate"):
            bad(where, why or problem[0], "bad-name")
            continue
        if problem:
            raise SourceError(problem[0], path=where)
        seen.add(key)
        try:
            st = os.stat(full)
        except OSError as exc:
            bad(full, f"listed file cannot be read: {exc.strerror}", "missing")
            continue
        if not stat.S_ISREG(st.st_mode):
            bad(full, "listed path is not a regular file", "special")
            continue
        fields = [file_field(fname, full, st.st_size, st.st_mtime_ns)]
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
        yield SourceSample(key, tuple(sorted(fields)))


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
