"""Cold remote epochs of two (or more) code trees, alternating: a quick A/B for changes on the
cold path that tools/bench_remote.py's full run is too slow and too noisy to settle.

    .venv/bin/python tools/bench_cold_ab.py --rounds 8 base=/tmp/old-tree new=.

Each TREE is a folder holding a ``shardpack/`` package (e.g. ``git worktree add /tmp/old-tree
HEAD~1``); NAME labels it in the report. Servers and data are tools/bench_remote.py's (nginx
behind the 30 ms DelayProxy, the --data folder it prepared); each epoch runs in a fresh
interpreter that imports shardpack from its tree: one cold, shuffled, bytes-only epoch, cache
emptied first, 2 DataLoader workers. Each round runs every tree once, the first tree of a round
rotating; one GET of the dataset's largest shard (as tools/bench_remote.py times it) follows
each round. Reported per tree: medians of MB/s, the ratio to the median GET, the workers' CPU
seconds (RUSAGE_CHILDREN of the epoch process: the DataLoader workers, whose downloads run in
their own threads) and the time to the first batch. Nothing is written to docs: quote the
printed lines.
"""
import argparse
import collections
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools")


def epoch(tree, url, cache, prefetch):
    """Child process: one cold epoch with shardpack imported from ``tree``; prints one JSON line."""
    sys.path.insert(0, TOOLS)
    import bench_remote  # noqa: E402 - puts ROOT first on sys.path: the tree goes before it
    sys.path.insert(0, os.path.abspath(tree))
    import shardpack
    here = os.path.dirname(os.path.abspath(shardpack.__file__))
    if here != os.path.join(os.path.abspath(tree), "shardpack"):
        raise SystemExit(f"{tree}: shardpack was imported from {here}, not from this tree")
    import torch  # noqa: F401 - imported before the clock starts, as in bench_remote

    def children():
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    before = children()
    r = bench_remote.run_shards(url, cache, prefetch, epochs=1)[0]
    print("EPOCH=" + json.dumps({"mbps": r["b"] / r["s"] / 1e6, "s": r["s"], "ttfb": r["ttfb"],
                                 "worker_cpu": children() - before}), flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--epoch":
        return epoch(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="+", metavar="NAME=TREE",
                    help="a label and a folder holding a shardpack/ package")
    ap.add_argument("--rounds", "--pairs", type=int, default=8,
                    help="rounds; each runs every tree once, then one GET (default 8)")
    ap.add_argument("--data", default=os.path.join(ROOT, "bench-data", "remote-10k"),
                    help="a folder tools/bench_remote.py prepared (default: its 1 GB one, "
                         "bench-data/remote-10k)")
    ap.add_argument("--prefetch", type=int, default=4, help="ShardDataset prefetch (default 4)")
    ap.add_argument("--rtt-ms", type=float, default=30.0,
                    help="round trip the delay proxy adds (default 30)")
    args = ap.parse_args()
    trees = [t.split("=", 1) for t in args.trees]
    if any(len(t) != 2 or not t[0] or t[0] == "GET" for t in trees):
        ap.error("trees are NAME=TREE, with a NAME other than GET")
    if not os.path.exists(os.path.join(args.data, "packed", "shardpack.json")):
        ap.error(f"{args.data}: no packed dataset; make it first with tools/bench_remote.py "
                 f"--data {args.data} --count 10000 --reps 1 --cases local")
    sys.path.insert(0, TOOLS)
    import bench_remote

    packed = os.path.join(args.data, "packed")
    shard = max((n for n in os.listdir(packed) if not n.startswith(".")),
                key=lambda n: os.path.getsize(os.path.join(packed, n)))
    servers = bench_remote.Servers(args.data, os.path.join(args.data, "servers"),
                                   args.rtt_ms / 2000)
    cache = os.path.join(args.data, "cache-ab")
    got = collections.defaultdict(list)
    try:
        for i in range(args.rounds):
            order = trees[i % len(trees):] + trees[:i % len(trees)]  # alternate who goes first
            for name, tree in order:
                shutil.rmtree(cache, ignore_errors=True)
                if os.path.exists(cache):
                    raise SystemExit(f"{cache}: could not empty the cache; the epoch would "
                                     "not be cold")
                try:
                    out = subprocess.run([sys.executable, __file__, "--epoch", tree,
                                          f"{servers.url}/packed", cache, str(args.prefetch)],
                                         capture_output=True, text=True, timeout=600)
                except subprocess.TimeoutExpired:
                    raise SystemExit(f"{name}: epoch did not finish in 600 s") from None
                lines = [ln for ln in out.stdout.splitlines() if ln.startswith("EPOCH=")]
                if out.returncode or not lines:
                    raise SystemExit(f"{name}: epoch failed: {out.stderr.strip()[-500:]}")
                got[name].append(json.loads(lines[-1][len("EPOCH="):]))
            t, n = bench_remote.single_get(f"{servers.url}/packed/{shard}")
            got["GET"].append({"mbps": n / t / 1e6})
            print(f"round {i}: " + ", ".join(f"{k} {v[-1]['mbps']:.0f} MB/s"
                                             for k, v in got.items()), flush=True)
    finally:
        servers.close()
        shutil.rmtree(cache, ignore_errors=True)
    get = statistics.median(x["mbps"] for x in got["GET"])
    print(f"single GET: median {get:.0f} MB/s over {len(got['GET'])}")
    for name, _ in trees:
        runs = got[name]
        med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        print(f"{name}: cold epoch median {med['mbps']:.0f} MB/s ({med['mbps'] / get:.0%} of the "
              f"GET), worker CPU {med['worker_cpu']:.2f} s, TTFB {med['ttfb']:.2f} s, "
              f"{len(runs)} epochs")


if __name__ == "__main__":
    main()
