"""The CPU ceiling of a cold remote epoch on this machine, counted for the fastlink suite.

A cold cached epoch has to do the work of downloading every shard (client and server) and the
work of a local epoch over the same shards, on the same cores. With every process on the machine
counted (/proc/stat busy time: the server, softirqs and loopback TCP are in it)::

    ceiling wall = (CPU of the GETs + CPU of a local epoch) / cores

is the fastest a cold epoch can be with today's costs per byte and perfect overlap. Cases,
alternated within each repetition, all in one process (DataLoader workers are forked): a cold
cached epoch, batched and per sample; every shard downloaded once with shardpack's own
``Storage.download``; the same two epochs on the local packed folder; and an idle second (the
machine's background, taken off every case).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import common as c
from benchmarks import testbed
from benchmarks.suites.remote import sample_epoch, shard_epoch

CASES = ("cold/batched", "cold/sample", "gets", "local/batched", "local/sample", "idle")
SERVER = {"pid": 0}  # the nginx master of this run


def measured(work) -> dict:
    """Run ``work()``; its wall, the machine's busy CPU and the server's CPU over that window."""
    def server():
        return c.process_cpu(c.descendants(SERVER["pid"]))
    m0, n0, t0 = c.machine_busy(), server(), time.perf_counter()
    extra = work() or {}
    wall = time.perf_counter() - t0
    return dict(wall=wall, cpu=c.machine_busy() - m0, server=server() - n0, **extra)


def epoch(url: str, batched: bool, cache_parent: str | None) -> dict:
    """One measured epoch (cold through a fresh cache, or local)."""
    from shardpack import ShardDataset
    cache = tempfile.mkdtemp(prefix="ceiling-", dir=cache_parent) if cache_parent else None
    try:
        def work():
            kwargs = dict(cache_dir=cache, shuffle=True)
            if batched:
                _, n, b, _ = shard_epoch(ShardDataset(url, batch_size=256, batched=True,
                                                      **kwargs))
            else:
                _, n, b, _ = sample_epoch(ShardDataset(url, **kwargs))
            return dict(samples=n, bytes=b)
        return measured(work)
    finally:
        if cache:
            shutil.rmtree(cache, ignore_errors=True)


def gets(url: str, shards: list, parent: str) -> dict:
    """Every shard downloaded once, one after another, with ``Storage.download``."""
    from shardpack.storage import Storage
    storage = Storage(url)
    folder = tempfile.mkdtemp(prefix="ceiling-get-", dir=parent)
    try:
        def work():
            for name, size in shards:
                storage.download(name, os.path.join(folder, name), size)
            return dict(bytes=sum(size for _, size in shards))
        return measured(work)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure(packed: str, parent: str, reps: int) -> dict:
    """Child: every case ``reps`` times (after one unmeasured round: imports, connections)."""
    packed = Path(packed)
    shards = sorted((p.name, p.stat().st_size) for p in packed.glob("*.tar"))
    results = {k: [] for k in CASES}
    with testbed.servers().NginxServer(packed.parent,
                                       Path(tempfile.mkdtemp(prefix="ceiling-nginx-"))) as nginx:
        url = f"{nginx.url}/{packed.name}"
        SERVER["pid"] = nginx.proc.pid
        run_case = {
            "cold/batched": lambda: epoch(url, True, parent),
            "cold/sample": lambda: epoch(url, False, parent),
            "gets": lambda: gets(url, shards, parent),
            "local/batched": lambda: epoch(str(packed), True, None),
            "local/sample": lambda: epoch(str(packed), False, None),
            "idle": lambda: measured(lambda: time.sleep(1.0)),
        }
        for case in CASES:
            run_case[case]()
        for rep in range(reps):
            for case in c.rotated(list(CASES), rep):
                results[case].append(run_case[case]())
    return dict(results=results, bytes=sum(s for _, s in shards), cores=os.cpu_count())


def ceilings(m: dict) -> dict:
    """{path: (ceiling MB/s, the GETs' MB/s, medians)} from ``measure``'s result; each case's
    CPU less the machine's background over its wall time."""
    rows = m["results"]
    background = statistics.median(r["cpu"] / r["wall"] for r in rows["idle"])
    med = {k: {"wall": statistics.median(r["wall"] for r in v),
               "cpu": statistics.median(r["cpu"] - background * r["wall"] for r in v)}
           for k, v in rows.items() if k != "idle"}
    mb = m["bytes"] / 1e6
    get = med["gets"]
    out = {}
    for path in ("batched", "sample"):
        ideal = (get["cpu"] + med[f"local/{path}"]["cpu"]) / m["cores"]
        out[path] = dict(ceiling=mb / ideal, get=mb / get["wall"],
                         cold=mb / med[f"cold/{path}"]["wall"], background=background)
    return out
