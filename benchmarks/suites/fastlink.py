"""Cold remote epochs on a fast link: nginx direct, nginx behind a proxy that holds each request
15 ms (responses spliced through), and rclone's S3, against one GET of a shard, the local
epoch, and this machine's CPU ceiling for a cold epoch (benchmarks/suites/ceiling.py)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common as c
from benchmarks import testbed
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure
from benchmarks.suites import ceiling
from benchmarks.suites.remote import SHARD_SIZE, Servers, sample_epoch, shard_epoch

HERE = "benchmarks.suites.fastlink"
SERVERS = ("direct", "proxy", "s3")
PATHS = ("batched", "sample")
S3_BUCKET = "bench"
SERVER_LABELS = {"local": "local files", "direct": "nginx, direct",
                 "proxy": "nginx behind SpliceProxy", "s3": "S3 (rclone serve s3)"}
PATH_LABELS = {"batched": "batched", "sample": "per sample", "nocache": "batched, no cache"}


def options(p) -> None:
    """The fastlink suite's options."""
    p.add_argument("--count", type=int, default=6000, help="~100 KB samples [6000]")
    p.add_argument("--rtt-ms", type=float, default=15.0,
                   help="held on every request by the SpliceProxy [15]")
    p.add_argument("--gets", type=int, default=3,
                   help="whole-shard GETs per server and client per repetition [3]")
    p.add_argument("--prefetch", type=int, default=None, help="ShardDataset's prefetch [its own]")
    p.add_argument("--s3-etag-hash", default="",
                   help="rclone's --etag-hash (default off: it would hash every object whole "
                        "on every request)")
    p.add_argument("--budget-s", type=float, default=480,
                   help="start no new repetition after this many seconds [480]")
    p.add_argument("--cases", default="", help="a subset: case keys or server names [all]")
    p.add_argument("--ceiling-reps", type=int, default=None,
                   help="repetitions of the CPU ceiling count, 0 to skip [--reps]")


def all_cases() -> list:
    """Every case key, in the order of one repetition."""
    return ([f"{srv}/{path}" for srv in ("local", *SERVERS) for path in PATHS]
            + ["direct/nocache"] + [f"{srv}/get" for srv in SERVERS])


# ------------------------------------------------------------------------------ data, servers

def prepare(data: Path, count: int, sample_bytes: int = 100_000) -> Path:
    """``count`` files of random bytes (90-110% of sample_bytes, named .jpg: nothing here
    decodes) in 10 classes, packed into 64 MB tar shards, the tree then deleted; kept between
    runs (a stamp per count). The packed folder."""
    images, packed, stamp = data / "images", data / "packed", data / f"ready-{count}"
    if stamp.exists():
        return packed
    for p in (images, packed):
        shutil.rmtree(p, ignore_errors=True)
    for stale in data.glob("ready-*") if data.is_dir() else ():
        stale.unlink()
    rng = random.Random(0)
    for i in range(count):
        folder = images / f"c{i % 10:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        size = rng.randint(sample_bytes * 9 // 10, sample_bytes * 11 // 10)
        (folder / f"{i:06d}.jpg").write_bytes(os.urandom(size))
    c.ensure_pack(images, packed, "--shard-size", SHARD_SIZE, "--format", "tar", "--check", "none")
    shutil.rmtree(images)
    stamp.touch()
    return packed


def link_tree(src, dest) -> None:
    """Hard links of the files of src in dest (a copy where links cannot be made)."""
    os.makedirs(dest, exist_ok=True)
    for entry in os.scandir(src):
        if entry.is_file():
            try:
                os.link(entry.path, os.path.join(dest, entry.name))
            except OSError:
                shutil.copy2(entry.path, os.path.join(dest, entry.name))


def serve(root, workdir, delay_s, etag_hash) -> None:
    """Child: nginx over root; a SpliceProxy holding every request delay_s in front of it;
    rclone serve s3 with root/packed as s3://bench/packed (hard links). Prints their URLs and
    the S3 options as JSON, then runs until stdin ends."""
    s, workdir = testbed.servers(), Path(workdir)
    link_tree(os.path.join(root, "packed"), workdir / "s3" / "data" / S3_BUCKET / "packed")
    with s.NginxServer(Path(root), workdir / "nginx") as nginx, \
            s.SpliceProxy(nginx.port, float(delay_s)) as proxy, \
            s.S3Server(workdir / "s3", count_requests=False, etag_hash=etag_hash) as s3:
        print(json.dumps({"direct": nginx.url, "proxy": proxy.url, "s3": s3.endpoint_url,
                          "s3_options": s3.storage_options, "s3_key": [s3.key, s3.secret]}),
              flush=True)
        sys.stdin.read()


def cache_parent(data: Path, need_bytes: int) -> str:
    """/dev/shm when it has room for a cold epoch's cache (twice the dataset), else a folder
    under the data."""
    try:
        if shutil.disk_usage("/dev/shm").free > 2 * need_bytes + (1 << 30):
            return "/dev/shm"
    except OSError:
        pass
    (data / "cache").mkdir(parents=True, exist_ok=True)
    return str(data / "cache")


# ------------------------------------------------------------------------------ cases (children)

def epoch(spec) -> dict:
    """Child: one epoch; remote ones cold, in a fresh empty cache folder (removed after).
    dict(s, n, b, ttfb): s from the DataLoader's start to its last batch, ttfb with the
    dataset's construction."""
    from shardpack import ShardDataset
    cache = (tempfile.mkdtemp(prefix="shardpack-bench-", dir=spec["cache_parent"])
             if spec["cache_parent"] else None)
    kwargs = dict(cache_dir=cache, shuffle=True, storage_options=spec.get("storage_options"))
    if spec.get("prefetch") is not None:
        kwargs["prefetch_shards"] = spec["prefetch"]
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
        return dict(s=secs, n=n, b=b, ttfb=open_s + first)
    finally:
        if cache:
            shutil.rmtree(cache, ignore_errors=True)


def _curl(args, url, path) -> tuple:
    res = subprocess.run(["curl", "-s", "-o", path, *args, "-w",
                          "%{time_total} %{size_download} %{http_code}", url],
                         capture_output=True, text=True, timeout=120)
    secs, n, code = res.stdout.split()
    if code not in ("200", "206") or float(secs) <= 0:
        raise RuntimeError(f"curl {url}: HTTP {code}, {secs} s")
    return float(secs), int(n)


def gets(spec) -> dict:
    """Child: whole-shard GETs: shardpack's own ``Storage.download`` into a file beside the
    cache (one streamed request, hashed on the way: what a cold epoch does per shard; the
    reference), fsspec HTTP / s3fs ``cat_file`` after one request that opened the connection,
    and curl (a process and a connection each) to /dev/null and into a file."""
    from shardpack.storage import Storage
    out = dict(own=[], fsspec=[], curl=[], curl_file=[])
    if spec["server"] == "s3":
        import s3fs
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **spec["storage_options"])
        target = f"{S3_BUCKET}/packed/{spec['shard']}"
        curl_url = f"{spec['base']}/{target}"
        region = spec["storage_options"]["client_kwargs"]["region_name"]
        auth = ["--aws-sigv4", f"aws:amz:{region}:s3", "--user", ":".join(spec["s3_key"])]
        base = f"s3://{S3_BUCKET}/packed"
    else:
        import fsspec
        fs = fsspec.filesystem("http", skip_instance_cache=True)
        target = curl_url = f"{spec['base']}/packed/{spec['shard']}"
        auth, base = [], f"{spec['base']}/packed"
    fs.info(target)
    for _ in range(spec["gets"]):
        t0 = time.perf_counter()
        n = len(fs.cat_file(target))
        out["fsspec"].append((time.perf_counter() - t0, n))
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
    curls = spec["gets"] if shutil.which("curl") else 0
    out["curl"] = [_curl(auth, curl_url, "/dev/null") for _ in range(curls)]
    for _ in range(curls):
        # what a cache must do at least: store the shard where the cache lives (no fsync, as
        # the cache does not fsync either)
        fd, path = tempfile.mkstemp(dir=spec["cache_parent"])
        os.close(fd)
        try:
            out["curl_file"].append(_curl(auth, curl_url, path))
        finally:
            os.unlink(path)
    return out


def run_case(spec) -> dict:
    """Child: one case (an epoch, or the GETs)."""
    return gets(spec) if spec["path"] == "get" else epoch(spec)


# ------------------------------------------------------------------------------ the suite

def specs(ports, packed, biggest, cache, args) -> dict:
    """{case key: spec} for the children."""
    urls = {"local": str(packed), "direct": f"{ports['direct']}/packed",
            "proxy": f"{ports['proxy']}/packed", "s3": f"s3://{S3_BUCKET}/packed"}
    out = {}
    for key in all_cases():
        srv, path = key.split("/")
        spec = dict(server=srv, path=path, storage_options=ports["s3_options"]
                    if srv == "s3" else None)
        if path == "get":
            spec.update(base=ports[srv], shard=biggest, gets=args.gets, s3_key=ports["s3_key"],
                        cache_parent=cache)
        else:
            spec.update(url=urls[srv], prefetch=args.prefetch,
                        cache_parent=None if srv == "local" or path == "nocache" else cache)
        out[key] = spec
    return out


def summarize(results) -> tuple:
    """(epochs {key: medians}, gets {server: {client: medians}}) over the repetitions."""
    epochs, got = {}, {}
    for key, rs in results.items():
        srv, path = key.split("/")
        if not rs:
            continue
        if path == "get":
            for client in ("own", "fsspec", "curl", "curl_file"):
                pairs = [p for r in rs for p in r.get(client, [])]
                if pairs:
                    got.setdefault(srv, {})[client] = dict(
                        n=len(pairs), mbps=c.med(b / s / 1e6 for s, b in pairs))
            continue
        epochs[key] = dict(mbps=c.med(r["b"] / r["s"] / 1e6 for r in rs),
                           sps=c.med(r["n"] / r["s"] for r in rs),
                           ttfb=c.med(r["ttfb"] for r in rs),
                           all=[round(r["b"] / r["s"] / 1e6) for r in rs])
    return epochs, got


def fast_figures(epochs, got, ceil) -> list:
    """A cold epoch per server and path in MB/s, its limits side by side (one GET, the local
    epoch, the CPU ceiling on nginx direct); then one GET per server, the other clients as
    peers."""
    out = []
    for srv in ("local", *SERVERS):
        for path in (*PATHS, "nocache"):
            e = epochs.get(f"{srv}/{path}")
            if e is None:
                continue
            local = (epochs.get(f"local/{path.replace('nocache', 'batched')}") or {}).get("mbps")
            get = (got.get(srv, {}).get("own") or {}).get("mbps")
            limit = {"one GET": get, "local epoch": local if srv != "local" else None}
            if srv == "direct" and path in ceil:
                limit["CPU ceiling"] = ceil[path]["ceiling"]
            note = f"{e['sps']:,.0f} samples/s; first batch {e['ttfb']:.2f} s; runs " + \
                " / ".join(map(str, e["all"]))
            if srv != "local" and get and local:
                goal = 0.8 * min(get, local)
                note += (f"; {e['mbps'] / get:.2f}x one GET; target 0.8x min(GET, local) = "
                         f"{goal:,.0f}: {c.verdict(e['mbps'] >= goal)}")
            out.append(figure(f"{SERVER_LABELS[srv]}, {PATH_LABELS[path]}", e["mbps"], "MB/s",
                              {}, limit, note))
    for srv in SERVERS:
        g = got.get(srv, {})
        if "own" in g:
            out.append(figure(f"{SERVER_LABELS[srv]}: one GET of a shard, Storage.download",
                              g["own"]["mbps"], "MB/s",
                              {"s3fs cat_file" if srv == "s3" else "fsspec cat_file":
                               (g.get("fsspec") or {}).get("mbps"),
                               "curl -o /dev/null": (g.get("curl") or {}).get("mbps"),
                               "curl -o FILE": (g.get("curl_file") or {}).get("mbps")}, {},
                              f"{g['own']['n']} GETs, into a file beside the cache"))
    return out


@suite("fastlink", title="Remote: a fast link, and the CPU ceiling", options=options,
       quick=dict(count=300, gets=1, budget_s=60),
       measures="""MB/s of cold epochs (a fresh empty `cache_dir` each; the no-cache row reads
       ranges into each worker's memory), batched and per sample, 2 DataLoader workers, batch
       256, shuffle on, bytes only, from nginx on 127.0.0.1, the same nginx behind a proxy
       that holds every request 15 ms and splices responses through undelayed, and rclone serve
       s3 over hard links of the same shards (ETags off); ~100 KB random samples in 64 MB tar
       shards. Beside each: one GET of the largest shard with shardpack's own
       `Storage.download` (the reference), the local epoch (page cache warm), and on nginx
       direct this machine's CPU ceiling: (CPU of downloading every shard + CPU of a local
       epoch) / cores, every process on the machine counted from /proc/stat. Each case in a
       fresh interpreter, cases alternated.""",
       bounds="""The CPU of the machine: server, loopback TCP and client share 2 cores. A cold
       epoch must do a download's work and a local epoch's work; with both cores busy all the
       time that allows 0.8-0.9x one GET batched and ~0.77x per sample on nginx direct, so the
       0.8x target is met through the proxy and on S3 and missed on nginx direct, at 75-95% of
       the ceiling.""")
def run_fastlink(run) -> Outcome:
    """The fastlink suite: every case per repetition, then the CPU ceiling."""
    a, started = run.args, time.monotonic()
    data = run.data_dir / "remote-fast"
    packed = prepare(data, a.count)
    tars = sorted(packed.glob("*.tar"), key=lambda p: p.stat().st_size)
    total = sum(p.stat().st_size for p in tars)
    cache = cache_parent(data, total)
    wanted = a.cases.split(",") if a.cases else all_cases()
    cases = [k for k in all_cases() if k in wanted or k.split("/")[0] in wanted]
    results = {k: [] for k in cases}
    shutil.rmtree(data / "servers", ignore_errors=True)
    servers = Servers(f"{HERE}:serve", str(data), str(data / "servers"), a.rtt_ms / 1000,
                      a.s3_etag_hash)
    try:
        spec = specs(servers.ports, packed, tars[-1].name, cache, a)
        for rep in range(run.reps):
            if rep and time.monotonic() - started > a.budget_s:
                break
            c.warm(c.files_under(packed))  # the local reference reads from memory
            for key in c.rotated(cases, rep):
                results[key].append(c.fresh(f"{HERE}:run_case", spec[key]))
                run.log(f"rep {rep} {key:15s} [{time.monotonic() - started:.0f} s]")
    finally:
        servers.close()
    reps = run.reps if a.ceiling_reps is None else a.ceiling_reps
    measured = c.fresh("benchmarks.suites.ceiling:measure", str(packed), cache, reps,
                       timeout=3600) if reps and not a.cases else None
    ceil = ceiling.ceilings(measured) if measured else {}
    epochs, got = summarize(results)
    setup = (f"{a.count:,} samples, {total / 1e6:,.0f} MB in {len(tars)} tar shards; caches in "
             f"{cache}; {a.rtt_ms:g} ms held per request; {a.gets} GETs per client and "
             f"repetition; prefetch {a.prefetch if a.prefetch is not None else 'default'}"
             + (f"; machine background {ceil['batched']['background']:.3f} cores" if ceil
                else "; no ceiling count") + ".")
    return Outcome(fast_figures(epochs, got, ceil), setup,
                   raw={"results": results, "ceiling": measured},
                   part=None if not a.cases else "cases")
