"""``shardpack export``: a shardpack dataset out to other tools' formats.

Layouts (docs/convert.md):

* ``webdataset``: ``OUT/shard-000000.tar``, ... holding members ``<key>.<field>`` in sample order,
  fields sorted, deterministic headers (:func:`shardpack.format.tar_header`); a shard ends before
  the sample that would take it past ``shard_size`` (a larger sample goes alone).  Member names
  are :func:`shardpack.format.tar_member_name`'s: ``webdataset.WebDataset(urls)`` gives a key with
  a '.' in its last part escaped and field names lower-cased (notes say so), ``convert`` of OUT
  gives back the dataset exactly (it reads :data:`MARKER_NAME`, :func:`read_marker`);
* ``parquet``: ``OUT/part-00000.parquet``, ... with a string column ``__key__`` and one binary
  column per field (null where a sample lacks the field); ``cls`` is int64 when every value is a
  canonical ASCII integer (else binary).  Row groups of about ROW_GROUP_BYTES; a file ends at
  ``shard_size`` bytes of field data.  The schema metadata carries the class names twice: as a
  Hugging Face ``ClassLabel`` feature of ``cls`` and as ``shardpack`` metadata;
* ``files``: ``OUT/<key>.<field>`` through :func:`shardpack.interop.unpack.unpack` (local OUT only).

Publishing: OUT's lock is held throughout (pack's :class:`~shardpack.write.outdir.OutLock`: one
run at a time per OUT), its file removed at the end when this run made it.  OUT must be missing or
empty unless ``overwrite`` (which un-publishes and removes an
earlier export there, and refuses a folder holding anything else).  Every tar or Parquet file is
written atomically, then :data:`MARKER_NAME` last: it is the commit point.  On an error the files
of the run are removed, so OUT holds no partial export.  ``files`` builds the tree in a hidden
sibling folder and renames it onto OUT when complete (a run killed with SIGKILL leaves that folder:
the next run for the same OUT removes it, once its owner process is gone).

Hostile datasets and full disks (docs/packing.md): a manifest naming one shard file twice is
refused; a full disk or another write error is one line (export has no ``--resume``: it is run
again); a local OUT that is a symbolic link is followed to the folder it names (a link to nothing,
or to a file, is refused).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import time
from dataclasses import dataclass, field

from shardpack import format as fmt
from shardpack.interop.pixelsout import AsStored, RawAsPng, pixels_writer
from shardpack.core.errors import (OVERWRITE, RESUME, FileSystemError, PackError,
                                   ShardpackError, SourceError)
from shardpack.core.sizes import parse_size
from shardpack.read.reader import open_reader
from shardpack.storage import Storage, is_temp_name
from shardpack.interop.unpack import check_shard_names, os_error, resolve_out
from shardpack.write.outdir import LOCK_NAME, OutLock

EXPORT_FORMATS = ("webdataset", "parquet", "files")
MARKER_NAME = "_shardpack_export.json"  # a leading '_': pyarrow and Spark readers skip it
ROW_GROUP_BYTES = 32 << 20
ROW_GROUP_ROWS = 10_000
_OURS = re.compile(r"shard-\d{6}\.tar|part-\d{5}\.parquet|" + re.escape(MARKER_NAME))
_CANONICAL_INT = re.compile(rb"-?(?:0|[1-9][0-9]{0,18})")
_INT64 = (-(1 << 63), (1 << 63) - 1)
MARKER_MAX_BYTES = 64 << 20  # one name per file written: a marker is far smaller
_FOREIGN_MARKER = (f"remove {MARKER_NAME} to read the tars as any other writer's (escaped "
                   "keys then stay escaped)")


@dataclass
class ExportSummary:
    """What :func:`export` did: OUT, the format, samples, files and field bytes written,
    seconds, and notes."""

    out: str
    to: str
    samples: int = 0
    files: int = 0          # tar shards, Parquet files, or plain files written
    bytes: int = 0          # field bytes exported
    seconds: float = 0.0
    notes: list = field(default_factory=list)
    first_skips: list = field(default_factory=list)  # export skips nothing; kept for the CLI

    def line(self) -> str:
        """The one-line summary the CLI prints."""
        return (f"exported {self.samples:,} samples ({self.bytes / 1e6:,.1f} MB of fields) to "
                f"{self.to} at {self.out}: {self.files:,} files in {self.seconds:.1f} s")


class _NotInteger(Exception):
    """A ``cls`` value that int64 cannot hold exactly: the Parquet export starts over."""


def export(dataset, out, *, to: str, storage_options: dict | None = None,
           shard_size="256MB", overwrite: bool = False, progress: bool = False,
           pixels_as: str = "npy") -> ExportSummary:
    """Write the dataset at ``dataset`` to ``out`` as ``to``; returns an :class:`ExportSummary`.

    Args:
        dataset: the dataset's folder or URL.
        out: the folder or URL written (must be missing or empty unless ``overwrite``).
        to: one of :data:`EXPORT_FORMATS`.
        storage_options: fsspec options, for both ``dataset`` and ``out``.
        shard_size: where a tar or Parquet file ends (bytes, or a size like "256MB").
        overwrite: replace an earlier export at ``out``.
        progress: show a progress bar.
        pixels_as: raw-pixel fields (``pack --pixels``) as stored (``"npy"``) or encoded as PNG
            (``"png"``: ``rgb.npy`` becomes ``png``).
    """
    if to not in EXPORT_FORMATS:
        raise ShardpackError(f"unknown export format {to!r}: expected one of {EXPORT_FORMATS}")
    limit = parse_size(shard_size)
    field_out = pixels_writer(pixels_as)
    started = time.perf_counter()
    reader = open_reader(dataset, storage_options=storage_options)
    check_shard_names(reader)
    summary = ExportSummary(out=os.fspath(out), to=to)
    try:
        summary = _export(reader, dataset, out, to, storage_options, limit, overwrite, progress,
                          summary, field_out)
    except PackError as exc:
        if exc.message.startswith("out of disk space") and RESUME in (exc.hint or ""):
            # Storage.open_atomic's hint is pack's: export has no --resume, it is run again
            raise FileSystemError(f"{exc.message}; nothing was published", path=exc.path,
                                  hint="free some space, then run the export again",
                                  errno=errno.ENOSPC) from None
        raise
    except ShardpackError:
        raise
    except OSError as exc:  # making OUT, a read or write failing, renaming into place, ...
        raise os_error(exc, os.fspath(out)) from None
    summary.seconds = time.perf_counter() - started
    return summary


def _export(reader, dataset, out, to: str, storage_options: dict | None, limit: int,
            overwrite: bool, progress: bool, summary: ExportSummary,
            field_out: AsStored) -> ExportSummary:
    if to == "files":
        if Storage(out, storage_options).local_path() is None:  # unpack writes local files
            raise ShardpackError("--to files writes a local folder", path=os.fspath(out),
                                 hint="export to webdataset or parquet for remote storage")
        out = resolve_out(out)  # a symbolic link OUT: its folder is the one replaced
    storage = Storage(out, storage_options)
    local = storage.local_path()
    if local is not None:
        resolve_out(local)  # refuses a link to nothing or to a file; follows the rest
    existed = storage.exists()
    try:
        # pack's lock: one writer at a time per OUT, whatever each writes (docs/convert.md)
        with OutLock(storage, remove=True):
            if to == "files":
                _export_files(reader, os.fspath(dataset), out, storage_options, overwrite,
                              progress, summary, field_out)
            else:
                summary = _export_formats(reader, storage, to, limit, overwrite, progress,
                                          summary, field_out)
    except BaseException:
        if not existed:  # a failed export leaves no empty OUT behind that it made itself
            with contextlib.suppress(Exception):
                storage.fs.rmdir(storage.root)
        raise
    return summary


def _export_formats(reader, storage: Storage, to: str, limit: int, overwrite: bool,
                    progress: bool, summary: ExportSummary,
                    field_out: AsStored) -> ExportSummary:
    """``webdataset`` or ``parquet``, under OUT's lock."""
    _prepare(storage, overwrite)
    int_cls = "cls" in reader.fields
    while True:
        try:
            _export_shards(reader, storage, to, limit, int_cls, progress, summary, field_out)
            break
        except _NotInteger:  # everything written was removed: start over, cls as binary
            int_cls = False
            summary = ExportSummary(out=summary.out, to=to)
    if to == "parquet" and "cls" in reader.fields and not int_cls:
        summary.notes.append("field 'cls' is not always an ASCII integer: exported as binary")
    return summary


def _export_shards(reader, storage: Storage, to: str, limit: int, int_cls: bool,
                   progress: bool, summary: ExportSummary, field_out: AsStored) -> None:
    written: list[str] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(reader), unit="sample", desc=f"exporting to {to}",
                   dynamic_ncols=True)
    try:
        samples = _samples(reader, bar, summary, field_out)
        if to == "webdataset":
            _write_tar_shards(reader, samples, storage, limit, written, summary)
        else:
            _write_parquet_parts(reader, samples, storage, limit, written, int_cls)
        summary.files = len(written)
        marker = {"format": "shardpack-export", "to": to, "dataset": reader.storage.url,
                  "samples": summary.samples, "bytes": summary.bytes, "files": written,
                  "fields": sorted({field_out.name(f) for f in reader.fields}),
                  "classes": fmt.thaw(reader.manifest.classes)}
        storage.write_atomic(MARKER_NAME, fmt.encode_manifest(marker))
    except BaseException:
        with contextlib.suppress(Exception):  # the error that stopped the export is the news
            for name in written:
                storage.remove(name)
            storage.remove_temp_files()
        raise
    finally:
        if bar is not None:
            bar.close()


def _samples(reader, bar, summary: ExportSummary, field_out: AsStored):
    """Every sample of the dataset in order, one shard in memory at a time; counts them.  A key
    that unpack would refuse (format.unsafe_name_reason: '..', absolute, not UTF-8, ...) is
    refused for every format, before anything of it is written."""
    for shard in range(len(reader.shards)):
        for sample in reader.iter_shard(shard):
            why = fmt.unsafe_name_reason(sample[fmt.KEY_FIELD])
            if why:
                raise ShardpackError(f"sample key cannot be exported: {why}",
                                     path=reader.shard_path(shard), key=sample[fmt.KEY_FIELD])
            sample = dict(field_out(k, v) if k != fmt.KEY_FIELD else (k, v)
                          for k, v in sample.items())
            summary.samples += 1
            summary.bytes += sum(len(v) for k, v in sample.items() if k != fmt.KEY_FIELD)
            yield shard, sample
            if bar is not None:
                bar.update(1)


def cls_value(data: bytes) -> int:
    """The int64 of a canonical ASCII integer (``b"7"``, ``b"-1"``; not ``b"07"``), else
    :class:`_NotInteger`: int64 must give the same bytes back."""
    if not _CANONICAL_INT.fullmatch(data) or data == b"-0":
        raise _NotInteger
    value = int(data)
    if not _INT64[0] <= value <= _INT64[1]:
        raise _NotInteger
    return value


def read_marker(storage: Storage) -> dict | None:
    """The export marker (:data:`MARKER_NAME`) of the folder ``storage``, checked; None where
    there is none.  ``convert`` reads it to undo the escape of the member names in the tars it
    lists (docs/convert.md); one that is not an export's marker is an error naming it.

    Args:
        storage: the folder.
    """
    if not storage.exists(MARKER_NAME):
        return None
    shown = storage.display(MARKER_NAME)
    size = storage.size(MARKER_NAME)
    if size > MARKER_MAX_BYTES:
        raise SourceError(f"{MARKER_NAME} is {size:,} bytes, more than an export marker holds",
                          path=shown, hint=_FOREIGN_MARKER)
    try:
        marker = json.loads(storage.read_bytes(MARKER_NAME, size=size))
    except (ValueError, RecursionError):
        marker = None
    if not (isinstance(marker, dict) and marker.get("format") == "shardpack-export"
            and isinstance(marker.get("to"), str) and _strings(marker.get("files"))
            and (marker.get("classes") is None or _strings(marker["classes"]))):
        raise SourceError("not the marker shardpack export writes (damaged or edited)",
                          path=shown, hint=_FOREIGN_MARKER)
    return marker


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _prepare(storage: Storage, overwrite: bool) -> None:
    """Make OUT ready for an export (its lock held)."""
    if storage.exists() and not storage.fs.isdir(storage.root):
        raise ShardpackError("output exists and is not a folder", path=storage.url)
    names = [n for n in storage.listdir() if not is_temp_name(n) and n != LOCK_NAME]
    if names and not overwrite:
        raise ShardpackError("output folder is not empty", path=storage.url,
                             hint=f"choose a new folder, or pass {OVERWRITE} to replace an "
                                  "earlier export there")
    foreign = [n for n in names if not _OURS.fullmatch(n)]
    if foreign:
        raise ShardpackError(f"output folder holds files export did not write ({foreign[0]!r}"
                             "...); refusing to touch them", path=storage.url,
                             hint="choose an empty folder")
    storage.makedirs()
    storage.remove_temp_files()
    storage.remove(MARKER_NAME)  # un-publish first, then clear
    for name in names:
        storage.remove(name)


def _export_files(reader, dataset: str, out: str, storage_options: dict | None,
                  overwrite: bool, progress: bool, summary: ExportSummary,
                  field_out: AsStored) -> None:
    """``files``, under OUT's lock (``out`` resolved, local)."""
    from shardpack.interop.unpack import remove_stale, unpack_replacing

    remove_stale(out)  # before any refusal: a killed run's leftovers go whatever this run does
    busy = os.path.lexists(out) and (not os.path.isdir(out) or any(
        name != LOCK_NAME for name in os.listdir(out)))
    if busy and not overwrite:
        raise ShardpackError("output exists and is not an empty folder", path=out,
                             hint=f"choose a new folder, or pass {OVERWRITE} to replace it")
    if busy and not os.path.isdir(out):
        raise ShardpackError("output exists and is not a folder", path=out)
    if busy and Storage(out, storage_options).contains(reader.storage) is not None:
        raise ShardpackError("output folder holds the dataset being exported; refusing to "
                             "replace it", path=out, hint="choose another folder")
    for shard in range(len(reader.shards)):
        index = reader.index(shard)
        summary.samples += index.num_samples
        summary.bytes += int(index.entry_sizes.sum())
    # the tree is built in one hidden work folder beside OUT, which a killed run leaves behind
    # and the next run removes (shardpack/interop/unpack.py, docs/packing.md), then swapped in
    # for OUT, which holds at least the lock file by now (it goes with the old OUT)
    pixels_as = "png" if isinstance(field_out, RawAsPng) else "npy"
    summary.files = unpack_replacing(dataset, out, storage_options=storage_options,
                                     progress=progress, pixels_as=pixels_as)


# ---------------------------------------------------------------------------------------------
# WebDataset tar shards
# ---------------------------------------------------------------------------------------------

def _write_tar_shards(reader, samples, storage: Storage, limit: int, written: list,
                      summary: ExportSummary) -> None:
    seen = _Renamed()
    pending = _next_record(samples, seen)
    while pending is not None:
        name = f"shard-{len(written):06d}.tar"
        with storage.open_atomic(name) as f:
            size = 0
            while pending is not None and not (size and size + len(pending) + len(fmt.TAR_END)
                                               > limit):
                f.write(pending)
                size += len(pending)
                pending = _next_record(samples, seen)
            f.write(fmt.TAR_END)
        written.append(name)
    summary.notes += seen.notes()


@dataclass
class _Renamed:
    """What a ``webdataset.WebDataset`` reader gets otherwise than shardpack (docs/convert.md)."""

    escaped: int = 0                          # keys with '.' or '%' in their last part
    upper: set = field(default_factory=set)   # field names with upper-case letters
    clashes: int = 0                          # samples with fields that differ only in case

    def notes(self) -> list[str]:
        """The summary's notes about them."""
        notes = []
        if self.escaped:
            notes.append(f"{self.escaped:,} keys have '.' or '%' in their last part: the member "
                         "names escape them (%2E, %25), webdataset.WebDataset gives the escaped "
                         "keys, shardpack convert of OUT the keys as they were")
        if self.upper:
            notes.append(f"fields with upper-case letters ({', '.join(sorted(self.upper))}): "
                         "webdataset.WebDataset gives them lower-cased, shardpack convert as "
                         "they are")
        if self.clashes:
            notes.append(f"{self.clashes:,} samples hold fields whose names differ only in case: "
                         "webdataset.WebDataset refuses them (duplicate file name)")
        return notes


def _next_record(samples, seen: _Renamed) -> bytes | None:
    """The tar members of the next sample, or None at the end."""
    item = next(samples, None)
    if item is None:
        return None
    shard, sample = item
    key = sample[fmt.KEY_FIELD]  # (safe: _samples checked it)
    last = key.rpartition("/")[2]
    seen.escaped += "." in last or "%" in last
    names = [name for name in sample if name != fmt.KEY_FIELD]
    seen.upper.update(name for name in names if name != name.lower())
    seen.clashes += len({name.lower() for name in names}) < len(names)
    parts = []
    for name in names:
        data = sample[name]
        parts += [fmt.tar_header(fmt.tar_member_name(key, name), len(data)), data,
                  bytes(fmt.tar_padding(len(data)))]
    return b"".join(parts)


# ---------------------------------------------------------------------------------------------
# Parquet files
# ---------------------------------------------------------------------------------------------

def _parquet_schema(reader, int_cls: bool):
    import pyarrow as pa

    classes = fmt.thaw(reader.manifest.classes)
    columns = [pa.field(fmt.KEY_FIELD, pa.string(), nullable=False)]
    features = {fmt.KEY_FIELD: {"dtype": "string", "_type": "Value"}}
    for name in reader.fields:
        integer = name == "cls" and int_cls
        columns.append(pa.field(name, pa.int64() if integer else pa.binary()))
        features[name] = ({"names": classes, "_type": "ClassLabel"} if integer and classes
                          else {"dtype": "int64" if integer else "binary", "_type": "Value"})
    metadata = {"huggingface": json.dumps({"info": {"features": features}}),
                "shardpack": json.dumps({"classes": classes, "dataset": reader.storage.url})}
    return pa.schema(columns, metadata=metadata)


def _write_parquet_parts(reader, samples, storage: Storage, limit: int, written: list,
                         int_cls: bool) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ShardpackError("--to parquet needs pyarrow",
                             hint="pip install 'shardpack[parquet]'") from None
    schema = _parquet_schema(reader, int_cls)
    names = schema.names
    pending = next(samples, None)
    while pending is not None or not written:  # an empty dataset still gets one (empty) file
        name = f"part-{len(written):05d}.parquet"
        with storage.open_atomic(name) as f, pq.ParquetWriter(f, schema) as writer:
            size = group_bytes = 0
            group: dict[str, list] = {n: [] for n in names}
            while pending is not None:
                sample = pending[1]
                nbytes = sum(len(v) for k, v in sample.items() if k != fmt.KEY_FIELD)
                if size and size + nbytes > limit:
                    break
                for n in names:
                    value = sample.get(n)
                    group[n].append(cls_value(value) if n == "cls" and int_cls
                                    and value is not None else value)
                size += nbytes
                group_bytes += nbytes
                if group_bytes >= ROW_GROUP_BYTES or len(group[names[0]]) >= ROW_GROUP_ROWS:
                    writer.write_table(pa.table(group, schema=schema))
                    group, group_bytes = {n: [] for n in names}, 0
                pending = next(samples, None)
            if group[names[0]]:
                writer.write_table(pa.table(group, schema=schema))
        written.append(name)
