"""``shardpack merge PART... OUT``: one dataset made of several finished ones ("parts"), without
copying shard bytes through this process when they share storage.

Everything about the parts is checked before OUT is touched: each is a finished dataset (its
manifest decodes), all agree on what their shards are (:data:`AGREE`), their part records
(``pack --part I/N``) make one whole split, and no sample key is in two parts (every index is
read, checked against its part's manifest, and its keys hashed).  Then, under OUT's lock
(:class:`~shardpack.write.outdir.OutLock`), each part's shards and indexes are hard-linked (local,
one
file system), copied by the store (one object store) or streamed (anything else) into OUT as
``shard-00000...`` in merge order (:meth:`~shardpack.storage.Storage.copy_from`), and the
manifest is written last, as in ``pack``.  A failure removes what the merge put into OUT and
publishes nothing.  The parts are only read.  docs/packing.md, "Parts that merge", has the
decisions.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import xxhash

from shardpack import format as fmt
from shardpack.core.errors import IntegrityError, OVERWRITE, PackError, ShardpackError
from shardpack.write.outdir import OutLock, clear_out, out_names
from shardpack.core.sizes import plural
from shardpack.read.reader import DatasetReader
from shardpack.storage import Storage

# manifest keys every part must agree on: what the shards are and what their fields mean
AGREE = ("version", "shard_format", "compression", "hash", "layout", "group", "classes",
         "preprocessing")
THREADS = 8  # indexes read, files linked or copied at once (remote stores: requests in flight)


@dataclass
class MergeSummary:
    """What :func:`merge` did: OUT, the parts, samples, shards and bytes merged, how the
    files got there (hard-linked, copied by the store, copied through this machine), seconds,
    and notes."""

    out: str
    parts: int = 0
    samples: int = 0
    shards: int = 0
    bytes: int = 0        # shard bytes
    linked: int = 0       # files (shards and indexes) hard-linked
    server: int = 0       # files copied by the object store itself
    streamed: int = 0     # files copied through this process
    seconds: float = 0.0
    notes: list = field(default_factory=list)

    def line(self) -> str:
        """The one-line summary the CLI prints."""
        how = [f"{plural(n, 'file')} {what}" for n, what in (
            (self.linked, "hard-linked"), (self.server, "copied by the store"),
            (self.streamed, "copied through this machine")) if n]
        return (f"merged {plural(self.parts, 'part')} into {plural(self.shards, 'shard')} "
                f"({plural(self.samples, 'sample')}, {self.bytes / 1e6:,.1f} MB) in "
                f"{self.seconds:.1f} s" + (": " + ", ".join(how) if how else ""))


@dataclass
class _Part:
    url: str
    storage: Storage
    manifest: fmt.Manifest

    @property
    def record(self) -> fmt.Part | None:
        return self.manifest.part

    def label(self) -> str:
        r = self.record
        return f"{self.url} (part {r.index}/{r.count})" if r else self.url


def merge(parts, out, *, storage_options: dict | None = None, overwrite: bool = False,
          progress: bool = False) -> MergeSummary:
    """Merge the finished datasets ``parts`` (folders or URLs) into one dataset at ``out``.

    Parts must agree on the :data:`AGREE` manifest keys and hold different sample keys.  Parts
    made by ``pack --part I/N`` must be the whole split (0..N-1, one each) and are merged in
    part order, whatever order they are given in; other parts are merged in the order given.
    ``storage_options`` apply to every part and to OUT.  Returns a :class:`MergeSummary`;
    raises a :class:`~shardpack.core.errors.ShardpackError` with a one-line message naming the part
    at fault; nothing is published on failure and the parts are never written.

    Args:
        parts: the datasets merged (folders or URLs).
        out: the merged dataset's folder or URL.
        storage_options: fsspec options, for every part and for ``out``.
        overwrite: replace a dataset at ``out``.
        progress: show a progress bar.
    """
    started = time.perf_counter()
    urls = [os.fspath(p) for p in parts]
    if not urls:
        raise ShardpackError("merge needs at least one PART")
    opened = [_open(url, storage_options) for url in urls]
    _check_distinct(opened)
    ordered = _order(opened)
    _check_agree(ordered)
    counts = {key: [_count_of(p, key) for p in ordered] for key in ("hidden", "ignored")}
    skipped = _skipped(ordered)
    storage = Storage(out, storage_options)
    for p in ordered:
        _check_not_inside(storage, p)
    _check_out(storage, overwrite)  # early, read-only: before the indexes are read
    fields = _check_keys(ordered, progress)
    summary = MergeSummary(out=storage.url, parts=len(ordered))
    with OutLock(storage):
        ours = _check_out(storage, overwrite)  # again, now that no other writer can start
        storage.makedirs()
        if overwrite:
            clear_out(storage, ours)
        entries = _place(storage, ordered, summary, progress)
        try:
            manifest = _manifest(ordered, entries, fields, skipped, counts)
            report = _merge_skip_reports(storage, ordered)
            if report is not None:
                manifest["skip_report"] = report
            storage.write_atomic(fmt.MANIFEST_NAME, fmt.encode_manifest(manifest))
        except BaseException:
            _remove(storage, [n for e in entries for n in (e["name"], e["index"])]
                    + [fmt.SKIPS_NAME])
            raise
    summary.samples = manifest["num_samples"]
    summary.shards = len(entries)
    summary.bytes = manifest["num_bytes"]
    summary.seconds = time.perf_counter() - started
    return summary


def _merge_skip_reports(storage: Storage, parts: list[_Part]) -> dict | None:
    """The parts' skip reports joined in merge order into OUT's (their counts are summed the
    same way), each read bounded by the size its manifest records; None when no part skipped.
    A part's skips without a report (an older release wrote none) leave the merged dataset
    without one: a report must name every skip it counts."""
    records = [(p, p.manifest.skip_report) for p in parts if p.manifest.skipped]
    if not records or any(record is None for _, record in records):
        return None
    size = entries = 0
    with storage.open_atomic(fmt.SKIPS_NAME) as out:
        for part, record in records:
            data = part.storage.read_bytes(record["name"], 0, record["bytes"])
            out.write(data)
            size, entries = size + len(data), entries + record["entries"]
    return {"name": fmt.SKIPS_NAME, "entries": entries, "bytes": size}


def _manifest(parts: list[_Part], entries: list[dict], fields: set, skipped: dict,
              counts: dict) -> dict:
    """The merged manifest: the keys the parts agree on, totals of the new shard entries, the
    indexes' field names, summed skip counts, no part record, ``merged_from``."""
    first = parts[0].manifest
    manifest = {
        "format": fmt.MANIFEST_FORMAT,
        "version": first.version,
        "shard_format": first.shard_format,
        "compression": first.compression,
        "hash": fmt.HASH_NAME,
        "num_samples": sum(e["samples"] for e in entries),
        "num_shards": len(entries),
        "num_bytes": sum(e["bytes"] for e in entries),
        "fields": sorted(fields),
        "classes": fmt.thaw(first.classes),
        "layout": first.layout,
        "skipped": skipped,
        "hidden": sum(counts["hidden"]),
        "group": first.group,
        "ignored": sum(counts["ignored"]),
        "preprocessing": fmt.thaw(first.preprocessing),
        "part": None,
        "merged_from": len(parts),
        "shards": entries,
    }
    sources = [p.manifest.source for p in parts if p.manifest.source is not None]
    if sources:  # converted parts (their source format agrees): their notes, once each
        notes = [n for s in sources for n in (s.get("notes") or []) if isinstance(n, str)]
        manifest["source"] = {"from": sources[0].get("from"), "notes": list(dict.fromkeys(notes))}
    return manifest


# -- the parts -------------------------------------------------------------------------------

def _open(url: str, storage_options: dict | None) -> _Part:
    """A finished dataset: its manifest must be there and decode (DatasetReader says which part
    it is not)."""
    reader = DatasetReader(url, storage_options=storage_options)
    if not reader.shards and reader.manifest.part is None:  # (a part of a split may be
        raise ShardpackError("part holds no shards", path=url)  # empty: it adds nothing)
    return _Part(url, reader.storage, reader.manifest)


def _check_distinct(parts: list[_Part]) -> None:
    seen: dict = {}
    for p in parts:
        place = p.storage.place()
        if place in seen:
            raise ShardpackError(f"the same part is given twice: {seen[place].url!r} and "
                                 f"{p.url!r}")
        seen[place] = p


def _order(parts: list[_Part]) -> list[_Part]:
    """Parts with part records (pack --part I/N): the whole split, in part order.  Parts
    without: the order given.  A mix: refused."""
    split = [p for p in parts if p.record is not None]
    if not split:
        return parts
    if len(split) != len(parts):
        other = next(p for p in parts if p.record is None)
        raise ShardpackError(f"{split[0].label()} is a part of a split (pack --part), "
                             f"{other.url} is not: merge the parts of one split, or datasets "
                             "packed without --part")
    count = split[0].record.count
    for p in split[1:]:
        if p.record.count != count:
            raise ShardpackError(f"{p.label()} and {split[0].label()} come from splits into "
                                 "different numbers of parts: merge the parts of one split")
    by_index: dict[int, _Part] = {}
    for p in split:
        i = p.record.index
        if i in by_index:
            raise ShardpackError(f"part {i}/{count} is given twice: {by_index[i].url} and "
                                 f"{p.url}")
        by_index[i] = p
    missing = [i for i in range(count) if i not in by_index]
    if missing:
        names = ", ".join(f"{i}/{count}" for i in missing[:10]) + (", ..." if len(missing) > 10
                                                                   else "")
        raise ShardpackError(f"{plural(len(missing), 'part')} of the split "
                             f"{'is' if len(missing) == 1 else 'are'} missing: {names} "
                             f"(given: {len(by_index)} of {count})",
                             hint="give every part of the split, 0 to N-1")
    return [by_index[i] for i in range(count)]


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:100] + "...]" * text.startswith("[")


def _check_agree(parts: list[_Part]) -> None:
    first = parts[0]
    for p in parts[1:]:
        for key in AGREE + ("source.from",):
            a, b = _agreed(first.manifest, key), _agreed(p.manifest, key)
            if a != b:
                raise ShardpackError(f"{key} is {_short(fmt.thaw(b))} here, but "
                                     f"{_short(fmt.thaw(a))} in "
                                     f"{first.url}", path=p.url,
                                     hint="merge needs parts that agree on "
                                          + ", ".join(AGREE))


def _agreed(manifest: fmt.Manifest, key: str):
    if key == "source.from":  # converted datasets: from the same source format
        return manifest.source.get("from") if manifest.source is not None else None
    return getattr(manifest, key)


def _count_of(part: _Part, key: str) -> int:
    """``hidden`` or ``ignored`` (decode_manifest checked them), 0 when absent."""
    return getattr(part.manifest, key) or 0


def _skipped(parts: list[_Part]) -> dict:
    total: Counter = Counter()
    for p in parts:  # counts checked by decode_manifest
        total.update(p.manifest.skipped or {})
    return dict(sorted(total.items()))


def _read_index(part: _Part, number: int) -> fmt.ShardIndex:
    """Shard ``number``'s index, checked against the part's manifest as every reader does."""
    entry = part.manifest.shards[number]
    path = part.storage.display(entry.index)
    data = part.storage.read_bytes(entry.index)
    if len(data) != entry.index_bytes or fmt.content_hash(data) != entry.index_hash:
        raise IntegrityError("index does not match its part's manifest (size or hash)",
                             path=path, hint="run shardpack verify on the part")
    index = fmt.decode_index(data, path)
    if (index.num_samples, index.shard_bytes, index.shard_hash.hex(), index.shard_format,
            index.compression) != (entry.samples, entry.bytes, entry.hash,
                                   part.manifest.shard_format, part.manifest.compression):
        raise IntegrityError("index disagrees with its part's manifest on the shard's samples, "
                             "size, hash, format or compression", path=path,
                             hint="run shardpack verify on the part")
    return index


def _key_hashes(index: fmt.ShardIndex) -> np.ndarray:
    blob, offsets = memoryview(index.key_blob), index.key_offsets.tolist()
    h = xxhash.xxh3_64_intdigest
    return np.fromiter((h(blob[a:b]) for a, b in zip(offsets, offsets[1:], strict=False)),
                       dtype=np.uint64, count=index.num_samples)


def _check_keys(parts: list[_Part], progress: bool) -> set:
    """Read every index (checked) and refuse a key that is in two parts.  Keeps 8 bytes per
    key (its xxh3-64) in one array, sorted; equal hashes in different parts are confirmed by
    comparing the keys themselves.  Returns the union of the indexes' field names."""
    jobs = [(pi, si) for pi, p in enumerate(parts) for si in range(len(p.manifest.shards))]
    fields: set = set()
    hashes: list[np.ndarray] = []
    bar = _bar(progress, len(jobs), "reading indexes")

    def scan(job):
        index = _read_index(parts[job[0]], job[1])
        return index.fields, _key_hashes(index)

    try:
        with ThreadPoolExecutor(THREADS) as pool:
            for names, h in pool.map(scan, jobs):
                fields.update(names)
                hashes.append(h)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    starts = np.zeros(len(jobs) + 1, dtype=np.int64)
    np.cumsum([len(h) for h in hashes], out=starts[1:])
    every = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
    del hashes
    ranked = np.sort(every)
    if not np.any(ranked[1:] == ranked[:-1]):
        return fields
    # some hash occurs more than once: compare the keys of each such group
    order = np.argsort(every, kind="stable")
    ranked = every[order]
    bounds = np.concatenate(([0], np.flatnonzero(ranked[1:] != ranked[:-1]) + 1,
                             [len(ranked)]))
    indexes: dict = {}

    def key_at(position: int) -> tuple[str, int, int]:
        j = int(np.searchsorted(starts, position, side="right")) - 1
        pi, si = jobs[j]
        if (pi, si) not in indexes:
            indexes[(pi, si)] = _read_index(parts[pi], si)
        return indexes[(pi, si)].key(position - int(starts[j])), pi, si

    for g in np.flatnonzero(np.diff(bounds) > 1).tolist():
        first_of: dict[str, tuple[int, int]] = {}  # key -> (part, shard) it was first seen in
        for r in range(int(bounds[g]), int(bounds[g + 1])):
            key, pi, si = key_at(int(order[r]))
            if key in first_of and first_of[key][0] != pi:
                (pa, sa), (pb, sb) = sorted([first_of[key], (pi, si)])
                a, b = parts[pa], parts[pb]
                raise ShardpackError(
                    f"sample key {key!r} is in two parts: {a.url} "
                    f"({a.manifest.shards[sa].name}) and {b.url} "
                    f"({b.manifest.shards[sb].name})",
                    hint="the parts of a merge must hold different samples")
            first_of.setdefault(key, (pi, si))
    return fields


# -- OUT ---------------------------------------------------------------------------------------

def _check_not_inside(storage: Storage, part: _Part) -> None:
    (fs_out, out), (fs_part, root) = storage.place(), part.storage.place()
    if fs_out == fs_part and (out == root or out.startswith(root.rstrip("/") + "/")):
        raise ShardpackError(f"OUT is {'the part' if out == root else 'inside the part'} "
                             f"{part.url}: merge never writes into a part", path=storage.url,
                             hint="choose another OUT")


def _check_out(storage: Storage, overwrite: bool) -> list[str]:
    """OUT must be empty, or with --overwrite hold only shardpack's files (a previous pack or
    merge); returns those."""
    if storage.exists() and not storage.fs.isdir(storage.root):
        raise ShardpackError("output exists and is not a folder", path=storage.url)
    ours, foreign = out_names(storage)
    if foreign and overwrite:
        raise ShardpackError(f"output folder holds files shardpack did not write "
                             f"({foreign[0]!r}...); refusing to touch them", path=storage.url,
                             hint="choose an empty folder")
    if (ours or foreign) and not overwrite:
        raise ShardpackError("output folder is not empty", path=storage.url,
                             hint=f"pass {OVERWRITE} to replace the dataset there, or choose an "
                                  "empty folder")
    return ours


def _place(storage: Storage, parts: list[_Part], summary: MergeSummary,
           progress: bool) -> list[dict]:
    """Every shard and index of the parts into OUT, renumbered in merge order; their manifest
    entries.  On any failure, what was put into OUT is removed."""
    shard_format = parts[0].manifest.shard_format
    jobs = [(p, entry) for p in parts for entry in p.manifest.shards]
    entries = [{"name": fmt.shard_name(n, shard_format), "index": fmt.index_name(n),
                **{k: getattr(entry, k) for k in ("samples", "bytes", "hash", "index_bytes",
                                         "index_hash")}}
               for n, (_, entry) in enumerate(jobs)]
    started: list[str] = []  # names in OUT a job began to write (removed on failure)
    lock = threading.Lock()
    ways: Counter = Counter()

    def put(part: _Part, name: str, dest: str, size: int, content_hash: str) -> None:
        with lock:
            started.append(dest)
        how = _copy(storage, part, name, dest, size, content_hash)
        with lock:
            ways[how] += 1

    def job(number: int) -> None:
        part, entry = jobs[number]
        new = entries[number]
        put(part, entry.name, new["name"], entry.bytes, entry.hash)
        put(part, entry.index, new["index"], entry.index_bytes, entry.index_hash)
        # indexes are small: read back and hashed whichever way they came
        data = storage.read_bytes(new["index"])
        if len(data) != entry.index_bytes or fmt.content_hash(data) != entry.index_hash:
            raise IntegrityError(f"the copy of {part.storage.display(entry.index)} does not "
                                 "match its part's manifest", path=storage.display(new["index"]))

    bar = _bar(progress, len(jobs), "merging")
    pool = ThreadPoolExecutor(THREADS)
    try:
        for _ in pool.map(job, range(len(jobs))):
            if bar is not None:
                bar.update(1)
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        _remove(storage, started)
        raise
    finally:
        pool.shutdown(wait=True)
        if bar is not None:
            bar.close()
    summary.linked, summary.server, summary.streamed = (ways["linked"], ways["server"],
                                                        ways["streamed"])
    if summary.streamed and any(storage.can_link(p.storage) for p in parts):
        summary.notes.append(f"{plural(summary.streamed, 'file')} copied, not hard-linked: OUT "
                             "is on another file system than a part, or it allows no links")
    return entries


def _copy(storage: Storage, part: _Part, name: str, dest: str, size: int,
          content_hash: str) -> str:
    """File ``name`` of ``part`` into OUT as ``dest`` (:meth:`Storage.copy_from`); how."""
    try:
        return storage.copy_from(part.storage, name, dest, size=size, content_hash=content_hash)
    except ShardpackError:
        raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise PackError("out of disk space", path=storage.display(dest),
                            hint="free some space, then run the merge again") from None
        raise PackError(f"cannot link or copy {part.storage.display(name)} here: "
                        f"{exc.strerror or exc}", path=storage.display(dest)) from exc


def _remove(storage: Storage, names: list[str]) -> None:
    """Best effort: the error on its way out is the one to report."""
    for name in names:
        try:
            storage.remove(name)
        except Exception:  # noqa: BLE001
            pass
    try:
        storage.remove_temp_files()
    except Exception:  # noqa: BLE001
        pass


def _bar(enabled: bool, total: int, desc: str):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit=" shards", desc=desc, dynamic_ncols=True)
