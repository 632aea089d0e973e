"""Shard writer: one :class:`ShardTask` -> one shard file and its index, written atomically.

The shard is streamed to a temp file (8 MB write buffer, hashed as it goes), fsynced and renamed;
then the index is written the same way.  An index only exists next to a complete shard, which is
what ``--resume`` relies on.  Runs in worker processes: it takes everything from its arguments.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from . import format as fmt
from .errors import BrokenImageError, DatasetNotFoundError, ShardpackError, SourceError
from .plan import ShardTask
from .images import check_image, check_image_full, is_image_field
from .resize import resize_image
from .samples import SourceField
from .storage import Storage

WRITE_BUFFER = 8 << 20
PROGRESS_EVERY = 64  # samples between reports to ``on_files``

# Set in a pack's worker processes (pack._init_worker) or, writing inline, in the packer: called
# with the number of source files written since the last call, to move the progress bar.
on_files = None


@dataclass(frozen=True)
class ShardResult:
    """What the manifest needs to know about one written shard."""

    number: int
    name: str
    index: str
    samples: int
    bytes: int
    hash: str
    index_bytes: int
    index_hash: str
    fields: tuple[str, ...]
    source_bytes: int = 0
    skipped: dict = field(default_factory=dict)
    first_skips: tuple[str, ...] = ()
    files: int = 0  # source files read

    def manifest_entry(self) -> dict:
        return {"name": self.name, "index": self.index, "samples": self.samples,
                "bytes": self.bytes, "hash": self.hash, "index_bytes": self.index_bytes,
                "index_hash": self.index_hash}


def read_field(f: SourceField) -> bytes:
    """The bytes of one source field, refusing a file that changed since the walk."""
    if f.path is None:
        return f.value
    try:
        fd = os.open(f.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        import socket

        raise SourceError(f"file vanished during the pack (or host {socket.gethostname()} "
                          "does not see it: on a cluster, SRC must be where every worker "
                          "reads it)", path=f.path) from None
    except OSError as exc:
        raise SourceError(f"cannot read: {exc.strerror}", path=f.path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SourceError("is no longer a regular file", path=f.path)
        want = f.size + 1  # one byte more than planned: a short read is EOF, a full one growth
        data = os.read(fd, want)
        total = len(data)
        if 0 < total < want and total < f.size:  # short read before the planned size: keep going
            chunks = [data]
            while total < want:
                chunk = os.read(fd, want - total)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            data = b"".join(chunks)
    except OSError as exc:
        raise SourceError(f"cannot read: {exc.strerror}", path=f.path) from None
    finally:
        os.close(fd)
    if total != f.size or st.st_mtime_ns != f.mtime_ns:
        raise SourceError(f"file changed during the pack (size {f.size} -> "
                          f"{max(total, st.st_size)})", path=f.path,
                          hint="pack again once the source is stable")
    return data


class Readahead:
    """Asks the kernel to start reading the source files of the next samples while this one is
    written (``posix_fadvise(WILLNEED)``: an open, a hint and a close per file, no data copied).
    A cold tree of small files is otherwise read one file at a time, each read waiting for the
    disk; with the hints the disk has up to AHEAD_FILES requests queued.  Bounded by files and
    bytes ahead; a file it cannot open is left for the real read to report."""

    AHEAD_FILES = 64
    AHEAD_BYTES = 32 << 20

    def __init__(self, samples):
        self.paths: list[tuple[str, int]] = []
        self.ends: list[int] = []  # per sample: its files are paths[:ends[i]] minus earlier ones
        for s in samples:
            self.paths += [(f.path, f.size) for f in s.fields
                           if f.path is not None and f.offset is None and not is_url(f.path)]
            self.ends.append(len(self.paths))
        self.sample = 0  # samples started
        self.next = 0    # first path not hinted yet
        self.ahead = 0   # bytes hinted and not yet started
        self.usable = hasattr(os, "posix_fadvise") and bool(self.paths)

    def advance(self) -> None:
        """The next sample is about to be read: hint the files that now fall in the window."""
        if not self.usable or self.sample >= len(self.ends):
            return
        start = self.ends[self.sample - 1] if self.sample else 0
        done = self.ends[self.sample]
        self.sample += 1
        for path_size in self.paths[start:min(done, self.next)]:
            self.ahead -= path_size[1]
        self.next = max(self.next, done)
        limit = min(len(self.paths), done + self.AHEAD_FILES)
        while self.next < limit and self.ahead < self.AHEAD_BYTES:
            path, size = self.paths[self.next]
            self.next += 1
            self.ahead += size
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            except OSError:
                self.usable = False  # not supported here: stop trying
            finally:
                os.close(fd)


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


def _container(f: SourceField, options: dict | None) -> tuple[Storage, str]:
    """(storage of the folder, file name) of the container a field points into; a local
    container that changed since it was indexed is refused."""
    parent, _, name = f.path.rpartition("/")
    storage = Storage(parent or ".", options)
    if storage.local and f.mtime_ns and os.stat(f.path).st_mtime_ns != f.mtime_ns:
        raise SourceError("file changed during the conversion", path=f.path,
                          hint="convert again once the source is stable")
    return storage, name


class RangeReader:
    """Reads byte-range fields of container files (``SourceField.offset`` set) through a sliding
    window: one read of at least ``window`` bytes serves all the fields that follow in it, so a
    shard converted from a tar or MDS file costs a few large reads, not one per field.  Any
    storage fsspec reaches works; a local container is refused if it changed since the plan."""

    def __init__(self, storage_options: dict | None = None, window: int = 16 << 20):
        self.options = storage_options
        self.window = window
        self.storages: dict[str, tuple[Storage, str]] = {}
        self.sizes: dict[str, int] = {}
        self.path = None
        self.start = self.end = 0
        self.buf = b""
        self.files: RemoteFiles | None = None  # whole files at URLs (write_shard sets it)

    def read(self, f: SourceField) -> bytes:
        start, end = f.offset, f.offset + f.size
        if f.path != self.path or start < self.start or end > self.end:
            self._fill(f, start, end)
        return self.buf[start - self.start:end - self.start]

    def _fill(self, f: SourceField, start: int, end: int) -> None:
        if f.path not in self.storages:
            storage, name = self.storages[f.path] = _container(f, self.options)
            self.sizes[f.path] = storage.size(name)
        storage, name = self.storages[f.path]
        size = self.sizes[f.path]
        if end > size:
            raise SourceError(f"field '{f.name}' runs past the end of the file ({end} > {size} "
                              "bytes): truncated or changed since it was indexed", path=f.path)
        stop = min(size, max(end, start + self.window))
        self.buf = b""  # let the old window go before the next one is read
        self.buf = storage.read_bytes(name, start, stop)
        self.path, self.start, self.end = f.path, start, stop


class RemoteFiles:
    """Whole source files on object storage (a ``pack`` of ``s3://...``): fetched ahead in
    batches of up to AHEAD_FILES files / AHEAD_BYTES, each batch as concurrent requests
    (``Storage.read_ranges``), since one request at a time would make a shard of small files
    cost one round trip per file.  Each file is read up to the size the walk listed: a file
    that shrank since is an error; one that changed in place at the same size, or grew, is not
    caught (that would cost a metadata request per file; docs/scale.md)."""

    AHEAD_FILES = 64
    AHEAD_BYTES = 32 << 20

    def __init__(self, task: ShardTask, storage_options: dict | None = None):
        self.options = storage_options
        self.order = [f for s in task.samples for f in s.fields
                      if f.path is not None and f.offset is None and is_url(f.path)]
        self.next = 0
        self.got: dict[str, bytes] = {}
        self.storages: dict[str, Storage] = {}

    def read(self, f: SourceField) -> bytes:
        if f.path not in self.got:
            self._fetch(f)
        data = self.got.pop(f.path)
        if isinstance(data, SourceError):  # this file's own error, raised when it is read
            raise data
        return data

    def _fetch(self, f: SourceField) -> None:
        while self.next < len(self.order) and self.order[self.next].path != f.path:
            self.next += 1  # (skipped samples leave their files behind)
        batch, total = [], 0
        for g in self.order[self.next:]:
            if len(batch) >= self.AHEAD_FILES or (batch and total + g.size > self.AHEAD_BYTES):
                break
            batch.append(g)
            total += g.size
        self.next += len(batch)
        if not batch or batch[0].path != f.path:
            batch.insert(0, f)
        self.got.clear()
        by_parent: dict[str, list[SourceField]] = {}
        for g in batch:
            by_parent.setdefault(g.path.rpartition("/")[0], []).append(g)
        for parent, files in by_parent.items():
            storage = self.storages.get(parent)
            if storage is None:
                storage = self.storages[parent] = Storage(parent, self.options)
            names = [g.path.rpartition("/")[2] for g in files]
            try:
                datas = storage.read_ranges([(n, 0, g.size)
                                             for n, g in zip(names, files, strict=True)])
            except (ShardpackError, OSError):  # one short or missing file spoils the batch:
                datas = [self._one(storage, n, g)  # one by one
                         for n, g in zip(names, files, strict=True)]
            for g, data in zip(files, datas, strict=True):
                if not isinstance(data, SourceError) and len(data) < g.size:
                    data = SourceError(f"file changed during the pack (size {g.size} -> "
                                       f"{len(data)})", path=g.path,
                                       hint="pack again once the source is stable")
                self.got[g.path] = data if isinstance(data, SourceError) else data[:g.size]

    @staticmethod
    def _one(storage: Storage, name: str, f: SourceField) -> bytes | SourceError:
        """One file's bytes, or the error that reading it gave (kept for when it is read)."""
        try:
            return storage.read_bytes(name) if f.size else b""
        except DatasetNotFoundError:
            return SourceError("file vanished during the pack", path=f.path)
        except (ShardpackError, OSError) as exc:
            return SourceError(f"cannot read: {exc}", path=f.path)


def is_url(path: str) -> bool:
    """Whether a source path is a URL for the storage layer rather than a local path."""
    return "://" in path and not path.startswith("file://")


class RowReader:
    """Reads Parquet cells a converter deferred to the writer (``SourceField.column`` set), so
    the parent process never holds or pickles image bytes.  Rows are decoded in batches of about
    ``BATCH_BYTES``, every deferred column of the task at once, walking forward through a row
    group: small batches reuse the allocator's memory, where whole 100 MB row groups had every
    forked writer zero fresh pages for each one (2.3x slower, measured).  pyarrow is imported
    only here."""

    BATCH_BYTES = 2 << 20

    def __init__(self, task: ShardTask, storage_options: dict | None = None):
        self.options = storage_options
        self.columns: dict[str, set] = {}
        for sample in task.samples:
            for f in sample.fields:
                if f.column is not None:
                    self.columns.setdefault(f.path, set()).add(f.column)
        self.files: dict[str, tuple] = {}
        self.path = None
        self.group = -1
        self.batches = iter(())
        self.first = self.stop = 0   # rows of the current batch
        self.values: dict = {}

    def read(self, f: SourceField) -> bytes:
        if f.path != self.path or not self.first <= f.offset < self.stop:
            self._load(f)
        data = self.values[f.column][f.offset - self.first]
        if data is None:  # (sizes may be estimates: see sources/parquet.py)
            raise SourceError(f"row {f.offset} of column {'.'.join(f.column)!r} is null, but "
                              "was not when it was indexed", path=f.path,
                              hint="convert again once the source is stable")
        return data

    def _load(self, f: SourceField) -> None:
        import bisect

        from .sources.parquet import import_pyarrow

        import_pyarrow()  # the allocator setting, when this process imports pyarrow first
        import pyarrow.parquet as pq

        if f.path not in self.files:
            storage, name = _container(f, self.options)
            handle = storage.open_arrow(name)
            pf = pq.ParquetFile(handle)
            starts = [0]
            for i in range(pf.metadata.num_row_groups):
                starts.append(starts[-1] + pf.metadata.row_group(i).num_rows)
            self.files = {f.path: (pf, starts, handle)}  # one file open at a time
            self.path, self.group = None, -1
        pf, starts, _ = self.files[f.path]
        group = bisect.bisect_right(starts, f.offset) - 1
        if not 0 <= group < len(starts) - 1:
            raise SourceError(f"row {f.offset} is past the end of the file ({starts[-1]} rows)",
                              path=f.path)
        if f.path != self.path or group != self.group or f.offset < self.first:
            meta = pf.metadata.row_group(group)
            rows = max(1, self.BATCH_BYTES * meta.num_rows // max(1, meta.total_byte_size))
            top = sorted({c[0] for c in self.columns[f.path]})
            self.batches = pf.iter_batches(batch_size=rows, row_groups=[group], columns=top,
                                           use_threads=False)
            self.path, self.group = f.path, group
            self.first = self.stop = starts[group]
        while not self.first <= f.offset < self.stop:
            batch = next(self.batches, None)
            if batch is None:  # the file has fewer rows than its metadata says
                raise SourceError(f"row {f.offset} is missing from row group {group}",
                                  path=f.path, hint="convert again once the source is stable")
            self.values = {column: _cells(_field(batch.column(column[0]), column[1:]))
                           for column in self.columns[f.path]}
            self.first, self.stop = self.stop, self.stop + batch.num_rows


def _field(array, parts: tuple):
    """The struct field ``parts`` (a path of names) of an Arrow array."""
    import pyarrow.compute as pc

    for part in parts:
        array = pc.struct_field(array, part)
    return array


class _Cells:
    """The cells of an Arrow binary array without a copy each: slices of its data buffer."""

    def __init__(self, offsets: np.ndarray, data: memoryview):
        self.offsets, self.data = offsets, data

    def __getitem__(self, i: int) -> memoryview:
        return self.data[int(self.offsets[i]):int(self.offsets[i + 1])]


def _cells(array):
    """Indexable cells of a binary Arrow array: zero-copy for plain binary without nulls."""
    import pyarrow as pa

    t = array.type
    if array.null_count == 0 and (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        width = 8 if pa.types.is_large_binary(t) else 4
        _, offsets, data = array.buffers()
        offsets = np.frombuffer(offsets, dtype=f"<i{width}", count=len(array) + 1,
                                offset=array.offset * width)
        return _Cells(offsets, memoryview(data) if data is not None else memoryview(b""))
    return array.to_pylist()


def write_shard(task: ShardTask, out_url: str, storage_options: dict | None = None,
                source_options: dict | None = None) -> ShardResult:
    opts = task.options
    storage = Storage(out_url, storage_options)
    ranges = RangeReader(source_options)
    ranges.files = RemoteFiles(task, source_options)  # whole remote files go with the ranges
    rows = RowReader(task, source_options)
    names = sorted({f.name for s in task.samples for f in s.fields})
    column = {n: i for i, n in enumerate(names)}
    width = len(names)
    missing = int(fmt.MISSING)
    field_offsets: list[int] = []  # row-major [rows x width], turned into arrays at the end
    field_sizes: list[int] = []
    starts, raw_sizes, hashes, keys = [], [], [], []
    skipped, first_skips = Counter(), []
    source_bytes = 0
    compressor = None
    if opts.compression == "zstd":
        import zstandard

        compressor = zstandard.ZstdCompressor(level=opts.zstd_level, write_content_size=True)
    shard = fmt.shard_name(task.number, opts.shard_format)
    tar = opts.shard_format == "tar"
    prepare = _prepared if opts.resize or opts.check != "none" else _read_only
    ahead = Readahead(task.samples)
    report, unreported, files = on_files, 0, 0
    with storage.open_atomic(shard) as f:
        sink = _Sink(f)
        if opts.shard_format == "msgpack":
            sink.write(fmt.msgpack_file_header())
        for sample in task.samples:
            ahead.advance()
            if report is not None:
                files += sum(1 for f in sample.fields if f.path is not None)
                unreported += 1
                if unreported == PROGRESS_EVERY:
                    report(files)
                    files = unreported = 0
            try:
                fields = [(sf.name, prepare(sf, opts, ranges, rows)) for sf in sample.fields]
            except SourceError as exc:
                if not opts.skip_bad:
                    raise
                skipped["broken-image" if isinstance(exc, BrokenImageError)
                        else "read-failed"] += 1
                if len(first_skips) < 20:
                    first_skips.append(str(exc))
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
    return ShardResult(task.number, shard, index_file, rows, sink.pos, sink.hasher.hexdigest(),
                       len(index), fmt.content_hash(index), tuple(names), source_bytes,
                       dict(skipped), tuple(first_skips), task.files)


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
    return ShardResult(task.number, shard, index_file, index.num_samples, index.shard_bytes,
                       hasher.hexdigest(), len(data), fmt.content_hash(data), index.fields,
                       source_bytes, skipped, (), task.files)


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


def _read_only(sf: SourceField, opts, ranges: RangeReader, rows: RowReader) -> bytes:
    if sf.path is None:
        return sf.value
    if sf.offset is None:
        return ranges.files.read(sf) if is_url(sf.path) else read_field(sf)
    return ranges.read(sf) if sf.column is None else rows.read(sf)


def _prepared(sf: SourceField, opts, ranges: RangeReader, rows: RowReader) -> bytes:
    """A field's bytes, image fields checked (``--check``) and resized (``--resize``)."""
    data = _read_only(sf, opts, ranges, rows)
    if not is_image_field(sf.name):
        return data
    if opts.check != "none":
        why = (check_image_full if opts.check == "full" else check_image)(data, sf.name)
        if why:
            raise BrokenImageError(why, path=_where(sf),
                                   hint="fix or remove it, or pass --skip-bad to skip and count "
                                        "broken images")
    if opts.resize:
        data = resize_image(data, sf.name, opts.resize, opts.quality, _where(sf))
    return data


def _where(sf: SourceField) -> str:
    if sf.path is None:
        return f"field '{sf.name}'"
    if sf.offset is None:
        return sf.path
    if sf.column is not None:
        return f"{sf.path} row {sf.offset} column {'.'.join(sf.column)}"
    return f"{sf.path} at byte {sf.offset}"
