"""``shardpack bench --sweep``: why does the GPU wait, and which change fixes it, measured here.

The sweep starts from the user's configuration (:class:`~shardpack.inspect.trial.Config`: the
bench options), then measures one lever at a time against it (raw files or packed, workers,
threads or processes, prefetch depth, pinned memory, where images decode, pack-time resize,
remote prefetch and cache), then the levers that helped together at each worker count.  Every
trial is a process of its own (:mod:`shardpack.inspect.trial`) with a deadline; trials are
repeated in turn, alternated, while the budget lasts.  :mod:`shardpack.inspect.verdict` turns the
figures into the table, the bound and the recommendation (docs/diagnose.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from shardpack.core.errors import ShardpackError
from shardpack.core.options import check_fields, option
from shardpack.inspect.trial import Config

EXECUTIONS = ("processes", "threads")
TRIAL_START_S = 3.0    # a trial's fixed cost before its measured part (interpreter, workers)
MIN_MEASURE_S = 2.0    # never measure a trial for less than this
RESIZE_SAMPLE = 1000   # samples packed for the pack-time resize lever
# The cache lever's two trials name their cache_dir by these, resolved to a real folder in the
# sweep's work folder just before a trial runs (run_trial): never a path a user could give.
FRESH_CACHE = "<a fresh cache>"
FILLED_CACHE = "<the cache the last cold trial filled>"


@dataclass(frozen=True)
class SweepOptions:
    """The sweep's own options; the starting point's loader options are the bench's
    (``--workers``, ``--decode``, ``--batch-size``, ``--size``, ``--step-ms``, ``--device``)."""

    sweep: bool = option(False, "Measure each lever that applies (workers, threads, prefetch, "
                         "pinned memory, decode place, pack-time resize, remote cache) on this "
                         "data against the starting point the other options give, and say which "
                         "change keeps the wait under 5% of the step (docs/diagnose.md).")
    budget: int = option(120, "--sweep: finish within about this many seconds (trials are "
                         "sampled to fit).", minimum=10, metavar="SECONDS")
    execution: str = option("processes", "--sweep: the start runs DataLoader worker processes or "
                            "threads of the training process.", choices=EXECUTIONS)
    prefetch_batches: int = option(2, "--sweep: the start's batches DeviceLoader moves ahead "
                                   "of the step.", minimum=1)
    prefetch_shards: int = option(2, "--sweep, remote data: the start's shards each reader "
                                  "fetches ahead.", minimum=0)
    cache_dir: str | None = option(None, "--sweep, remote data: the start's local shard cache "
                                   "[default: none, ranged reads].", metavar="DIR")
    transform: str | None = option(None, "--sweep: your per-batch CPU transform, run in the "
                                   "workers after decode, so the sweep measures it.",
                                   metavar="MODULE:FUNCTION")
    model: str | None = option(None, "--sweep on CUDA: a torchvision model (resnet50) whose "
                               "train step replaces --step-ms.", metavar="NAME")
    json_path: str | None = option(None, "--sweep: write every figure as JSON here.",
                                   flag="--json", metavar="FILE")

    def __post_init__(self):
        check_fields(self)


@dataclass
class Measured:
    """A configuration and its trials' results (one per repetition)."""

    config: Config
    runs: list = dataclasses.field(default_factory=list)
    error: str | None = None


@dataclass
class Sweep:
    """What a sweep measured: every configuration, the user's starting point first; the levers
    it could not try here and why; the budget and time it took; the machine's cores."""

    measured: list
    not_measured: list
    step_ms: float
    budget_s: float
    elapsed_s: float = 0.0
    cores: int = 1
    notes: list = dataclasses.field(default_factory=list)
    packs: dict = dataclasses.field(default_factory=dict)  # a sample pack's path -> the command
    # that makes the real one


def worker_counts(cores: int) -> list[int]:
    """1, 2, 4, ... up to this machine's cores, the cores themselves included."""
    counts, w = [], 1
    while w < cores:
        counts.append(w)
        w *= 2
    return counts + [cores]


class Data:
    """Where the sweep's configurations read from: the packed dataset (``packed``), the raw tree
    (``files``), a resized sample pack (``resized``, with its side), and scratch space."""

    def __init__(self, source: str, files: str | None, workdir: str, on_error: str = "raise"):
        from shardpack.format.names import MANIFEST_NAME

        self.workdir, self.on_error = workdir, on_error
        self.packs: dict = {}  # the sample packs made here -> the command for the real one
        self.remote = "://" in source and not source.startswith("file://")
        self.resized = self.resize_side = None
        if self.remote or os.path.exists(os.path.join(source, MANIFEST_NAME)):
            self.packed, self.files = source, files
        elif os.path.isdir(source):
            self.packed, self.files = None, source
        else:
            raise ShardpackError(f"{source}: neither a packed dataset (no {MANIFEST_NAME}) nor a "
                                 "folder of files", hint="give a dataset or an image tree")

    def pack_samples(self, size: int, progress: bool) -> None:
        """Pack what the sweep needs from the raw tree: the tree itself (a sample of it when it
        is large) when there is no packed dataset, and a sample resized to the training size."""
        from shardpack.write.pack import pack
        from shardpack.write.packsource import PackSource

        total = sum(1 for _ in PackSource(self.files, skip_bad=self.on_error == "skip"))
        part = max(1, total // RESIZE_SAMPLE)
        whole = part if self.packed is None else None
        if whole is not None:  # the packed side of the comparison: a sample, as the user would
            self.packed = os.path.join(self.workdir, "packed")
            pack(self.files, self.packed, part=(0, whole) if whole > 1 else None,
                 on_error=self.on_error, progress=progress)
            self.packs[self.packed] = f"shardpack pack {self.files} OUT"
        self.resize_side = resize_side(size)
        self.resized = os.path.join(self.workdir, f"resized-{self.resize_side}")
        pack(self.files, self.resized, part=(0, part) if part > 1 else None,
             resize=self.resize_side, on_error=self.on_error, progress=progress)
        self.packs[self.resized] = f"shardpack pack {self.files} OUT --resize {self.resize_side}"


def resize_side(size: int) -> int:
    """The pack-time shorter side for a training side of ``size``: 8/7 of it, as 256 is of 224
    (the random crops keep their range of scales; docs/diagnose.md)."""
    return int(round(size * 8 / 7))


def plan(start: Config, data: Data, cuda: bool, cores: int) -> tuple[list, list]:
    """The single-lever configurations (the starting point first) and the levers not measured
    here, each ``(lever, why)``.  Trials run in this order while the budget lasts, so the levers
    that matter most where they apply come right after the start: for remote data its prefetch
    and cache; on CUDA the levers only a GPU shows (pinned memory, decode on the GPU), since a
    model's train step makes each trial cost seconds more."""
    out, skipped = [start], []
    base = start
    if start.files:
        base = start.but(name="packed", lever="packed", path=data.packed, files=False)
        out.append(base)
    elif data.files is not None:
        out.append(start.but(name="raw files (ImageFolder + Pillow)", lever="files",
                             path=data.files, files=True))
    out += _remote_levers(base, data, skipped)
    device = _device_levers(base, cuda, skipped)
    if cuda:
        out, device = out + device, []
    for w in worker_counts(cores):
        if w != base.workers:
            out.append(base.but(name=f"workers {w}", lever="workers", workers=w))
    other = "threads" if base.execution == "processes" else "processes"
    out.append(base.but(name=other, lever="execution", execution=other))
    deeper = max(4, 2 * base.prefetch_batches)
    out.append(base.but(name=f"prefetch {deeper}", lever="prefetch", prefetch_batches=deeper))
    out += device
    out += _resize_lever(base, data, skipped)
    if not cuda:
        skipped.append(("model step", "no CUDA device: the step is simulated (--step-ms)"))
    return out, skipped


def _device_levers(base: Config, cuda: bool, skipped: list) -> list:
    """Pinned memory and where images decode (the GPU's levers first)."""
    out = []
    if cuda:
        out.append(base.but(name="pinned off" if base.pin else "pinned on", lever="pin",
                            pin=not base.pin))
    else:
        skipped.append(("pin", "pinned memory speeds host-to-GPU copies: no CUDA device here"))
    if cuda and base.decode == "gpu":  # the start decodes there already: the other way
        out.append(base.but(name="decode on CPU", lever="decode", decode="cpu"))
    elif cuda and base.decode != "none":
        out.append(base.but(name="decode on GPU", lever="decode", decode="gpu"))
    elif base.decode != "none":
        skipped.append(("decode on GPU", "nvJPEG needs a CUDA device: none here"))
    if base.decode in ("cpu", "cpu-whole"):
        other = "cpu-whole" if base.decode == "cpu" else "cpu"
        out.append(base.but(name="decode whole" if other == "cpu-whole" else "decode region",
                            lever="decode", decode=other))
    return out


def _resize_lever(base: Config, data: Data, skipped: list) -> list:
    """Pack-time resize, measured on a sample packed resized."""
    if data.resized is not None:
        return [base.but(name=f"pack --resize {data.resize_side}", lever="resize",
                         path=data.resized)]
    if data.files is None:
        skipped.append(("pack-time resize", "needs the raw files: give --files TREE"))
    return []


def _remote_levers(base: Config, data: Data, skipped: list) -> list:
    """Remote data: shards fetched ahead, and a local cache cold then cached."""
    if not data.remote:
        skipped.append(("remote cache and prefetch", "the data is local"))
        return []
    out = [base.but(name=f"prefetch_shards {p}", lever="prefetch_shards", prefetch_shards=p)
           for p in (2, 8) if p != base.prefetch_shards]
    out.append(base.but(name="cache (cold)", lever="cache", cache_dir=FRESH_CACHE))
    out.append(base.but(name="cache (cached)", lever="cache", cache_dir=FILLED_CACHE))
    return out


def combine(measured: list, cores: int) -> list[Config]:
    """The levers that helped (each one's best value, 3% or more samples/s over the base it
    changed), together, at each worker count: the configurations the recommendation picks from
    along with the single ones."""
    from shardpack.inspect.verdict import summary

    singles = [m for m in measured if m.runs]
    if not singles:
        return []
    base = next((m for m in singles if m.config.lever == "packed"), singles[0])
    if base.config.files:
        return []
    floor = summary(base)["samples_per_s"] * 1.03
    best: dict = {}
    for m in singles:
        lever = m.config.lever
        if lever in ("start", "packed", "files", "workers", "cache"):
            continue
        rate = summary(m)["samples_per_s"]
        if rate >= floor and rate > best.get(lever, (0, None))[0]:
            best[lever] = (rate, m.config)
    cached = next((m for m in singles if m.config.cache_dir == FILLED_CACHE), None)
    tuned = base.config
    for _, config in best.values():
        tuned = tuned.but(**{f.name: getattr(config, f.name) for f in dataclasses.fields(Config)
                             if getattr(config, f.name) != getattr(base.config, f.name)
                             and f.name not in ("name", "lever")})
    names = [c.name for _, c in best.values()]
    if cached is not None and summary(cached)["samples_per_s"] >= floor:
        tuned = tuned.but(cache_dir=FILLED_CACHE)
        names.append("cached")
    if tuned == base.config:
        return []
    names = ", ".join(names)
    known = {dataclasses.replace(m.config, name="", lever="") for m in measured}
    out = []
    for w in worker_counts(cores):
        config = tuned.but(name=f"{names}, workers {w}", lever="combined", workers=w)
        if dataclasses.replace(config, name="", lever="") not in known:
            out.append(config)
    return out


def with_cache(config: Config, workdir: str, caches: dict) -> Config:
    """``config`` with the cache lever's markers made real folders: :data:`FRESH_CACHE` a new
    one in ``workdir``, :data:`FILLED_CACHE` the last fresh one (``caches["last"]``); any other
    ``cache_dir`` (the user's own) as given."""
    if config.cache_dir not in (FRESH_CACHE, FILLED_CACHE):
        return config
    if config.cache_dir == FRESH_CACHE or "last" not in caches:
        caches["last"] = tempfile.mkdtemp(prefix="cache-", dir=workdir)
    return config.but(cache_dir=caches["last"])


def run_trial(config: Config, seconds: float, workdir: str, caches: dict) -> dict:
    """One trial in a process of its own, with a deadline; its result, or ``{"error": ...}``."""
    config = with_cache(config, workdir, caches)
    request = json.dumps({"config": dataclasses.asdict(config), "seconds": seconds})
    limit = seconds * 3 + 60
    try:
        proc = subprocess.run([sys.executable, "-m", "shardpack.inspect.trial"], input=request,
                              capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {limit:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the trial exited {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


def sweep(start: Config, data: Data, opts: SweepOptions, *, cuda: bool,
          progress: bool = False) -> Sweep:
    """Measure ``start`` and its levers within ``opts.budget`` seconds (see the module)."""
    clock = Budget(opts.budget)
    cores = os.cpu_count() or 1
    if data.files is not None:
        data.pack_samples(start.size, progress)
    singles, skipped = plan(start, data, cuda, cores)
    result = Sweep([Measured(c) for c in singles], skipped, start.step_ms, opts.budget,
                   cores=cores, packs=data.packs)
    planned = len(singles) + len(worker_counts(cores))
    clock.seconds = max(MIN_MEASURE_S, clock.left() / planned - TRIAL_START_S)
    bar = _bar(progress, planned)
    caches: dict = {}
    _round(result.measured, clock, data.workdir, caches, bar, first=True)
    combos = [Measured(c) for c in combine(result.measured, cores)]
    _round(combos, clock, data.workdir, caches, bar)
    result.measured += combos
    # more rounds, alternated over every configuration, while the budget lasts
    while clock.left() >= len(result.measured) * clock.trial_cost():
        if bar is not None:
            bar.total += len(result.measured)
        _round(result.measured, clock, data.workdir, caches, bar)
    if bar is not None:
        bar.close()
    result.elapsed_s = clock.elapsed()
    for m in result.measured:
        if not m.runs and m.error is None:
            result.not_measured.append((m.config.name, f"no time left in the {opts.budget} s "
                                                       "budget (give a larger --budget)"))
    result.measured = [m for m in result.measured if m.runs or m.error is not None]
    return result


class Budget:
    """The sweep's clock: time left, and what a trial costs (its measured part, ``seconds``, and
    its start-up, learnt from the trials run so far)."""

    def __init__(self, budget: float):
        self.budget, self.started = budget, time.perf_counter()
        self.seconds = MIN_MEASURE_S
        self.overheads: list = []

    def elapsed(self) -> float:
        """Seconds since the sweep began."""
        return time.perf_counter() - self.started

    def left(self) -> float:
        """Seconds of the budget left."""
        return self.budget - self.elapsed()

    def trial_cost(self) -> float:
        """What the next trial will take: its measured part and the longest start-up seen."""
        start = max(self.overheads) if self.overheads else TRIAL_START_S
        return self.seconds + start


def _round(measured: list, clock: Budget, workdir: str, caches: dict, bar,
           first: bool = False) -> None:
    """Run each configuration once, while the budget lasts (``first``: the starting point runs
    whatever the budget says)."""
    for k, m in enumerate(measured):
        if m.error is None and ((first and k == 0) or clock.left() >= clock.trial_cost()):
            began = time.perf_counter()
            out = run_trial(m.config, clock.seconds, workdir, caches)
            clock.overheads.append(max(0.0, time.perf_counter() - began - clock.seconds))
            if "error" in out:
                m.error = out["error"]
            else:
                m.runs.append(out)
        if bar is not None:
            bar.update(1)


def _bar(progress: bool, total: int):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="trial", desc="sweep")


def workspace() -> str:
    """A scratch folder for sample packs and caches (the caller removes it)."""
    return tempfile.mkdtemp(prefix="shardpack-sweep-")


def remove(path: str) -> None:
    """Remove the scratch folder (sample packs, caches)."""
    shutil.rmtree(path, ignore_errors=True)
