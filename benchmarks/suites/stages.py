"""The loader's two execution modes on the trees suite's three trees: the README pipeline with
its decode in N threads of the training process (``execution="threads"``) or in N DataLoader
worker processes (``execution="processes"``); images/s, the peak memory of the whole job and
the per-stage counters of ``stats()``, each measurement in a fresh interpreter, the contenders
alternated."""

from __future__ import annotations

import inspect
import os
import subprocess
import tempfile
import time

from benchmarks import common as c
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure
from benchmarks.suites import trees

HERE = "benchmarks.suites.stages"
SIZE, EPOCHS = 224, 2
MODES = ("threads", "processes")
RATE_TARGET, RATE_TREES = 0.95, ("photos", "large")
MEMORY_TARGET, MEMORY_WORKERS = 0.75, 2
SAMPLE_S = 0.075  # the memory sampling interval
STAGES = ("order", "read", "decode", "transform", "pin", "device")  # the table's order
COUNTERS = ("items", "busy_s", "wait_in_s", "wait_out_s")
STATS_SETTLE_S = 0.3  # waited after an epoch before reading stats() (3 of the workers' flushes)


def options(p) -> None:
    """The stages suite's options."""
    p.add_argument("--trees", default=",".join(trees.TREES),
                   help=f"the trees to run, comma-separated [{','.join(trees.TREES)}]")
    p.add_argument("--workers", default="2,8",
                   help="the worker counts (threads or processes), comma-separated [2,8]")
    p.add_argument("--batch-size", type=int, default=trees.BATCH,
                   help=f"images a batch of icons and photos [{trees.BATCH}]")
    p.add_argument("--large-batch", type=int, default=64,
                   help="images a batch of the large tree [64: 16 batches an epoch, so that 8 "
                        "workers have two rounds]")
    p.add_argument("--icons", type=int, default=5000, help="48 px PNG icons [5000]")
    p.add_argument("--photos", type=int, default=5000, help="~100 KB generated JPEGs [5000]")
    p.add_argument("--large", type=int, default=1024, help="3000x2000 JPEGs [1024]")
    p.add_argument("--counters", type=int, default=1, choices=(0, 1),
                   help="measure the stage counters' cost against a bytes-only batch [1]")


def contender(mode: str, workers: int) -> str:
    """A contender's name: ``threads-2``, ``processes-8``."""
    return f"{mode}-{workers}"


# ------------------------------------------------------------------------------ the child

def _loader(mode: str, workers: int, path: str, batch: int):
    """(the dataset, the README pipeline over it) in ``mode`` with ``workers``."""
    import shardpack
    from torch.utils.data import DataLoader

    ds = shardpack.ShardDataset(path, batch_size=batch, batched=True, shuffle=True,
                                decode=shardpack.CpuDecode(SIZE), **_execution(mode, workers))
    if mode == "threads":  # the threads run in this process: no DataLoader workers
        dl = DataLoader(ds, batch_size=None, num_workers=0)
    else:
        dl = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=True)
    return ds, shardpack.DeviceLoader(dl, device="cpu", decode_on="cpu")


def _execution(mode: str, workers: int) -> dict:
    """The dataset's execution keywords (none where this shardpack has no ``execution=``: its
    only mode is worker processes; with processes the DataLoader's ``num_workers`` says how
    many)."""
    if not has_execution():
        return {}
    return dict(execution=mode, workers=workers) if mode == "threads" else dict(execution=mode)


def has_execution() -> bool:
    """Whether this shardpack's ``ShardDataset`` takes ``execution=``."""
    import shardpack

    return "execution" in inspect.signature(shardpack.ShardDataset).parameters


def stage_stats(*sources) -> dict:
    """{stage: {counter: number}} from the first of ``sources`` whose ``stats`` is callable (the
    DeviceLoader's holds the dataset's stages and its own); {} where none is."""
    for source in sources:
        if callable(getattr(source, "stats", None)):
            return {str(name): {str(k): v for k, v in counters.items()
                                if isinstance(v, (int, float)) and not isinstance(v, bool)}
                    for name, counters in source.stats().items()
                    if isinstance(counters, dict) and "items" in counters}
    return {}


def measure(mode: str, workers: int, path: str, batch: int) -> dict:
    """Child: one contender, EPOCHS epochs, each batch's images touched (one element read): the
    last epoch's steady images/s (see :func:`steady_rate`), the cores it used (this process and
    its workers, from /proc), the 1st epoch's time to the first batch from the loader's
    construction (imports before it), and ``stats()`` after each epoch."""
    import torch  # noqa: F401  (imported before the clock starts, as shardpack's modules are)

    import shardpack  # noqa: F401

    t0 = time.perf_counter()
    ds, loader = _loader(mode, workers, path, batch)
    epochs, stats = [], []
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        loader.reset_stats()  # the stages' counters are cumulative: each epoch its own table
        cpu0 = c.process_cpu(c.descendants(os.getpid()))
        start = t0 if epoch == 0 else time.perf_counter()
        arrivals = []  # (time, images) of each batch
        for b in loader:
            x = b["image"]
            x[0, 0, 0, 0].item()
            arrivals.append((time.perf_counter(), len(x)))
        end = time.perf_counter()
        cpu = c.process_cpu(c.descendants(os.getpid())) - cpu0
        epochs.append(dict(n=sum(k for _, k in arrivals), batches=len(arrivals),
                           rate=steady_rate(arrivals, workers, end), wall=end - start,
                           first=(arrivals[0][0] if arrivals else end) - start, cpu=cpu))
        # workers hand their counters to the table every FLUSH_S and at their pass's end, which
        # may come after the training process has taken the last batch
        time.sleep(STATS_SETTLE_S)
        stats.append(stage_stats(loader, ds))
    last = epochs[-1]
    return dict(rate=last["rate"], ttfb=epochs[0]["first"], cores=last["cpu"] / last["wall"],
                n=last["n"], batches=last["batches"], stats=stats)


def steady_rate(arrivals: list, workers: int, end: float) -> float | None:
    """Images/s of an epoch once its first round is in (the first ``workers`` batches): the
    images of the later batches over the time from that round's last batch to the epoch's end.
    Counting from the first batch instead would favour worker processes: N of them start
    together and hand in their first batches at about the same time, so the batches just after
    the first cost no wait.  None where the epoch has no batch after its first round."""
    if len(arrivals) <= workers:
        return None
    since = arrivals[workers - 1][0]
    images = sum(k for _, k in arrivals[workers:])
    return images / (end - since) if end > since else None


# ------------------------------------------------------------------------------ the parent

def _memory_kb(pid: int) -> tuple[int, int, int, int]:
    """(Rss, Pss, Pss less its file-backed pages, peak RSS) of a process in kB
    (/proc/PID/smaps_rollup, VmHWM of /proc/PID/status); zeros once it is gone.  File-backed
    pages are the page cache: local shards, which shardpack reads through mmap, and the
    libraries' code; what is left is what the process allocated (heap, the batch slots)."""
    found = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("Rss", "Pss", "Pss_File"):
                    found[name] = int(rest.split()[0])
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    found["hwm"] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    pss = found.get("Pss", 0)
    return found.get("Rss", 0), pss, pss - found.get("Pss_File", 0), found.get("hwm", 0)


class MemorySampler:
    """The memory of a process tree, sampled: the peak of its summed PSS (pages shared after a
    fork split among the processes sharing them: the job's memory), that less the file-backed
    pages, the peak of its summed RSS and the sum of each process's own peak RSS (shared pages
    counted in every process)."""

    def __init__(self):
        self.pss = self.own = self.rss = 0
        self.hwm: dict[int, int] = {}

    def sample(self, root: int) -> None:
        """Read every process of ``root``'s tree once."""
        rss = pss = own = 0
        for pid in c.descendants(root):
            r, p, o, hwm = _memory_kb(pid)
            rss, pss, own = rss + r, pss + p, own + o
            self.hwm[pid] = max(self.hwm.get(pid, 0), hwm)
        self.pss, self.rss = max(self.pss, pss), max(self.rss, rss)
        self.own = max(self.own, own)

    def result(self) -> dict:
        """The peaks in MB."""
        return dict(pss_mb=self.pss / 1024, own_mb=self.own / 1024, rss_mb=self.rss / 1024,
                    hwm_sum_mb=sum(self.hwm.values()) / 1024, processes=len(self.hwm))


def run_child(mode: str, workers: int, path, batch: int, timeout: float = 900) -> dict:
    """:func:`measure` in a fresh interpreter (benchmarks.child), its process tree's memory
    sampled from here every SAMPLE_S s (outside the measured processes)."""
    cmd = c.child_cmd(f"{HERE}:measure", mode, workers, str(path), batch)
    memory = MemorySampler()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=c.child_env())
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                break
            memory.sample(proc.pid)
            time.sleep(SAMPLE_S)
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())
    return dict(c.parse_child(done, contender(mode, workers)), **memory.result())


def batch_of(run, tree: str) -> int:
    """The batch size of ``tree``."""
    return run.args.large_batch if tree == "large" else run.args.batch_size


def measure_tree(run, tree: str, packed, kinds: list[tuple[str, int]]) -> dict:
    """Every contender on one tree, alternated, ``run.reps`` times: {name: [results]}."""
    c.warm(c.files_under(packed))
    runs = {contender(*k): [] for k in kinds}
    for rep in range(run.reps):
        for mode, workers in c.rotated(kinds, rep):
            r = run_child(mode, workers, packed, batch_of(run, tree))
            runs[contender(mode, workers)].append(r)
            run.log(f"{tree} rep {rep} {contender(mode, workers):12s} "
                    f"{r['rate'] or 0:8.1f} images/s on {r['cores']:.2f} cores, first batch "
                    f"{r['ttfb']:6.2f} s, PSS {r['pss_mb']:6.0f} MB (less file pages "
                    f"{r['own_mb']:5.0f}), sum of peak RSS {r['hwm_sum_mb']:6.0f} MB, "
                    f"processes {r['processes']}")
    return runs


# ------------------------------------------------------------------------------ counters

COUNTER_SAMPLES, COUNTER_BATCH, COUNTER_ITEMS = 40_000, 256, 100_000


def counters_dataset(run):
    """40,000 samples of 1 KB (a bytes-only epoch is where the counters weigh most), packed
    once into the run's data folder."""
    import shardpack

    out = run.data_dir / f"stages-counters-{COUNTER_SAMPLES}"
    if not (out / "shardpack.json").exists():  # packed: its manifest is written last
        src = run.data_dir / f"stages-counters-src-{COUNTER_SAMPLES}"
        rng = __import__("random").Random(0)
        for i in range(COUNTER_SAMPLES):
            path = src / f"c{i % 4}" / f"{i:06d}.bin"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(rng.randbytes(1000))
        shardpack.pack(src, out, workers=1)
    return out


def measure_counters(path: str) -> dict:
    """Child: what the stage counters cost against a bytes-only batch.  (1) The median time of a
    batch of COUNTER_BATCH 1 KB samples, every read checked, in this process (5 epochs after a
    first); (2) the counters' own time an item: the dataset's chain of stages (order, read,
    decode, transform, outlet) over COUNTER_ITEMS items with stages that do nothing, less the
    same items through the bare steps; a batch of the dataset is one item of each stage."""
    import statistics

    import shardpack
    from shardpack.loader.pipeline import MapStage, Outlet, Stage

    ds = shardpack.ShardDataset(path, batch_size=COUNTER_BATCH, batched=True, shuffle=True)
    per_batch = []
    for epoch in range(6):
        start, count = time.perf_counter(), sum(1 for _ in ds)
        if epoch:
            per_batch.append((time.perf_counter() - start) / count)

    class Source(Stage):
        name = "order"

        def __init__(self, n):
            super().__init__(None)
            self.left = n

        def step(self):
            if self.left <= 0:
                raise StopIteration
            self.left -= 1
            return self.left

    def counted():
        last = Source(COUNTER_ITEMS)
        for name in ("read", "decode", "transform"):
            last = MapStage(name, abs, last)
        start = time.perf_counter()
        for _ in Outlet(last, None, 0):
            pass
        return time.perf_counter() - start

    def bare():
        source = Source(COUNTER_ITEMS)
        start = time.perf_counter()
        try:
            while True:
                abs(abs(abs(source.step())))
        except StopIteration:
            return time.perf_counter() - start

    costs = [(counted() - bare()) / COUNTER_ITEMS for _ in range(5)]
    return dict(batch_s=statistics.median(per_batch), counter_s=statistics.median(costs))


def counter_figures(run) -> list[dict]:
    """The counters' cost a batch, against a bytes-only batch's time."""
    path = counters_dataset(run)
    done = subprocess.run(c.child_cmd(f"{HERE}:measure_counters", str(path)),
                          capture_output=True, text=True, env=c.child_env(), timeout=900)
    r = c.parse_child(done, "counters")
    share = 100 * r["counter_s"] / r["batch_s"]
    return [figure("counters: their cost a batch", r["counter_s"] * 1e6, "us",
                   {}, {"a bytes-only batch of 256 x 1 KB": r["batch_s"] * 1e6},
                   f"{share:.3f}% of a bytes-only batch (target < 1%: "
                   f"{'met' if share < 1 else 'NOT met'})")]


# ------------------------------------------------------------------------------ figures

def _ratio_note(x, target, better_low: bool, runs: str) -> str:
    if x is None:
        return "no figure"
    if target is None:
        return f"no target; {runs}"
    ok = x <= target if better_low else x >= target
    return f"target {'<=' if better_low else '>='} {target}x: {c.verdict(ok)}; {runs}"


def pair_figures(tree: str, workers: int, runs: dict) -> list[dict]:
    """images/s and peak memory of threads and processes with ``workers``, and their ratios."""
    t, p = runs.get(contender("threads", workers)), runs.get(contender("processes", workers))
    if not t or not p:
        return []
    head = f"{tree}, {workers} workers"

    def med(rs, key):
        return c.med(r[key] for r in rs)

    rate_t, rate_p = med(t, "rate"), med(p, "rate")
    pss_t, pss_p = med(t, "pss_mb"), med(p, "pss_mb")

    def runs_of(key):
        return (f"runs threads {c.spread([r[key] for r in t], '{:,.0f}')}, processes "
                f"{c.spread([r[key] for r in p], '{:,.0f}')}")
    figures = [figure(f"{head}: images/s, threads", rate_t, "images/s", {"processes": rate_p}, {},
                      f"2nd epoch once its first round is in; on {med(t, 'cores'):.2f} cores "
                      f"(processes {med(p, 'cores'):.2f}); first batch {med(t, 'ttfb'):.2f} s "
                      f"(processes {med(p, 'ttfb'):.2f} s)"),
               figure(f"{head}: peak memory (summed PSS), threads", pss_t, "MB",
                      {"processes": pss_p}, {},
                      f"the whole job, sampled every {SAMPLE_S * 1000:.0f} ms; less the "
                      f"file-backed pages (mapped shards, the libraries' code): threads "
                      f"{med(t, 'own_mb'):,.0f}, processes {med(p, 'own_mb'):,.0f}; sum of peak "
                      f"RSS (shared pages counted in each process): threads "
                      f"{med(t, 'hwm_sum_mb'):,.0f}, processes {med(p, 'hwm_sum_mb'):,.0f}")]
    x = rate_t / rate_p if rate_t and rate_p else None
    target = RATE_TARGET if tree in RATE_TREES else None
    figures.append(figure(f"{head}: images/s threads / processes", x, "x", {},
                          {"target": target}, _ratio_note(x, target, False, runs_of("rate"))))
    x = pss_t / pss_p if pss_t and pss_p else None
    own_t, own_p = med(t, "own_mb"), med(p, "own_mb")
    own = f"{own_t / own_p:.2f}x" if own_t and own_p else "-"
    target = MEMORY_TARGET if workers == MEMORY_WORKERS else None
    figures.append(figure(f"{head}: peak memory threads / processes", x, "x", {},
                          {"target": target},
                          _ratio_note(x, target, True, f"less file pages {own}; PSS "
                                      + runs_of("pss_mb"))))
    return figures


def epoch_stages(result: dict) -> dict:
    """The stages' counters of the measured (last) epoch of one run."""
    return result["stats"][-1] if result.get("stats") else {}


def stage_table(runs: list) -> dict:
    """{stage: {counter: median over the runs}} of one contender's runs."""
    names = {s for r in runs for s in epoch_stages(r)}
    ordered = [s for s in STAGES if s in names] + sorted(names - set(STAGES))
    return {s: {k: c.med(epoch_stages(r).get(s, {}).get(k) for r in runs) for k in COUNTERS}
            for s in ordered}


def _counters(row: dict) -> str:
    items = row.get("items")
    return (f"{items:,.0f} items, " if items is not None else "") + ", ".join(
        f"{k[:-2].replace('_', ' ')} {row[k]:.2f} s" for k in ("wait_in_s", "wait_out_s")
        if row.get(k) is not None)


def stage_figures(tree: str, workers: int, runs: dict) -> list[dict]:
    """One row per stage of the measured epoch with ``workers``: threads' busy seconds, the
    processes' beside them, items and waits in the note."""
    t = stage_table(runs.get(contender("threads", workers), []))
    p = stage_table(runs.get(contender("processes", workers), []))
    out = []
    for stage in list(t) + [s for s in p if s not in t]:
        rt, rp = t.get(stage, {}), p.get(stage, {})
        if not rt.get("items") and not rp.get("items"):  # pin without CUDA: nothing to show
            continue
        value = rt.get("busy_s") if rt else None
        peers = {"processes": rp.get("busy_s")} if rp else {}
        out.append(figure(f"{tree}, {workers} workers: stage {stage}, busy", value, "s", peers, {},
                          f"threads: {_counters(rt) or '-'}; processes: {_counters(rp) or '-'}"))
    return out


def tree_figures(tree: str, runs: dict, counts: list[int]) -> list[dict]:
    """The figures of one tree: each worker count's pair, then the first count's stage table."""
    figures = [f for w in counts for f in pair_figures(tree, w, runs)]
    return figures + (stage_figures(tree, counts[0], runs) if counts else [])


def _parse(run) -> tuple[list[str], list[int]]:
    """The trees and worker counts asked for; SystemExit naming what is unknown."""
    names = [t.strip() for t in run.args.trees.split(",") if t.strip()]
    unknown = set(names) - set(trees.TREES)
    if unknown:
        raise SystemExit(f"stages: unknown tree {', '.join(sorted(unknown))}; the trees: "
                         f"{', '.join(trees.TREES)}")
    try:
        counts = [int(w) for w in run.args.workers.split(",") if w.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise SystemExit(f"stages: --workers takes counts >= 1, comma-separated, got "
                         f"{run.args.workers!r}")
    return names, counts


@suite("stages", title="Stages: threads or worker processes", options=options,
       quick=dict(reps=1, icons=600, photos=600, large=40, batch_size=16, large_batch=4),
       measures="""The README pipeline (`CpuDecode(224)` as the dataset's decode,
       `DeviceLoader(device="cpu", decode_on="cpu")`, normalised float NCHW, shuffled) on the
       trees suite's three trees (48x48 PNG icons and ~500x375 JPEGs of ~100 KB in batches of
       256, 1,024 3000x2000 JPEGs of ~1.7 MB in batches of 64; each a tar pack of 64 MB shards),
       run two ways with 2 and with 8 workers: `execution="threads"` (the workers are threads of
       the training process, the dataset iterated through `DataLoader(num_workers=0)`) and
       `execution="processes"` (a DataLoader with that many persistent worker processes).
       Figures: the 2nd epoch's images/s once its first round is in (one batch per worker: N
       worker processes hand in their first batches together, so counting from the first batch
       would favour them), the peak memory of the whole job (the training process and its
       workers) and the ratios threads / processes against their targets (>= 0.95x images/s on
       photos and large; <= 0.75x memory with 2 workers). The memory figure is the peak of the
       summed PSS of the process tree, sampled every 75 ms: pages shared after the fork are
       split among the processes that share them, so the job's memory is counted once; the note
       gives it less the file-backed pages (the page cache: the shards shardpack maps, which one
       process touching them all holds in its PSS, and the libraries' code) and, for reference,
       the sum of each process's peak RSS, which counts shared pages in every worker. Then one
       row per stage (`stats()` of the DeviceLoader: the dataset's stages and its own) for the
       2nd epoch with 2 workers: the wall seconds its workers spent in it, summed over them (a
       wait for a core or for the interpreter lock counts as busy), threads beside processes;
       the note gives its items (batches: the stages pass whole batches) and its waits, on its
       input (in a chain that pulls, the time of the stages before it) and, for the dataset's
       last stage, on the consumer. A stage that counted nothing (pin, without CUDA) has no row.
       Each measurement in a fresh interpreter, the contenders alternated, medians. Last, the
       stage counters' cost: the clock reads and sums of the dataset's chain of stages an item
       (a batch is one item of each stage; stages that do nothing, less the same steps bare,
       medians of 5 x 100,000 items) against the time of a bytes-only batch of 256 x 1 KB
       samples, every read checked (40,000 samples, 5 epochs in one process).""",
       bounds="""Two shared cores bound every figure: with both kept busy (the notes give the
       cores used) images/s follows an image's CPU cost, and 8 workers cannot run more than 2 at
       once, so they add memory and switches, not speed. Icons are small PNGs decoded whole by
       Pillow: per image, the Python around the decode weighs more than for a JPEG, and in
       threads all of it runs under the training process's one interpreter lock, where each
       worker process has its own; the icons' figures and stage rows give the gap as measured.
       Photos and large JPEGs spend their time in the decoder's C code, which runs outside the
       lock. Memory: worker processes each carry an interpreter, torch and their batches in
       flight; threads share one.""")
def run_stages(run) -> Outcome:
    """The stages suite: each tree made and packed once (the trees suite's data), then every
    contender, alternated."""
    names, counts = _parse(run)
    modes = MODES if has_execution() else ("processes",)
    kinds = [(m, w) for w in counts for m in modes]
    figures, raw, described = [], {}, []
    for tree in names:
        _, packed, what = trees.prepare(run, tree)
        described.append(f"{tree}: {what}")
        raw[tree] = measure_tree(run, tree, packed, kinds)
        figures += tree_figures(tree, raw[tree], counts)
    if run.args.counters:
        figures += counter_figures(run)
    missing = "" if has_execution() else (" This shardpack's ShardDataset has no execution=: "
                                          "worker processes only.")
    setup = (f"{'; '.join(described)}. Batch {run.args.batch_size} (large: "
             f"{run.args.large_batch}), {SIZE}x{SIZE}, workers "
             f"{', '.join(map(str, counts))}, {EPOCHS} epochs, {run.reps} repetitions, warm page "
             f"cache.{missing}")
    part = None if tuple(names) == trees.TREES and counts == [2, 8] else \
        "-".join(names) + "-" + "-".join(map(str, counts))
    return Outcome(figures, setup, part=part, raw=raw)
