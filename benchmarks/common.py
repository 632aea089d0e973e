"""Helpers every suite shares (standard library only: a peer's venv imports this module too).

Page-cache control (posix_fadvise DONTNEED, checked with mmap + mincore; reading to warm), a
subprocess runner that records wall time and peak memory, a runner for one function in a fresh
interpreter, CPU accounting from /proc, the generated data the suites share, and small
statistics.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

# the checkout the suites run from (scripts/make_images.py, the peers' venvs); the A/B harness
# runs this package from a copy and says where the checkout is
ROOT = Path(os.environ.get("SHARDPACK_BENCH_ROOT") or Path(__file__).resolve().parents[1])
HARNESS = Path(__file__).resolve().parents[1]  # the folder holding this package
DATA = ROOT / "bench-data"
PEER_PY = ROOT / ".bench-venv" / "bin" / "python"
LOADERS_PY = ROOT / ".bench-loaders-venv" / "bin" / "python"
MAKE_IMAGES = ROOT / "scripts" / "make_images.py"
TICK = os.sysconf("SC_CLK_TCK")
PAGE = mmap.PAGESIZE

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value


# ------------------------------------------------------------------------------ files and trees

def list_tree(src) -> list[tuple[str, int]]:
    """Sorted [(relpath, class_index)] of the files under src; the class is the index of the
    top-level folder in sorted order (torchvision ImageFolder convention)."""
    classes = sorted(e.name for e in os.scandir(src) if e.is_dir())
    items = []
    for ci, cname in enumerate(classes):
        base = os.path.join(src, cname)
        for root, dirs, files in os.walk(base):
            dirs.sort()
            rel = os.path.relpath(root, src)
            items.extend((os.path.join(rel, f), ci) for f in sorted(files))
    return items


def split_key(relpath: str) -> tuple[str, str]:
    """'n00_x/000001.jpg' -> ('n00_x/000001', 'jpg')."""
    stem, ext = os.path.splitext(relpath)
    return stem, ext[1:].lower()


def files_under(path) -> list[str]:
    """Every file below ``path``."""
    out = []
    for root, _, files in os.walk(path):
        out.extend(os.path.join(root, f) for f in files)
    return out


def tree_bytes(path) -> int:
    """Bytes of every file below ``path``."""
    return sum(os.path.getsize(p) for p in files_under(path))


# ------------------------------------------------------------------------------ page cache

def resident_pages(path) -> tuple[int, int]:
    """(resident, total) pages of path in the page cache, via mmap + mincore."""
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    n = (size + PAGE - 1) // PAGE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap failed: {path}")
        try:
            vec = (ctypes.c_ubyte * n)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore failed: {path}")
            return sum(v & 1 for v in vec), n
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def resident_fraction(paths, sample: int = 300, seed: int = 0) -> float:
    """Fraction of page-cache-resident pages over a random sample of paths."""
    paths = random.Random(seed).sample(list(paths), min(sample, len(paths)))
    res = tot = 0
    for p in paths:
        r, t = resident_pages(p)
        res, tot = res + r, tot + t
    return res / tot if tot else 0.0


def evict(paths) -> None:
    """Write back dirty pages, then drop each file's pages with POSIX_FADV_DONTNEED."""
    os.sync()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(paths) -> None:
    """Read every file once so it is in the page cache."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 22):
                pass


def fincore_check(paths) -> str:
    """An independent check of an eviction with util-linux fincore: resident bytes / size."""
    res = subprocess.run(["fincore", "-b", "-n", "-o", "RES,SIZE"] + list(paths),
                         capture_output=True, text=True).stdout.split()
    nums = [int(x) for x in res]
    return (f"fincore: {sum(nums[0::2]):,} of {sum(nums[1::2]):,} bytes resident in "
            f"{len(paths)} files right after the first eviction")


# ------------------------------------------------------------------------------ processes, CPU

def descendants(pid: int) -> list[int]:
    """pid and all its descendants (via /proc/PID/task/TID/children)."""
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return seen


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_measured(cmd, log_path, timeout=None, env=None, interval=0.2) -> dict:
    """Run cmd under /usr/bin/time; returns dict(rc, wall_s, maxrss_mb, tree_pss_mb, timeout).

    maxrss_mb: ru_maxrss of the largest single process of the tree (GNU time %M);
    tree_pss_mb: peak of the summed PSS of the whole process tree, sampled every `interval` s
    (counts shared pages once, so forked workers are not double counted)."""
    rss_file = f"{log_path}.time"
    full = ["/usr/bin/time", "-f", "%M", "-o", rss_file] + [str(c) for c in cmd]
    peak = [0]
    done = threading.Event()
    with open(log_path, "wb") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(full, stdout=log, stderr=subprocess.STDOUT,
                                env=env or child_env())

        def sample():
            while not done.wait(interval):
                peak[0] = max(peak[0], sum(_pss_kb(p) for p in descendants(proc.pid)))
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        timed_out = False
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc, timed_out = proc.wait(), True
        wall = time.perf_counter() - t0
        done.set()
        th.join()
    maxrss = 0.0
    try:
        with open(rss_file) as f:
            maxrss = int(f.read().split()[-1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return dict(rc=rc, wall_s=wall, maxrss_mb=maxrss, tree_pss_mb=peak[0] / 1024,
                timeout=timed_out)


def machine_busy() -> float:
    """CPU seconds the machine's CPUs have been busy: user, nice, system, irq and softirq (idle,
    iowait and the hypervisor's steal left out; guest time is inside user already)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / TICK


def process_cpu(pids) -> float:
    """CPU seconds (user + system) of the processes ``pids`` so far; gone ones count 0."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(rest[11]) + int(rest[12])) / TICK
    return total


def quiet_moment(limit: float = 60, window: float = 2.0, share: float = 0.15) -> None:
    """Wait (at most ``limit`` s) until other processes use < ``share`` of the CPUs for
    ``window`` s: a shared machine's neighbours come and go."""
    t0 = time.time()
    while time.time() - t0 < limit:
        busy = machine_busy()
        time.sleep(window)
        if machine_busy() - busy < share * window * os.cpu_count():
            return


# ------------------------------------------------------------------------------ fresh interpreters

def child_env(extra: dict | None = None) -> dict:
    """The environment of a child process: this package importable (appended to PYTHONPATH, so
    that a tree the A/B harness put first stays first)."""
    env = dict(os.environ, **(extra or {}))
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(HARNESS) not in parts:
        parts.append(str(HARNESS))
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("SHARDPACK_BENCH_ROOT", str(ROOT))
    return env


def child_cmd(func: str, *args, python=None) -> list[str]:
    """The command that calls ``func`` ("module:function") with ``args`` (JSON) in a fresh
    interpreter and prints its JSON result (benchmarks/child.py)."""
    return [str(python or sys.executable), "-m", "benchmarks.child", func, json.dumps(args)]


def fresh(func: str, *args, python=None, timeout: float = 900, env: dict | None = None):
    """Call ``func`` ("module:function") with ``args`` in a fresh interpreter; its result.
    Each measurement in its own process: in one long-lived process the local reference of the
    remote suite slowed to ~4 s after its first repetition, which nothing reproduced by hand."""
    done = subprocess.run(child_cmd(func, *args, python=python), capture_output=True, text=True,
                          timeout=timeout, env=child_env(env))
    return parse_child(done, func)


def parse_child(done: subprocess.CompletedProcess, what: str):
    """The RESULT= line of a finished benchmarks.child run, or RuntimeError with its stderr."""
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT=")]
    if done.returncode != 0 or not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {tail}")
    return json.loads(lines[-1][len("RESULT="):])


def shardpack_cmd(*args) -> list[str]:
    """The ``shardpack`` command of the shardpack this interpreter imports (the console script
    would import the installed one; the A/B harness needs the tree on PYTHONPATH)."""
    return [sys.executable, "-c", "from shardpack.cli import main; main(prog_name='shardpack')",
            *[str(a) for a in args]]


# ------------------------------------------------------------------------------ shared data

def ensure_images(data_dir: Path, count: int, tiny: bool = False) -> tuple[Path, str]:
    """An ImageFolder tree of ``count`` generated JPEGs (scripts/make_images.py; ~100 KB each, or
    ~1 KB with ``tiny``) in DATA_DIR/{imagenet,tiny}-COUNT, made unless a finished one is there.
    Returns (path, the command that made it)."""
    src = Path(data_dir) / f"{'tiny' if tiny else 'imagenet'}-{count}"
    done = Path(f"{src}.done")
    cmd = [sys.executable, str(MAKE_IMAGES), str(src), "--count", str(count)]
    cmd += ["--tiny"] if tiny else []
    shown = shlex.join(["python", "scripts/make_images.py", _shown(src)] + cmd[3:])
    if not done.exists():
        src.parent.mkdir(parents=True, exist_ok=True)
        print("generating:", shown, file=sys.stderr, flush=True)
        subprocess.run(cmd + ["--overwrite"], check=True)
        done.write_text(shown + "\n")
    return src, shown


def ensure_pack(src, out, *options) -> Path:
    """``shardpack pack SRC OUT OPTIONS -q`` unless OUT already holds a dataset."""
    out = Path(out)
    if not (out / "shardpack.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = shardpack_cmd("pack", src, out, *options, "-q")
        print("packing:", shlex.join(cmd[3:]), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, env=child_env())
    return out


def _shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def shard_files(dataset) -> list[str]:
    """The shard files of a packed dataset, from its manifest."""
    with open(os.path.join(dataset, "shardpack.json")) as f:
        return [os.path.join(dataset, s["name"]) for s in json.load(f)["shards"]]


# ------------------------------------------------------------------------------ statistics

def rotated(items: list, rep: int) -> list:
    """``items`` rotated by ``rep``: contenders alternate their places across repetitions."""
    k = rep % len(items) if items else 0
    return items[k:] + items[:k]


def med(values):
    """The median of the values that are not None, or None."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def spread(values, fmt: str = "{:,.2f}") -> str:
    """"lo-hi, n" of the values (the note of a median)."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{fmt.format(min(values))}-{fmt.format(max(values))}, n={len(values)}"


def verdict(ok: bool) -> str:
    """"pass" or "FAIL", as the page writes a target's result."""
    return "pass" if ok else "FAIL"
