"""Before/after a refactor of the read path (issue 18): the same reads with the code of a base
commit and with the working tree, alternated in fresh processes, median rates.  Not a test;
figures go to docs/benchmarks.md.

Cases: bytes-only batched epochs (100 KB and 1 KB samples, local tar), CPU decode (224 px,
batches of 64, 1,536 samples), and the same 100 KB dataset over HTTP (nginx on 127.0.0.1, no
added latency) with a cache: cold (empty cache) and warm (the cache filled by the cold run).
And `shardpack preview` sheets of 64 cells (cells per second): on the 100 KB dataset and on 64
photos of 12 MP made once under bench-data/.  `--cases preview,HTTP` runs only those.

    python tools/bench_before_after.py --base 3f2c1ab --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIG = ROOT / "bench-data" / "imagenet-20000-packed-tar"
TINY = ROOT / "bench-data" / "tiny-100000-packed-tar"


def child(case: str, url: str, cache: str | None) -> float:
    """One measurement in this process: samples per second."""
    import shardpack

    if case == "preview":  # a 64-cell contact sheet (shardpack preview), cells per second
        from shardpack.inspect.preview import PreviewOptions, preview

        out = Path(tempfile.mkdtemp()) / "sheet.png"
        summary = preview(url, out, PreviewOptions(n=64, seed=1))
        shutil.rmtree(out.parent)
        return summary.cells / summary.seconds
    if case == "decode":
        data = shardpack.ShardDataset(url, seed=1, batch_size=64, batched=True,
                                      decode=shardpack.CpuDecode(224))
        t, n = time.perf_counter(), 0
        for batch in data:
            n += len(batch["__index__"])
            if n >= 1536:
                break
        return n / (time.perf_counter() - t)
    if cache is None:  # a pass first, untimed: imports done lazily in the first epoch (70 ms
        # of a 150 ms epoch of 1 KB samples) would otherwise be what the figure measures
        warm = shardpack.ShardDataset(url, batch_size=256, batched=True, seed=1)
        for _ in warm:
            pass
    # a new dataset: its reader checks every sample again (the memo is per reader)
    data = shardpack.ShardDataset(url, batch_size=256, batched=True, seed=1, cache_dir=cache)
    t = time.perf_counter()
    n = sum(len(b["__index__"]) for b in data)
    return n / (time.perf_counter() - t)


def big_photos(count: int = 64) -> Path:
    """A pack of ``count`` 4000x3000 JPEGs (tests/imagegen.py's ramp_photo: smooth ramps plus
    noise, ~4.6 MB each), made once under bench-data/."""
    out = ROOT / "bench-data" / f"photos-12mp-{count}-packed"
    if not (out / "shardpack.json").exists():
        sys.path.insert(0, str(ROOT))
        import shardpack
        from tests.imagegen import ramp_photo

        src = Path(tempfile.mkdtemp(dir=ROOT / "bench-data")) / "src"
        for i in range(count):
            (src / f"c{i % 4}").mkdir(parents=True, exist_ok=True)
            (src / f"c{i % 4}" / f"{i:03d}.jpg").write_bytes(ramp_photo(i, 4000, 3000))
        shardpack.pack(src, out, workers=2)
        shutil.rmtree(src.parent)
    return out


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the commit before the change")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--cases", default=None,
                   help="comma-separated labels' first words to run (e.g. 'preview,HTTP') "
                        "[all]")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        case, url, cache = args.child
        print(child(case, url, None if cache == "-" else cache))
        return
    base = Path(tempfile.mkdtemp()) / "base"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base), args.base],
                   cwd=ROOT, check=True)
    sys.path.insert(0, str(ROOT))
    from tests.servers import NginxServer

    results: dict[tuple[str, str], list[float]] = {}
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and \
        shutil.disk_usage("/dev/shm").free > 3 * _tree_bytes(BIG) else None
    try:
        with NginxServer(BIG.parent, Path(tempfile.mkdtemp())) as nginx:
            url = nginx.url_for(BIG.name)
            cases = [("bytes 100 KB", "bytes", str(BIG)), ("bytes 1 KB", "bytes", str(TINY)),
                     ("CPU decode 224 px", "decode", str(BIG)),
                     ("HTTP cold (cache filled)", "cold", url),
                     ("HTTP warm (cache full)", "warm", url),
                     ("preview 64 cells, ~500x375 JPEGs", "preview", str(BIG)),
                     ("preview 64 cells, 12 MP JPEGs", "preview", str(big_photos()))]
            if args.cases:
                wanted = tuple(args.cases.split(","))
                cases = [c for c in cases if c[0].split()[0] in wanted]
            for rep in range(args.reps):
                for who in (("before", "after") if rep % 2 == 0 else ("after", "before")):
                    tree = base if who == "before" else ROOT
                    # caches in memory where they fit: a cache on disk is still being written
                    # back while the warm epoch runs (stop 27's HTTP figures)
                    cache = tempfile.mkdtemp(dir=shm if shm else None)
                    for label, case, target in cases:
                        kind = "bytes" if case in ("cold", "warm") else case
                        env = dict(os.environ, PYTHONPATH=str(tree))
                        out = subprocess.run(
                            [sys.executable, str(ROOT / "tools" / "bench_before_after.py"),
                             "--base", args.base, "--child", kind, target,
                             cache if case in ("cold", "warm") else "-"],
                            capture_output=True, text=True, check=True, env=env, cwd=tree)
                        rate = float(out.stdout.split()[-1])
                        results.setdefault((label, who), []).append(rate)
                        print(f"rep {rep} {who:6s} {label}: {rate:,.0f}/s", file=sys.stderr)
                    shutil.rmtree(cache)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT)
    print(f"`python tools/bench_before_after.py --base {args.base} --reps {args.reps}`: "
          f"{args.reps} runs each, alternated, fresh processes, median samples/s:\n")
    print("| case | before | after | after / before |")
    print("|---|---|---|---|")
    for label in dict.fromkeys(k[0] for k in results):
        b = statistics.median(results[(label, "before")])
        a = statistics.median(results[(label, "after")])
        print(f"| {label} | {b:,.0f} | {a:,.0f} | {a / b:.3f} |")
    print(json.dumps({f"{k[0]}/{k[1]}": v for k, v in results.items()}), file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
