"""Shard writer: one :class:`ShardTask` -> one shard file and its index, written atomically.

The shard is streamed to a temp file (8 MB write buffer, hashed as it goes), fsynced and renamed;
then the index is written the same way.  An index only exists next to a complete shard, which is
what ``--resume`` relies on.  Runs in worker processes: it takes everything from its arguments.
Field bytes come from the readers the task opens (:mod:`shardpack.fields`): the writer does not
know how any kind of field is stored.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from shardpack import format as fmt
from shardpack.core.errors import BrokenImageError, SourceError
from shardpack.images.content import check_image, check_image_full, is_image_field
from shardpack.write.plan import ShardTask
from shardpack.write.resize import resize_image
from shardpack.write.samples import SourceField
from shardpack.storage import Storage

WRITE_BUFFER = 8 << 20
PROGRESS_EVERY = 64  # samples between reports to ``on_files``

# Set in a pack's worker processes (pack._init_worker) or, writing inline, in the packer: called
# with the number of source files written since the last call, to move the progress bar.
on_files = None


@dataclass(frozen=True)
class ShardResult:
    """One written shard: its manifest entry, and what the pack's summary needs besides."""

    number: int
    entry: fmt.ShardEntry
    fields: tuple[str, ...]
    source_bytes: int = 0
    skipped: dict = field(default_factory=dict)
    skips: tuple[tuple[str, str, str], ...] = ()  # every skip: (reason, path, message)
    files: int = 0  # source files read

    @property
    def first_skips(self) -> list[str]:
        return [f"{path}: {message}" for _, path, message in self.skips[:20]]


class _Sink:
    """Buffered, hashed writes to an open file, through one buffer allocated once: growing a
    fresh bytearray per flush made the kernel zero ~2 GB of new pages per 2 GB written."""

    def __init__(self, f):
        self.f = f
        self.buf = bytearray(WRITE_BUFFER)
        self.view = memoryview(self.buf)
        self.fill = 0   # bytes waiting in buf
        self.pos = 0    # bytes written so far (file offset)
        self.hasher = fmt.new_content_hasher()

    def write(self, data) -> None:
        n = len(data)
        if self.fill + n > WRITE_BUFFER:
            self.flush()
            if n > WRITE_BUFFER // 2:  # a large record: straight through
                self.hasher.update(data)
                self.f.write(data)
                self.pos += n
                return
        self.view[self.fill:self.fill + n] = data
        self.fill += n
        self.pos += n

    def flush(self) -> None:
        if self.fill:
            chunk = self.view[:self.fill]
            self.hasher.update(chunk)
            self.f.write(chunk)
            self.fill = 0


def write_shard(task: ShardTask, out_url: str, storage_options: dict | None = None,
                source_options: dict | None = None) -> ShardResult:
    opts = task.options
    storage = Storage(out_url, storage_options)
    readers = task.open_readers(source_options)  # one per kind of field (shardpack.write.fields)
    names = sorted({f.name for s in task.samples for f in s.fields})
    column = {n: i for i, n in enumerate(names)}
    width = len(names)
    missing = int(fmt.MISSING)
    field_offsets: list[int] = []  # row-major [rows x width], turned into arrays at the end
    field_sizes: list[int] = []
    starts, raw_sizes, hashes, keys = [], [], [], []
    skipped, skips = Counter(), []
    source_bytes = 0
    compressor = None
    if opts.compression == "zstd":
        import zstandard

        compressor = zstandard.ZstdCompressor(level=opts.zstd_level, write_content_size=True)
    shard = fmt.shard_name(task.number, opts.shard_format)
    tar = opts.shard_format == "tar"
    prepare = _prepared if opts.resize or opts.check != "none" else _read_only
    report, unreported, files = on_files, 0, 0
    with storage.open_atomic(shard) as f:
        sink = _Sink(f)
        if opts.shard_format == "msgpack":
            sink.write(fmt.msgpack_file_header())
        for sample in task.samples:
            if report is not None:
                files += sum(1 for f in sample.fields if f.path is not None)
                unreported += 1
                if unreported == PROGRESS_EVERY:
                    report(files)
                    files = unreported = 0
            try:
                fields = [(sf.name, prepare(sf, opts, readers)) for sf in sample.fields]
            except SourceError as exc:
                if not opts.skip_bad:
                    raise
                reason = "broken-image" if isinstance(exc, BrokenImageError) else "read-failed"
                skipped[reason] += 1
                where = exc.path or next((f.path for f in sample.fields if f.path), sample.key)
                skips.append((reason, str(where), exc.message))
                continue
            offsets_row, sizes_row = [missing] * width, [0] * width
            for name, data in fields:
                sizes_row[column[name]] = len(data)
            if tar:
                record, offsets = _tar_record(sample.key, fields)
                raw_size = len(record)
            else:
                payload, offsets = fmt.encode_payload(sample.key, fields)
                stored = compressor.compress(payload) if compressor else payload
                record = fmt.record_header(stored, len(payload), compressor is not None) + stored
                raw_size = len(payload)
            for (name, _), off in zip(fields, offsets, strict=True):
                offsets_row[column[name]] = off
            field_offsets += offsets_row
            field_sizes += sizes_row
            starts.append(sink.pos)
            raw_sizes.append(raw_size)
            hashes.append(fmt.sample_hash(record))
            keys.append(sample.key)
            source_bytes += sum(sizes_row)
            sink.write(record)
        end = sink.pos
        if tar:
            sink.write(fmt.TAR_END)
        sink.flush()
    if report is not None and files:
        report(files)
    rows = len(keys)
    index = fmt.encode_index(
        shard_format=opts.shard_format, compression=opts.compression, shard_bytes=sink.pos,
        shard_hash=sink.hasher.digest(), plan_digest=task.digest,
        skipped=sum(skipped.values()), fields=names,
        starts=starts + [end], raw_sizes=raw_sizes, sample_hashes=hashes,
        field_offsets=np.array(field_offsets, dtype="<u8").reshape(rows, width),
        field_sizes=np.array(field_sizes, dtype="<u8").reshape(rows, width), keys=keys)
    index_file = fmt.index_name(task.number)
    storage.write_atomic(index_file, index)
    entry = fmt.ShardEntry(shard, index_file, rows, sink.pos, sink.hasher.hexdigest(),
                           len(index), fmt.content_hash(index))
    return ShardResult(task.number, entry, tuple(names), source_bytes, dict(skipped),
                       tuple(skips), task.files)


def result_from_index(task: ShardTask, storage: Storage) -> ShardResult | None:
    """For ``--resume``: the result of an already complete shard, or None if it must be redone.

    Complete means: the index exists, decodes, was made by the same plan task, and the shard file
    has the size and hash the index records."""
    opts = task.options
    shard, index_file = fmt.shard_name(task.number, opts.shard_format), fmt.index_name(task.number)
    try:
        data = storage.read_bytes(index_file)
        index = fmt.decode_index(data, storage.display(index_file))
    except (FileNotFoundError, fmt.FormatError):
        return None
    if index.plan_digest != task.digest or not storage.exists(shard):
        return None
    if storage.size(shard) != index.shard_bytes:
        return None
    hasher = fmt.new_content_hasher()
    with storage.open(shard) as f:
        while chunk := f.read(WRITE_BUFFER):
            hasher.update(chunk)
    if hasher.digest() != index.shard_hash:
        return None
    # every field of every kept sample, as written (after any --resize)
    source_bytes = int(index.entry_sizes.sum())
    skipped = {"read-failed": index.skipped} if index.skipped else {}
    entry = fmt.ShardEntry(shard, index_file, index.num_samples, index.shard_bytes,
                           hasher.hexdigest(), len(data), fmt.content_hash(data))
    return ShardResult(task.number, entry, index.fields, source_bytes, skipped,
                       _kept_skips(task, index), task.files)


def _kept_skips(task: ShardTask, index) -> tuple[tuple[str, str, str], ...]:
    """The skips of a shard kept by ``--resume``: its planned samples that its index lacks.
    The index keeps their count, not their reasons: they are named as the interrupted run's."""
    if not index.skipped:
        return ()
    kept = set(index.keys())
    return tuple(("read-failed",
                  str(next((f.path for f in s.fields if f.path), s.key)),
                  "skipped by the interrupted run (its reason was not recorded)")
                 for s in task.samples if s.key not in kept)


_PADDING = [bytes(-n % fmt.TAR_BLOCK) for n in range(fmt.TAR_BLOCK)]


def _tar_record(key: str, fields: list[tuple[str, bytes]]) -> tuple[bytes, list[int]]:
    """One sample's tar members, and where each field's data starts in them."""
    parts, offsets, offset = [], [], 0
    for name, data in fields:
        header = fmt.tar_header(fmt.tar_member_name(key, name), len(data))
        pad = _PADDING[len(data) % fmt.TAR_BLOCK]
        offset += len(header)
        offsets.append(offset)
        offset += len(data) + len(pad)
        parts += (header, data, pad)
    return b"".join(parts), offsets


def _read_only(sf: SourceField, opts, readers: dict) -> bytes:
    return readers[sf.reader].read(sf)


def _prepared(sf: SourceField, opts, readers: dict) -> bytes:
    """A field's bytes, image fields checked (``--check``) and resized (``--resize``)."""
    data = readers[sf.reader].read(sf)
    if not is_image_field(sf.name):
        return data
    if opts.check != "none":
        why = (check_image_full if opts.check == "full" else check_image)(data, sf.name)
        if why:
            raise BrokenImageError(why, path=sf.reader.where(sf),
                                   hint="fix or remove it, or pass --skip-bad to skip and count "
                                        "broken images")
    if opts.resize:
        data = resize_image(data, sf.name, opts.resize, opts.quality, sf.reader.where(sf))
    return data
