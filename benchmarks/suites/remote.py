"""Remote streaming through a 30 ms link: shardpack over HTTP (nginx behind a delay proxy)
against the same epochs on local disk and against one HTTP GET per image."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from benchmarks import common as c
from benchmarks import testbed
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure

HERE = "benchmarks.suites.remote"
SHARD_SIZE = "64MB"
CASES = ["local", "cold4", "cold0", "nocache4", "nocache0", "first", "perfile", "proxy"]
LABELS = {"local": "local files, 1st epoch", "local2": "local files, 2nd epoch",
          "cold4": "remote, cache, cold, prefetch=4",
          "warm4": "remote, cache, warm (2nd epoch), prefetch=4",
          "cold0": "remote, cache, cold, prefetch=0",
          "nocache4": "remote, no cache (ranged chunks), prefetch=4",
          "nocache0": "remote, no cache (ranged chunks), prefetch=0",
          "perfile": "one HTTP GET per image (unpacked tree)"}


def options(p) -> None:
    """The remote suite's options."""
    p.add_argument("--count", type=int, default=3000, help="100 KB JPEGs [3000]")
    p.add_argument("--rtt-ms", type=float, default=30.0, help="round trip of the proxy [30]")
    p.add_argument("--per-file-count", type=int, default=1024,
                   help="images read in the per-file case (it is slow) [1024]")
    p.add_argument("--budget-s", type=float, default=480,
                   help="start no new repetition after this many seconds [480]")
    p.add_argument("--cases", default=",".join(CASES), help="a subset of the cases")


# -------------------------------------------------------------------- servers (child process)

def serve(root, workdir, delay_s) -> None:
    """Child: nginx over root, a DelayProxy in front; print the ports, run until stdin ends."""
    s = testbed.servers()
    with s.NginxServer(root, workdir) as nginx, s.DelayProxy(nginx.port, delay_s) as proxy:
        print(json.dumps({"nginx": nginx.port, "proxy": proxy.port}), flush=True)
        sys.stdin.read()


class Servers:
    """The servers' child process (so that a proxy's event loop shares no GIL with the client
    measured); ``ports`` is the JSON line it printed once it was up.

    Args:
        func: the child's function ("module:function"): it prints one JSON line, then serves
            until its stdin ends.
        *args: its arguments.
    """

    def __init__(self, func, *args):
        self.proc = subprocess.Popen(c.child_cmd(func, *args), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=c.child_env())
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise RuntimeError("server process failed to start")
        self.ports = json.loads(line)

    def close(self) -> None:
        """End the child (its stdin) and wait for it."""
        self.proc.stdin.close()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ----------------------------------------------------------------------------- measured epochs

def shard_epoch(ds, first_only=False) -> tuple:
    """One epoch of a batched ShardDataset through the DataLoader: (seconds, samples, bytes,
    first-batch s); with first_only, stop after the first batch."""
    import torch
    from torch.utils.data import DataLoader
    t0 = time.perf_counter()
    first, samples, nbytes = None, 0, 0
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


def count_samples(samples) -> tuple:
    """collate_fn of the per-sample path: (samples, field bytes), repeats and labels left out."""
    n = b = 0
    for sample in samples:
        if sample.get("__repeat__"):
            continue
        n += 1
        b += sum(len(v) for k, v in sample.items()
                 if not k.startswith("__") and k != "cls"
                 and isinstance(v, (bytes, bytearray, memoryview)))
    return n, b


def sample_epoch(ds) -> tuple:
    """One epoch of a per-sample ShardDataset: (seconds, samples, bytes, first-batch s)."""
    from torch.utils.data import DataLoader
    t0 = time.perf_counter()
    first, samples, nbytes = None, 0, 0
    for n, b in DataLoader(ds, batch_size=256, num_workers=2, collate_fn=count_samples):
        if first is None:
            first = time.perf_counter() - t0
        samples, nbytes = samples + n, nbytes + b
    return time.perf_counter() - t0, samples, nbytes, first


def run_shards(url, cache_dir, prefetch, epochs=1, shuffle=True, first_only=False) -> list:
    """Build the dataset (timed: it reads the manifest) and run ``epochs`` epochs."""
    from shardpack import ShardDataset
    t0 = time.perf_counter()
    ds = ShardDataset(url, batch_size=256, batched=True, cache_dir=cache_dir,
                      prefetch_shards=prefetch, shuffle=shuffle)
    open_s = time.perf_counter() - t0
    out = []
    for e in range(epochs):
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


def _count_bytes(items):
    return len(items), sum(len(b) for b in items)


def run_per_file(urls) -> dict:
    """One epoch of one GET per image, 2 workers, batches of 256."""
    from torch.utils.data import DataLoader
    loader = DataLoader(PerFile(urls), batch_size=256, num_workers=2, shuffle=True,
                        collate_fn=_count_bytes)
    t0 = time.perf_counter()
    n = b = 0
    for k, nb in loader:
        n, b = n + k, b + nb
    return dict(s=time.perf_counter() - t0, n=n, b=b)


def single_get(url) -> list:
    """One GET of a whole object through the proxy: [seconds, bytes]."""
    import requests
    t0 = time.perf_counter()
    n = 0
    with requests.get(url, stream=True, timeout=120) as r:
        r.raise_for_status()
        for chunk in r.iter_content(1 << 20):
            n += len(chunk)
    return [time.perf_counter() - t0, n]


def run_case(case, url, packed, cache_root, perfile_urls, big_url):
    """Child: one case; what the suite records for it."""
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
    return single_get(big_url)


# ----------------------------------------------------------------------------- the suite

def prepare(data, count) -> tuple:
    """An ImageFolder tree of ``count`` generated JPEGs and its pack in 64 MB shards, kept
    between runs (a stamp per count)."""
    images, packed = data / "images", data / "packed"
    stamp = data / f"ready-{count}"
    if not stamp.exists():
        for p in (images, packed):
            shutil.rmtree(p, ignore_errors=True)
        data.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(c.MAKE_IMAGES), str(images), "--count", str(count)],
                       check=True)
        c.ensure_pack(images, packed, "--shard-size", SHARD_SIZE)
        stamp.touch()
    return images, packed


def summarize(runs) -> dict:
    """{case: [dict(s, n, b, ...)]} -> {case: medians}; ``after`` is the rate after the first
    batch (256 samples) arrived."""
    out = {}
    for case, rs in runs.items():
        if rs:
            out[case] = dict(sps=c.med(r["n"] / r["s"] for r in rs),
                             mbps=c.med(r["b"] / r["s"] / 1e6 for r in rs),
                             s=c.med(r["s"] for r in rs), n=rs[0]["n"], reps=len(rs),
                             ttfb=c.med(r.get("ttfb") for r in rs),
                             after=c.med((r["n"] - 256) / (r["s"] - (r["ttfb"] - (r.get("open")
                                                                                  or 0)))
                                         for r in rs if r.get("ttfb") and r["n"] > 256),
                             worst=max(r["s"] + (r.get("open") or 0) for r in rs))
    return out


def remote_figures(s, gets) -> list:
    """Each case's samples/s; the cold epoch in MB/s against one GET; the times to the first
    batch against 1 s + one shard fetch."""
    out = []
    get_mbps = c.med(b / t / 1e6 for t, b in gets) if gets else None
    get_s = c.med(t for t, _ in gets) if gets else None
    for key in ("local", "local2", "cold4", "warm4", "cold0", "nocache4", "nocache0", "perfile"):
        if key not in s:
            continue
        r, ref = s[key], s.get("local2" if key in ("warm4", "local2") else "local")
        limit = {LABELS["local2" if key == "warm4" else "local"]: ref["sps"]} \
            if ref and not key.startswith("local") else {}
        note = f"{r['mbps']:,.1f} MB/s; epoch {r['s']:.2f} s"
        if r.get("after"):
            note += f"; {r['after']:,.0f}/s after the 1st batch"
        if key == "warm4" and ref:
            note += f"; target >= 90% of local: {r['sps'] / ref['sps']:.0%} " + \
                c.verdict(r["sps"] >= 0.9 * ref["sps"])
        out.append(figure(LABELS[key], r["sps"], "samples/s", {}, limit, note))
    if "cold4" in s and get_mbps:
        r = s["cold4"]["mbps"] / get_mbps
        out.append(figure("remote, cache, cold, prefetch=4: MB/s", s["cold4"]["mbps"], "MB/s",
                          {"one GET per image": s.get("perfile", {}).get("mbps")},
                          {"one GET of a 64 MB shard": get_mbps},
                          f"{r:.0%} of one GET (target >= 80%: {c.verdict(r >= 0.8)})"))
    for key, what in (("cold4", "shuffle on"), ("first", "shuffle off")):
        if key in s and get_s is not None:
            t, lim = s[key]["ttfb"], 1.0 + get_s
            out.append(figure(f"time to first batch, cold, cache, {what}", t, "s", {},
                              {"1 s + one shard fetch": lim},
                              f"with the dataset's construction; {c.verdict(t < lim)}"))
    return out


@suite("remote", title="Remote: a 30 ms link", options=options,
       quick=dict(count=300, per_file_count=64, budget_s=60),
       measures="""Samples per second of bytes-only epochs of a dataset served by nginx on
       127.0.0.1 behind a proxy that delays every chunk 15 ms each way (30 ms RTT, no bandwidth
       limit), against the same epochs on the local packed folder and against one HTTP GET per
       image of the unpacked tree: `ShardDataset(batch_size=256, batched=True)` in a DataLoader
       with 2 workers, shuffle on, with a cache (cold, then warm), without one (ranged reads),
       prefetch 4 or 0. Each case in a fresh interpreter, cases alternated, medians. The time to
       the first batch counts the dataset's construction.""",
       bounds="""The proxy: one asyncio thread that moves ~350-450 MB/s (the limit of the cold
       epoch is one GET of a shard through it), sharing the 2 cores with nginx and the loader: a
       traced cold epoch used ~5.2 s of CPU in 3.3 s. Warm epochs read the cache at local speed.
       The first batch pays the first import of the HTTP client (~0.3-0.4 s).""")
def run_remote(run) -> Outcome:
    """The remote suite: every case per repetition, alternated, each in a fresh interpreter."""
    a, started = run.args, time.monotonic()
    data = run.data_dir / "remote" / f"n{a.count}"
    images, packed = prepare(data, a.count)
    rels = [rel for rel, _ in c.list_tree(images)[:a.per_file_count]]
    biggest = max(os.scandir(packed), key=lambda e: e.stat().st_size if e.is_file() else 0).name
    shutil.rmtree(data / "servers", ignore_errors=True)
    servers = Servers(f"{HERE}:serve", str(data), str(data / "servers"), a.rtt_ms / 2000)
    base = f"http://127.0.0.1:{servers.ports['proxy']}"
    cache, runs, gets = data / "cache", {k: [] for k in LABELS}, []
    cases = [k for k in CASES if k in a.cases.split(",")]
    try:
        for rep in range(run.reps):
            if rep and time.monotonic() - started > a.budget_s:
                run.log(f"budget reached: {rep} repetitions")
                break
            for case in c.rotated(cases, rep):
                shutil.rmtree(cache, ignore_errors=True)
                result = c.fresh(f"{HERE}:run_case", case, f"{base}/packed", str(packed),
                                 str(cache), [f"{base}/images/{r}" for r in rels],
                                 f"{base}/packed/{biggest}")
                if case in ("cold4", "local"):
                    runs[case].append(result[0])
                    runs["warm4" if case == "cold4" else "local2"].append(result[1])
                elif case == "proxy":
                    gets.append(result)
                else:
                    runs.setdefault(case, []).extend(result)
                run.log(f"rep {rep} {case:9s} [{time.monotonic() - started:.0f} s]")
    finally:
        servers.close()
        shutil.rmtree(cache, ignore_errors=True)
    s = summarize(runs)
    setup = (f"{a.count:,} generated JPEGs, {c.tree_bytes(images) / 1e6:,.0f} MB, "
             f"{len(c.shard_files(packed))} shards of <= {SHARD_SIZE}; {a.rtt_ms:g} ms RTT; "
             f"per-file case: the first {len(rels)} images; load average at the end "
             + " ".join(f"{x:.1f}" for x in os.getloadavg()) + ".")
    return Outcome(remote_figures(s, gets), setup, raw={"runs": runs, "gets": gets},
                   part=None if cases == CASES else "cases")
