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

The class counts are :mod:`shardpack.inspect.classes`; the sample reads this module shares with
``preview`` are :mod:`shardpack.inspect.sampling`.  No torch here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from dataclasses import field as dataclass_field

import numpy as np

from shardpack.core.errors import DecodeError, ShardpackError
from shardpack.core.sizes import human
from shardpack.images.content import check_image, content_format, is_image_field
from shardpack.images.headers import HeaderShort, header_info, read_header
from shardpack.inspect.classes import (
    ClassCounts, class_counts, class_lines, class_source, imbalance,
)
from shardpack.inspect.sampling import (
    FETCH_CHUNK, fetch_samples, image_field, load_indexes, new_figure, random_ids, read_spans,
    require_plot, save_figure, some_of, which_samples,
)
from shardpack.read.reader import DatasetReader

HEAD_BYTES = 16 << 10      # first image header read: most headers end well within it
HEAD_GAP = 64 << 10        # a header's next bytes this near those held: read the gap too
PERCENTILES = (50, 90, 99)
# the figure helpers are sampling.py's; importable here as before
__all__ = ["DatasetStats", "FieldSizes", "ImageSizes", "StatsOptions", "dataset_stats",
           "field_sizes", "image_sizes", "new_figure", "require_plot", "save_figure"]


@dataclass(frozen=True)
class StatsOptions:
    """What ``info --stats`` looks at: how many random samples (``sample``; ``seed`` picks
    them), and the share of the median class under which a class is rare (``min_share``)."""

    sample: int = 2000       # images whose headers are read; labels read when keys lack them
    seed: int = 0
    min_share: float = 0.01  # a class under this share of the median class's count is rare


# -- field sizes ----------------------------------------------------------------------------------

@dataclass
class FieldSizes:
    """The sizes of one field across the dataset: how many samples have it, their bytes, and
    percentiles."""

    field: str
    samples: int          # samples that have the field
    total: int            # bytes in all
    points: dict          # "min", "p50", "p90", "p99", "max" -> bytes


def field_sizes(reader: DatasetReader) -> list[FieldSizes]:
    """Per field (and the stored sample: record bytes in the shard), size percentiles from the
    indexes alone.

    Args:
        reader: the dataset.
    """
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
    """Pixel sizes of the images of the samples looked at, with the samples without an image
    and those whose image does not decode."""

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
        """min, p10, p50, p90 and max of the widths (``which`` 0) or heights (1).

        Args:
            which: 0 for widths, 1 for heights.
        """
        values = np.array([s[which] for s in self.sizes] if self.sizes else [0])
        return {"min": int(values.min()),
                **{f"p{p}": int(np.percentile(values, p, method="nearest"))
                   for p in (10, 50, 90)}, "max": int(values.max())}


def image_sizes(reader: DatasetReader, opts: StatsOptions) -> ImageSizes | None:
    """The pixel sizes of the image of ``opts.sample`` random samples, from their headers (whole
    samples where shards are compressed), or None for a dataset without image fields.

    Args:
        reader: the dataset.
        opts: how many samples, and which (``seed``).
    """
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
            got = read_spans(reader, [(item[2], item[3] + lo, item[3] + hi)
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
    """The report of ``info --stats``: class counts, field sizes, image sizes, warnings."""

    dataset: str
    classes: ClassCounts | None
    fields: list[FieldSizes]
    images: ImageSizes | None
    warnings: list[str]
    min_share: float = 0.01

    def lines(self) -> list[str]:
        """The report as ``info --stats`` prints it."""
        out = class_lines(self.classes)
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
        """The report as ``info --stats --json`` writes it."""
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
        """Write the class histogram as a PNG (matplotlib).

        Args:
            path: the file to write.
        """
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
        ax.set_title(f"{self.dataset}\n{class_source(cc)}", fontsize=10)
        save_figure(fig, path)


def _common(im: ImageSizes, top: int) -> list:
    return [[w, h, n] for (w, h), n in Counter(im.sizes).most_common(top)]


def _image_lines(im: ImageSizes | None) -> list[str]:
    if im is None:
        return ["images    no image fields"]
    how = "read whole (compressed shards), hash-checked" if im.checked else \
        "read from the image headers only: not hash-checked ('shardpack verify' checks)"
    fields = ", ".join(f"{k} {v:,}" for k, v in im.fields.most_common())
    why = "do not decode, or fail their hash check" if im.checked else "do not decode"
    out = [f"images    pixel sizes of {which_samples(im.read, im.total)}", f"  {how}",
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
        out.append(f"  unreadable: {some_of(im.unreadable, 3)}")
    return out


def dataset_stats(reader: DatasetReader, opts: StatsOptions = StatsOptions(),
                  name: str | None = None) -> DatasetStats:
    """The ``info --stats`` report of ``reader``'s dataset.

    Args:
        reader: the dataset.
        opts: how many samples are read, and the imbalance threshold.
        name: the dataset's name in the report (default its URL).
    """
    classes = class_counts(reader, opts.sample, opts.seed)
    stats = DatasetStats(name or reader.storage.url, classes, field_sizes(reader),
                         image_sizes(reader, opts), [], opts.min_share)
    if classes is not None:
        stats.warnings += imbalance(classes, opts.min_share)
    return stats
