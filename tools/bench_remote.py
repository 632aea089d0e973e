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

Fast link (issue 19; the DelayProxy, one asyncio thread at ~400 MB/s, is the bottleneck above):

    .venv/bin/python tools/bench_remote.py --fast [--count 6000] [--reps 3] [--write-docs]

Data under bench-data/remote-fast/: ~100 KB files of random bytes (fast to make, incompressible)
packed into 64 MB tar shards. Servers, in a child process: nginx direct, nginx behind
tests/servers.py SpliceProxy (15 ms held on every request, responses spliced through undelayed),
and rclone serve s3 (tests/servers.py S3Server) over hard links of the shards. Per server, cold
epochs (a fresh empty cache_dir each, in /dev/shm when it fits) of the batched and the per-sample
path, and whole-shard GETs (fsspec HTTP / s3fs cat_file, and curl); the same epochs on the local
packed folder, page cache warm. Reported: cold epoch MB/s, time to first batch, ratios to one
GET and to local, and the target 0.8 x min(one GET, local). `--write-docs` writes the
'### Fast link' subsection of '## Remote' in docs/benchmarks.md and nothing else.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
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
    """The servers' child process (``--serve``: nginx + DelayProxy; ``--serve-fast``: see
    serve_fast); ``ports`` is the JSON line it printed once it was up."""

    def __init__(self, root, workdir, delay_s, mode="--serve", *extra):
        shutil.rmtree(workdir, ignore_errors=True)
        self.proc = subprocess.Popen([sys.executable, __file__, mode, root, workdir,
                                      str(delay_s), *extra],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise RuntimeError("server process failed to start")
        self.ports = json.loads(line)
        self.url = f"http://127.0.0.1:{self.ports['proxy']}" if mode == "--serve" else None

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


# ============================================================================ fast link (--fast)
#
# Issue 19: the DelayProxy (one asyncio thread, ~400 MB/s) is the bottleneck of the cases above.
# Here: nginx direct, nginx behind tests/servers.py SpliceProxy (latency on every request,
# responses moved with os.splice), and rclone serve s3; incompressible ~100 KB samples.

FAST_HEADING = "### Fast link"
FAST_SERVERS = ("direct", "proxy", "s3")
FAST_PATHS = ("batched", "sample")
FAST_COUNT = 6000
S3_BUCKET = "bench"
SERVER_LABELS = {"local": "local files (page cache warm)",
                 "direct": "nginx, direct", "proxy": "nginx behind SpliceProxy",
                 "s3": "S3 (rclone serve s3)"}
PATH_LABELS = {"batched": "batched", "sample": "per sample",
               "nocache": "batched, no cache (cache_dir=None)"}


def fast_cases():
    """Every case key of the fast mode, in the order of one repetition."""
    return ([f"{srv}/{path}" for srv in ("local", *FAST_SERVERS) for path in FAST_PATHS]
            + ["direct/nocache"]
            + [f"{srv}/get" for srv in FAST_SERVERS])


def link_tree(src, dest):
    """Hard links of the files of src in dest (a copy where links cannot be made)."""
    os.makedirs(dest, exist_ok=True)
    for entry in os.scandir(src):
        if entry.is_file():
            try:
                os.link(entry.path, os.path.join(dest, entry.name))
            except OSError:
                shutil.copy2(entry.path, os.path.join(dest, entry.name))


def serve_fast(root, workdir, delay_s, etag_hash):
    """Child process: nginx over root; a SpliceProxy holding every request delay_s in front of
    it; rclone serve s3 with root/packed as s3://bench/packed (hard links). Prints their URLs and
    the S3 storage options as JSON, then runs until stdin ends."""
    from pathlib import Path

    from tests.servers import NginxServer, S3Server, SpliceProxy
    workdir = Path(workdir)
    link_tree(os.path.join(root, "packed"), workdir / "s3" / "data" / S3_BUCKET / "packed")
    with NginxServer(Path(root), workdir / "nginx") as nginx, \
            SpliceProxy(nginx.port, float(delay_s)) as proxy, \
            S3Server(workdir / "s3", count_requests=False, etag_hash=etag_hash) as s3:
        print(json.dumps({"direct": nginx.url, "proxy": proxy.url, "s3": s3.endpoint_url,
                          "s3_options": s3.storage_options, "s3_key": [s3.key, s3.secret],
                          "s3_region": s3.REGION}), flush=True)
        sys.stdin.read()
        if proxy.errors:
            print("SpliceProxy errors:", proxy.errors[:5], file=sys.stderr)


def prepare_fast(data, count, sample_bytes=100_000):
    """An ImageFolder-like tree of `count` files of random bytes (sizes 90-110% of sample_bytes,
    named .jpg, not images: nothing here decodes) in 10 classes, packed into 64 MB tar shards;
    the tree is deleted once packed. Kept between runs (a stamp per count); the packed folder."""
    images, packed = os.path.join(data, "images"), os.path.join(data, "packed")
    stamp = os.path.join(data, f"ready-{count}")
    if os.path.exists(stamp):
        return packed
    for p in (images, packed):
        shutil.rmtree(p, ignore_errors=True)
    for stale in (e.path for e in os.scandir(data) if e.name.startswith("ready-")) \
            if os.path.isdir(data) else ():
        os.remove(stale)
    rng = random.Random(0)
    for i in range(count):
        folder = os.path.join(images, f"c{i % 10:02d}")
        os.makedirs(folder, exist_ok=True)
        size = rng.randint(sample_bytes * 9 // 10, sample_bytes * 11 // 10)
        with open(os.path.join(folder, f"{i:06d}.jpg"), "wb") as f:
            f.write(os.urandom(size))
    bin_dir = os.path.dirname(sys.executable)
    subprocess.run([os.path.join(bin_dir, "shardpack"), "pack", images, packed,
                    "--shard-size", SHARD_SIZE, "--format", "tar", "--check", "none", "-q"],
                   check=True)
    shutil.rmtree(images)
    open(stamp, "w").close()
    return packed


def count_samples(samples):
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


def sample_epoch(ds):
    """One epoch of a per-sample ShardDataset: (seconds, samples, bytes, first-batch s)."""
    from torch.utils.data import DataLoader
    t0 = time.perf_counter()
    first = None
    samples = nbytes = 0
    for n, b in DataLoader(ds, batch_size=256, num_workers=2, collate_fn=count_samples):
        if first is None:
            first = time.perf_counter() - t0
        samples, nbytes = samples + n, nbytes + b
    return time.perf_counter() - t0, samples, nbytes, first


def fast_epoch(spec):
    """One epoch, in this process. Remote: cold, in a fresh empty cache folder (removed after).
    Returns dict(s, n, b, ttfb, open): s from the DataLoader's start to its last batch, ttfb with
    the dataset's construction."""
    import tempfile

    from shardpack import ShardDataset
    cache = (tempfile.mkdtemp(prefix="shardpack-bench-", dir=spec["cache_parent"])
             if spec["cache_parent"] else None)
    kwargs = dict(cache_dir=cache, shuffle=True, storage_options=spec.get("storage_options"))
    if spec.get("prefetch") is not None:
        kwargs["prefetch"] = spec["prefetch"]
    try:
        t0 = time.perf_counter()
        if spec["path"] in ("batched", "nocache"):
            ds = ShardDataset(spec["url"], batch_size=256, batched=True, **kwargs)
            open_s = time.perf_counter() - t0
            secs, n, b, first = shard_epoch(ds)
        else:
            ds = ShardDataset(spec["url"], **kwargs)
            open_s = time.perf_counter() - t0
            secs, n, b, first = sample_epoch(ds)
        return dict(s=secs, n=n, b=b, ttfb=open_s + first, open=open_s)
    finally:
        if cache:
            shutil.rmtree(cache, ignore_errors=True)


def fast_gets(spec):
    """`gets` whole-shard GETs with fsspec HTTP / s3fs cat_file (after one request that opens
    the connection), then as many with curl (a process and a connection each).
    Returns dict(fsspec=[(s, bytes)], curl=[(s, bytes)])."""
    out = dict(fsspec=[], curl=[], curl_file=[], own=[])
    if spec["server"] == "s3":
        import s3fs
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **spec["storage_options"])
        target = f"{S3_BUCKET}/packed/{spec['shard']}"
        curl_url = f"{spec['base']}/{target}"
        region = spec["storage_options"]["client_kwargs"]["region_name"]
        curl_auth = ["--aws-sigv4", f"aws:amz:{region}:s3", "--user", ":".join(spec["s3_key"])]
    else:
        import fsspec
        fs = fsspec.filesystem("http", skip_instance_cache=True)
        target = curl_url = f"{spec['base']}/packed/{spec['shard']}"
        curl_auth = []
    fs.info(target)
    for _ in range(spec["gets"]):
        t0 = time.perf_counter()
        n = len(fs.cat_file(target))
        out["fsspec"].append((time.perf_counter() - t0, n))
    # the loader's own download: Storage.download streams one GET into a file beside the cache,
    # hashing on the way (what a cold epoch does for every shard)
    from shardpack.storage import Storage
    base = f"s3://{S3_BUCKET}/packed" if spec["server"] == "s3" else f"{spec['base']}/packed"
    storage = Storage(base, spec.get("storage_options"))
    size = storage.size(spec["shard"])
    for _ in range(spec["gets"]):
        fd, path = tempfile.mkstemp(dir=spec["cache_parent"])
        os.close(fd)
        try:
            t0 = time.perf_counter()
            storage.download(spec["shard"], path, size)
            out["own"].append((time.perf_counter() - t0, size))
        finally:
            os.unlink(path)
    curl = shutil.which("curl")
    for _ in range(spec["gets"] if curl else 0):
        res = subprocess.run([curl, "-s", "-o", "/dev/null", *curl_auth, "-w",
                              "%{time_total} %{size_download} %{http_code}", curl_url],
                             capture_output=True, text=True, timeout=120)
        secs, n, code = res.stdout.split()
        if code != "200":
            raise RuntimeError(f"curl {curl_url}: HTTP {code}")
        out["curl"].append((float(secs), int(n)))
    # what a cache must do at least: store the shard where the cache lives (no fsync, as the
    # cache does not fsync either)
    for _ in range(spec["gets"] if curl else 0):
        fd, path = tempfile.mkstemp(dir=spec["cache_parent"])
        os.close(fd)
        try:
            res = subprocess.run([curl, "-s", "-o", path, *curl_auth, "-w",
                                  "%{time_total} %{size_download} %{http_code}", curl_url],
                                 capture_output=True, text=True, timeout=120)
        finally:
            os.unlink(path)
        secs, n, code = res.stdout.split()
        if code not in ("200", "206") or float(secs) <= 0:
            raise RuntimeError(f"curl {curl_url} into a file: HTTP {code}, {secs} s")
        out["curl_file"].append((float(secs), int(n)))
    return out


def fast_subprocess(spec):
    """A case in a fresh interpreter (see case_subprocess)."""
    out = subprocess.run([sys.executable, __file__, "--fast-case", json.dumps(spec)],
                         capture_output=True, text=True, timeout=900)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("CASE_RESULT=")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"case {spec['server']}/{spec['path']} failed: "
                           f"{out.stderr.strip().splitlines()[-5:]}")
    return json.loads(lines[-1][len("CASE_RESULT="):])


def run_fast_case(spec):
    return fast_gets(spec) if spec["path"] == "get" else fast_epoch(spec)


def cache_parent(data, need_bytes):
    """/dev/shm when it has room for a cold epoch's cache (twice the dataset, for slack), else a
    folder under the data."""
    try:
        if shutil.disk_usage("/dev/shm").free > 2 * need_bytes + (1 << 30):
            return "/dev/shm"
    except OSError:
        pass
    folder = os.path.join(data, "cache")
    os.makedirs(folder, exist_ok=True)
    return folder


def fast_specs(servers, packed, biggest, cache_dir, args):
    """{case key: spec} for the subprocesses."""
    urls = {"local": packed, "direct": f"{servers.ports['direct']}/packed",
            "proxy": f"{servers.ports['proxy']}/packed", "s3": f"s3://{S3_BUCKET}/packed"}
    options = {"s3": servers.ports["s3_options"]}
    specs = {}
    for key in fast_cases():
        srv, path = key.split("/")
        spec = dict(server=srv, path=path, storage_options=options.get(srv))
        if path == "get":
            spec.update(base=servers.ports[srv], shard=biggest, gets=args.gets,
                        s3_key=servers.ports["s3_key"], cache_parent=cache_dir)
        else:
            spec.update(url=urls[srv],
                        cache_parent=None if srv == "local" or path == "nocache" else cache_dir,
                        prefetch=args.prefetch)
        specs[key] = spec
    return specs


def fast_progress(key, result):
    if key.endswith("/get"):
        rates = [f"{b / s / 1e6:.0f}" for s, b in result["fsspec"]]
        curl = [f"{b / s / 1e6:.0f}" for s, b in result["curl"]]
        return f"GET MB/s {' '.join(rates)}" + (f"; curl {' '.join(curl)}" if curl else "")
    return (f"{result['b'] / result['s'] / 1e6:.0f} MB/s, {result['n'] / result['s']:.0f} "
            f"samples/s, first batch {result['ttfb']:.2f} s")


def main_fast(args):
    started = time.monotonic()
    load = "%.1f %.1f %.1f" % os.getloadavg()
    data = args.data or os.path.join(ROOT, "bench-data", "remote-fast")
    count = args.count or FAST_COUNT
    rtt_ms = 15.0 if args.rtt_ms is None else args.rtt_ms
    packed = prepare_fast(data, count)
    manifest = json.load(open(os.path.join(packed, "shardpack.json")))
    files = [e for e in os.scandir(packed) if e.is_file()]
    biggest = max((e for e in files if e.name.endswith(".tar")), key=lambda e: e.stat().st_size)
    total = sum(e.stat().st_size for e in files if e.name.endswith(".tar"))
    cache_dir = cache_parent(data, total)
    info = dict(cmd=" ".join(["tools/bench_remote.py"] + sys.argv[1:]), load=load, count=count,
                shards=len(manifest.get("shards", [])), mb=total / 1e6, rtt_ms=rtt_ms,
                shard=biggest.name, shard_mb=biggest.stat().st_size / 1e6, cache=cache_dir,
                etag=args.s3_etag_hash, gets=args.gets, prefetch=args.prefetch)
    wanted = args.cases.split(",") if args.cases else fast_cases()
    cases = [k for k in fast_cases() if k in wanted or k.split("/")[0] in wanted]
    results = {k: [] for k in cases}
    servers = Servers(data, os.path.join(data, "servers"), rtt_ms / 1000, "--serve-fast",
                      args.s3_etag_hash)
    try:
        specs = fast_specs(servers, packed, biggest.name, cache_dir, args)
        for rep in range(args.reps):
            if rep and time.monotonic() - started > args.budget_s:
                print(f"budget reached: {rep} repetitions", flush=True)
                break
            bench_common.warm([e.path for e in files])  # the local reference reads from memory
            for key in cases[rep % len(cases):] + cases[:rep % len(cases)]:  # alternate
                results[key].append(fast_subprocess(specs[key]))
                print(f"rep {rep} {key:15s} {fast_progress(key, results[key][-1])}  "
                      f"[{time.monotonic() - started:.0f} s]", flush=True)
    finally:
        servers.close()
    info["minutes"] = (time.monotonic() - started) / 60
    finish_fast(args, results, info)
    print(f"total {time.monotonic() - started:.0f} s")


# ---------------------------------------------------------------------- fast link: report

def summarize_fast(results):
    """-> (epochs {key: dict}, gets {server: {client: dict}}), medians over the repetitions."""
    epochs, gets = {}, {}
    for key, rs in results.items():
        if not rs:
            continue
        srv, path = key.split("/")
        if path == "get":
            for client in ("fsspec", "curl", "curl_file", "own"):
                pairs = [tuple(p) for r in rs for p in r.get(client, [])]
                if pairs:
                    gets.setdefault(srv, {})[client] = dict(
                        n=len(pairs), s=med([s for s, _ in pairs]),
                        mbps=med([b / s / 1e6 for s, b in pairs]), mb=pairs[0][1] / 1e6)
            continue
        epochs[key] = dict(reps=len(rs), n=rs[0]["n"], s=med([r["s"] for r in rs]),
                           mbps=med([r["b"] / r["s"] / 1e6 for r in rs]),
                           sps=med([r["n"] / r["s"] for r in rs]),
                           ttfb=med([r["ttfb"] for r in rs]),
                           all=[round(r["b"] / r["s"] / 1e6) for r in rs])
    return epochs, gets


def fast_rows(epochs, gets):
    """The main table's rows and the list of targets missed."""
    rows = ["| server | path | reps | epoch s | samples/s | MB/s (per rep) | first batch s | "
            "one GET MB/s | vs one GET | vs local | target 0.8 x min(GET, local) | result | "
            "vs fsspec/s3fs cat_file | vs curl GET | vs curl GET into a file |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    missed = []
    for srv in ("local", *FAST_SERVERS):
        for path in (*FAST_PATHS, "nocache"):
            e = epochs.get(f"{srv}/{path}")
            if e is None:
                continue
            local = (epochs.get(f"local/{path.replace('nocache', 'batched')}") or {}).get("mbps")
            get = (gets.get(srv, {}).get("own") or {}).get("mbps")
            vs_get = f"{e['mbps'] / get:.2f}x" if get else "-"
            vs_local = f"{e['mbps'] / local:.2f}x" if local else "-"
            need, result = "-", "-"
            if srv != "local" and get and local:
                goal = 0.8 * min(get, local)
                need = f"{goal:.0f} MB/s"
                result = "PASS" if e["mbps"] >= goal else "FAIL"
                if result == "FAIL":
                    missed.append(f"{srv}/{path}: {e['mbps']:.0f} of {goal:.0f} MB/s "
                                  f"({e['mbps'] / goal:.0%})")
            curl = {c: (gets.get(srv, {}).get(c) or {}).get("mbps")
                    for c in ("fsspec", "curl", "curl_file")}
            vs_curl = {c: f"{e['mbps'] / v:.2f}x" if v else "-" for c, v in curl.items()}
            per_rep = " / ".join(str(v) for v in e["all"])
            rows.append(f"| {SERVER_LABELS[srv]} | {PATH_LABELS[path]} | {e['reps']} | "
                        f"{e['s']:.2f} | {e['sps']:.0f} | {e['mbps']:.0f} ({per_rep}) | "
                        f"{e['ttfb']:.2f} | {f'{get:.0f}' if get else '-'} | {vs_get} | "
                        f"{vs_local} | {need} | {result} | {vs_curl['fsspec']} | "
                        f"{vs_curl['curl']} | {vs_curl['curl_file']} |")
    return rows, missed


def report_fast(epochs, gets, machine, info):
    rows, missed = fast_rows(epochs, gets)
    get_rows = ["| server | client | GETs | median s | MB/s |", "|---|---|---:|---:|---:|"]
    for srv in FAST_SERVERS:
        for client, label in (("own", "shardpack Storage.download into a file beside the cache "
                                      "(the reference)"),
                              ("fsspec", "s3fs cat_file" if srv == "s3" else
                               "fsspec HTTP cat_file"), ("curl", "curl -o /dev/null"),
                              ("curl_file", "curl -o FILE beside the cache")):
            g = gets.get(srv, {}).get(client)
            if g:
                get_rows.append(f"| {SERVER_LABELS[srv]} | {label} | {g['n']} | {g['s']:.3f} | "
                                f"{g['mbps']:.0f} |")
    etag = (f"ETags by {info['etag']} (rclone hashes the whole object on every request)"
            if info["etag"] else "ETags off (rclone would hash the whole object on every "
                                 "request; a real S3 stores them)")
    prefetch = ("the default prefetch" if info["prefetch"] is None
                else f"prefetch={info['prefetch']}")
    head = (f"Command: `.venv/bin/python {info['cmd']}` ({info['minutes']:.1f} min)\n\n"
            f"Machine: {machine['nproc']} cores ({machine['cpu']}), {machine['ram_gib']:.0f} GiB "
            f"RAM, Linux {machine['kernel']}, Python {machine['python']}, data on "
            f"{machine['fs']}; shared and noisy (load average at start {info['load']}). "
            f"Servers, all on 127.0.0.1 in one child process, sharing the cores with the client: "
            f"nginx direct; the same nginx behind tests/servers.py SpliceProxy, which holds every "
            f"request {info['rtt_ms']:g} ms (one RTT per request; responses are spliced through "
            f"undelayed: no bandwidth limit, no TCP window effects of a long link); rclone serve "
            f"s3 (tests/servers.py S3Server, no request log, {etag}) over hard links of the same "
            f"shards, read with s3fs. Dataset: {info['count']} samples of random bytes (~100 KB, "
            f"incompressible, named .jpg), {info['mb']:.0f} MB in {info['shards']} tar shards of "
            f"<= {SHARD_SIZE}. Every remote epoch is cold: a fresh empty `cache_dir` in "
            f"{info['cache']}, removed after (the no-cache row: ranged chunks in each worker's "
            f"memory). Shuffle on, 2 DataLoader workers, batch 256, "
            f"{prefetch}, bytes only (no decode). Batched: `ShardDataset(url, batch_size=256, "
            f"batched=True, cache_dir=..., shuffle=True)` in `DataLoader(batch_size=None)`; per "
            f"sample: `ShardDataset(url, cache_dir=..., shuffle=True)` in "
            f"`DataLoader(batch_size=256, collate_fn=<counts bytes>)`. Local: the same on the "
            f"packed folder, no cache, page cache warm (the shards are read before every "
            f"repetition). Epoch s runs from the DataLoader's start to its last batch; first "
            f"batch s includes the dataset's construction. One GET: the whole "
            f"{info['shard_mb']:.0f} MB shard {info['shard']}, {info['gets']} per repetition, "
            f"with shardpack's own `Storage.download` into a file beside the cache (one streamed "
            f"request, hashed on the way, as a cold epoch fetches every shard: the reference for "
            f"'vs one GET'), with fsspec HTTP / s3fs `cat_file` into memory after one request "
            f"that opened the connection, and with curl (a process and a connection each; to "
            f"/dev/null and into a file beside the cache). Each case runs in a fresh "
            f"interpreter; cases alternate within each repetition; medians over the "
            f"repetitions.\n\n")
    body = head + "\n".join(rows) + "\n\n" + "\n".join(get_rows) + "\n"
    if missed:
        body += "\nTargets missed: " + "; ".join(missed) + ".\n"
    return body


def finish_fast(args, results, info):
    epochs, gets = summarize_fast(results)
    data = args.data or os.path.join(ROOT, "bench-data", "remote-fast")
    body = report_fast(epochs, gets, bench_common.machine_info(data), info)
    print("\n" + body)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(mode="fast", results=results, info=info), f, indent=1)
    if args.write_docs:
        write_subsection(os.path.join(ROOT, "docs", "benchmarks.md"), HEADING, FAST_HEADING, body)
        print("wrote", FAST_HEADING, "under", HEADING, "in docs/benchmarks.md")


def _subsection_span(lines, section, heading):
    """(start, end) of `section` (up to the next '## ') and of `heading` inside it (up to the
    next '## ' or '### '; None if absent)."""
    start = lines.index(section)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    sub = next((i for i in range(start + 1, end) if lines[i] == heading), None)
    if sub is None:
        return (start, end), None
    sub_end = next((i for i in range(sub + 1, end)
                    if lines[i].startswith("## ") or lines[i].startswith("### ")), end)
    return (start, end), (sub, sub_end)


def read_subsection(md_path, section, heading):
    """The body of `heading` inside `section`, or None."""
    lines = open(md_path).read().splitlines() if os.path.exists(md_path) else []
    if section not in lines:
        return None
    _, sub = _subsection_span(lines, section, heading)
    return "\n".join(lines[sub[0] + 2:sub[1]]).strip("\n") + "\n" if sub else None


def write_subsection(md_path, section, heading, body):
    """Write `heading` + body inside `section`, replacing that subsection if there, else at the
    section's end; the rest of the file is kept (bench_common.update_section replaces whole
    '## ' sections)."""
    lines = open(md_path).read().splitlines() if os.path.exists(md_path) else []
    new = [heading, ""] + body.rstrip("\n").splitlines()
    if section not in lines:
        lines = (lines or ["# Benchmarks"]) + ["", section, ""] + new
    else:
        (_, end), sub = _subsection_span(lines, section, heading)
        if sub is not None:
            start, stop = sub
        else:
            start = stop = end
            while start > 0 and not lines[start - 1].strip():
                start -= 1
            new = [""] + new
        tail = lines[stop:]
        lines = lines[:start] + new + ([""] + tail if tail else [])
    with open(md_path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        return serve(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-fast":
        return serve_fast(*sys.argv[2:6])
    if len(sys.argv) > 1 and sys.argv[1] == "--case":
        print("CASE_RESULT=" + json.dumps(run_case(*json.loads(sys.argv[2]))), flush=True)
        return None
    if len(sys.argv) > 1 and sys.argv[1] == "--fast-case":
        print("CASE_RESULT=" + json.dumps(run_fast_case(json.loads(sys.argv[2]))), flush=True)
        return None
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", action="store_true",
                    help="the fast-link mode: nginx direct, behind SpliceProxy, and S3 (rclone); "
                         "writes the '### Fast link' subsection")
    ap.add_argument("--data",
                    help="data folder [bench-data/remote; --fast: bench-data/remote-fast]")
    ap.add_argument("--count", type=int,
                    help=f"samples, ~100 KB each [3000; --fast: {FAST_COUNT}]")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rtt-ms", type=float,
                    help="round trip [30: DelayProxy, 15 ms each way; --fast: 15, all of it held "
                         "on each request by SpliceProxy]")
    ap.add_argument("--gets", type=int, default=3,
                    help="--fast: whole-shard GETs per server and client per repetition")
    ap.add_argument("--prefetch", type=int,
                    help="--fast: ShardDataset's prefetch [its default]")
    ap.add_argument("--s3-etag-hash", default="",
                    help="--fast: rclone's --etag-hash (default off: rclone would hash the whole "
                         "object on every request)")
    ap.add_argument("--per-file-count", type=int, default=1024,
                    help="images read in the per-file case (it is slow)")
    ap.add_argument("--budget-s", type=float, default=480,
                    help="start no new repetition after this many seconds")
    ap.add_argument("--cases",
                    help="comma-separated subset of the cases to run (for quick comparisons; the "
                         f"docs want all of them) [{','.join(CASES)}; --fast: "
                         f"{','.join(fast_cases())}, or a server's name for all its cases]")
    ap.add_argument("--write-docs", action="store_true",
                    help="write the '## Remote' section (keeping its '### Fast link'); with "
                         "--fast only that subsection")
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--from-json", help="only re-render the report of an earlier --json run")
    args = ap.parse_args()
    saved = json.load(open(args.from_json)) if args.from_json else None
    if saved and saved.get("mode") == "fast":
        return finish_fast(args, saved["results"], saved["info"])
    if args.fast and not saved:
        return main_fast(args)
    args.data = args.data or os.path.join(ROOT, "bench-data", "remote")  # the slow-proxy mode
    args.count = args.count or 3000
    args.rtt_ms = 30.0 if args.rtt_ms is None else args.rtt_ms
    args.cases = args.cases or ",".join(CASES)
    if saved:
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
        md = os.path.join(ROOT, "docs", "benchmarks.md")
        fast = read_subsection(md, HEADING, FAST_HEADING)  # the --fast run's subsection stays
        bench_common.update_section(md, HEADING, body)
        if fast:
            write_subsection(md, HEADING, FAST_HEADING, fast)
        print("wrote", HEADING, "in docs/benchmarks.md")


if __name__ == "__main__":
    main()
