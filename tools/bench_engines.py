"""Packing on each engine, and walking a tree in one process against on an engine (issue 17).
Not a test; figures go to docs/benchmarks.md.

* ``pack``: the same tree packed with ``--engine local``, ``dask`` and ``ray`` (2 workers each;
  dask and ray start a local cluster for the run, and that start is counted), alternated,
  median seconds; the page cache holds the tree (warm) and OUT is on tmpfs (``--out-dir``,
  /dev/shm by default), so the figure is CPU and engine overhead: with OUT on this machine's
  disk, the fsync of 2 GB from the run before made any run 1.3-3.6 s, whatever the engine.
* ``walk``: files listed per second by ``Source`` alone (the walk, no reading), in this
  process and as one task per top-level folder on a local pool of 2 processes and on dask,
  from the local tree and from the S3 server of the tests (``rclone serve s3`` on 127.0.0.1,
  the tree linked into its data folder), directly and behind the tests' DelayProxy (30 ms RTT:
  listing far from the store is a chain of round trips, which pieces listed at once overlap).

    python tools/bench_engines.py bench-data/imagenet-20000 --reps 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pack_once(src: str, engine: str, out: Path, address: str | None = None
              ) -> tuple[float, float]:
    """(seconds of the whole pack, seconds of it spent starting the engine)."""
    import shardpack

    t = time.perf_counter()
    summary = shardpack.pack(src, out, engine=engine, workers=2, shard_size="64MB",
                             address=address)
    seconds = time.perf_counter() - t
    shutil.rmtree(out)
    return seconds, summary.engine_start


def walk_rate(src: str, runner=None, storage_options=None) -> tuple[float, int]:
    from shardpack.write.samples import Source

    t = time.perf_counter()
    source = Source(src, storage_options=storage_options)
    if runner is not None:
        source.use_engine(runner)
    files = sum(len(s.fields) - 1 for s in source)  # (cls is not a file)
    return files / (time.perf_counter() - t), files


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--engines", nargs="+", default=["local", "dask", "ray"])
    p.add_argument("--skip-pack", action="store_true")
    p.add_argument("--out-dir", default="/dev/shm", help="where OUT goes (tmpfs: no disk noise)")
    args = p.parse_args()
    out = Path(tempfile.mkdtemp(dir=args.out_dir)) / "out"
    if not args.skip_pack:
        times = {e: [] for e in args.engines}
        for rep in range(args.reps):
            engines = args.engines if rep % 2 == 0 else list(reversed(args.engines))
            for engine in engines:
                times[engine].append(pack_once(args.src, engine, out))
                print(f"rep {rep} {engine}: {times[engine][-1][0]:.1f} s", file=sys.stderr)
        local = statistics.median(t for t, _ in times["local"])
        local_run = statistics.median(t - s for t, s in times["local"])
        print(f"`python tools/bench_engines.py {args.src} --reps {args.reps}`: pack, 2 workers, "
              f"warm page cache, {args.reps} runs each alternated, median seconds; 'start' is "
              "the part spent starting the engine (a local cluster for dask and ray):\n")
        print("| engine | seconds (median) | runs | start | vs local | vs local, start "
              "excluded |")
        print("|---|---|---|---|---|---|")
        for engine in args.engines:
            med = statistics.median(t for t, _ in times[engine])
            start = statistics.median(s for _, s in times[engine])
            run = statistics.median(t - s for t, s in times[engine])
            runs = ", ".join(f"{t:.1f}" for t, _ in times[engine])
            print(f"| {engine} | {med:.1f} | {runs} | {start:.1f} | {med / local:.2f}x | "
                  f"{run / local_run:.2f}x |")
    running(args.src, args.reps, out)
    walks(args.src, args.reps)


def running(src: str, reps: int, out: Path) -> None:
    """The same packs on a cluster that is already up (a Dask LocalCluster, a local Ray, both
    started here with 2 workers): what a long pack, or a second pack on a long-lived cluster,
    pays per task.  One unmeasured pack first warms each engine's workers (imports)."""
    import distributed
    import ray

    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, host="127.0.0.1")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    engines = {"local": ("local", None), "dask, running": ("dask", cluster.scheduler_address),
               "ray, running": ("ray", None)}
    try:
        for engine, address in engines.values():
            pack_once(src, engine, out, address)
        times = {name: [] for name in engines}
        for rep in range(reps):
            names = list(engines) if rep % 2 == 0 else list(reversed(engines))
            for name in names:
                engine, address = engines[name]
                times[name].append(pack_once(src, engine, out, address)[0])
                print(f"rep {rep} {name}: {times[name][-1]:.1f} s", file=sys.stderr)
    finally:
        ray.shutdown()
        cluster.close()
    local = statistics.median(times["local"])
    print(f"\nThe same on clusters already running (2 workers each, warmed by one pack), "
          f"{reps} runs each alternated:\n")
    print("| engine | seconds (median) | runs | vs local |")
    print("|---|---|---|---|")
    for name in engines:
        med = statistics.median(times[name])
        runs = ", ".join(f"{t:.1f}" for t in times[name])
        print(f"| {name} | {med:.2f} | {runs} | {med / local:.2f}x |")


def walks(src: str, reps: int) -> None:
    from concurrent.futures import ProcessPoolExecutor

    from shardpack.write.engine import DaskEngine, ExecutorEngine
    from tests.servers import DelayProxy, S3Server

    rows = []
    work = Path(tempfile.mkdtemp())
    with S3Server(work) as server, ProcessPoolExecutor(2) as pool, \
            DelayProxy(server.port, 0.015) as proxy:
        bucket = server.data_dir / "walk"
        shutil.copytree(src, bucket / "tree", copy_function=os.link)
        time.sleep(2)  # rclone sees files placed in its folder within its 1 s dir cache
        url, options = "s3://walk/tree", server.storage_options
        far = server.storage_options_for(proxy.url)
        dask = DaskEngine(workers=2)
        try:
            runners = {"one process": None, "local pool, 2": ExecutorEngine(pool, 2),
                       "dask, 2 workers": dask}
            for where, (s, opts) in (("local tree", (src, None)), ("S3 server", (url, options)),
                                     ("S3 server, 30 ms RTT", (url, far))):
                rates = {name: [] for name in runners}
                for _ in range(reps):
                    for name, runner in runners.items():
                        rate, files = walk_rate(s, runner, opts)
                        rates[name].append(rate)
                for name in runners:
                    rows.append((where, name, statistics.median(rates[name]), files))
        finally:
            dask.close()
    shutil.rmtree(work, ignore_errors=True)
    print(f"\nWalk only (`Source`, no reading), {reps} runs each, median files listed per "
          "second:\n")
    print("| source | walk | files | files/s (median) |")
    print("|---|---|---|---|")
    for where, name, rate, files in rows:
        print(f"| {where} | {name} | {files:,} | {rate:,.0f} |")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
