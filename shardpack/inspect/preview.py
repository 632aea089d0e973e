"""``shardpack preview``: a contact sheet (PNG) or a self-contained HTML page of N samples, each
image drawn with its key and label (docs/preview.md).  Pillow only; no torch.

* Which samples: random (``seed``) or the first ones in stored order, filtered by key prefix
  and by class.  Key prefixes (and an ImageFolder pack's class, its keys' first folder) are
  matched in the indexes, with no sample read; other datasets keep their labels inside the
  samples, so ``class_name`` reads samples in the chosen order until it has N (at most
  ``SCAN_FACTOR`` x N samples, and the summary says when it found fewer).
* How they are read: exactly each sample's bytes by ranged reads, local or remote (never a
  whole shard, never the reader's 8 MB chunks), each checked against its index hash
  (:func:`shardpack.inspect.sampling.fetch_samples`).
* Which image: the default decode's field rule (:func:`shardpack.inspect.sampling.image_field`),
  decoded by :func:`shardpack.images.content.decode_rgb` (what training sees; an image over the
  decode budget, ``SHARDPACK_MAX_PIXELS``, is refused from its header, never decoded).  A sample
  that does not decode, has no image, or whose bytes fail their hash gets a marked cell (red
  border and the reason), never a crash; the summary counts them.
* Drawing the sheet or the page: :mod:`shardpack.inspect.sheet`.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field as dataclass_field

import numpy as np

from shardpack.core.deprecation import keyword_only
from shardpack.core.errors import DecodeError, ShardpackError
from shardpack.images.formats.png import PNG
from shardpack.images.headers import header_info
from shardpack.images.content import decode_rgb
from shardpack.read.reader import DatasetReader
from shardpack.core.sizes import human
from shardpack.inspect.sampling import (
    LABEL_FIELD, fetch_samples, image_field, keys_carry_classes, label_text, label_values,
    load_indexes,
)
from shardpack.inspect.sheet import BORDER, Cell, Layout, draw_sheet, html_page, layout

SCAN_FACTOR = 50       # class filter on labels inside samples: read at most N x this samples
# the drawing is sheet.py's; its names are importable here as before
__all__ = ["BORDER", "Cell", "Layout", "PreviewOptions", "PreviewSummary", "collect",
           "draw_sheet", "html_page", "layout", "make_cell", "make_cells", "preview"]


@dataclass(frozen=True)
class PreviewOptions:
    """What ``shardpack preview`` shows: how many samples (``n``), which (random by ``seed``, or
    the ``first``; of a class, with a key prefix), how big (``cell`` px, ``columns``), which
    image ``field``, and whether as an ``html`` page instead of a PNG."""

    n: int = 64
    seed: int = 0
    first: bool = False               # the first samples in stored order, not random ones
    class_name: str | None = None     # only samples of this class (name, or label value)
    key_prefix: str | None = None     # only samples whose key starts so
    cell: int = 128                   # image area of a cell, px (square)
    columns: int | None = None        # default: ceil(sqrt(N))
    field: str | None = None          # the image field; default: the decode's rule
    html: bool = False                # a self-contained HTML page instead of a PNG


@dataclass
class PreviewSummary:
    """What a preview wrote and read: cells, samples and bytes read, time, notes, and the reason
    of each marked cell."""

    out: str
    cells: int
    read: int                  # samples read
    nbytes: int                # their bytes
    seconds: float
    notes: list = dataclass_field(default_factory=list)
    reasons: list = dataclass_field(default_factory=list)  # "key: why" of each marked cell

    @property
    def marked(self) -> int:
        """Cells marked in red (no image shown)."""
        return len(self.reasons)

    def line(self) -> str:
        """The summary line the command prints."""
        marked = f", {self.marked:,} marked in red" if self.marked else ""
        return (f"wrote {self.out}: {self.cells:,} samples{marked}; read {self.read:,} samples "
                f"({human(self.nbytes)}) by ranged reads in {self.seconds:.2f} s")


# -- which samples --------------------------------------------------------------------------------

def _prefix_rows(index, prefix: bytes) -> np.ndarray:
    """bool per sample of the shard: its key starts with ``prefix`` (vectorised over keys)."""
    starts, ends = index.key_bounds
    ok = (ends - starts) >= len(prefix)
    blob = np.frombuffer(index.key_blob, dtype=np.uint8)
    if not len(blob):
        return ok
    for j, byte in enumerate(prefix):
        ok &= blob[np.minimum(starts + j, len(blob) - 1)] == byte
    return ok


def _matching_ids(reader: DatasetReader, prefixes: list[str]) -> np.ndarray:
    load_indexes(reader)
    found = []
    for shard in range(len(reader.shards)):
        index = reader.index(shard)
        ok = np.ones(index.num_samples, dtype=bool)
        for prefix in prefixes:
            ok &= _prefix_rows(index, prefix.encode("utf-8", "surrogateescape"))
        found.append(np.flatnonzero(ok).astype(np.int64) + int(reader.offsets[shard]))
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _check_class(reader: DatasetReader, name: str, dataset: str) -> None:
    m = reader.manifest
    if not keys_carry_classes(reader) and LABEL_FIELD not in m.fields:
        raise ShardpackError(f"--class {name!r}: the dataset has no labels (no "
                             f"{LABEL_FIELD!r} field)", path=dataset)
    if m.classes is not None and name not in m.classes:
        shown = ", ".join(m.classes[:10]) + (", ..." if len(m.classes) > 10 else "")
        raise ShardpackError(f"--class {name!r}: no such class ({len(m.classes):,} classes: "
                             f"{shown})", path=dataset)


def _order(pool, count: int, opts: PreviewOptions) -> np.ndarray:
    """Up to ``count`` ids of ``pool`` (an int: all of range(pool); or an id array), in the order
    they are wanted: stored order with ``first``, else a seeded random draw."""
    total = pool if isinstance(pool, int) else len(pool)
    count = min(count, total)
    if opts.first:
        picked = np.arange(count, dtype=np.int64)
    else:
        picked = np.random.default_rng(opts.seed).choice(total, size=count, replace=False)
    return picked if isinstance(pool, int) else np.asarray(pool)[picked]


def collect(reader: DatasetReader, opts: PreviewOptions, dataset: str) -> tuple[list, dict]:
    """The samples to show (dicts, or the ShardpackError of a sample whose bytes are wrong) and
    what reading them took: ``{"read": samples, "bytes": n, "notes": [...]}``."""
    if not len(reader):
        raise ShardpackError("the dataset has no samples", path=dataset)
    prefixes, scan = [], False
    if opts.key_prefix is not None:
        prefixes.append(opts.key_prefix)
    if opts.class_name is not None:
        _check_class(reader, opts.class_name, dataset)
        if keys_carry_classes(reader):
            prefixes.append(opts.class_name + "/")
        else:
            scan = True
    pool = _matching_ids(reader, prefixes) if prefixes else len(reader)
    if not (pool if isinstance(pool, int) else len(pool)):
        raise ShardpackError(f"no sample matches {_filters(opts)}", path=dataset,
                             hint="'shardpack ls' lists the keys")
    ids = _order(pool, opts.n * SCAN_FACTOR if scan else opts.n, opts)
    if not scan:
        load_indexes(reader, np.unique(reader.locate_many(ids)[0]))  # side by side, remote
        info = {"read": len(ids), "bytes": _span_bytes(reader, ids), "notes": []}
        if len(ids) < opts.n:
            info["notes"].append(f"only {len(ids):,} samples " + (
                f"match {_filters(opts)}" if prefixes else "in the dataset"))
        return fetch_samples(reader, ids), info
    return _scan_class(reader, ids, pool if isinstance(pool, int) else len(pool), opts, dataset)


def _scan_class(reader: DatasetReader, ids: np.ndarray, candidates: int, opts: PreviewOptions,
                dataset: str) -> tuple[list, dict]:
    """``class_name`` where labels are inside the samples: read ``ids`` (of ``candidates``
    samples passing the key filter) in order, a batch at a time, until N samples of the class
    are found."""
    classes = reader.manifest.classes
    info = {"read": 0, "bytes": 0, "notes": []}
    kept, unread = [], 0
    step = max(opts.n, 64)
    for at in range(0, len(ids), step):
        part = ids[at:at + step]
        info["read"] += len(part)
        labels = label_values(reader, part)
        if labels is not None:  # choose by the label bytes alone, then read the chosen whole
            part = part[[label_text(str(v).encode(), classes) == opts.class_name
                         if v is not None else False for v in labels]]
            part = part[:opts.n - len(kept)]
        info["bytes"] += _span_bytes(reader, part)
        for sample in fetch_samples(reader, part):
            if isinstance(sample, ShardpackError):
                unread += 1
            elif LABEL_FIELD in sample and \
                    label_text(sample[LABEL_FIELD], classes) == opts.class_name:
                kept.append(sample)
        if len(kept) >= opts.n:
            kept = kept[:opts.n]
            break
    if info["read"] < candidates:
        where = (f"the {info['read']:,} samples read (at most N x {SCAN_FACTOR}: this "
                 "dataset's labels are inside its samples)")
    else:
        where = "the dataset" if opts.key_prefix is None else \
            f"the samples matching --key {opts.key_prefix!r}"
    if unread:
        info["notes"].append(f"{unread:,} samples read for --class failed their hash check "
                             "(run 'shardpack verify')")
    if not kept:
        raise ShardpackError(f"no sample of class {opts.class_name!r} in {where}", path=dataset)
    if len(kept) < opts.n:
        info["notes"].append(f"only {len(kept):,} samples of class {opts.class_name!r} in "
                             f"{where}")
    return kept, info


def _span_bytes(reader: DatasetReader, ids) -> int:
    shards, rows = reader.locate_many(ids)
    return sum(b - a for a, b in (reader.index(s).span(r)
                                  for s, r in zip(shards.tolist(), rows.tolist(), strict=True)))


def _filters(opts: PreviewOptions) -> str:
    parts = []
    if opts.key_prefix is not None:
        parts.append(f"--key {opts.key_prefix!r}")
    if opts.class_name is not None:
        parts.append(f"--class {opts.class_name!r}")
    return " and ".join(parts) or "(no filter)"


# -- cells ----------------------------------------------------------------------------------------

def make_cell(sample, classes, has_labels: bool, opts: PreviewOptions) -> Cell:
    """One cell: the sample's image fitted into ``opts.cell`` px, or a reason to mark it."""
    from PIL import Image

    if isinstance(sample, ShardpackError):  # bytes that fail their hash: never shown
        return Cell(sample.key or "?", None, None, sample.message)
    raw = sample.get(LABEL_FIELD)
    label = label_text(raw, classes) if raw is not None else \
        ("(no label)" if has_labels else None)
    cell = Cell(sample["__key__"], label, None)
    try:
        cell.field = image_field([n for n in sample if len(sample[n])], opts.field)
        data = bytes(sample[cell.field])  # (once: the decode and the header read take bytes)
        cell.nbytes = len(data)
        # a thumbnail needs no full decode: a JPEG is decoded at 1/2-1/8 scale when that
        # still covers the cell (12 MP photos: ~8x less work)
        pixels = decode_rgb(data, min_side=opts.cell)
    except DecodeError as exc:
        cell.error = exc.message
        return cell
    except Exception as exc:  # noqa: BLE001 - a sample's bytes never stop the sheet
        cell.error = f"cannot decode: {type(exc).__name__}: {exc}"
        return cell
    image = Image.fromarray(pixels)
    try:  # the JPEG may have been decoded smaller: the size shown is the header's
        cell.size = header_info(data)[0]
    except Exception:  # noqa: BLE001 - it decoded, so this is unlikely; the decoded size then
        cell.size = image.size
    image.thumbnail((opts.cell, opts.cell), Image.Resampling.BICUBIC, reducing_gap=2.0)
    cell.thumb = image
    return cell


def make_cells(reader: DatasetReader, samples: list, opts: PreviewOptions) -> list[Cell]:
    """The cells of ``samples`` (:func:`make_cell`), decoded side by side on a few threads.

    Args:
        reader: the dataset (its classes and fields).
        samples: what :func:`collect` gave.
        opts: the preview's options.
    """
    classes = reader.manifest.classes
    has_labels = LABEL_FIELD in reader.manifest.fields
    threads = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(threads) as pool:  # decoders release the GIL
        return list(pool.map(lambda s: make_cell(s, classes, has_labels, opts), samples))


# -- the command ----------------------------------------------------------------------------------

def _title(dataset: str, count: int, total: int, opts: PreviewOptions) -> str:
    how = "first" if opts.first else f"random (seed {opts.seed})"
    where = f", {_filters(opts)}" if opts.key_prefix is not None or opts.class_name else ""
    return f"{dataset} | {count:,} {how} of {total:,} samples{where}"


def _write(out: str, data: bytes) -> None:
    tmp = f"{out}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, out)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ShardpackError(f"cannot write the preview: {exc.strerror or exc}", path=out) \
            from None


@keyword_only("storage_options")
def preview(dataset, out, opts: PreviewOptions = PreviewOptions(), *,
            storage_options: dict | None = None) -> PreviewSummary:
    """Write a contact sheet (PNG) or, with ``opts.html``, an HTML page of ``opts.n`` samples
    of ``dataset`` to ``out``.

    Args:
        dataset: the dataset's folder or URL.
        out: the file to write.
        opts: which samples, how many, how drawn.
        storage_options: fsspec options for a remote dataset (keyword-only; positional still
            works, deprecated).
    """
    started = time.perf_counter()
    # no cache_dir: nothing fetched whole
    reader = DatasetReader(dataset, storage_options=storage_options)
    name = os.fspath(dataset)
    samples, info = collect(reader, opts, name)
    cells = make_cells(reader, samples, opts)
    title = _title(name, len(cells), len(reader), opts)
    if opts.html:
        data = html_page(cells, opts, title).encode("utf-8")
    else:
        data = PNG.encode(draw_sheet(cells, opts, title))
    out = os.fspath(out)
    _write(out, data)
    return PreviewSummary(out, len(cells), info["read"], info["bytes"],
                          time.perf_counter() - started, info["notes"],
                          [f"{c.key!r}: {c.error}" for c in cells if c.thumb is None])
