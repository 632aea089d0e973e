"""Reading a few samples of a dataset, and the small helpers ``info --stats`` and ``preview`` share
(docs/preview.md).

Checked ranged reads of a few samples (:func:`fetch_samples`), the label field alone
(:func:`label_values`), label names (:func:`label_text`), the default image field
(:func:`image_field`), random sample ids (:func:`random_ids`), and the optional matplotlib figure
(:func:`new_figure`).  No torch here.
"""

from __future__ import annotations

import numpy as np

from shardpack.core.errors import DecodeError, FormatError, ShardpackError
from shardpack.images.content import is_image_field
from shardpack.read.reader import DatasetReader, decode_sample

LABEL_FIELD = "cls"  # the class label field (shardpack.loader.batches.LABEL_FIELDS, without torch)
FETCH_CHUNK = 128          # samples per concurrent ranged read (bounds memory)
PLOT_EXTRA = "pip install 'shardpack[plot]'"


def new_figure(figsize: tuple[float, float]):
    """A matplotlib Figure (no pyplot, no global backend), or a one-line error naming the
    extra when matplotlib is not installed.

    Args:
        figsize: width and height in inches.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ShardpackError("--plot needs matplotlib, which is not installed",
                             hint=PLOT_EXTRA) from None
    return Figure(figsize=figsize, layout="constrained")


def require_plot() -> None:
    """Fail before any work when --plot cannot be honoured."""
    new_figure((1, 1))


def save_figure(fig, path) -> None:
    """Write ``fig`` to ``path`` as a PNG (whatever the name ends with); a one-line error when
    the file cannot be written.

    Args:
        fig: a figure of :func:`new_figure`.
        path: the file to write.
    """
    try:
        fig.savefig(path, dpi=100, format="png")  # whatever the name ends with
    except OSError as exc:
        raise ShardpackError(f"cannot write the plot: {exc.strerror or exc}", path=str(path)) \
            from None


def fetch_samples(reader: DatasetReader, ids) -> list[dict | ShardpackError]:
    """Samples ``ids`` (global ids) by ranged reads of exactly their bytes (never a whole shard
    or an 8 MB chunk), concurrently, each checked against its index hash as the reader checks
    one (a fresh read: checked every time).  A sample whose bytes are wrong comes back as its
    :class:`ShardpackError` (naming shard, sample and offset) in its place; a shard that cannot
    be read raises."""
    out: list = []
    ids = np.asarray(ids, dtype=np.int64)
    for at in range(0, len(ids), FETCH_CHUNK):
        shards, rows = reader.locate_many(ids[at:at + FETCH_CHUNK])
        shards, rows = shards.tolist(), rows.tolist()
        spans = [(reader.shards[s].name, *reader.index(s).span(r))
                 for s, r in zip(shards, rows, strict=True)]
        got = read_spans(reader, spans)
        for s, r, (_, start, _), data in zip(shards, rows, spans, got, strict=True):
            try:
                reader.check_rows(s, np.array([r], dtype=np.int64), data, base=start, fresh=True)
                out.append(decode_sample(reader.index(s), r, data, reader.shard_path(s)))
            except ShardpackError as exc:
                out.append(exc)
    return out


def read_spans(reader: DatasetReader, spans: list) -> list:
    """The bytes of each span, by ranged reads; a shard shorter than its index says (truncated,
    or a remote read that kept coming back short) is a one-line FormatError naming the shard.

    Args:
        reader: the dataset.
        spans: (shard file name, start, end) each.
    """
    try:
        return reader.storage.read_ranges(spans)
    except ShardpackError:
        raise
    except OSError as exc:
        raise FormatError(f"cannot read sample bytes: {exc}", path=reader.storage.url,
                          hint="the shard may be truncated: run 'shardpack verify'") from None


def label_values(reader: DatasetReader, ids) -> list | None:
    """The labels of samples ``ids`` from ranged reads of the label field alone (None for a
    sample without one), or None where a shard is compressed (the field is not addressable
    there: read whole samples).  For counting and choosing only: a sample's hash covers the whole
    sample, so these bytes are not checked; what is shown is read whole and checked."""
    shards, rows = reader.locate_many(ids)
    load_indexes(reader, np.unique(shards))
    spans, where = [], []
    for k, (s, r) in enumerate(zip(shards.tolist(), rows.tolist(), strict=True)):
        index = reader.index(s)
        if index.compression != "none":
            return None
        if LABEL_FIELD not in index.field_spans:
            continue
        starts, sizes = index.field_spans[LABEL_FIELD]
        if sizes[r]:
            spans.append((reader.shards[s].name, int(starts[r]), int(starts[r] + sizes[r])))
            where.append(k)
    out: list = [None] * len(shards)
    for k, data in zip(where, read_spans(reader, spans) if spans else [], strict=True):
        out[k] = label_value(data)
    return out


def image_field(names, field: str | None = None) -> str:
    """The image field of a sample with fields ``names`` (non-empty ones), by the default
    decode's rule (shardpack/transforms/decode.py, ``CpuDecode(field=None)``): the one image field,
    or of
    several the one named by an extension alone (``jpg`` beside ``seg.png``).  ``field`` names
    it instead.  Raises :class:`DecodeError` with the reason otherwise."""
    names = [n for n in names if not n.startswith("__")]
    if field is not None:
        if field not in names:
            raise DecodeError(f"no field {field!r} (fields: {', '.join(names) or 'none'})")
        return field
    found = [n for n in names if is_image_field(n)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise DecodeError(f"no image field (fields: {', '.join(names) or 'none'})")
    plain = [n for n in found if "." not in n]
    if len(plain) != 1:
        raise DecodeError(f"{len(found)} image fields ({', '.join(found)}), none the obvious "
                          "one: choose with --field")
    return plain[0]


def label_value(raw) -> int | str:
    """A label's value: an int where the bytes are one, else its text."""
    text = bytes(raw).decode("utf-8", "replace").strip()
    try:
        return int(text)
    except ValueError:
        return text


def label_text(raw, classes) -> str:
    """What a cell shows for label bytes ``raw``: the class name where the manifest has classes
    and the label is one of them, else the label's own value."""
    value = label_value(raw)
    if classes and isinstance(value, int):
        return classes[value] if 0 <= value < len(classes) else f"{value} (not a class)"
    return str(value)


def keys_carry_classes(reader: DatasetReader) -> bool:
    """An ImageFolder pack: each key's first folder is its class (``classes[cls]``)."""
    m = reader.manifest
    return m.layout == "imagefolder" and m.classes is not None


def load_indexes(reader: DatasetReader, shards=None) -> None:
    """The indexes of ``shards`` (default: every shard), remote ones side by side."""
    todo = range(len(reader.shards)) if shards is None else [int(s) for s in shards]
    reader.storage.map_reads(reader.index, todo)


def random_ids(total: int, count: int, seed: int) -> np.ndarray:
    """``count`` distinct ids of ``range(total)`` (all when count >= total), sorted."""
    if count >= total:
        return np.arange(total, dtype=np.int64)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(total, size=count, replace=False)).astype(np.int64)


def some_of(items, limit: int = 10) -> str:
    """The first ``limit`` of ``items`` joined by commas, and how many more there are.

    Args:
        items: strings.
        limit: how many are shown.
    """
    items = list(items)
    more = f", ... ({len(items) - limit:,} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def which_samples(looked: int, total: int) -> str:
    """Which samples a count covers, in words: all of them, or a random ``looked`` of ``total``.

    Args:
        looked: samples looked at.
        total: samples in the dataset.
    """
    return f"all {total:,} samples" if looked >= total else \
        f"a random {looked:,} of {total:,} samples (a sample)"
