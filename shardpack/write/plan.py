"""Samples -> shard tasks: the deterministic plan of a pack.

The plan is a pure function of the sample stream and the options: shard boundaries fall where the
next sample would take the shard past ``shard_size`` bytes (estimated from source sizes plus format
overhead) or past ``max_samples`` samples (default 100,000, as WebDataset's ShardWriter: it bounds
the memory a shard task of tiny files takes in the packer and in its writer process).  A sample
that starts a source block (a Parquet row group, read whole by a writer) also ends the shard when
the block would not fit and the shard is at least half full, so no block is decoded twice.  A
sample larger than ``shard_size`` goes alone into its own shard.  Each :class:`ShardTask` is
self-contained (no global state), so any ``concurrent.futures``-style executor (a local process
pool, Dask, Ray) can run it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import xxhash

from shardpack.core.errors import ShardpackError, SourceError, option_hint
from shardpack.format import codec_for
from shardpack.images.content import is_image_field
from shardpack.write.options import CHECKS, DEFAULT_MAX_SAMPLES, PackOptions, check_part
from shardpack.write.samples import SourceSample

# CHECKS, PackOptions and check_part live in shardpack.write.options; importable here as before
__all__ = ["CHECKS", "FieldCensus", "PackOptions", "PartOf", "ShardTask", "check_part",
           "part_of", "plan"]

@dataclass(frozen=True)
class ShardTask:
    """One shard to write: its samples, whose fields name their readers
    (:mod:`shardpack.fields`), and the options.  Small and picklable: it crosses to worker
    processes and cluster workers."""

    number: int
    samples: tuple[SourceSample, ...]
    options: PackOptions
    source_bytes: int = 0   # planned bytes of all fields
    files: int = 0          # source files read (inline values excluded)

    @property
    def digest(self) -> int:
        """Fingerprint of what this shard is made of: keys, field names, sizes, mtimes, values,
        options.  A shard kept by --resume must carry the same digest in its index."""
        h = xxhash.xxh3_64(repr(sorted(self.options.as_dict().items())).encode())
        for s in self.samples:
            h.update(s.key.encode("utf-8", "surrogateescape") + b"\0")
            for f in s.fields:
                h.update(f"{f.name}\0{f.size}\0{f.mtime_ns}\0{f.offset}\0{f.column}\0".encode())
                if f.value is not None:
                    h.update(f.value)
        return h.intdigest()

    def open_readers(self, storage_options: dict | None = None) -> dict:
        """The readers this task's fields need: ``{reader class: reader}``, one per class its
        fields name (``SourceField.reader``), each opened on its own fields in task order."""
        kinds: dict = {}
        for s in self.samples:
            for f in s.fields:
                kind = kinds.get(f.reader)
                if kind is None:
                    if f.reader is None:
                        raise ShardpackError(f"field {f.name!r} of sample {s.key!r} names no "
                                             "reader (SourceField.reader)")
                    kind = kinds[f.reader] = []
                kind.append(f)
        return {reader: reader(fields, storage_options=storage_options)
                for reader, fields in kinds.items()}


class FieldCensus:
    """Stops a pack whose samples are dotted file names folded together.  Grouping by the first
    dot makes ``IMG_2019.01.05_1234.jpg`` key ``IMG_2019`` with field ``01.05_1234.jpg``: images
    folded into one sample, one field name per image.  Folding always yields field names with a
    dot, so only those are counted: the check fails when at least MIN_RARE dotted names occur in
    a single sample each and they are most of the dotted names (real multi-field datasets repeat
    their few dotted names, ``seg.png``, in every sample), or when one sample holds more than
    MAX_IMAGES_PER_SAMPLE image fields (numbered frames folded per folder: ``frame.0001.jpg``
    repeats across folders, so its names are not rare).  Checked every CHECK_EVERY new names
    (an exploding source fails early) and at the end."""

    MIN_RARE = 4
    CHECK_EVERY = 1024
    MAX_IMAGES_PER_SAMPLE = 256

    def __init__(self):
        self.counts: dict[str, int] = {}   # dotted field name -> samples that have it
        self.first: dict[str, str] = {}    # dotted field name -> key of its first sample

    def add(self, sample: SourceSample) -> None:
        """Count the dotted field names of ``sample``; fail on too many image fields in it.

        Args:
            sample: the next sample of the plan.
        """
        counts = self.counts
        images = 0
        for f in sample.fields:
            name = f.name
            if "." not in name:
                continue
            images += is_image_field(name)
            n = counts.get(name)
            if n is None:
                counts[name] = 1
                self.first[name] = sample.key
                if len(counts) % self.CHECK_EVERY == 0:
                    self.check()
            else:
                counts[name] = n + 1
        if images > self.MAX_IMAGES_PER_SAMPLE:
            name = next(f.name for f in sample.fields if "." in f.name and is_image_field(f.name))
            self._fail(f"sample {sample.key!r} holds {images:,} image fields (e.g. {name!r})")

    def check(self) -> None:
        """Fail when most dotted field names so far occur in a single sample each."""
        rare = [name for name, n in self.counts.items() if n == 1]
        if len(rare) < self.MIN_RARE or 2 * len(rare) <= len(self.counts):
            return
        self._fail(f"{len(self.counts):,} distinct dotted field names, {len(rare):,} of them in "
                   f"a single sample (e.g. sample {self.first[rare[0]]!r} has field "
                   f"{rare[0]!r})")

    @staticmethod
    def _fail(what: str) -> None:
        raise SourceError(f"{what}: file names with dots are being folded into one sample",
                          hint=f"pass {option_hint('group', 'image')} for one sample per "
                               "image file (key = name without the last extension), or "
                               "rename the files to <key>.<field>")


def part_of(key: str, count: int) -> int:
    """The part (of ``count``) a sample belongs to in ``pack --part I/N``: by a hash of its key,
    so parts are disjoint, cover every sample, hold about 1/N each, and do not depend on the
    walk order, the engine or the number of workers."""
    return xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogateescape")) % count


class PartOf:
    """The samples of a source that fall in part ``index`` of ``count`` (:func:`part_of`);
    everything else (report, src) is the source's.  The packer tells the source itself, not
    this wrapper, of its engine (``shardpack.write.pack.RunsOnEngine``)."""

    def __init__(self, source, index: int, count: int):
        self.source, self.index, self.count = source, index, count

    def __getattr__(self, name):
        return getattr(self.source, name)

    def __iter__(self):
        index, count = self.index, self.count
        return (s for s in self.source if part_of(s.key, count) == index)


def plan(samples: Iterable[SourceSample], options: PackOptions,
         census: bool = True) -> Iterator[ShardTask]:
    """The shard tasks of ``samples``, in order (the module's rules).

    Args:
        samples: the source's samples, in walk order.
        options: the pack's options (format, shard size, max samples, ...).
        census: watch field names for dotted names folded together (:class:`FieldCensus`);
            off where files cannot fold (one sample per image file).
    """
    census = FieldCensus() if census else None
    number = 0
    batch: list[SourceSample] = []
    size = nbytes = files = 0
    codec = codec_for(options.shard_format)  # the format's overhead, for the size estimate
    per_field, align = codec.field_overhead, codec.field_align
    limit, max_samples = options.shard_size, options.max_samples or DEFAULT_MAX_SAMPLES
    for sample in samples:
        if census is not None:
            census.add(sample)
        est = codec.sample_overhead(sample.key)
        sample_bytes = sample_files = 0
        for f in sample.fields:  # inlined estimated_size(): this runs once per file
            sample_bytes += f.size
            sample_files += f.path is not None
            est += per_field + f.size + (-f.size % align)
        if batch and (len(batch) >= max_samples or size + est > limit or (
                sample.block and size + sample.block > limit and 2 * size >= limit)):
            yield ShardTask(number, tuple(batch), options, nbytes, files)
            number += 1
            batch, size, nbytes, files = [], 0, 0, 0
        batch.append(sample)
        size += est
        nbytes += sample_bytes
        files += sample_files
    if census is not None:
        census.check()
    if batch:
        yield ShardTask(number, tuple(batch), options, nbytes, files)
