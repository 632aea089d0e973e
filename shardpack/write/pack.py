"""The packer: walk -> plan -> shard tasks on an executor -> manifest, written last.

``pack()`` streams the plan into the executor with a bounded number of tasks in flight, so memory
stays bounded whatever the dataset size.  Any ``concurrent.futures.Executor`` works (pass
``executor=``); by default a local process pool of ``workers`` processes, or inline when
``workers == 1``.  The manifest is the commit point: it is written atomically after every shard and
index is in place, and removed first by ``--overwrite``, so a reader never sees a half-made pack.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections import Counter
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field

from shardpack.core.version import __version__
from shardpack import format as fmt
from shardpack.write.engine import Engine, check_engine, make_engine
from shardpack.core.errors import PackError, ShardpackError, SourceError
from shardpack.write.outdir import LOCK_NAME, STATE_NAME, OutLock, clear_out, is_ours
from shardpack.write.plan import PackOptions, PartOf, ShardTask, check_part, plan
from shardpack.core.sizes import parse_size, plural
from shardpack.write.samples import Source, within
from shardpack.write.skips import FIRST, SkipLog
from shardpack.storage import Storage, is_temp_name
from shardpack.write import writer
from shardpack.write.writer import ShardResult, result_from_index, write_shard



@dataclass
class PackSummary:
    out: str
    samples: int = 0
    shards: int = 0
    bytes: int = 0
    source_bytes: int = 0
    files: int = 0
    seconds: float = 0.0
    reused_shards: int = 0
    hidden: int = 0
    skipped: dict = field(default_factory=dict)
    first_skips: list = field(default_factory=list)
    fields: list = field(default_factory=list)
    classes: list | None = None
    notes: list = field(default_factory=list)
    converted_from: str | None = None
    images: int | None = None  # image files found (one sample per image), else None
    ignored: int = 0           # files that are neither images nor sidecars of one
    index_bytes: int = 0
    engine: str = "local"
    engine_start: float = 0.0  # seconds to start or reach the engine (part of ``seconds``)
    skip_report: str | None = None  # where every skip is named (OUT/skipped.jsonl), if any
    followed: int = 0          # links leading outside SRC that --follow-links followed
    datasets: list = field(default_factory=list)  # shardpack datasets inside SRC, left out

    def line(self) -> str:
        rate = self.source_bytes / self.seconds / 1e6 if self.seconds else 0.0
        seconds = self.seconds or float("inf")
        if self.converted_from:
            text = (f"converted {plural(self.samples, 'sample')} from {self.converted_from} "
                    f"({self.source_bytes / 1e6:,.1f} MB of fields) into "
                    f"{plural(self.shards, 'shard')} ({self.bytes / 1e6:,.1f} MB) in "
                    f"{self.seconds:.1f} s: {self.samples / seconds:,.0f} samples/s, "
                    f"{rate:,.1f} MB/s")
        else:
            found = (f"{plural(self.images, 'image file')} found, " if self.images is not None
                     else "")
            text = (f"packed {plural(self.samples, 'sample')} ({found}"
                    f"{plural(self.files, 'file')} read, {self.source_bytes / 1e6:,.1f} MB) into "
                    f"{plural(self.shards, 'shard')} ({self.bytes / 1e6:,.1f} MB) in "
                    f"{self.seconds:.1f} s: {self.files / seconds:,.0f} files/s, "
                    f"{rate:,.1f} MB/s")
        if self.reused_shards:
            text += (f"; {plural(self.reused_shards, 'complete shard')} kept from the "
                     "interrupted run")
        if self.skipped:
            text += "; skipped " + ", ".join(f"{v:,} {k}" for k, v in sorted(self.skipped.items()))
        if self.ignored:
            text += (f"; ignored {plural(self.ignored, 'file')} that "
                     f"{'is' if self.ignored == 1 else 'are'} neither an image nor a sidecar")
        if self.hidden:
            text += f"; ignored {plural(self.hidden, 'hidden entry', 'hidden entries')}"
        if self.followed:
            text += (f"; followed {plural(self.followed, 'link')} leading outside SRC "
                     "(--follow-links)")
        if self.datasets:
            text += f"; left out {plural(len(self.datasets), 'shardpack dataset')} inside SRC"
        return text

    def report_lines(self) -> list[str]:
        """What the command line prints before the summary line: the first skips, where the
        rest are named, and the notes."""
        lines = [f"skipped: {line}" for line in self.first_skips[:FIRST]]
        total = sum(self.skipped.values())
        if self.skip_report and total:
            more = (f"the first {FIRST} of {total:,} shown; " if total > FIRST else "")
            lines.append(f"skipped: {more}every skipped entry is named with its reason in "
                         f"{self.skip_report}")
        return lines + [f"note: {line}" for line in self.notes]


def pack(src, out, *, format: str = "tar", shard_size="256MB", max_samples: int | None = None,
         compression: str = "none", zstd_level: int = 3, resize: int | None = None,
         quality: int = 90, skip_bad: bool = False, layout: str = "auto", group: str = "auto",
         check: str = "quick", follow_links: bool = False, allow_empty_classes: bool = False,
         workers: int | None = None, resume: bool = False,
         overwrite: bool = False, executor: Executor | None = None, engine: str = "local",
         address: str | None = None, part: tuple[int, int] | None = None,
         progress: bool = False, storage_options: dict | None = None) -> PackSummary:
    """Pack the files under ``src`` (a folder or URL, or a .csv/.jsonl listing) into a dataset at
    ``out`` (a folder or URL).

    ``engine`` (``local``, ``dask``, ``ray``; shardpack/write/engine.py) runs the walk and the shard
    tasks, on the cluster at ``address`` for dask and ray; ``executor`` (any
    ``concurrent.futures.Executor``) overrides it.  ``part=(i, n)`` packs only the samples of
    part ``i`` of ``n`` (:func:`~shardpack.write.plan.part_of`), for ``shardpack merge`` later.
    ``follow_links`` packs what links leading outside ``src`` point to (refused by default);
    ``allow_empty_classes`` keeps a class folder without samples as a class (an error by
    default, as torchvision's ImageFolder).
    Returns a :class:`PackSummary`.  Raises a :class:`~shardpack.core.errors.ShardpackError`
    subclass
    with a one-line message naming the file at fault; nothing is published on failure."""
    options = make_options(format=format, shard_size=shard_size, max_samples=max_samples,
                           compression=compression, zstd_level=zstd_level, resize=resize,
                           quality=quality, skip_bad=skip_bad, layout=layout, group=group,
                           check=check)
    source = Source(src, layout=layout, group=group, skip_bad=skip_bad,
                    exclude=_inside(out, src, storage_options), follow_links=follow_links,
                    allow_empty_classes=allow_empty_classes, storage_options=storage_options)
    # --follow-links decides which files are packed: part of the source, as --resume sees it
    # (absent when off, as in states of releases before it)
    origin = {"source": source.src, **({"follow_links": True} if follow_links else {})}
    return pack_source(source, out, options, origin=origin, workers=workers,
                       resume=resume, overwrite=overwrite, executor=executor, engine=engine,
                       address=address, part=part, progress=progress,
                       storage_options=storage_options, source_options=storage_options)


def make_options(*, format: str, shard_size, max_samples: int | None, compression: str,
                 zstd_level: int, resize: int | None, quality: int, skip_bad: bool,
                 layout: str, group: str = "auto", check: str = "quick") -> PackOptions:
    """The :class:`PackOptions` of ``pack``'s and ``convert``'s keyword arguments."""
    return PackOptions(shard_format=format, shard_size=parse_size(shard_size),
                       max_samples=max_samples, compression=compression, zstd_level=zstd_level,
                       resize=resize, quality=quality, skip_bad=skip_bad, layout=layout,
                       group=group, check=check)


def _inside(out, src, storage_options) -> str | None:
    """Where OUT lies inside the folder SRC (left out of the walk), else None: its real path
    (local), or its path on the store (SRC and OUT on one object store).  Decision
    (docs/packing.md): OUT inside SRC is allowed and never packed."""
    storage, source = Storage(out, storage_options), Storage(src, storage_options)
    if storage.local and source.local:
        if not os.path.isdir(source.root):
            return None
        root, real = os.path.realpath(source.root), os.path.realpath(storage.root)
    elif not storage.local and not source.local and storage.protocol == source.protocol:
        root, real = source.root.rstrip("/"), storage.root.rstrip("/")
        return real if real.startswith(root + "/") else None
    else:
        return None
    return real if real != root and within(real, root) else None


def pack_source(source, out, options: PackOptions, *, origin: dict, workers: int | None = None,
                resume: bool = False, overwrite: bool = False, executor: Executor | None = None,
                engine: str = "local", address: str | None = None,
                part: tuple[int, int] | None = None, progress: bool = False,
                storage_options: dict | None = None,
                source_options: dict | None = None) -> PackSummary:
    """The pipeline behind ``pack`` and ``convert``: any ``source`` (an iterable of
    :class:`~shardpack.write.samples.SourceSample` with ``.src`` and ``.report``) -> plan -> shards
    on
    the executor -> manifest.  ``origin`` identifies the source in the resume state (a resume
    must come from the same source and options); ``origin["from"]``, when set, names the format
    a conversion read and is recorded in the manifest with the report's notes."""
    if resume and overwrite:
        raise ShardpackError("--resume and --overwrite exclude each other")
    if executor is None:
        check_engine(engine, address)  # before OUT is touched or a cluster started
    if part is not None:
        part = check_part(part)
        origin = {**origin, "part": list(part)}
        source = PartOf(source, *part)
    started = time.perf_counter()
    storage = Storage(out, storage_options)
    with OutLock(storage):
        return _pack_locked(source, storage, options, origin, started, workers=workers,
                            resume=resume, overwrite=overwrite, executor=executor,
                            progress=progress, source_options=source_options, engine=engine,
                            address=address)


def engine_of(engine: str, address: str | None, workers: int | None,
              executor: Executor | None) -> Engine:
    """The engine a pack runs on (shardpack/write/engine.py); the local pool's workers report files
    written to the progress bar and die with the packer."""
    return make_engine(engine, address=address, workers=workers, executor=executor,
                       initializer=_init_worker)


def _pack_locked(source, storage: Storage, options: PackOptions, origin: dict, started: float,
                 *, workers, resume, overwrite, executor, progress, source_options,
                 engine="local", address=None) -> PackSummary:
    state = {"shardpack": __version__, **origin, "options": options.as_dict()}
    summary = PackSummary(out=storage.url, converted_from=origin.get("from"))
    summary.notes += _prepare_out(storage, state, resume=resume, overwrite=overwrite)
    results: dict[int, ShardResult] = {}
    bar = _progress(progress)
    files = _FileProgress(bar)
    planned = {"files": 0, "bytes": 0}
    runner = None
    skips = SkipLog()
    # every part of a --part split walks the whole tree: part 0 alone records the walk's skips
    walk = not isinstance(source, PartOf) or source.index == 0

    def take_walk_skips() -> None:
        taken = source.report.take_skips()
        if walk:
            skips.add(taken, "walk")

    try:
        ready = time.perf_counter()
        runner = engine_of(engine, address, workers, executor)
        summary.engine, summary.engine_start = runner.name, time.perf_counter() - ready
        if hasattr(source, "use_engine"):
            source.use_engine(runner)  # the walk runs on the engine too
        files.shared = runner.shared_counter
        if runner.inline and bar is not None:
            writer.on_files = files.add  # inline: the writer moves the bar itself
        by_image = getattr(source.report, "group", None) == "image"
        tasks = _count(plan(source, options, census=not by_image), planned, bar)
        for result, reused in _run(tasks, runner, storage, resume,
                                   source_options=source_options, files=files):
            results[result.number] = result
            summary.reused_shards += reused
            skips.add(result.skips)
            take_walk_skips()
            files.task_done(result, bool(reused))
            if bar is not None:
                bar.set_postfix_str(
                    f"{plural(len(results), 'shard')}, "
                    f"{plural(sum(r.entry.samples for r in results.values()), 'sample')}")
        if not results and not isinstance(source, PartOf):  # (a part may be empty)
            raise ShardpackError("no samples found in the source", path=source.src,
                                 hint="check SRC, or the skip counts of --skip-bad")
        take_walk_skips()
        _finish(storage, source, results, options, summary, origin.get("from"), skips)
    except BaseException as exc:
        if runner is not None:
            runner.stop()  # nothing may still write into OUT once its lock is released
        storage.remove_temp_files()
        if isinstance(exc, ShardpackError) and _mark_failed(storage, state, exc) and \
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
        if bar is not None:
            bar.close()
    summary.files = planned["files"]
    summary.seconds = time.perf_counter() - started
    return summary


class _FileProgress:
    """The progress bar counts source files written.  Pool workers add to ``shared`` (a counter
    in shared memory, inherited at fork) every few samples and the packer polls it while it
    waits; other executors report whole tasks; inline writing moves the bar through ``add``."""

    def __init__(self, bar):
        self.bar = bar
        self.shared = None
        self.done = 0    # files of finished tasks
        self.reused = 0  # files of shards kept by --resume

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


def _prepare_out(storage: Storage, state: dict, *, resume: bool, overwrite: bool) -> list[str]:
    """Check and prepare OUT; returns note lines for the summary."""
    notes = []
    if storage.exists() and not storage.fs.isdir(storage.root):
        raise ShardpackError("output exists and is not a folder", path=storage.url)
    names = [n for n in storage.listdir() if not is_temp_name(n) and n != LOCK_NAME]
    if fmt.MANIFEST_NAME in names and STATE_NAME in names:
        # a pack killed between publishing its manifest and removing its state: the dataset is
        # whole, the state a leftover that no run would otherwise remove (we hold OUT's lock)
        storage.remove(STATE_NAME)
        names.remove(STATE_NAME)
    ours = [n for n in names if is_ours(n)]
    foreign = [n for n in names if not is_ours(n)]
    failed = (names and not overwrite and not foreign and fmt.MANIFEST_NAME not in names
              and _failed_run(storage, state))
    if failed and (not resume or failed == "other"):
        # What a pack left when it failed with an error (bad input, disk full): nothing was
        # published, so there is no dataset to lose.  A rerun, with the same or other options
        # (--skip-bad, say), starts afresh instead of being refused; --resume keeps complete
        # shards only for the same source and options.  An interrupted pack (killed, Ctrl-C)
        # and a pack still running leave no failure mark: those stay refused, so that the work
        # of an interrupted pack is never thrown away without --overwrite (docs/packing.md).
        shards = sum(1 for n in ours if n.endswith(tuple(fmt.SHARD_SUFFIX.values())))
        for name in ours:
            storage.remove(name)
        kept = ("; --resume would have kept its complete shards" if failed == "same"
                else "")
        notes.append(f"removed what a failed pack left in OUT ({plural(shards, 'shard')}, "
                     f"never published){kept}")
        names = ours = []
    if names and not (resume or overwrite):
        unfinished = fmt.MANIFEST_NAME not in names and STATE_NAME in names
        raise ShardpackError("output folder is not empty" + (
            ": an interrupted pack left its shards there" if unfinished else ""),
            path=storage.url,
            hint="rerun the same command with --resume to finish it, or pass --overwrite to "
                 "start afresh" if unfinished else
                 "choose an empty folder, or pass --overwrite to replace the dataset there")
    if foreign and (resume or overwrite):
        raise ShardpackError(f"output folder holds files shardpack did not write "
                             f"({foreign[0]!r}...); refusing to touch them", path=storage.url,
                             hint="choose an empty folder")
    if resume:
        if fmt.MANIFEST_NAME in names:
            raise ShardpackError("output already holds a finished dataset; nothing to resume",
                                 path=storage.url, hint="use --overwrite to pack it again")
        if ours:
            try:
                previous = json.loads(storage.read_bytes(STATE_NAME))
            except (FileNotFoundError, ValueError):
                raise ShardpackError("output has shards but no pack state to resume from",
                                     path=storage.url, hint="use --overwrite") from None
            # every origin key (source, from, allow_pickle, label_column, ...), not options
            origin_keys = sorted((set(previous) | set(state)) - {"shardpack", "options",
                                                                 "failed"})
            for what in origin_keys:
                if previous.get(what) != state.get(what):
                    name = what if what == "source" else _option_flag(what)
                    raise ShardpackError(f"--resume with a different {name} than the "
                                         f"interrupted run: was {previous.get(what)!r}, now "
                                         f"{state.get(what)!r}", path=storage.url,
                                         hint="rerun with the same source, or use --overwrite")
            # a key an older release did not record had its default then
            defaults = PackOptions().as_dict()
            was = {**defaults, **(previous.get("options") or {})}
            now = state["options"]
            differ = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
            if differ:
                said = ", ".join(f"{_option_flag(k)} was {was.get(k)!r}, now {now.get(k)!r}"
                                 for k in differ)
                raise ShardpackError(f"--resume with different options than the interrupted "
                                     f"pack: {said}", path=storage.url,
                                     hint="rerun with the same options, or use --overwrite")
    storage.makedirs()
    storage.remove_temp_files()
    if overwrite:
        clear_out(storage, ours)  # un-publish first, then clear
    storage.write_atomic(STATE_NAME, json.dumps(state, sort_keys=True).encode())
    return notes


def _mark_failed(storage: Storage, state: dict, exc: BaseException) -> bool:
    """Record in the pack state that this run ended with an error (see _prepare_out); not once
    the manifest is written (the dataset is published, its state is gone).  Whether it did."""
    try:
        if storage.exists(fmt.MANIFEST_NAME):
            return False
        storage.write_atomic(STATE_NAME, json.dumps({**state, "failed": str(exc)},
                                                    sort_keys=True).encode())
        return True
    except (OSError, ShardpackError):  # a full disk, say: then the folder stays refused
        return False


def _failed_run(storage: Storage, state: dict) -> str | None:
    """Whether OUT's pack state says a run failed: "same" (this source and options), "other"
    (others), or None (no failed run: none, or one interrupted or still running)."""
    try:
        previous = json.loads(storage.read_bytes(STATE_NAME))
    except (FileNotFoundError, ValueError, ShardpackError):
        return None
    if not isinstance(previous, dict) or "failed" not in previous:
        return None
    return "same" if {k: v for k, v in previous.items() if k != "failed"} == state else "other"


def _option_flag(name: str) -> str:
    """The CLI flag of a PackOptions field, for messages."""
    return "--" + {"shard_format": "format"}.get(name, name).replace("_", "-")


def _count(tasks, planned: dict, bar):
    for task in tasks:
        planned["files"] += task.files
        planned["bytes"] += task.source_bytes
        if bar is not None:
            bar.total = planned["files"]
            bar.refresh()
        yield task


def _run(tasks, runner: Engine, storage: Storage, resume: bool,
         source_options: dict | None = None, files: _FileProgress | None = None):
    """Yield (result, reused) for every task; at most twice the engine's workers in flight.
    Tasks get OUT as an absolute path (local) or URL: workers may run in another folder."""
    out = storage.root if storage.local else storage.url
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
                            hint="free some space, then rerun with --resume") from None
        raise PackError(f"writing shard {task.number} failed: {type(exc).__name__}: {exc}",
                        hint="rerun with --resume to keep the shards already written") from exc


def _finish(storage: Storage, source, results: dict, options: PackOptions,
            summary: PackSummary, converted_from: str | None, skips: SkipLog) -> None:
    ordered = [results[i] for i in sorted(results)]
    # every part of a --part split walks the whole tree: what the walk counted (bad entries,
    # hidden, ignored files) is recorded by part 0 only, so a merge of the parts counts it once
    walk = not isinstance(source, PartOf) or source.index == 0
    skipped = Counter(source.report.skipped if walk else {})
    for r in ordered:
        skipped.update(r.skipped)
        summary.first_skips.extend(r.first_skips)
    summary.first_skips[:0] = source.report.first_skips
    fields = sorted({f for r in ordered for f in r.fields})
    manifest = {
        "format": fmt.MANIFEST_FORMAT,
        "version": fmt.FORMAT_VERSION,
        "shard_format": options.shard_format,
        "compression": options.compression,
        "hash": fmt.HASH_NAME,
        "num_samples": sum(r.entry.samples for r in ordered),
        "num_shards": len(ordered),
        "num_bytes": sum(r.entry.bytes for r in ordered),
        "fields": fields,
        "classes": source.report.classes,
        "layout": source.report.layout,
        "skipped": dict(sorted(skipped.items())),
        "hidden": source.report.hidden if walk else 0,
        "group": (source.report.group if source.report.layout in ("imagefolder", "files")
                  else None),
        "ignored": getattr(source.report, "ignored", 0) if walk else 0,
        "preprocessing": {"resize": options.resize, "quality": options.quality}
        if options.resize else None,
        "shards": [r.entry.to_dict() for r in ordered],
    }
    if converted_from:
        manifest["source"] = {"from": converted_from, "notes": list(source.report.notes)}
    if isinstance(source, PartOf):
        manifest["part"] = {"index": source.index, "count": source.count}
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
    summary.samples = manifest["num_samples"]
    summary.shards = len(ordered)
    summary.bytes = manifest["num_bytes"]
    summary.source_bytes = sum(r.source_bytes for r in ordered)
    summary.hidden = source.report.hidden
    report = source.report
    summary.images = report.images if getattr(report, "group", None) == "image" else None
    summary.ignored = getattr(report, "ignored", 0)
    summary.index_bytes = sum(r.entry.index_bytes for r in ordered)
    if getattr(report, "first_ignored", None):
        summary.notes.append(f"files that are neither images nor sidecars of one are not "
                             f"samples, e.g. {report.first_ignored[0]}")
    if getattr(report, "excluded", None):
        summary.notes.append(f"left the output folder out of the walk: {report.excluded}")
    datasets = getattr(report, "datasets", None) or []
    if datasets:
        shown = ", ".join(datasets[:5]) + (f" and {len(datasets) - 5:,} more"
                                           if len(datasets) > 5 else "")
        summary.notes.append(f"left out {plural(len(datasets), 'shardpack dataset')} inside "
                             f"SRC (a folder holding {fmt.MANIFEST_NAME} or a pack's state): "
                             f"{shown}")
    summary.datasets = list(datasets)
    if report.layout == "imagefolder" and getattr(report, "hidden_folders", None):
        summary.notes.append(f"hidden top-level folders are not classes (torchvision's "
                             f"ImageFolder would make them classes): "
                             f"{', '.join(report.hidden_folders[:5])}")
    summary.followed = getattr(report, "followed", 0)
    summary.skipped = dict(skipped)
    summary.fields = fields
    summary.classes = source.report.classes
    summary.notes += list(source.report.notes)


def _progress(enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=0, unit=" files", unit_scale=True, desc="packing", dynamic_ncols=True,
                smoothing=0.1)
