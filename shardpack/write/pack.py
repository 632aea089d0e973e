"""The packer: walk -> plan -> shard tasks on an executor -> manifest, written last.

``pack()`` streams the plan into the executor with a bounded number of tasks in flight, so memory
stays bounded whatever the dataset size.  Any ``concurrent.futures.Executor`` works (pass
``executor=``); by default a local process pool of ``workers`` processes, or inline when
``workers == 1``.  The manifest is the commit point: it is written atomically after every shard and
index is in place, and removed first by ``--overwrite``, so a reader never sees a half-made pack.
Its options are :class:`~shardpack.write.options.PackOptions`; OUT's checks before and after a run
are in :mod:`shardpack.write.prepare`.
"""

from __future__ import annotations

import errno
import time
from collections import Counter
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Protocol, runtime_checkable

from shardpack import format as fmt
from shardpack.core.deprecation import renamed
from shardpack.core.errors import PackError, RESUME, SKIP_BAD, ShardpackError, SourceError
from shardpack.core.options import check_keywords, from_keywords
from shardpack.core.sizes import plural
from shardpack.core.version import __version__
from shardpack.storage import Storage
from shardpack.write import writer
from shardpack.write.engine import Engine, make_engine
from shardpack.write.options import OLD_KEYWORDS, PackOptions
from shardpack.write.outdir import STATE_NAME, OutLock, is_ours
from shardpack.write.plan import PartOf, ShardTask, plan
from shardpack.write.prepare import mark_failed, prepare_out
from shardpack.write.packsource import PackSource
from shardpack.write.skips import SkipLog
from shardpack.write.summary import PackSummary
from shardpack.write.writer import ShardResult, result_from_index, write_shard

__all__ = ["PackSummary", "RunsOnEngine", "engine_of", "pack", "pack_files", "pack_source"]


@renamed(**OLD_KEYWORDS)
def pack(src, out, *, layout: str = "auto", group: str = "auto", follow_links: bool = False,
         allow_empty_classes: bool = False, label_column: str | None = None,
         part: tuple[int, int] | str | None = None, shard_format: str = "tar",
         shard_size: int | str = "256MB",
         max_samples: int | None = None, compression: str = "none", zstd_level: int = 3,
         workers: int | None = None, engine: str = "local", address: str | None = None,
         resize: int | None = None, pixels: str = "keep", quality: int = 90,
         check: str = "quick",
         on_error: str = "raise", resume: bool = False, overwrite: bool = False,
         progress: bool = False, executor: Executor | None = None,
         storage_options: dict | None = None) -> PackSummary:
    """Pack the files under ``src`` into a dataset at ``out``.

    Each option is a field of :class:`~shardpack.write.options.PackOptions`, whose help text is
    the CLI's (``shardpack pack --help``); the old spellings ``format=`` and ``skip_bad=`` still
    work, with a DeprecationWarning.  Nothing is published on failure.

    Args:
        src: a folder or URL, or a .csv/.jsonl listing.
        out: the dataset's folder or URL.
        layout: ``auto``, ``imagefolder`` (class folders) or ``files``.
        group: how files make samples: ``auto``, ``image``, ``webdataset``.
        follow_links: pack what links leading outside ``src`` point to (refused by default).
        allow_empty_classes: keep a class folder without samples as a class (an error by
            default, as torchvision's ImageFolder).
        label_column: a .csv/.jsonl listing's column that becomes the class label ``cls``
            (integers kept, names -> index by sorted name; docs/packing.md, "Listings").
        part: ``(i, n)`` or ``"i/n"``: only the samples of part ``i`` of ``n``
            (:func:`~shardpack.write.plan.part_of`), for ``shardpack merge`` later.
        shard_format: ``tar`` or ``msgpack``.
        shard_size: the target shard size, bytes or text such as ``"256MB"``.
        max_samples: also end a shard after this many samples (default 100,000).
        compression: ``none``, or ``zstd`` (msgpack shards).
        zstd_level: the zstd level.
        workers: processes writing shards (default: all cores).
        engine: ``local``, ``dask`` or ``ray`` (shardpack/write/engine.py): where the walk and
            the shard tasks run.
        address: the dask or ray cluster to use (default: one started for this pack).
        resize: shrink images so the shorter side is this long, once, at pack time.
        pixels: how images are stored: ``"keep"`` (as they came), ``"raw"`` (uint8 RGB pixels
            in an ``rgb.npy`` field), ``"auto"`` or ``"auto:SIZE"`` (raw where the raw bytes
            are at most SIZE; docs/images.md, "Raw pixels").  After ``resize``.
        quality: JPEG/WebP quality when ``resize`` re-encodes.
        check: the image check while packing: ``quick``, ``full`` or ``none``.
        on_error: ``"raise"`` stops at the first bad entry, ``"skip"`` skips and counts them.
        resume: continue an interrupted pack into ``out``.
        overwrite: replace the dataset in ``out``.
        progress: show a progress bar.
        executor: any ``concurrent.futures.Executor``; overrides ``engine``.
        storage_options: fsspec options for remote ``src`` and ``out``.

    Returns:
        A :class:`PackSummary`.  Raises a :class:`~shardpack.core.errors.ShardpackError`
        subclass with a one-line message naming the file at fault.
    """
    options = from_keywords(PackOptions, locals(), command="pack")
    return pack_files(src, out, options, executor=executor, storage_options=storage_options)


check_keywords(pack, PackOptions, "pack")  # pack()'s keywords are PackOptions' fields


def pack_files(src, out, options: PackOptions, *, executor: Executor | None = None,
               storage_options: dict | None = None) -> PackSummary:
    """:func:`pack` with its options checked: walk ``src`` and pack it into ``out``.

    Args:
        src: a folder or URL, or a .csv/.jsonl listing.
        out: the dataset's folder or URL.
        options: the pack's options.
        executor: any ``concurrent.futures.Executor``; overrides ``options.engine``.
        storage_options: fsspec options for remote ``src`` and ``out``.
    """
    source = PackSource(src, layout=options.layout, group=options.group,
                        skip_bad=options.skip_bad, exclude=_inside(out, src, storage_options),
                        follow_links=options.follow_links,
                        allow_empty_classes=options.allow_empty_classes,
                        label_column=options.label_column,
                        need_images=options.check != "none", storage_options=storage_options)
    # --follow-links decides which files are packed: part of the source, as --resume sees it
    # (absent when off, as in states of releases before it)
    origin = {"source": source.src, **({"follow_links": True} if options.follow_links else {})}
    return pack_source(source, out, options, origin=origin, executor=executor,
                       storage_options=storage_options, source_options=storage_options)


def _inside(out, src, storage_options) -> str | None:
    """Where OUT lies inside the folder SRC (left out of the walk), else None: its real path
    (local), or its path on the store (SRC and OUT on one object store).  Decision
    (docs/packing.md): OUT inside SRC is allowed and never packed."""
    return Storage(src, storage_options).contains(Storage(out, storage_options), strictly=True)


@runtime_checkable
class RunsOnEngine(Protocol):
    """A source whose walk runs on the pack's engine too (the file walk of
    :mod:`shardpack.write.samples`): told the engine before it is iterated."""

    def use_engine(self, runner: Engine) -> None:
        """Run the walk's tasks on ``runner``.

        Args:
            runner: the engine the pack's shard tasks run on.
        """


def pack_source(source, out, options: PackOptions, *, origin: dict,
                executor: Executor | None = None, storage_options: dict | None = None,
                source_options: dict | None = None) -> PackSummary:
    """The pipeline behind ``pack`` and ``convert``: any ``source`` -> plan -> shards on the
    executor -> manifest.

    Args:
        source: an iterable of :class:`~shardpack.write.samples.SourceSample` with ``.src`` and
            ``.report``; a :class:`RunsOnEngine` source walks on the pack's engine.
        out: the dataset's folder or URL.
        options: the pack's options (``options.part``: only that part's samples).
        origin: identifies the source in the resume state (a resume must come from the same
            source and options); ``origin["from"]``, when set, names the format a conversion
            read and is recorded in the manifest with the report's notes.
        executor: any ``concurrent.futures.Executor``; overrides ``options.engine``.
        storage_options: fsspec options for ``out``.
        source_options: fsspec options the shard tasks read the source with.
    """
    if options.part is not None:
        origin = {**origin, "part": list(options.part)}
        source = PartOf(source, *options.part)
    started = time.perf_counter()
    storage = Storage(out, storage_options)
    with OutLock(storage):
        return _pack_locked(source, storage, options, origin, started, executor=executor,
                            source_options=source_options)


def engine_of(engine: str, address: str | None, workers: int | None,
              executor: Executor | None) -> Engine:
    """The engine a pack runs on (shardpack/write/engine.py); the local pool's workers report
    files written to the progress bar and die with the packer.

    Args:
        engine: ``local``, ``dask`` or ``ray``.
        address: the cluster's address (dask, ray), or None.
        workers: the number of workers, or None for the engine's default.
        executor: a caller's executor, which wins over ``engine``.
    """
    return make_engine(engine, address=address, workers=workers, executor=executor,
                       initializer=_init_worker)


def _pack_locked(source, storage: Storage, options: PackOptions, origin: dict, started: float,
                 *, executor, source_options) -> PackSummary:
    state = {"shardpack": __version__, **origin, "options": options.as_dict()}
    summary = PackSummary(out=storage.url, converted_from=origin.get("from"))
    summary.notes += prepare_out(storage, state, resume=options.resume,
                                 overwrite=options.overwrite)
    files = _FileProgress(_progress(options.progress))
    runner = None
    skips = SkipLog()
    try:
        ready = time.perf_counter()
        runner = engine_of(options.engine, options.address, options.workers, executor)
        summary.engine, summary.engine_start = runner.name, time.perf_counter() - ready
        results = _write_shards(source, storage, options, runner, files, skips, summary,
                                source_options)
        _finish(storage, source, results, options, summary, origin.get("from"), skips)
    except BaseException as exc:
        if runner is not None:
            runner.stop()  # nothing may still write into OUT once its lock is released
        storage.remove_temp_files()
        if isinstance(exc, ShardpackError) and mark_failed(storage, state, exc) and \
                isinstance(exc, SourceError):
            # bad input: say that the folder is free for the rerun the error asks for (with
            # --skip-bad, say; docs/packing.md)
            exc.hint = (f"{exc.hint}; " if exc.hint else "") + (
                "nothing was published: rerun into the same OUT, with changed options if "
                "need be")
        raise
    finally:
        skips.close()
        writer.on_files = None
        if runner is not None:
            runner.close()
        if files.bar is not None:
            files.bar.close()
    summary.files = files.planned
    summary.seconds = time.perf_counter() - started
    return summary


def _write_shards(source, storage: Storage, options: PackOptions, runner: Engine,
                  files: _FileProgress, skips: SkipLog, summary: PackSummary,
                  source_options) -> dict[int, ShardResult]:
    """Plan the source and write its shards on ``runner``; their results by number."""
    # every part of a --part split walks the whole tree: part 0 alone records the walk's skips
    walk = not isinstance(source, PartOf) or source.index == 0
    walked = source.source if isinstance(source, PartOf) else source
    if isinstance(walked, RunsOnEngine):
        walked.use_engine(runner)  # the walk runs on the engine too
    files.shared = runner.shared_counter
    bar = files.bar
    if runner.inline and bar is not None:
        writer.on_files = files.add  # inline: the writer moves the bar itself
    by_image = getattr(source.report, "group", None) == "image"
    tasks = _count(plan(source, options, census=not by_image), files)
    results: dict[int, ShardResult] = {}
    for result, reused in _run(tasks, runner, storage, options.resume,
                               source_options=source_options, files=files):
        results[result.number] = result
        summary.reused_shards += reused
        skips.add(result.skips)
        _take_walk_skips(source, skips, walk)
        files.task_done(result, bool(reused))
        if bar is not None:
            bar.set_postfix_str(
                f"{plural(len(results), 'shard')}, "
                f"{plural(sum(r.entry.samples for r in results.values()), 'sample')}")
    if not results and not isinstance(source, PartOf):  # (a part may be empty)
        raise ShardpackError("no samples found in the source", path=source.src,
                             hint=f"check SRC, or the skip counts of {SKIP_BAD}")
    _take_walk_skips(source, skips, walk)
    return results


def _take_walk_skips(source, skips: SkipLog, walk: bool) -> None:
    """Move the walk's skips so far into ``skips`` (only where this run records the walk's)."""
    taken = source.report.take_skips()
    if walk:
        skips.add(taken, "walk")


class _FileProgress:
    """The progress bar counts source files written.  Pool workers add to ``shared`` (a counter
    in shared memory, inherited at fork) every few samples and the packer polls it while it
    waits; other executors report whole tasks; inline writing moves the bar through ``add``."""

    def __init__(self, bar):
        self.bar = bar
        self.shared = None
        self.done = 0    # files of finished tasks
        self.reused = 0  # files of shards kept by --resume
        self.planned = 0  # files of the tasks planned so far

    def add(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def task_done(self, result: ShardResult, reused: bool) -> None:
        self.done += result.files
        self.reused += result.files if reused else 0
        self.poll()

    def poll(self) -> None:
        if self.bar is None:
            return
        live = self.shared.value if self.shared is not None else 0
        target = max(self.done, self.reused + live)  # shards kept by --resume write nothing
        if target > self.bar.n:
            self.bar.update(target - self.bar.n)


def _init_worker(counter) -> None:
    _die_with_parent()

    def add(n: int) -> None:
        with counter.get_lock():
            counter.value += n

    writer.on_files = add


def _die_with_parent() -> None:
    """Pool workers get SIGKILL when the packer dies (Linux), so a killed pack leaves no orphan
    still writing shards that a later --resume would race with."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: workers exit when they find the pipe closed
        pass


def _count(tasks, files: _FileProgress):
    """The tasks, counting their files into ``files`` (the bar's total) as they are planned."""
    bar = files.bar
    for task in tasks:
        files.planned += task.files
        if bar is not None:
            bar.total = files.planned
            bar.refresh()
        yield task


def _run(tasks, runner: Engine, storage: Storage, resume: bool,
         source_options: dict | None = None, files: _FileProgress | None = None):
    """Yield (result, reused) for every task; at most twice the engine's workers in flight.
    Tasks get OUT as an absolute path (local) or URL: workers may run in another folder."""
    out = storage.location()
    limit = 2 * runner.workers
    pending: list[tuple[ShardTask, Future]] = []
    for task in tasks:
        if resume:
            kept = result_from_index(task, storage)
            if kept is not None:
                yield kept, 1
                continue
        if runner.inline:
            yield write_shard(task, out, _options_of(storage), source_options), 0
            continue
        pending.append((task, runner.submit(write_shard, task, out, _options_of(storage),
                                            source_options)))
        while len(pending) >= limit:
            yield _result(*pending.pop(0), files), 0
    while pending:
        yield _result(*pending.pop(0), files), 0


def _options_of(storage: Storage) -> dict | None:
    return storage.storage_options or None


def _result(task: ShardTask, future: Future, files: _FileProgress | None = None
            ) -> ShardResult:
    poll = 0.25 if files is not None and files.bar is not None else None
    try:
        while True:
            try:
                return future.result(timeout=poll)
            except (TimeoutError, FuturesTimeout):  # (the same class from Python 3.11 on)
                files.poll()
    except ShardpackError:
        raise
    except Exception as exc:  # a worker died (BrokenProcessPool) or an unexpected error
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise PackError("out of disk space",
                            hint=f"free some space, then rerun with {RESUME}") from None
        raise PackError(f"writing shard {task.number} failed: {type(exc).__name__}: {exc}",
                        hint=f"rerun with {RESUME} to keep the shards already written") from exc


def _finish(storage: Storage, source, results: dict, options: PackOptions,
            summary: PackSummary, converted_from: str | None, skips: SkipLog) -> None:
    """Publish: the skip report, then the manifest (the commit point); fill in the summary."""
    ordered = [results[i] for i in sorted(results)]
    # every part of a --part split walks the whole tree: what the walk counted (bad entries,
    # hidden, ignored files) is recorded by part 0 only, so a merge of the parts counts it once
    walk = not isinstance(source, PartOf) or source.index == 0
    skipped = Counter(source.report.skipped if walk else {})
    for r in ordered:
        skipped.update(r.skipped)
        summary.first_skips.extend(r.first_skips)
    summary.first_skips[:0] = source.report.first_skips
    manifest = _manifest(source, ordered, options, skipped, walk, converted_from)
    record = skips.publish(storage)  # before the manifest that points to it
    if record is not None:
        manifest["skip_report"] = record
        summary.skip_report = storage.display(record["name"])
    # shards numbered past the plan's end come from an older, longer run: remove them
    for name in storage.listdir():
        if name.startswith("shard-") and is_ours(name):
            number = int(name[6:11]) if name[6:11].isdigit() else -1
            if number >= len(ordered):
                storage.remove(name)
    storage.remove_temp_files()  # a task whose worker died and was rerun left its temp file
    storage.write_atomic(fmt.MANIFEST_NAME, fmt.encode_manifest(manifest))
    storage.remove(STATE_NAME)
    summary.add_results(source.report, ordered, manifest, skipped)


def _manifest(source, ordered: list, options: PackOptions, skipped: Counter, walk: bool,
              converted_from: str | None) -> dict:
    """The manifest of the shards ``ordered`` (docs/format.md), the skip report aside."""
    report = source.report
    manifest = {
        "format": fmt.MANIFEST_FORMAT,
        "version": fmt.FORMAT_VERSION,
        "shard_format": options.shard_format,
        "compression": options.compression,
        "hash": fmt.HASH_NAME,
        "num_samples": sum(r.entry.samples for r in ordered),
        "num_shards": len(ordered),
        "num_bytes": sum(r.entry.bytes for r in ordered),
        "fields": sorted({f for r in ordered for f in r.fields}),
        "classes": report.classes,
        "layout": report.layout,
        "skipped": dict(sorted(skipped.items())),
        "hidden": report.hidden if walk else 0,
        "group": report.group if report.layout in ("imagefolder", "files") else None,
        "ignored": getattr(report, "ignored", 0) if walk else 0,
        "preprocessing": preprocessing(options),
        "shards": [r.entry.to_dict() for r in ordered],
    }
    if converted_from:
        manifest["source"] = {"from": converted_from, "notes": list(report.notes)}
    if isinstance(source, PartOf):
        manifest["part"] = {"index": source.index, "count": source.count}
    return manifest


def preprocessing(options: PackOptions) -> dict | None:
    """What the pack did to the images, for the manifest: the resize and its quality, the
    stored form of the pixels; None for nothing."""
    done: dict = {}
    if options.resize:
        done.update(resize=options.resize, quality=options.quality)
    if options.pixels != "keep":
        done["pixels"] = options.pixels
    return done or None


def _progress(enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=0, unit=" files", unit_scale=True, desc="packing", dynamic_ncols=True,
                smoothing=0.1)
