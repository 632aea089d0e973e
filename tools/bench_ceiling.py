"""The CPU ceiling of a cold remote epoch on this machine (issue 19).

    .venv/bin/python tools/bench_ceiling.py [--reps 5] [--data /dev/shm/remote-fast] [--write-docs]

Where the fast-link benchmark (tools/bench_remote.py --fast) shows a cold epoch under 0.8x one GET
on nginx without a proxy, this asks whether the machine could do better at all. A cold cached
epoch has to do the work of downloading every shard (what one GET after another costs: client
and server) and the work of a local epoch over the same shards (gathering and handing batches
over), on the same cores. Measured per case, with every process on the machine counted
(/proc/stat busy time, so the server, softirqs and the kernel's loopback TCP are in it):

    ceiling wall = (CPU of the GETs + CPU of a local epoch) / cores

is the fastest a cold epoch can be with today's costs per byte and perfect overlap; the ceiling
ratio is the GET's wall over that. An epoch at the ceiling ratio uses every core all the time.

Cases, alternated within each repetition, all in this process (DataLoader workers are forked):
a cold cached epoch (fresh cache folder in /dev/shm) batched and per sample; every shard
downloaded once with shardpack's own Storage.download (the reference of bench_remote.py: one
streamed request, hashed on the way, into a file beside the cache); the same two epochs on the
local packed folder (tmpfs, so page cache warm). Each case's window runs from the dataset's
construction to the end of its iteration (workers joined); CPU and wall cover that window.
`--write-docs` writes a subsection under "## Fast link: what bounds a cold epoch (issue 19)" in
docs/benchmarks.md.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import bench_common  # noqa: E402
import bench_remote  # noqa: E402

SECTION = "## Fast link: what bounds a cold epoch (issue 19)"
HEADING = "### The CPU ceiling of this machine (issue 19)"
TICK = os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """CPU seconds the machine's CPUs have been busy: user, nice, system, irq and softirq (idle,
    iowait and the hypervisor's steal left out; guest time is inside user already)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / TICK


def tree_cpu(root: int) -> float:
    """CPU seconds of process ``root`` and every live process below it (the nginx this run
    started: its master and workers)."""
    total = 0.0
    for pid in bench_common.descendants(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(rest[11]) + int(rest[12])) / TICK
    return total


SERVER = {"pid": 0}  # the nginx master of this run


def measured(work) -> dict:
    """Run ``work()``; its wall, the machine's busy CPU and the server's CPU over that window."""
    m0, n0, t0 = machine_busy(), tree_cpu(SERVER["pid"]), time.perf_counter()
    extra = work() or {}
    wall = time.perf_counter() - t0
    return dict(wall=wall, cpu=machine_busy() - m0, server=tree_cpu(SERVER["pid"]) - n0,
                **extra)


def idle(seconds: float = 1.0) -> dict:
    """The machine's busy CPU while this run does nothing: other tenants, daemons."""
    return measured(lambda: time.sleep(seconds))


def epoch(url: str, batched: bool, cache_parent: str | None) -> dict:
    from shardpack import ShardDataset
    cache = tempfile.mkdtemp(prefix="ceiling-", dir=cache_parent) if cache_parent else None
    try:
        def work():
            kwargs = dict(cache_dir=cache, shuffle=True)
            if batched:
                ds = ShardDataset(url, batch_size=256, batched=True, **kwargs)
                _, n, b, _ = bench_remote.shard_epoch(ds)
            else:
                ds = ShardDataset(url, **kwargs)
                _, n, b, _ = bench_remote.sample_epoch(ds)
            return dict(samples=n, bytes=b)
        return measured(work)
    finally:
        if cache:
            shutil.rmtree(cache, ignore_errors=True)


def gets(url: str, shards: list[tuple[str, int]], parent: str) -> dict:
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


CASES = ("cold/batched", "cold/sample", "gets", "local/batched", "local/sample", "idle")


def run(args) -> tuple[dict, dict]:
    from tests.servers import NginxServer
    data = args.data
    packed = Path(bench_remote.prepare_fast(data, args.count))
    shards = sorted((p.name, p.stat().st_size) for p in packed.glob("*.tar"))
    parent = bench_remote.cache_parent(data, sum(s for _, s in shards))
    results = {c: [] for c in CASES}
    info = dict(load=" ".join(f"{x:.1f}" for x in os.getloadavg()), cores=os.cpu_count(),
                shard_bytes=sum(s for _, s in shards), shards=len(shards), parent=parent)
    with NginxServer(packed.parent, Path(tempfile.mkdtemp(prefix="ceiling-nginx-"))) as nginx:
        url = f"{nginx.url}/{packed.name}"
        SERVER["pid"] = nginx.proc.pid
        run_case = {
            "cold/batched": lambda: epoch(url, True, parent),
            "cold/sample": lambda: epoch(url, False, parent),
            "gets": lambda: gets(url, shards, parent),
            "local/batched": lambda: epoch(str(packed), True, None),
            "local/sample": lambda: epoch(str(packed), False, None),
            "idle": idle,
        }
        for case in CASES:  # one unmeasured round: imports, first connections
            run_case[case]()
        for rep in range(args.reps):
            order = CASES[rep % len(CASES):] + CASES[:rep % len(CASES)]
            for case in order:
                r = run_case[case]()
                results[case].append(r)
                print(f"rep {rep} {case:14s} wall {r['wall']:.3f} s  cpu {r['cpu']:.2f} "
                      f"core-s (server {r['server']:.2f})", flush=True)
    return results, info


def report(results: dict, info: dict, args) -> str:
    # other tenants' and daemons' CPU, per second, taken off each case's machine CPU
    background = statistics.median(r["cpu"] / r["wall"] for r in results["idle"])
    med = {c: {"wall": statistics.median(r["wall"] for r in rows),
               "cpu": statistics.median(r["cpu"] - background * r["wall"] for r in rows),
               "server": statistics.median(r["server"] for r in rows)}
           for c, rows in results.items() if c != "idle"}
    mb = info["shard_bytes"] / 1e6
    cores = info["cores"]
    get = med["gets"]
    get_rate = mb / get["wall"]
    machine = bench_common.machine_info(args.data)
    lines = [
        f"Command: `.venv/bin/python tools/bench_ceiling.py --reps {args.reps} --data {args.data}"
        f"{' --write-docs' if args.write_docs else ''}`",
        "",
        f"Machine: {machine['nproc']} cores ({machine['cpu']}), {machine['ram_gib']:.0f} GiB "
        f"RAM, Linux {machine['kernel']}, Python {machine['python']}, data on {machine['fs']}; "
        f"shared and noisy (load average at start {info['load']}).",
        "",
        f"Data: {info['shards']} tar shards, {mb:.0f} MB (the --fast set of bench_remote.py); "
        f"nginx on 127.0.0.1 sharing the {cores} cores; caches and GET copies in "
        f"{info['parent']}. Shuffle on, 2 DataLoader workers, batch 256, bytes only. CPU is the "
        "whole machine's busy time (user, nice, system, irq, softirq; not steal) over each "
        "case's window (construction to the end of the iteration), so nginx, softirqs and "
        "loopback TCP count, less the machine's background: "
        f"{background:.3f} cores busy while this run slept 1 s (median). Medians of "
        f"{args.reps} alternated repetitions, all in one process, taken column by column; CPU "
        "is counted in ticks of 0.01 s.",
        "",
        "| case | wall s | MB/s | CPU core-s | of which nginx | core-s per GB | cores busy |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    names = {"cold/batched": "cold cached epoch, batched", "cold/sample":
             "cold cached epoch, per sample", "gets": "every shard once, Storage.download "
             "(one GET after another)", "local/batched": "local epoch, batched",
             "local/sample": "local epoch, per sample"}
    for case in CASES[:-1]:  # (not idle)
        m = med[case]
        lines.append(f"| {names[case]} | {m['wall']:.3f} | {mb / m['wall']:.0f} | "
                     f"{m['cpu']:.2f} | {m['server']:.2f} | {m['cpu'] / mb * 1000:.2f} | "
                     f"{m['cpu'] / m['wall']:.2f} of {cores} |")
    lines += ["", "| path | ceiling wall s = (GETs + local) CPU / cores | ceiling MB/s | "
              "ceiling vs one GET | measured vs one GET | measured / ceiling | "
              "cold CPU over GETs + local |", "|---|---:|---:|---:|---:|---:|---:|"]
    ceilings = {}
    for path in ("batched", "sample"):
        cold, local = med[f"cold/{path}"], med[f"local/{path}"]
        ideal = (get["cpu"] + local["cpu"]) / cores
        ceilings[path] = (mb / ideal) / get_rate
        lines.append(f"| {path} | {ideal:.3f} | {mb / ideal:.0f} | {ceilings[path]:.2f}x | "
                     f"{(mb / cold['wall']) / get_rate:.2f}x | {ideal / cold['wall']:.0%} | "
                     f"{cold['cpu'] - get['cpu'] - local['cpu']:+.2f} core-s |")
    lines += ["", f"One GET after another: {get_rate:.0f} MB/s. The target of issue 19 is 0.8x "
              f"of it; this machine's ceiling for it is {ceilings['batched']:.2f}x (batched) "
              f"and {ceilings['sample']:.2f}x (per sample): what a cold epoch would reach "
              "with every core busy all the time and no cost of its own beyond a download "
              "and a local epoch."]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "bench-data", "remote-fast"),
                    help="data folder, shared with bench_remote.py --fast")
    ap.add_argument("--count", type=int, default=6000, help="samples, ~100 KB each")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    results, info = run(args)
    body = report(results, info, args)
    print("\n" + body)
    if args.write_docs:
        bench_remote.write_subsection(os.path.join(ROOT, "docs", "benchmarks.md"), SECTION,
                                      HEADING, body)
        print("wrote", HEADING, "in docs/benchmarks.md")


if __name__ == "__main__":
    main()
