"""Engines and the walk: the same pack on the local pool, Dask and Ray (started by the pack, and
already running), and files listed per second by the source walk alone, in one process and as
pieces on a pool or Dask, from a local tree and from an S3 server (directly and at 30 ms)."""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common as c
from benchmarks import testbed
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure

HERE = "benchmarks.suites.engines"


def options(p) -> None:
    """The engines suite's options."""
    p.add_argument("--images", type=int, default=20000, help="100 KB JPEGs [20000]")
    p.add_argument("--engines", default="local,dask,ray")
    p.add_argument("--out-dir", default="/dev/shm",
                   help="where OUT goes (tmpfs: no disk noise) [/dev/shm]")
    p.add_argument("--skip-running", action="store_true", help="no packs on running clusters")
    p.add_argument("--skip-walk", action="store_true", help="no walk cases")


def pack_once(src: str, engine: str, out: Path, address: str | None = None) -> tuple:
    """(seconds of the whole pack, seconds of it spent starting the engine)."""
    import shardpack
    t = time.perf_counter()
    summary = shardpack.pack(src, out, engine=engine, workers=2, shard_size="64MB",
                             address=address)
    seconds = time.perf_counter() - t
    shutil.rmtree(out)
    return seconds, summary.engine_start


def packs(src: str, reps: int, engines: list, out_dir: str) -> dict:
    """Child: each engine starting its own cluster for the pack, alternated."""
    work = Path(tempfile.mkdtemp(dir=out_dir))
    out = work / "out"
    times = {e: [] for e in engines}
    try:
        for rep in range(reps):
            for engine in (engines if rep % 2 == 0 else list(reversed(engines))):
                times[engine].append(pack_once(src, engine, out))
                print(f"rep {rep} {engine}: {times[engine][-1][0]:.1f} s", file=sys.stderr)
    finally:  # the folder in tmpfs (memory) goes too, not only the pack in it
        shutil.rmtree(work, ignore_errors=True)
    return times


def running(src: str, reps: int, out_dir: str) -> dict:
    """Child: the same packs on clusters already up (a Dask LocalCluster, a local Ray, 2
    workers each), warmed by one unmeasured pack each: what a long pack, or a second pack on a
    long-lived cluster, pays per task."""
    import distributed
    import ray

    work = Path(tempfile.mkdtemp(dir=out_dir))
    out = work / "out"
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, host="127.0.0.1")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    engines = {"local": ("local", None), "dask, running": ("dask", cluster.scheduler_address),
               "ray, running": ("ray", None)}
    try:
        for engine, address in engines.values():
            pack_once(src, engine, out, address)
        times = {name: [] for name in engines}
        for rep in range(reps):
            for name in (list(engines) if rep % 2 == 0 else list(reversed(engines))):
                engine, address = engines[name]
                times[name].append(pack_once(src, engine, out, address)[0])
    finally:
        ray.shutdown()
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    return times


def walk_rate(src: str, runner=None, storage_options=None) -> tuple:
    """Files listed per second by the source walk alone (no reading)."""
    from shardpack.write.packsource import PackSource  # (internal: the walk without the pack)
    t = time.perf_counter()
    source = PackSource(src, storage_options=storage_options)
    if runner is not None:
        source.use_engine(runner)
    files = sum(len(s.fields) - 1 for s in source)  # (cls is not a file)
    return files / (time.perf_counter() - t), files


def walks(src: str, reps: int) -> list:
    """Child: the walk in one process, on a local pool of 2 and on Dask, from the local tree,
    from rclone's S3 server (the tree hard-linked into its folder) and through a 30 ms proxy."""
    from concurrent.futures import ProcessPoolExecutor

    from shardpack.write.engine import DaskEngine, ExecutorEngine  # (internal: the runners)

    s, rows, work = testbed.servers(), [], Path(tempfile.mkdtemp())
    with s.S3Server(work) as server, ProcessPoolExecutor(2) as pool, \
            s.DelayProxy(server.port, 0.015) as proxy:
        shutil.copytree(src, server.data_dir / "walk" / "tree", copy_function=os.link)
        time.sleep(2)  # rclone sees files placed in its folder within its 1 s dir cache
        url, options = "s3://walk/tree", server.storage_options
        dask = DaskEngine(workers=2)
        try:
            runners = {"one process": None, "local pool, 2": ExecutorEngine(pool, 2),
                       "dask, 2 workers": dask}
            for where, (target, opts) in (
                    ("local tree", (src, None)), ("S3 server", (url, options)),
                    ("S3 server, 30 ms RTT", (url, server.storage_options_for(proxy.url)))):
                rates = {name: [] for name in runners}
                for _ in range(reps):
                    for name, runner in runners.items():
                        rate, files = walk_rate(target, runner, opts)
                        rates[name].append(rate)
                rows.append((where, files, {k: statistics.median(v) for k, v in rates.items()}))
        finally:
            dask.close()
    shutil.rmtree(work, ignore_errors=True)
    return rows


@suite("engines", title="Engines and the walk", options=options,
       quick=dict(images=200, engines="local,dask", skip_running=True),
       measures="""Seconds of `shardpack.pack(engine=..., workers=2, shard_size="64MB")` of a
       tree of generated 100 KB JPEGs, page cache warm, OUT on tmpfs (on disk, the fsync of the
       run before makes any run 1.3-3.6 s), engines alternated: the local pool, Dask and Ray
       each starting a local cluster for the pack (that start counted, and given apart), then
       the same on clusters already running. And files listed per second by the source walk
       alone: in one process, as one task per top-level folder on a local pool of 2 and on
       Dask, from the local tree and from `rclone serve s3` on 127.0.0.1, directly and behind a
       30 ms proxy.""",
       bounds="""Fixed costs on 2 cores: a local pack of 2 GB is ~1.5 s of CPU, so a cluster's
       own processes (scheduler, nannies, raylet) and its start show; per task a running Dask
       adds ~18 ms, Ray ~6 ms. The S3 walk is bound by rclone (~6,000 keys/s on the same
       cores), so more listers cannot list faster than it answers.""")
def run_engines(run) -> Outcome:
    """The engines suite: packs, packs on running clusters, walks (each part a child)."""
    a = run.args
    src, gen = c.ensure_images(run.data_dir, a.images)
    c.warm(c.files_under(src))
    engines = a.engines.split(",")
    times = c.fresh(f"{HERE}:packs", str(src), run.reps, engines, a.out_dir, timeout=3600)
    local = c.med(t for t, _ in times["local"])
    local_run = c.med(t - s for t, s in times["local"])
    figures = []
    for engine in engines[1:]:
        med = c.med(t for t, _ in times[engine])
        start = c.med(s for _, s in times[engine])
        run_s = c.med(t - s for t, s in times[engine])
        figures.append(figure(f"pack on {engine}, cluster started by the pack", med, "s", {},
                              {"local": local},
                              f"{med / local:.2f}x local; start {start:.1f} s; start excluded "
                              f"{run_s / local_run:.2f}x; runs "
                              f"{c.spread([t for t, _ in times[engine]])}"))
    if not a.skip_running:
        held = c.fresh(f"{HERE}:running", str(src), run.reps, a.out_dir, timeout=3600)
        ref = c.med(held["local"])
        for name in ("dask, running", "ray, running"):
            med = c.med(held[name])
            figures.append(figure(f"pack on {name} (2 workers, warmed)", med, "s", {},
                                  {"local": ref}, f"{med / ref:.2f}x local; runs "
                                  f"{c.spread(held[name])}"))
    if not a.skip_walk:
        for where, files, rates in c.fresh(f"{HERE}:walks", str(src), run.reps, timeout=3600):
            others = "; ".join(f"{k}: {v:,.0f}/s" for k, v in rates.items()
                               if k != "one process")
            figures.append(figure(f"walk, {where}: one process", rates["one process"],
                                  "files/s", {}, {}, f"{others}; {files:,} files listed"))
    setup = f"{a.images:,} JPEGs (`{gen}`), 64 MB shards, 2 workers; {run.reps} runs each."
    return Outcome(figures, setup, raw={"packs": times},
                   part=None if engines == ["local", "dask", "ray"] and not (
                       a.skip_running or a.skip_walk) else "partial")
