"""Samples per class for ``info --stats``: counted, checked for imbalance, drawn as text bars
(docs/preview.md).

An ImageFolder pack's class is its key's class folder (the manifest's rule, which ``verify``
checks: ``classes[cls]`` is the key's first folder), so every sample is counted from the indexes
alone.  Other datasets keep labels only inside the samples (field ``cls``): those of at most
``sample`` samples are read, and the report says it is a sample.  Every count adds up: labels
looked at = in the classes + outside them + without a label + unread.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from dataclasses import field as dataclass_field

import numpy as np

from shardpack.core.errors import ShardpackError
from shardpack.inspect.sampling import (
    LABEL_FIELD, fetch_samples, keys_carry_classes, label_value, label_values, load_indexes,
    random_ids, some_of, which_samples,
)
from shardpack.read.reader import DatasetReader

NO_LABEL = "(no label)"  # ClassCounts.outside: samples without a label
BAR_WIDTH = 40
MAX_ROWS = 50              # class rows printed in full; beyond, the largest and smallest 25


@dataclass
class ClassCounts:
    """Samples per class: one row per class (or per label value, without classes), with those
    outside the classes, and the samples that could not be read."""

    names: list[str]          # one row per class (the manifest's order), or per label value
    counts: list[int]
    # read == sum(counts) + sum(outside.values()); read + len(bad) samples were looked at
    read: int                 # samples counted
    total: int                # samples in the dataset
    source: str               # "keys" (every sample) or "labels" (read from samples)
    outside: dict = dataclass_field(default_factory=dict)  # label text -> count, not a class
    bad: list = dataclass_field(default_factory=list)      # samples that could not be read

    @property
    def looked(self) -> int:
        """Samples looked at: counted plus unreadable."""
        return self.read + len(self.bad)

    @property
    def sampled(self) -> bool:
        """Whether the counts cover a random part of the dataset (unreadable samples aside)."""
        return self.looked < self.total


def class_counts(reader: DatasetReader, sample: int, seed: int = 0) -> ClassCounts | None:
    """Samples per class of ``reader``'s dataset, or None when it has no labels (no ``cls``
    field): from the keys of an ImageFolder pack (every sample), else from the labels of at
    most ``sample`` random samples (the label bytes alone where shards are not compressed).

    Args:
        reader: the dataset.
        sample: the most samples whose labels are read.
        seed: which random samples.
    """
    m = reader.manifest
    total = len(reader)
    if keys_carry_classes(reader):
        load_indexes(reader)
        folders: Counter = Counter()
        for shard in range(len(reader.shards)):
            folders.update(k.split("/", 1)[0] for k in reader.index(shard).keys())
        counts = [folders.pop(name, 0) for name in m.classes]
        outside = {f"folder {name!r}": n for name, n in folders.items()}
        return ClassCounts(list(m.classes), counts, total, total, "keys", outside)
    if LABEL_FIELD not in m.fields:
        return None
    ids = random_ids(total, sample, seed)
    values: Counter = Counter()
    bad = []
    spans = label_values(reader, ids)
    source = "labels"
    if spans is not None:  # the label bytes alone: a few bytes a sample, not whole samples
        values.update(spans)
        source = "label-spans"
    else:
        for sample in fetch_samples(reader, ids):
            if isinstance(sample, ShardpackError):
                bad.append(str(sample))
            else:
                raw = sample.get(LABEL_FIELD)
                values[label_value(raw) if raw is not None else None] += 1
    classes = m.classes
    if classes is not None:
        counts = [values.pop(i, 0) for i in range(len(classes))]
        outside = {(NO_LABEL if v is None else str(v)): n for v, n in values.items()}
        return ClassCounts(list(classes), counts, len(ids) - len(bad), total, source,
                           outside, bad)
    missing = values.pop(None, 0)
    order = sorted(values, key=lambda v: (isinstance(v, str), v))
    return ClassCounts([str(v) for v in order], [values[v] for v in order],
                       len(ids) - len(bad), total, source,
                       {NO_LABEL: missing} if missing else {}, bad)


def imbalance(cc: ClassCounts, min_share: float) -> list[str]:
    """Warnings: empty classes, rare classes, labels outside the class list, unread samples.

    Args:
        cc: the class counts.
        min_share: a class under this share of the median class's count is rare.
    """
    out = []
    counts = np.asarray(cc.counts, dtype=np.int64)
    where = " in the samples read" if cc.sampled else ""
    empty = [n for n, c in zip(cc.names, cc.counts, strict=True) if c == 0]
    if cc.sampled and counts.sum() < 20 * max(1, len(cc.names)):
        # a sample this small leaves classes empty or rare by chance: say so instead
        out.append(f"{int(counts.sum()):,} samples read for {len(cc.names):,} classes: too few "
                   "to judge balance (raise --sample)")
        empty = []
        counts = np.zeros(0, dtype=np.int64)
    if empty:
        out.append(f"{len(empty):,} of {len(cc.names):,} classes have no samples{where}: "
                   + some_of(repr(n) for n in empty))
    if counts.any():
        median = float(np.median(counts[counts > 0]))
        rare = [(n, c) for n, c in zip(cc.names, cc.counts, strict=True)
                if 0 < c < min_share * median]
        if rare:
            out.append(f"{len(rare):,} classes have under {min_share:.0%} of the median "
                       f"class's {median:,.0f} samples{where}: "
                       + some_of(f"{n!r} ({c:,})" for n, c in rare))
    outside = {k: v for k, v in cc.outside.items() if k != NO_LABEL}
    if outside:
        n = sum(outside.values())
        what = "samples are in class folders" if cc.source == "keys" else "samples have labels"
        out.append(f"{n:,} {what} that are not classes of the manifest: "
                   + some_of(f"{k} ({v:,})" for k, v in outside.items()))
    if cc.outside.get(NO_LABEL):
        out.append(f"{cc.outside[NO_LABEL]:,} samples{where} have no label")
    if cc.bad:
        out.append(f"{len(cc.bad):,} samples could not be read: {cc.bad[0]}")
    return out


def class_source(cc: ClassCounts) -> str:
    """Where the counts of ``cc`` come from, in words (the keys, or the labels of which
    samples).

    Args:
        cc: the class counts.
    """
    if cc.source == "keys":
        return f"all {cc.total:,} samples, class from each key's class folder"
    if cc.source == "label-spans":
        return (f"labels of {which_samples(cc.looked, cc.total)}, read alone (a few bytes "
                "each; not hash-checked: the hash covers the whole sample)")
    return f"labels of {which_samples(cc.looked, cc.total)}"


def _class_count(cc: ClassCounts) -> str:
    """The line that says where every sample looked at went."""
    inside = sum(cc.counts)
    parts = [f"{inside:,} in the classes below"]
    outside = {k: v for k, v in cc.outside.items() if k != NO_LABEL}
    if outside:
        what = "in folders that are not classes" if cc.source == "keys" else \
            "with labels that are not classes"
        parts.append(f"{sum(outside.values()):,} {what}")
    if cc.outside.get(NO_LABEL):
        parts.append(f"{cc.outside[NO_LABEL]:,} without a label")
    if cc.bad:
        parts.append(f"{len(cc.bad):,} could not be read")
    return f"  {cc.looked:,} samples: " + ", ".join(parts)


def class_lines(cc: ClassCounts | None) -> list[str]:
    """The histogram lines of ``info --stats``: where the counts come from, where every sample
    looked at went, and a text bar per class (the largest and smallest classes of many).

    Args:
        cc: the class counts, or None for a dataset without labels.
    """
    if cc is None:
        return ["histogram no labels (no 'cls' field)"]
    out = [f"histogram {len(cc.names):,} classes, {class_source(cc)}", _class_count(cc)]
    if not cc.names:
        return out
    rows = list(zip(cc.names, cc.counts, strict=True))
    shown = rows
    if len(rows) > MAX_ROWS:
        by_count = sorted(rows, key=lambda r: -r[1])
        shown = by_count[:MAX_ROWS // 2] + [None] + by_count[-(MAX_ROWS // 2):]
    top = max(cc.counts) or 1
    width = min(32, max(len(n) for n in cc.names))
    for row in shown:
        if row is None:
            out.append(f"  ... {len(rows) - 2 * (MAX_ROWS // 2):,} classes more, between "
                       "these counts (the largest and the smallest are shown)")
            continue
        name, count = row
        bar = "#" * round(BAR_WIDTH * count / top) if count else ""
        label = name if len(name) <= width else name[:width - 3] + "..."
        out.append(f"  {label:<{width}}  {count:>9,}  {bar}")
    return out
