"""``shardpack info --stats``: what a dataset holds, at a glance (docs/preview.md).

* Class histogram.  An ImageFolder pack's class is its key's class folder (the manifest's rule,
  which ``verify`` checks: ``classes[cls]`` is the key's first folder), so every sample is counted
  from the indexes alone.  Other datasets keep labels only inside the samples (field ``cls``):
  those of at most ``sample`` samples are read (whole samples by ranged reads, each checked
  against its index hash), and the report says it is a sample.
* Per-field size percentiles, from the indexes' sizes: no sample bytes are read.
* Image sizes from headers only: the first 16 KB of the image of at most ``sample`` random
  samples, then, for the few whose headers run longer (JPEG APPn segments: ICC profiles, EXIF
  thumbnails, XMP; a TIFF directory after the pixels), the bytes the header parser names next,
  in rounds; compressed shards: the whole sample.  An image whose header the parser cannot read
  is read whole and handed to Pillow, then decoded: "unreadable" is only an image that does not
  decode.  Header bytes cannot be checked against the index hash (it covers whole samples): the
  report says so; ``shardpack verify`` is the check.
* Every count adds up, and the report says how: samples looked at = sized + unreadable + without
  an image field; labels looked at = in the classes + outside them + without a label + unread.
* Imbalance warnings: empty classes, classes under ``min_share`` of the median class's count,
  labels that are not one of the classes.

Also the helpers shardpack/inspect/preview.py shares: checked ranged reads of a few samples
(:func:`fetch_samples`), label names (:func:`label_text`), the default image field
(:func:`image_field`), and the optional matplotlib figure (:func:`new_figure`).  No torch here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from dataclasses import field as dataclass_field

import numpy as np

from shardpack.core.errors import DecodeError, FormatError, ShardpackError
from shardpack.core.sizes import human
from shardpack.images.headers import HeaderShort, header_info, read_header
from shardpack.images.content import check_image, content_format, is_image_field
from shardpack.read.reader import DatasetReader, decode_sample

LABEL_FIELD = "cls"  # the class label field (shardpack.loader.batches.LABEL_FIELDS, without torch)
NO_LABEL = "(no label)"  # ClassCounts.outside: samples without a label
HEAD_BYTES = 16 << 10      # first image header read: most headers end well within it
HEAD_GAP = 64 << 10        # a header's next bytes this near those held: read the gap too
FETCH_CHUNK = 128          # samples per concurrent ranged read (bounds memory)
PERCENTILES = (50, 90, 99)
BAR_WIDTH = 40
MAX_ROWS = 50              # class rows printed in full; beyond, the largest and smallest 25
PLOT_EXTRA = "pip install 'shardpack[plot]'"


@dataclass(frozen=True)
class StatsOptions:
    sample: int = 2000       # images whose headers are read; labels read when keys lack them
    seed: int = 0
    min_share: float = 0.01  # a class under this share of the median class's count is rare


# -- helpers shared with preview.py ---------------------------------------------------------------

def new_figure(figsize: tuple[float, float]):
    """A matplotlib Figure (no pyplot, no global backend), or a one-line error naming the
    extra when matplotlib is not installed."""
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
        got = _read(reader, spans)
        for s, r, (_, start, _), data in zip(shards, rows, spans, got, strict=True):
            try:
                reader.check_rows(s, np.array([r], dtype=np.int64), data, base=start, fresh=True)
                out.append(decode_sample(reader.index(s), r, data, reader.shard_path(s)))
            except ShardpackError as exc:
                out.append(exc)
    return out


def _read(reader: DatasetReader, spans: list) -> list:
    """Ranged reads; a shard shorter than its index says (truncated, or a remote read that kept
    coming back short) is a one-line FormatError naming the shard."""
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
    for k, data in zip(where, _read(reader, spans) if spans else [], strict=True):
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
    if reader.storage.local:
        for shard in todo:
            reader.index(shard)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(reader.index, todo))


def random_ids(total: int, count: int, seed: int) -> np.ndarray:
    """``count`` distinct ids of ``range(total)`` (all when count >= total), sorted."""
    if count >= total:
        return np.arange(total, dtype=np.int64)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(total, size=count, replace=False)).astype(np.int64)


# -- class counts ---------------------------------------------------------------------------------

@dataclass
class ClassCounts:
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
        return self.read + len(self.bad)

    @property
    def sampled(self) -> bool:  # a random part of the dataset (unreadable samples aside)
        return self.looked < self.total


def class_counts(reader: DatasetReader, opts: StatsOptions) -> ClassCounts | None:
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
    ids = random_ids(total, opts.sample, opts.seed)
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
    """Warnings: empty classes, rare classes, labels outside the class list, unread samples."""
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
                   + _some(repr(n) for n in empty))
    if counts.any():
        median = float(np.median(counts[counts > 0]))
        rare = [(n, c) for n, c in zip(cc.names, cc.counts, strict=True)
                if 0 < c < min_share * median]
        if rare:
            out.append(f"{len(rare):,} classes have under {min_share:.0%} of the median "
                       f"class's {median:,.0f} samples{where}: "
                       + _some(f"{n!r} ({c:,})" for n, c in rare))
    outside = {k: v for k, v in cc.outside.items() if k != NO_LABEL}
    if outside:
        n = sum(outside.values())
        what = "samples are in class folders" if cc.source == "keys" else "samples have labels"
        out.append(f"{n:,} {what} that are not classes of the manifest: "
                   + _some(f"{k} ({v:,})" for k, v in outside.items()))
    if cc.outside.get(NO_LABEL):
        out.append(f"{cc.outside[NO_LABEL]:,} samples{where} have no label")
    if cc.bad:
        out.append(f"{len(cc.bad):,} samples could not be read: {cc.bad[0]}")
    return out


def _some(items, limit: int = 10) -> str:
    items = list(items)
    more = f", ... ({len(items) - limit:,} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


# -- field sizes ----------------------------------------------------------------------------------

@dataclass
class FieldSizes:
    field: str
    samples: int          # samples that have the field
    total: int            # bytes in all
    points: dict          # "min", "p50", "p90", "p99", "max" -> bytes


def field_sizes(reader: DatasetReader) -> list[FieldSizes]:
    """Per field (and the stored sample: record bytes in the shard), size percentiles from the
    indexes alone."""
    load_indexes(reader)
    names = list(reader.manifest.fields)
    parts: dict[str, list] = {n: [] for n in names}
    stored = []
    for shard in range(len(reader.shards)):
        index = reader.index(shard)
        stored.append(np.diff(index.starts.astype(np.int64)))
        numbers = index.entry_fields.astype(np.int64)
        sizes = index.entry_sizes.astype(np.int64)
        for k, name in enumerate(index.fields):
            parts.setdefault(name, []).append(sizes[numbers == k])
    out = [_sizes(name, parts[name]) for name in parts]
    out.append(_sizes("(stored sample)", stored))
    return out


def _sizes(name: str, parts: list) -> FieldSizes:
    values = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if not len(values):
        return FieldSizes(name, 0, 0, {})
    points = {"min": int(values.min())}
    for p in PERCENTILES:
        points[f"p{p}"] = int(np.percentile(values, p, method="nearest"))
    points["max"] = int(values.max())
    return FieldSizes(name, len(values), int(values.sum()), points)


# -- image sizes from headers ---------------------------------------------------------------------

@dataclass
class ImageSizes:
    # read == len(sizes) + len(unreadable) + no_image: every sample looked at is one of the three
    read: int                # samples looked at
    total: int               # samples in the dataset
    fields: Counter          # image field -> sized images
    sizes: list              # (width, height) per sized image
    formats: Counter
    no_image: int = 0        # samples looked at without an image field
    unreadable: list = dataclass_field(default_factory=list)  # "key: reason" (does not decode)
    checked: bool = False    # whole samples read (compressed shards): hash-checked

    def percentiles(self, which: int) -> dict:
        values = np.array([s[which] for s in self.sizes] if self.sizes else [0])
        return {"min": int(values.min()),
                **{f"p{p}": int(np.percentile(values, p, method="nearest"))
                   for p in (10, 50, 90)}, "max": int(values.max())}


def image_sizes(reader: DatasetReader, opts: StatsOptions) -> ImageSizes | None:
    if not any(is_image_field(f) for f in reader.manifest.fields):
        return None
    ids = random_ids(len(reader), opts.sample, opts.seed + 1)
    result = ImageSizes(len(ids), len(reader), Counter(), [], Counter(),
                        checked=reader.manifest.compression != "none")
    if result.checked:  # a compressed payload has no readable header alone: whole samples
        for sample in fetch_samples(reader, ids):
            if isinstance(sample, ShardpackError):
                result.unreadable.append(str(sample))
                continue
            try:
                name = image_field([n for n in sample if len(sample[n])])
            except DecodeError:
                result.no_image += 1
                continue
            data = sample[name]
            _note_header(result, sample["__key__"], name, [(0, data)], len(data))
        return result
    wanted = []  # (key, field, shard name, start, size)
    shards, rows = reader.locate_many(ids)
    for s, r in zip(shards.tolist(), rows.tolist(), strict=True):
        index = reader.index(s)
        try:
            name = image_field([n for n, _, size in index.sample_fields(r) if size])
        except DecodeError:
            result.no_image += 1
            continue
        starts, sizes = index.field_spans[name]
        wanted.append((index.key(r), name, reader.shards[s].name, int(starts[r]), int(sizes[r])))
    _read_headers(reader, result, wanted)
    return result


def _read_headers(reader, result: ImageSizes, wanted: list) -> None:
    """Note the size of each wanted image from ranged reads of its header: first HEAD_BYTES,
    then, in rounds (all images still short side by side), the bytes its parser names next
    (:class:`HeaderShort`), never past the field's size."""
    todo = [(item, [], 0, min(item[4], HEAD_BYTES)) for item in wanted]
    while todo:
        later = []
        for at in range(0, len(todo), 4 * FETCH_CHUNK):
            part = todo[at:at + 4 * FETCH_CHUNK]
            got = _read(reader, [(item[2], item[3] + lo, item[3] + hi)
                                 for item, _, lo, hi in part])
            for (item, parts, lo, _), data in zip(part, got, strict=True):
                _merge(parts, lo, data)
                span = _note_header(result, item[0], item[1], parts, item[4])
                if span is not None:
                    later.append((item, parts, *span))
        todo = later


def _merge(parts: list, lo: int, data) -> None:
    """Add the window ``[lo, lo + len(data))`` to ``parts`` (sorted, joined where they touch)."""
    merged: list = []
    for start, chunk in sorted([*parts, (lo, bytes(data))], key=lambda p: p[0]):
        if merged and start <= merged[-1][0] + len(merged[-1][1]):
            first, held = merged[-1]
            end = first + len(held)
            if start + len(chunk) > end:
                merged[-1] = (first, held + chunk[end - start:])
        else:
            merged.append((start, chunk))
    parts[:] = merged


def _next_span(parts: list, short: HeaderShort, size: int) -> tuple[int, int]:
    """The bytes to read for a header that needs ``[short.at, short.need)``: near a window held
    (a JPEG's next segment), that window grows, at least doubling, so a long run of APPn segments
    takes a few rounds; far beyond (a TIFF directory at the end of the file) a window of its own
    is read, not the bytes between."""
    start, held = max((p for p in parts if p[0] <= short.at), key=lambda p: p[0])
    end = start + len(held)
    if short.at - end <= max(len(held), HEAD_GAP):
        return end, min(size, max(short.need + HEAD_BYTES, end + len(held)))
    return short.at, min(size, short.need + HEAD_BYTES)


def _note_header(result: ImageSizes, key: str, field: str, parts: list,
                 size: int) -> tuple[int, int] | None:
    """Note the size of the image of ``size`` bytes whose windows ``parts`` are at hand; returns
    the span to read next where they are not enough.  Unreadable is only an image that does not
    decode: where the header parser fails, the whole image goes to :func:`header_info` (Pillow,
    then a full decode) before it is called so."""
    try:
        (width, height), kind = read_header(parts, size)
    except HeaderShort as short:
        return _next_span(parts, short, size)
    except ValueError:
        data = parts[0][1]  # (the window from byte 0)
        if len(data) < size:
            if content_format(data) is None:  # not an image format shardpack decodes
                result.unreadable.append(f"{key!r}: {check_image(data, field)}")
                return None
            return len(data), size
        try:
            (width, height), kind = header_info(data)
        except Exception as exc:  # noqa: BLE001 - Pillow raises many types for bad data
            reason = check_image(data, field) or str(exc) or type(exc).__name__
            result.unreadable.append(f"{key!r}: {reason}")
            return None
    result.fields[field] += 1
    result.sizes.append((width, height))
    result.formats[kind] += 1
    return None


# -- the report -----------------------------------------------------------------------------------

@dataclass
class DatasetStats:
    dataset: str
    classes: ClassCounts | None
    fields: list[FieldSizes]
    images: ImageSizes | None
    warnings: list[str]
    min_share: float = 0.01

    def lines(self) -> list[str]:
        out = _class_lines(self.classes)
        out.append("sizes     bytes per sample: min / p50 / p90 / p99 / max (from the indexes)")
        width = max(len(f.field) for f in self.fields)
        for f in self.fields:
            if not f.samples:
                out.append(f"  {f.field:<{width}}  no samples")
                continue
            points = " / ".join(human(f.points[k]) for k in ("min", "p50", "p90", "p99", "max"))
            out.append(f"  {f.field:<{width}}  {points}  ({f.samples:,} samples, "
                       f"{human(f.total)})")
        out += _image_lines(self.images)
        out += [f"warning   {w}" for w in self.warnings]
        return out

    def to_json(self) -> dict:
        cc, im = self.classes, self.images
        return {
            "classes": None if cc is None else {
                "names": cc.names, "counts": cc.counts, "read": cc.read, "total": cc.total,
                "looked": cc.looked, "source": cc.source, "outside": cc.outside,
                "unread": len(cc.bad)},
            "field_sizes": {f.field: {"samples": f.samples, "bytes": f.total, **f.points}
                            for f in self.fields},
            "images": None if im is None else {
                "read": im.read, "total": im.total, "sized": len(im.sizes),
                "fields": dict(im.fields),
                "formats": dict(im.formats), "width": im.percentiles(0),
                "height": im.percentiles(1), "common": _common(im, 10),
                "no_image": im.no_image, "unreadable": len(im.unreadable),
                "hash_checked": im.checked},
            "warnings": self.warnings,
        }

    def plot(self, path) -> None:
        """The class histogram as a PNG (matplotlib)."""
        cc = self.classes
        if cc is None:
            raise ShardpackError("no class labels to plot (no 'cls' field)", path=self.dataset)
        many = len(cc.names) > 60
        fig = new_figure((min(20.0, max(6.0, 0.25 * len(cc.names) + 2)), 4.5))
        ax = fig.add_subplot()
        counts = np.asarray(cc.counts)
        median = float(np.median(counts[counts > 0])) if counts.any() else 0.0
        rare = [bool(c < self.min_share * median) for c in cc.counts]
        ax.bar(range(len(counts)), counts, color=["#c0392b" if r else "#2e86c1" for r in rare])
        if median:
            ax.axhline(median, color="gray", linestyle="--", linewidth=1,
                       label=f"median {median:,.0f} (red: under {self.min_share:.0%} of it)")
            ax.legend(loc="upper right")
        if not many:
            ax.set_xticks(range(len(cc.names)), cc.names, rotation=60, ha="right", fontsize=8)
        ax.set_xlabel(f"class ({len(cc.names):,})")
        ax.set_ylabel("samples")
        ax.set_title(f"{self.dataset}\n{_class_source(cc)}", fontsize=10)
        save_figure(fig, path)


def _which(looked: int, total: int) -> str:
    return f"all {total:,} samples" if looked >= total else \
        f"a random {looked:,} of {total:,} samples (a sample)"


def _class_source(cc: ClassCounts) -> str:
    if cc.source == "keys":
        return f"all {cc.total:,} samples, class from each key's class folder"
    if cc.source == "label-spans":
        return (f"labels of {_which(cc.looked, cc.total)}, read alone (a few bytes each; not "
                "hash-checked: the hash covers the whole sample)")
    return f"labels of {_which(cc.looked, cc.total)}"


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


def _class_lines(cc: ClassCounts | None) -> list[str]:
    if cc is None:
        return ["histogram no labels (no 'cls' field)"]
    out = [f"histogram {len(cc.names):,} classes, {_class_source(cc)}", _class_count(cc)]
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


def _common(im: ImageSizes, top: int) -> list:
    return [[w, h, n] for (w, h), n in Counter(im.sizes).most_common(top)]


def _image_lines(im: ImageSizes | None) -> list[str]:
    if im is None:
        return ["images    no image fields"]
    how = "read whole (compressed shards), hash-checked" if im.checked else \
        "read from the image headers only: not hash-checked ('shardpack verify' checks)"
    fields = ", ".join(f"{k} {v:,}" for k, v in im.fields.most_common())
    why = "do not decode, or fail their hash check" if im.checked else "do not decode"
    out = [f"images    pixel sizes of {_which(im.read, im.total)}", f"  {how}",
           f"  {im.read:,} samples: {len(im.sizes):,} sized{f' ({fields})' if fields else ''}, "
           f"{len(im.unreadable):,} unreadable ({why}), {im.no_image:,} without an image field"]
    if im.sizes:
        for which, name in ((0, "width"), (1, "height")):
            p = im.percentiles(which)
            out.append(f"  {name:<7} min {p['min']:,}  p10 {p['p10']:,}  p50 {p['p50']:,}  "
                       f"p90 {p['p90']:,}  max {p['max']:,}")
        n = len(im.sizes)
        common = ", ".join(f"{w}x{h} {c / n:.0%}" for w, h, c in _common(im, 5))
        out.append(f"  common  {common} ({len(set(im.sizes)):,} distinct)")
        out.append("  formats " + ", ".join(f"{k} {v:,}" for k, v in im.formats.most_common()))
    if im.unreadable:
        out.append(f"  unreadable: {_some(im.unreadable, 3)}")
    return out


def dataset_stats(reader: DatasetReader, opts: StatsOptions = StatsOptions(),
                  name: str | None = None) -> DatasetStats:
    classes = class_counts(reader, opts)
    stats = DatasetStats(name or reader.storage.url, classes, field_sizes(reader),
                         image_sizes(reader, opts), [], opts.min_share)
    if classes is not None:
        stats.warnings += imbalance(classes, opts.min_share)
    return stats
