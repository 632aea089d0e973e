"""Shard writer: one :class:`ShardTask` -> one shard file and its index, written atomically.

The shard is streamed to a temp file (8 MB write buffer, hashed as it goes), fsynced and renamed;
then the index is written the same way.  An index only exists next to a complete shard, which is
what ``--resume`` relies on.  Runs in worker processes: it takes everything from its arguments.
Field bytes come from the readers the task opens (:mod:`shardpack.write.fields`): the writer does
not know how any kind of field is stored, nor how a shard format lays samples out (the format's
codec, :func:`shardpack.format.codec_for`, encodes them).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import xxhash

from shardpack import format as fmt
from shardpack.core.errors import SKIP_BAD, BrokenImageError, SourceError, option_hint
from shardpack.images.content import check_image, check_image_full, is_image_field
import shardpack.write.fields as field_io
from shardpack.write.fields import FileStream
from shardpack.write.plan import ShardTask
from shardpack.write.pixels import PixelForm, pixel_form
from shardpack.write.resize import resize_image
from shardpack.write.samples import SourceField
from shardpack.storage import Storage

WRITE_BUFFER = 8 << 20
# zstd records are compressed, and read back, whole: a field above this is refused with
# --compression zstd (docs/packing.md, "Large samples")
MAX_COMPRESSED_FIELD = 1 << 30
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
        """The first 20 skips, as ``path: message`` lines for the summary."""
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
    """Write shard ``task.number`` and then its index under ``out_url``, each atomically; a
    sample whose fields cannot be read is skipped and counted with ``--skip-bad``, else raises.

    Args:
        task: the plan task: its samples and the pack's options.
        out_url: the dataset's folder or URL.
        storage_options: fsspec options of the output.
        source_options: fsspec options of the sources (for the field readers).
    """
    opts = task.options
    codec = fmt.codec_for(opts.shard_format)
    storage = Storage(out_url, storage_options)
    readers = task.open_readers(source_options)  # one per kind of field (shardpack.write.fields)
    form = pixel_form(opts.pixels)
    columns = _Columns(task, form)
    compressor = _compressor(opts)
    prepare = _prepared if opts.resize or opts.check != "none" or form.converts else _read_only
    progress = _Progress(on_files)
    shard = codec.shard_name(task.number)
    with storage.open_atomic(shard) as f:
        sink = _Sink(f)
        sink.write(codec.file_header())
        for sample in task.samples:
            progress.sample(sample)
            fields, streamed = _read_fields(sample, prepare, opts, readers, columns, form)
            if fields is None:
                continue
            if streamed:
                _write_streamed(codec, sample.key, fields, sink, columns)
                continue
            record, offsets, raw_size = codec.encode_sample(sample.key, fields, compressor)
            columns.add(sample.key, fields, offsets, sink.pos, raw_size, fmt.sample_hash(record))
            sink.write(record)
        end = sink.pos
        sink.write(codec.file_end())
        sink.flush()
    progress.done()
    index = columns.encode_index(opts, sink, end, task.digest)
    index_file = fmt.index_name(task.number)
    storage.write_atomic(index_file, index)
    entry = fmt.ShardEntry(shard, index_file, len(columns.keys), sink.pos,
                           sink.hasher.hexdigest(), len(index), fmt.content_hash(index))
    return ShardResult(task.number, entry, tuple(columns.names), columns.source_bytes,
                       dict(columns.skipped), tuple(columns.skips), task.files)


class _Columns:
    """What the index of a shard being written records, sample by sample: record starts,
    payload sizes, hashes, keys, and each sample's field offsets and sizes (row-major lists,
    one column per field name of the task, made into arrays at the end); and the skips."""

    def __init__(self, task: ShardTask, form: PixelForm):
        # every name a field may be stored under (--pixels renames images); the index keeps
        # only those some sample has (encode_index)
        self.names = sorted({n for s in task.samples for f in s.fields for n in form.names(f.name)})
        self.column = {n: i for i, n in enumerate(self.names)}
        self.width = len(self.names)
        self.offsets: list[int] = []
        self.sizes: list[int] = []
        self.starts, self.raw_sizes, self.hashes, self.keys = [], [], [], []
        self.source_bytes = 0
        self.skipped: Counter = Counter()
        self.skips: list[tuple[str, str, str]] = []

    def add(self, key: str, fields, offsets, start: int, raw_size: int, digest: int) -> None:
        offsets_row, sizes_row = [_MISSING] * self.width, [0] * self.width
        column = self.column
        for (name, data), off in zip(fields, offsets, strict=True):
            offsets_row[column[name]] = off
            sizes_row[column[name]] = len(data)
        self.offsets += offsets_row
        self.sizes += sizes_row
        self.starts.append(start)
        self.raw_sizes.append(raw_size)
        self.hashes.append(digest)
        self.keys.append(key)
        self.source_bytes += sum(sizes_row)

    def skip(self, sample, exc: SourceError) -> None:
        reason = "broken-image" if isinstance(exc, BrokenImageError) else "read-failed"
        self.skipped[reason] += 1
        where = exc.path or next((f.path for f in sample.fields if f.path), sample.key)
        self.skips.append((reason, str(where), exc.message))

    def encode_index(self, opts, sink: _Sink, end: int, digest: int) -> bytes:
        rows, width = len(self.keys), self.width
        offsets = np.array(self.offsets, dtype="<u8").reshape(rows, width)
        sizes = np.array(self.sizes, dtype="<u8").reshape(rows, width)
        used = (offsets != _MISSING).any(axis=0) if rows else np.ones(width, bool)
        if not used.all():  # a name --pixels could have made and no sample has
            self.names = [n for n, keep in zip(self.names, used, strict=True) if keep]
            offsets, sizes = offsets[:, used], sizes[:, used]
        return fmt.encode_index(
            shard_format=opts.shard_format, compression=opts.compression, shard_bytes=sink.pos,
            shard_hash=sink.hasher.digest(), plan_digest=digest,
            skipped=sum(self.skipped.values()), fields=self.names,
            starts=self.starts + [end], raw_sizes=self.raw_sizes, sample_hashes=self.hashes,
            field_offsets=np.ascontiguousarray(offsets), field_sizes=np.ascontiguousarray(sizes),
            keys=self.keys)


_MISSING = int(fmt.MISSING)


def _read_fields(sample, prepare, opts, readers: dict, columns: _Columns, form: PixelForm):
    """(``[(name, bytes or FileStream)]`` of the sample's fields, whether one is a
    FileStream), or (None, False) when one cannot be read and ``--skip-bad`` skips the sample
    (counted in ``columns``).  Runs once per field packed: fields under the streaming size
    (nearly all, and under every limit) go straight to ``prepare``; then the pixels' stored
    form (``--pixels``, ``form``) may turn the sample's image into raw pixels."""
    fields, streamed, large = [], False, field_io.STREAM_SIZE
    try:
        for sf in sample.fields:
            if (sf.size or 0) < large:
                data = prepare(sf, opts, readers)
            else:
                data = _large_field(sf, prepare, opts, readers)
                streamed = streamed or isinstance(data, FileStream)
            if isinstance(data, FileStream):  # a file packed as it is (never an image --pixels
                fields.append((sf.name, data))  # converts: those are prepared)
            else:
                fields.append(form.store(sf.name, data, sf.reader.where(sf)))
        _check_names(fields, sample)
        return fields, streamed
    except SourceError as exc:
        _close_streams(fields)
        if not opts.skip_bad:
            raise
        columns.skip(sample, exc)
        return None, False


def _check_names(fields: list, sample) -> None:
    """Two fields of one name (two images of a sample both stored as raw pixels) are refused."""
    names = [name for name, _ in fields]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise SourceError(f"sample {sample.key!r}: two fields would be stored as {twice[0]!r} "
                          "(two images of one sample as raw pixels)",
                          path=str(next((f.path for f in sample.fields if f.path), sample.key)),
                          hint="pack with --pixels keep, or keep one image a sample")


def _large_field(sf: SourceField, prepare, opts, readers: dict):
    """A field of the streaming size or more: its bytes, or, for a file packed as it is
    (uncompressed, and no image check or resize to apply to it), a :class:`FileStream` the
    writer copies in chunks; over a format's limit, a one-line error."""
    reader = readers[sf.reader]
    most = fmt.codec_for(opts.shard_format).max_field
    if most is not None and (sf.size or 0) > most:
        raise SourceError(f"field {sf.name!r} is {sf.size:,} bytes: {opts.shard_format} "
                          f"shards hold fields of up to {most:,} bytes", path=reader.where(sf),
                          hint=f"pack with {option_hint('shard_format', 'tar')}, which holds "
                               "fields of any size")
    as_is = prepare is _read_only or not is_image_field(sf.name)
    if as_is and opts.compression == "none":
        stream = reader.open_stream(sf)
        if stream is not None:
            return stream
    if opts.compression != "none" and (sf.size or 0) > MAX_COMPRESSED_FIELD:
        raise SourceError(f"field {sf.name!r} is {sf.size:,} bytes: zstd compression "
                          f"compresses a record whole, up to {MAX_COMPRESSED_FIELD:,} bytes a "
                          "field", path=reader.where(sf),
                          hint=f"pack with {option_hint('compression', 'none')}, which copies "
                               "large files in chunks")
    return prepare(sf, opts, readers)


def _close_streams(fields) -> None:
    for _, data in fields:
        if isinstance(data, FileStream):
            data.close()


def _write_streamed(codec, key: str, fields, sink: _Sink, columns: _Columns) -> None:
    """Write a sample holding large files in chunks: the codec lays out the record around
    them (:meth:`~shardpack.format.ShardCodec.sample_parts`), the same bytes its
    ``encode_sample`` joins, and the sample hash is taken as the parts go by.  A file that
    fails or changes while it is copied fails the shard: part of it is written already."""
    hasher = xxhash.xxh3_64()
    start = sink.pos
    try:
        parts, offsets, raw_size = codec.sample_parts(key, fields, _parts_crc)
        for part in parts:
            for chunk in part.chunks() if isinstance(part, FileStream) else (part,):
                hasher.update(chunk)
                sink.write(chunk)
    finally:
        _close_streams(fields)
    columns.add(key, fields, offsets, start, raw_size, hasher.intdigest())


def _parts_crc(parts) -> int:
    """CRC32C of the bytes of ``parts`` in order, files read through in chunks."""
    crc, update = 0, fmt.crc32c_function()
    for part in parts:
        for chunk in part.chunks() if isinstance(part, FileStream) else (part,):
            crc = update(chunk, crc)
    return crc


def _compressor(opts):
    """The zstd compressor of a compressed pack, or None."""
    if opts.compression != "zstd":
        return None
    import zstandard

    return zstandard.ZstdCompressor(level=opts.zstd_level, write_content_size=True)


class _Progress:
    """Source files written, reported to ``report`` (:data:`on_files`) every
    :data:`PROGRESS_EVERY` samples and at the end."""

    def __init__(self, report):
        self.report, self.unreported, self.files = report, 0, 0

    def sample(self, sample) -> None:
        if self.report is None:
            return
        self.files += sum(1 for f in sample.fields if f.path is not None)
        self.unreported += 1
        if self.unreported == PROGRESS_EVERY:
            self.report(self.files)
            self.files = self.unreported = 0

    def done(self) -> None:
        if self.report is not None and self.files:
            self.report(self.files)


def result_from_index(task: ShardTask, storage: Storage) -> ShardResult | None:
    """For ``--resume``: the result of an already complete shard, or None if it must be redone.

    Complete means: the index exists, decodes, was made by the same plan task, and the shard file
    has the size and hash the index records.

    Args:
        task: the plan task the shard was written for.
        storage: the dataset's storage.
    """
    opts = task.options
    shard = fmt.codec_for(opts.shard_format).shard_name(task.number)
    index_file = fmt.index_name(task.number)
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
                                   hint=f"fix or remove it, or pass {SKIP_BAD} to skip and count "
                                        "broken images")
    if opts.resize:
        data = resize_image(data, sf.name, opts.resize, opts.quality, sf.reader.where(sf))
    return data
