"""Remote streaming benchmark: shardpack over HTTP through a 30 ms RTT link vs local disk vs one
HTTP request per image (what users do without packing).

    .venv/bin/python tools/bench_remote.py [--count 3000] [--reps 3] [--write-docs]

Setup (kept between runs, under bench-data/remote/, git-ignored): an ImageFolder tree of JPEGs
(tools/make_images.py) and its pack with 64 MB shards. nginx (tests/servers.py) serves both; a
DelayProxy (15 ms each way) sits in front of it. The servers run in a child process of their own so
that the proxy's event loop does not share a GIL with the client being measured.

Every case is one epoch of bytes only (no decode): ShardDataset(batch_size=256, batched=True) in a
DataLoader(batch_size=None, num_workers=2); the per-file case is a map-style Dataset doing one GET
per image with a requests.Session per worker, DataLoader(batch_size=256, num_workers=2). Cases
alternate within each repetition; medians over the repetitions are reported.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import bench_common  # noqa: E402

HEADING = "## Remote"
SHARD_SIZE = "64MB"


# -------------------------------------------------------------------- servers (child process)

def serve(root, workdir, delay_s):
    """Child process: nginx over root, a delay proxy in front; print the ports, run until stdin
    ends."""
    from tests.servers import DelayProxy, NginxServer
    with NginxServer(root, workdir) as nginx, DelayProxy(nginx.port, delay_s) as proxy:
        print(json.dumps({"nginx": nginx.port, "proxy": proxy.port}), flush=True)
        sys.stdin.read()


class Servers:
    def __init__(self, root, workdir, delay_s):
        shutil.rmtree(workdir, ignore_errors=True)
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", root, workdir,
                                      str(delay_s)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("server process failed to start")
        self.ports = json.loads(line)
        self.url = f"http://127.0.0.1:{self.ports['proxy']}"

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ----------------------------------------------------------------------------- data

def prepare(data, count):
    images, packed = os.path.join(data, "images"), os.path.join(data, "packed")
    stamp = os.path.join(data, f"ready-{count}")
    if os.path.exists(stamp):
        return images, packed
    for p in (images, packed):
        shutil.rmtree(p, ignore_errors=True)
    py, bin_dir = sys.executable, os.path.dirname(sys.executable)
    subprocess.run([py, os.path.join(ROOT, "tools", "make_images.py"), images,
                    "--count", str(count)], check=True)
    subprocess.run([os.path.join(bin_dir, "shardpack"), "pack", images, packed,
                    "--shard-size", SHARD_SIZE, "-q"], check=True)
    open(stamp, "w").close()
    return images, packed


# ----------------------------------------------------------------------------- measured epochs

def shard_epoch(ds, first_only=False):
    """One epoch of a ShardDataset through the DataLoader: (seconds, samples, bytes, first-batch s);
    with first_only, stop after the first batch."""
    import torch
    from torch.utils.data import DataLoader
    t0 = time.perf_counter()
    first = None
    samples = nbytes = 0
    for batch in DataLoader(ds, batch_size=None, num_workers=2):
        if first is None:
            first = time.perf_counter() - t0
        rep = batch.get("__repeat__")
        samples += len(batch["__key__"]) - (int(rep.sum()) if isinstance(rep, torch.Tensor) else 0)
        for value in batch.values():
            if hasattr(value, "offsets") and hasattr(value, "data"):
                nbytes += int(value.offsets[-1])
        if first_only:
            break
    return time.perf_counter() - t0, samples, nbytes, first


def run_shards(url, cache_dir, prefetch, epochs=1, shuffle=True, first_only=False):
    """Build the dataset (timed: it reads the manifest) and run `epochs` epochs; a list of dicts."""
    from shardpack import ShardDataset
    t0 = time.perf_counter()
    ds = ShardDataset(url, batch_size=256, batched=True, cache_dir=cache_dir, prefetch=prefetch,
                      shuffle=shuffle)
    open_s = time.perf_counter() - t0
    out = []
    for e in range(epochs):
        if hasattr(ds, "set_epoch"):
            ds.set_epoch(e)
        secs, n, b, first = shard_epoch(ds, first_only)
        out.append(dict(s=secs, n=n, b=b, ttfb=open_s + first if e == 0 else first,
                        open=open_s if e == 0 else None))
    return out


class PerFile:
    """Map-style dataset: one HTTP GET per image, a keep-alive session per worker process."""

    def __init__(self, urls):
        self.urls, self.session = urls, None

    def __len__(self):
        return len(self.urls)

    def __getitem__(self, i):
        if self.session is None:
            import requests
            self.session = requests.Session()
        r = self.session.get(self.urls[i], timeout=60)
        r.raise_for_status()
        return r.content


def count_bytes(items):
    return len(items), sum(len(b) for b in items)


def run_per_file(urls):
    from torch.utils.data import DataLoader
    loader = DataLoader(PerFile(urls), batch_size=256, num_workers=2, shuffle=True,
                        collate_fn=count_bytes)
    t0 = time.perf_counter()
    n = b = 0
    for k, nb in loader:
        n, b = n + k, b + nb
    return dict(s=time.perf_counter() - t0, n=n, b=b)


def single_get(url):
    """One GET of a whole object through the proxy: (seconds, bytes)."""
    import requests
    t0 = time.perf_counter()
    n = 0
    with requests.get(url, stream=True, timeout=120) as r:
        r.raise_for_status()
        for chunk in r.iter_content(1 << 20):
            n += len(chunk)
    return time.perf_counter() - t0, n


# ----------------------------------------------------------------------------- report

def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs):
    """{case: [dict(s, n, b, ...)]} -> {case: dict(sps, mbps, s, n, reps, ttfb)} using medians."""
    out = {}
    for case, rs in runs.items():
        if rs:
            out[case] = dict(sps=med([r["n"] / r["s"] for r in rs]),
                             mbps=med([r["b"] / r["s"] / 1e6 for r in rs]),
                             s=med([r["s"] for r in rs]), n=rs[0]["n"], reps=len(rs),
                             ttfb=med([r.get("ttfb") for r in rs]),
                             # steady state: the rate after the first batch (256 samples) arrived
                             after=med([(r["n"] - 256)
                                        / (r["s"] - (r["ttfb"] - (r.get("open") or 0)))
                                        for r in rs if r.get("ttfb") and r["n"] > 256]),
                             open=med([r.get("open") for r in rs]),
                             worst=max(r["s"] + (r.get("open") or 0) for r in rs))
    return out


LABELS = [("local", "local files (reference), prefetch n/a"),
          ("local2", "local files, 2nd epoch (reference for warm)"),
          ("cold4", "remote, cache, cold, prefetch=4"),
          ("warm4", "remote, cache, warm (2nd epoch), prefetch=4"),
          ("cold0", "remote, cache, cold, prefetch=0"),
          ("nocache4", "remote, no cache (ranged chunks), prefetch=4"),
          ("nocache0", "remote, no cache (ranged chunks), prefetch=0"),
          ("first", "remote, cache, cold, prefetch=4, shuffle off: first batch only"),
          ("perfile", "one HTTP GET per image (unpacked tree)")]


def report(s, proxy, shard_get, args, machine, info):
    rows = ["| case | samples | reps | epoch s | worst s | first batch s | samples/s | MB/s | "
            "vs local (same epoch) | samples/s after 1st batch |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, label in LABELS:
        if key in s:
            r = s[key]
            local = s.get("local2" if key in ("warm4", "local2") else "local", {}).get("sps")
            ratio = f"{r['sps'] / local:.2f}x" if local else "?"
            ttfb = f"{r['ttfb']:.2f}" if r["ttfb"] is not None else "-"
            if key == "first":  # one batch only: its rates mean nothing
                rows.append(f"| {label} | 1 batch | {r['reps']} | - | {r['worst']:.2f} | {ttfb} "
                            f"| - | - | - | - |")
                continue
            rows.append(f"| {label} | {r['n']} | {r['reps']} | {r['s']:.2f} | {r['worst']:.2f} | "
                        f"{ttfb} | {r['sps']:.0f} | {r['mbps']:.1f} | {ratio} | " +
                        (f"{r['after']:.0f} |" if r["after"] else "- |"))
    if proxy:
        rows.append(f"| proxy, one GET of a {shard_get['mb']:.0f} MB shard | - | {proxy['reps']} | "
                    f"{shard_get['s']:.2f} | - | - | - | {proxy['mbps']:.1f} | - | - |")
    checks = []

    def check(name, ok, detail):
        checks.append(f"| {name} | {detail} | {'PASS' if ok else 'FAIL'} |")
    ref = s.get("local2") or s.get("local")  # the warm epoch is a 2nd epoch: so is its reference
    if "warm4" in s and ref:
        r = s["warm4"]["sps"] / ref["sps"]
        check("steady state (warm, whole epoch) >= 90% of local (2nd epochs)", r >= 0.9,
              f"{r:.0%} of local")
        if s["warm4"]["after"] and ref["after"]:
            r = s["warm4"]["after"] / ref["after"]
            check("steady state (warm, after 1st batch) >= 90% of local (2nd epochs)", r >= 0.9,
                  f"{r:.0%} of local")
    for key, what in (("cold4", "shuffle on"), ("first", "shuffle off")):
        if key in s and shard_get:
            t, lim = s[key]["ttfb"], 1.0 + shard_get["s"]
            check(f"TTFB (cold, cache, {what}) < 1 s + one shard fetch", t < lim,
                  f"TTFB {t:.2f} s, shard fetch {shard_get['s']:.2f} s, limit {lim:.2f} s")
    if "cold4" in s and proxy:
        r = s["cold4"]["mbps"] / proxy["mbps"]
        check("cold epoch >= 80% of proxy single-object MB/s", r >= 0.8,
              f"{s['cold4']['mbps']:.1f} / {proxy['mbps']:.1f} MB/s = {r:.0%}")
    table = ("\n".join(rows) + "\n\n| target | measured | result |\n|---|---|---|\n"
             + "\n".join(checks))
    cmd = info.get("cmd") or " ".join(["tools/bench_remote.py"] + sys.argv[1:])
    head = (f"Command: `.venv/bin/python {cmd}`\n\n"
            f"Machine: {machine['nproc']} cores ({machine['cpu']}), "
            f"{machine['ram_gib']:.0f} GiB RAM, "
            f"Linux {machine['kernel']}, Python {machine['python']}, data on {machine['fs']}; "
            f"shared and noisy (load average at start {info['load']}). Link: nginx on 127.0.0.1 "
            f"behind tests/servers.py DelayProxy, {args.rtt_ms:g} ms RTT, no bandwidth limit. "
            f"Dataset: {info['count']} JPEGs, {info['mb']:.0f} MB, {info['shards']} shards of "
            f"<= {SHARD_SIZE}. Bytes only (no decode), 2 DataLoader workers, batch 256, "
            f"shuffle on; "
            f"medians over alternating repetitions. TTFB counts dataset construction (manifest "
            f"fetch) plus DataLoader start; 'worst s' is the slowest repetition including "
            f"dataset construction. Per-file case: first {info['perfile_n']} images.\n\n")
    return head + table + "\n"


CASES = ["local", "cold4", "cold0", "nocache4", "nocache0", "first", "perfile", "proxy"]


def run_case(case, url, packed, cache_root, perfile_urls, big_url):
    """One case, in this process; returns what main() records for it."""
    if case == "local":
        return run_shards(packed, None, 4, epochs=2)
    if case == "cold4":
        return run_shards(url, cache_root, 4, epochs=2)
    if case == "cold0":
        return run_shards(url, cache_root, 0)
    if case in ("nocache4", "nocache0"):
        return run_shards(url, None, int(case[-1]))
    if case == "first":
        return run_shards(url, cache_root, 4, shuffle=False, first_only=True)
    if case == "perfile":
        return [run_per_file(perfile_urls)]
    return [list(single_get(big_url))]


def case_subprocess(case, *args):
    """Each case runs in a fresh interpreter (as tools/bench_pack.py runs each contender): in one
    long-lived process the local reference slowed to ~4 s after the first repetition, which no
    single sequence of cases reproduced by hand."""
    out = subprocess.run([sys.executable, __file__, "--case", json.dumps([case, *args])],
                         capture_output=True, text=True, timeout=900)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("CASE_RESULT=")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"case {case} failed: {out.stderr.strip().splitlines()[-3:]}")
    return json.loads(lines[-1][len("CASE_RESULT="):])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        return serve(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    if len(sys.argv) > 1 and sys.argv[1] == "--case":
        print("CASE_RESULT=" + json.dumps(run_case(*json.loads(sys.argv[2]))), flush=True)
        return None
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "bench-data", "remote"))
    ap.add_argument("--count", type=int, default=3000, help="images (~100 KB each)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rtt-ms", type=float, default=30.0)
    ap.add_argument("--per-file-count", type=int, default=1024,
                    help="images read in the per-file case (it is slow)")
    ap.add_argument("--budget-s", type=float, default=480,
                    help="start no new repetition after this many seconds")
    ap.add_argument("--cases", default=",".join(CASES),
                    help="comma-separated subset of the cases to run (for quick comparisons; the "
                         "docs want all of them)")
    ap.add_argument("--write-docs", action="store_true", help="write the '## Remote' section")
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--from-json", help="only re-render the report of an earlier --json run")
    args = ap.parse_args()
    if args.from_json:
        saved = json.load(open(args.from_json))
        return finish(args, saved["runs"], [tuple(g) for g in saved["gets"]], saved["info"])

    started = time.monotonic()
    load = "%.1f %.1f %.1f" % os.getloadavg()
    images, packed = prepare(args.data, args.count)
    manifest = json.load(open(os.path.join(packed, "shardpack.json")))
    shards = manifest.get("shards", [])
    tree = bench_common.list_tree(images)
    perfile_urls_rel = [rel for rel, _ in tree[:args.per_file_count]]
    info = dict(cmd=" ".join(["tools/bench_remote.py"] + sys.argv[1:]), load=load,
                count=len(tree), shards=len(shards),
                mb=bench_common.tree_bytes(images) / 1e6, perfile_n=len(perfile_urls_rel))
    biggest = max(os.scandir(packed), key=lambda e: e.stat().st_size if e.is_file() else 0).name

    servers = Servers(args.data, os.path.join(args.data, "servers"), args.rtt_ms / 2000)
    url = f"{servers.url}/packed"
    perfile_urls = [f"{servers.url}/images/{rel}" for rel in perfile_urls_rel]
    cache_root = os.path.join(args.data, "cache")
    runs = {k: [] for k, _ in LABELS}
    gets = []
    try:
        cases = [c for c in CASES if c in args.cases.split(",")]
        for rep in range(args.reps):
            if rep and time.monotonic() - started > args.budget_s:
                print(f"budget reached: {rep} repetitions", flush=True)
                break
            order = cases[rep % len(cases):] + cases[:rep % len(cases)]  # alternate
            for case in order:
                shutil.rmtree(cache_root, ignore_errors=True)
                result = case_subprocess(case, url, packed, cache_root, perfile_urls,
                                         f"{servers.url}/packed/{biggest}")
                if case in ("cold4", "local"):
                    runs[case].append(result[0])
                    runs["warm4" if case == "cold4" else "local2"].append(result[1])
                elif case == "proxy":
                    gets.append(tuple(result[0]))
                else:
                    runs[case] += result
                last = (runs.get(case) or [None])[-1] if case != "proxy" else None
                desc = (f"{last['n'] / last['s']:.0f} samples/s, {last['b'] / last['s'] / 1e6:.1f} "
                        f"MB/s" if last else f"{gets[-1][1] / gets[-1][0] / 1e6:.1f} MB/s")
                print(f"rep {rep} {case:9s} {desc}  [{time.monotonic() - started:.0f} s]",
                      flush=True)
    finally:
        servers.close()
        shutil.rmtree(cache_root, ignore_errors=True)

    finish(args, runs, gets, info)
    print(f"total {time.monotonic() - started:.0f} s")


def finish(args, runs, gets, info):
    s = summarize(runs)
    proxy = dict(mbps=med([b / t / 1e6 for t, b in gets]), reps=len(gets)) if gets else None
    shard_get = dict(s=med([t for t, _ in gets]), mb=gets[0][1] / 1e6) if gets else None
    body = report(s, proxy, shard_get, args, bench_common.machine_info(args.data), info)
    print("\n" + body)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(runs=runs, gets=gets, summary=s, info=info), f, indent=1)
    if args.write_docs:  # re-reads the file and replaces only this section
        bench_common.update_section(os.path.join(ROOT, "docs", "benchmarks.md"), HEADING, body)
        print("wrote", HEADING, "in docs/benchmarks.md")


if __name__ == "__main__":
    main()
