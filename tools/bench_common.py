"""Helpers for the packing benchmark (stdlib only: also imported by the peer venv's runners).

Page-cache control (posix_fadvise + mincore), a subprocess runner that records wall time and
peak memory, machine facts, file listing in ImageFolder order, and the markdown section update.
"""
import ctypes
import mmap
import os
import platform
import random
import subprocess
import threading
import time

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value


def list_tree(src):
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


def split_key(relpath):
    """'n00_x/000001.jpg' -> ('n00_x/000001', 'jpg')."""
    stem, ext = os.path.splitext(relpath)
    return stem, ext[1:].lower()


def resident_pages(path):
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


def resident_fraction(paths, sample=300, seed=0):
    """Fraction of page-cache-resident pages over a random sample of paths."""
    paths = random.Random(seed).sample(paths, min(sample, len(paths)))
    res = tot = 0
    for p in paths:
        r, t = resident_pages(p)
        res, tot = res + r, tot + t
    return res / tot if tot else 0.0


def evict(paths):
    """Write back dirty pages, then drop each file's pages with POSIX_FADV_DONTNEED."""
    os.sync()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(paths):
    """Read every file once so it is in the page cache."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 20):
                pass


def files_under(path):
    out = []
    for root, _, files in os.walk(path):
        out.extend(os.path.join(root, f) for f in files)
    return out


def tree_bytes(path):
    return sum(os.path.getsize(p) for p in files_under(path))


def descendants(pid):
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


def _pss_kb(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_measured(cmd, log_path, timeout=None, env=None, interval=0.2):
    """Run cmd under /usr/bin/time; returns dict(rc, wall_s, maxrss_mb, tree_pss_mb, timeout).

    maxrss_mb: ru_maxrss of the largest single process of the tree (GNU time %M);
    tree_pss_mb: peak of the summed PSS of the whole process tree, sampled every `interval` s
    (counts shared pages once, so forked workers are not double counted)."""
    rss_file = log_path + ".time"
    full = ["/usr/bin/time", "-f", "%M", "-o", rss_file] + list(cmd)
    peak = [0]
    done = threading.Event()
    with open(log_path, "wb") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(full, stdout=log, stderr=subprocess.STDOUT, env=env)

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


def machine_info(data_dir):
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    fs, best = "?", ""
    real = os.path.realpath(data_dir)
    with open("/proc/mounts") as f:
        for line in f:
            dev, mnt, typ = line.split()[:3]
            if (real + "/").startswith(mnt.rstrip("/") + "/") and len(mnt) >= len(best):
                fs, best = f"{typ} on {dev} ({mnt})", mnt
    return dict(nproc=os.cpu_count(), ram_gib=mem_kb / 2**20, cpu=cpu,
                kernel=platform.release(), python=platform.python_version(), fs=fs)


def update_section(md_path, heading, body):
    """Replace the markdown section starting with `heading` (up to the next '## ') with body."""
    lines = open(md_path).read().splitlines() if os.path.exists(md_path) else []
    new = [heading, ""] + body.rstrip("\n").splitlines()
    if heading in lines:
        start = lines.index(heading)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        tail = [""] + lines[end:] if end < len(lines) else []
        lines = lines[:start] + new + tail
    else:
        if not lines:
            lines = ["# Benchmarks"]
        lines += [""] + new
    with open(md_path, "w") as f:
        f.write("\n".join(lines) + "\n")
