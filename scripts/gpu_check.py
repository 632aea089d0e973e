"""Does GPU decode make the GPU wait less, and by how much?  One call, under 6 minutes.

On a CUDA machine; the same rows on any machine with ``--cpu-smoke`` (host-clock timing and a
stand-in decoder).

    python3 scripts/gpu_check.py [--budget-s 300] [--out FILE.md] [--json FILE.json]
                               [--workers 2,4,12] [--sections a,b] [--inject-failure SECTION]
    python3 scripts/gpu_check.py --cpu-smoke [--synthetic]      # every section, on the CPU

Sections, each standing alone (a failure is a FAILED row with its one-line cause, the later
sections still run, and the exit code is 1 when any failed):

  data      generate and pack the JPEGs (photos from scripts/make_images.py, else synthetic)
  decode    GPU vs CPU decode of the same 256 samples with the same crops: pixel difference
            and a pass/fail tolerance
  nvjpeg    nvJPEG batched decode alone, full size, beside simplejpeg on one core
  model     ResNet-50 train step (bf16 autocast, channels-last) on a batch already on the GPU:
            the ceiling
  loader    the same step fed by DeviceLoader, CPU decode and GPU decode at 2, 4 and 12 workers
            (loader.cpu.2 ... loader.gpu.12, each a section of its own)
  errors    nvJPEG's message for a broken JPEG, and how shardpack classifies it
  sweep     ``shardpack bench --sweep --model resnet50`` on the packed data, in a process of its
            own: the recommendation, the start's bound, each configuration's samples/s and wait;
            pinned memory and GPU decode must be among them (on the smoke run a simulated 30 ms
            step, and both listed as not measured); its printed table goes to the JSON report
  transfer  pinned vs pageable host-to-device copy
  tests     the GPU tests (pytest; --collect-only on the smoke run)

Every fed run (and the ceiling) goes through a DeviceLoader and reports the GPU idle share from
its own ``DeviceLoader.idle()`` (CUDA events on the training stream; the host's clock on the smoke
run, labelled with its ``timing``), over steady windows that never cross an epoch boundary, after
warm-up steps, the epoch start apart; images/s and per loader core, the host's wait for data (a
separate figure), CPU fallbacks, GPU-failed and bad images, peak device memory (torch's allocator,
and the device's used memory from cudaMemGetInfo, which sees nvJPEG's own allocations).
docs/device.md, "GPU checks".

Runs from the working tree: the repository root goes on sys.path, shardpack need not be
installed (its missing wheels: ``bash scripts/gpu_wheels.sh``).  Rows are written to ``--out`` and
``--json`` as they come, so a killed run still leaves what it measured.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import importlib
import importlib.util
import io
import json
import math
import multiprocessing as mp
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from the working tree: shardpack is not installed there
    sys.path.insert(0, str(ROOT))

# what `import shardpack` and its read/decode path need (pyproject.toml dependencies)
NEEDED = ("numpy", "torch", "PIL", "msgpack", "xxhash", "crc32c", "fsspec", "click", "simplejpeg",
          "zstandard")


def _missing_modules() -> list[str]:
    missing = []
    for name in NEEDED:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 (absent, or a wheel that does not load here)
            missing.append(f"{name} ({type(exc).__name__}: {exc})".replace("\n", " "))
    return missing


_missing = _missing_modules()
if _missing:  # one clear line instead of a traceback from deep inside shardpack
    sys.exit(f"gpu_check: missing Python packages {', '.join(_missing)}: run "
             "`bash scripts/gpu_wheels.sh` and install .whl/ first (docs/device.md, GPU checks)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image, ImageDraw, ImageFilter  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import shardpack  # noqa: E402
from shardpack.transforms.gpudecode import (NVJPEG_STATUS, is_fatal, nvjpeg_statuses,  # noqa: E402
                                 standin_backend)
from shardpack.images.content import is_image_field  # noqa: E402

CLASSES = 10
# (errors after loader: a broken JPEG must not touch nvJPEG's decoder before the timed runs)
SECTIONS = ("data", "decode", "nvjpeg", "model", "loader", "errors", "sweep", "transfer",
            "tests")
# each section's share of the time budget (the loader's is split between its runs); a section's
# deadline is its share of the time left, against the shares of the sections still to come
SHARES = {"data": 0.09, "decode": 0.04, "errors": 0.01, "nvjpeg": 0.04, "model": 0.06,
          "loader": 0.38, "sweep": 0.20, "transfer": 0.02, "tests": 0.16}
NEED_S = {"tests": 40.0}  # a section skipped (not failed) with less than this left
FEEDS = ("cpu", "gpu")
DIFF_IMAGES = 256                       # GPU vs CPU decode: this many images compared
TOL_MEAN, TOL_IMAGE = 5.0, 15.0         # pass: mean abs diff (0-255) over all, and worst image's
FULL_EPOCH, FULL_BUDGET = 48, 300.0     # batches per epoch at the default budget
SMOKE_BUDGET = 90.0                     # --cpu-smoke's (the sweep's 20 s, and tests' 40 s left)
WINDOWS = 4                             # steady windows per fed run (3 on the ceiling)
SWEEP_MIN_S = 30        # the sweep's budget on CUDA: its share, never less (a trial costs ~10 s)
SWEEP_SMOKE_S = 20      # its budget on the smoke run (a simulated 30 ms step)
GPU_TESTS = ("tests/integration/test_gpudecode.py::test_gpu_decoder_has_no_hidden_sync_per_batch",
             "tests/integration/test_gpudecode.py::test_real_nvjpeg_error_on_a_broken_jpeg_is_the_images",
             "tests/integration/test_decode_device.py::test_gpu_decode_close_to_cpu",
             "tests/tools/test_train_example.py::test_two_ranks_on_the_gpus_there_are")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class InjectedFailure(RuntimeError):
    """--inject-failure: raised inside the named section (tests the sections' independence)."""


class Unavailable(RuntimeError):
    """A section needs what an earlier one failed to make."""


def cause(exc: BaseException) -> str:
    """One line: the exception's type and the first line of its message (no C++ backtrace)."""
    text = str(exc).split("Exception raised from ")[0].strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {' '.join(first.split())}"[:300].replace("|", "/")


# -- report ----------------------------------------------------------------------------------------
@dataclass
class Report:
    """The section rows and the fed-run rows, printed as they come and rewritten to ``out`` (a
    markdown table) and ``json_path`` each time, so a killed run still leaves what it measured."""

    out: str | None
    json_path: str | None
    head: str = ""
    rows: list = field(default_factory=list)
    feeds: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def add(self, section: str, check: str, result: str, status: str = "ok", **data) -> None:
        self.rows.append(dict(section=section, check=check, result=result, status=status, **data))
        log(f"{section} | {check}: {result}")
        self.save()

    def feed(self, row: dict) -> None:
        self.feeds.append(row)
        self.save()

    def failed(self) -> list[str]:
        return [r["section"] for r in self.rows if r["status"] == "FAILED"]

    def text(self) -> str:
        lines = [self.head, "", "| section | check | result |", "|---|---|---|"]
        lines += [f"| {r['section']} | {r['check']} | {r['result']} |" for r in self.rows]
        if self.feeds:
            timings = "; ".join(f"{t} timing: {TIMINGS.get(t, t)}" for t in dict.fromkeys(
                f["timing"] for f in self.feeds if f.get("timing")))
            lines += ["", "GPU idle share, between steps, from DeviceLoader.idle()"
                      f"{f' ({timings})' if timings else ''}:", "",
                      "| " + " | ".join(FEED_COLUMNS) + " |",
                      "|" + "---|" * len(FEED_COLUMNS)]
            lines += ["| " + " | ".join(feed_cells(f)) + " |" for f in self.feeds]
            lines += [""] + answer(self.feeds)
        return "\n".join(lines)

    def save(self) -> None:
        if self.out:
            Path(self.out).write_text(self.text() + "\n")
        if self.json_path:
            Path(self.json_path).write_text(json.dumps(
                dict(head=self.head, **self.meta, rows=self.rows, feeds=self.feeds,
                     answer=answer(self.feeds), failed=self.failed()), indent=1, default=str)
                + "\n")


# DeviceLoader.idle()'s "timing": how its figures were taken
TIMINGS = {"cuda-events": "CUDA events on the training stream",
           "host": "the host's clock, batches staying on the CPU"}
FEED_COLUMNS = ("feed", "workers", "images/s", "x ceiling", "img/s per loader core",
                "GPU idle, steady", "GPU idle, epoch start", "host wait",
                "worker / main CPU (cores)", "CPU fallbacks", "GPU failed", "bad",
                "peak alloc / reserved", "device used + / outside torch", "steady steps (windows)")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _gib(x) -> str:
    return "-" if x is None else f"{x / 2**30:.1f}"


def _span(values, fmt) -> str:
    """The range of per-window values, where there are several."""
    return f" ({fmt(min(values))}-{fmt(max(values))})" if len(values) > 1 else ""


def feed_cells(f: dict) -> list[str]:
    if f.get("failed"):
        return [f["feed"], str(f["workers"]), "FAILED: " + f["failed"]] + ["-"] * 12
    ceiling = f.get("x_ceiling")
    start = f.get("epoch_start_ms")
    start = "-" if start is None else f"{start:.0f} ms ({_pct(f.get('epoch_start_share'))} of " \
        "an epoch)"
    cpu = "/".join("-" if c is None else f"{c:.1f}"
                   for c in (f.get("worker_cores"), f.get("main_cores")))
    return [
        f["feed"], str(f["workers"] or "-"),
        f"{f['rate']:,.0f}" + _span(f["window_rates"], lambda v: f"{v:,.0f}"),
        "-" if ceiling is None else f"{ceiling:.2f}x",
        "-" if not f["workers"] else f"{f['rate'] / f['workers']:,.0f}",
        _pct(f["idle"]) + _span(f["window_idle"], _pct), start, _pct(f["host_wait"]),
        cpu.replace("/", " / "),
        str(f.get("cpu_fallbacks", "-")), str(f.get("gpu_failed", "-")), str(f.get("bad", "-")),
        f"{_gib(f.get('peak_alloc'))} / {_gib(f.get('peak_reserved'))} GiB"
        if f.get("peak_alloc") is not None else "-",
        f"+{_gib(f.get('used_delta'))} / {_gib(f.get('outside_torch'))} GiB"
        if f.get("used_delta") is not None else "-",
        f"{f['steady_steps']} ({len(f['window_rates'])}){f.get('note', '')}"]


def answer(feeds: list[dict]) -> list[str]:
    """The question in one line per worker count: the GPU's idle share with CPU decode against
    GPU decode, and the images/s ratio."""
    ok = {(f["feed"], f["workers"]): f for f in feeds if not f.get("failed")}
    lines = []
    ceiling = next((f for f in feeds if f["feed"] == "ceiling" and not f.get("failed")), None)
    for w in sorted({f["workers"] for f in feeds if f["workers"]}):
        cpu, gpu = ok.get(("CPU decode", w)), ok.get(("GPU decode", w))
        if cpu is None or gpu is None or cpu["idle"] is None or gpu["idle"] is None:
            continue
        lines.append(f"* {w} workers: GPU idle {_pct(cpu['idle'])} with CPU decode, "
                     f"{_pct(gpu['idle'])} with GPU decode "
                     f"({100 * (gpu['idle'] - cpu['idle']):+.1f} points); images/s "
                     f"{cpu['rate']:,.0f} -> {gpu['rate']:,.0f} "
                     f"({gpu['rate'] / max(cpu['rate'], 1e-9):.2f}x)")
    if ceiling is not None and lines:
        lines.append(f"* ceiling (batch already on the device): {ceiling['rate']:,.0f} images/s, "
                     f"GPU idle {_pct(ceiling['idle'])}")
    return lines


# -- time budget -------------------------------------------------------------------------------
class Budget:
    """A deadline for the whole run.  Each section (in plan order) gets the time left times its
    share over the shares of the sections still to come: one that ends early leaves its time to
    the later ones."""

    def __init__(self, seconds: float, plan: list[tuple[str, float]]):
        self.seconds = seconds
        self.end = time.perf_counter() + seconds
        self.plan = list(plan)

    def left(self) -> float:
        return self.end - time.perf_counter()

    def deadline(self, key: str, need: float = 1.0) -> float | None:
        """This section's deadline (absolute perf_counter time), or None to skip it."""
        keys = [k for k, _ in self.plan]
        i = keys.index(key)
        share = self.plan[i][1] / max(sum(s for _, s in self.plan[i:]), 1e-9)
        del self.plan[i]
        left = self.left()
        if left < need:
            return None
        return time.perf_counter() + max(left * share, min(need, left))


# -- data ----------------------------------------------------------------------------------------
def _load_make_images():
    spec = importlib.util.spec_from_file_location("make_images",
                                                  ROOT / "scripts" / "make_images.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def photo_generator():
    """scripts/make_images.py if scikit-image and its sample photos are there, else (None, why)."""
    try:
        mod = _load_make_images()
        data_dir = mod.skimage_data_dir()
    except RuntimeError:  # make_images' own: no scikit-image
        return None, "scikit-image not installed"
    missing = [p for p in mod.PHOTOS if not os.path.isfile(os.path.join(data_dir, p))]
    if missing:
        return None, f"scikit-image photos missing: {len(missing)} of {len(mod.PHOTOS)}"
    return mod, ""


_NOISE: list = []  # per-process noise tile for the synthetic generator (made on first use)


def synthetic_jpeg(index: int, seed: int = 0, classes: int = CLASSES, quality: int = 95) -> bytes:
    """A photo-like JPEG from numpy + Pillow alone: smooth colour blobs and a gradient, a few soft
    shapes, a class-dependent tint and sensor-like noise; ~400x350 on average, random sizes and
    orientation.  Depends only on (seed, index)."""
    if not _NOISE:
        _NOISE.append(np.random.default_rng(12345).normal(0, 9, (640, 640, 3)).astype(np.float32))
    rng = np.random.default_rng([seed, index])
    w, h = int(rng.integers(320, 481)), int(rng.integers(260, 441))
    if rng.random() < 0.25:
        w, h = h, w
    # smooth base: a coarse random colour grid, upsampled bicubically
    grid = rng.integers(0, 256, (int(rng.integers(2, 6)), int(rng.integers(2, 6)), 3))
    img = Image.fromarray(grid.astype(np.uint8)).resize((w, h), Image.BICUBIC)
    draw = ImageDraw.Draw(img)  # a few shapes: edges for the DCT, as objects give a photo
    for _ in range(int(rng.integers(1, 5))):
        x0, y0 = int(rng.integers(0, w - 40)), int(rng.integers(0, h - 40))
        x1, y1 = x0 + int(rng.integers(30, w // 2)), y0 + int(rng.integers(30, h // 2))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=fill)
    img = img.filter(ImageFilter.GaussianBlur(1.5))  # soft edges, as out-of-focus objects
    pixels = np.asarray(img, dtype=np.float32)
    angle = rng.uniform(0, 2 * math.pi)
    ramp = (np.cos(angle) * np.linspace(-1, 1, w, dtype=np.float32)[None, :]
            + np.sin(angle) * np.linspace(-1, 1, h, dtype=np.float32)[:, None])
    pixels += ramp[:, :, None] * rng.uniform(15, 50)
    hue = 2 * math.pi * (index % classes) / classes  # the class's tint
    pixels += 25 * np.cos(hue + np.array([0, 2.09, 4.19], dtype=np.float32))
    ny, nx = int(rng.integers(0, 640 - h + 1)), int(rng.integers(0, 640 - w + 1))
    pixels += _NOISE[0][ny:ny + h, nx:nx + w]
    buf = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _write_synthetic(args) -> int:
    root, start, stop, seed, classes = args
    total = 0
    for i in range(start, stop):
        data = synthetic_jpeg(i, seed, classes)
        (Path(root) / f"c{i % classes:02d}" / f"{i:06d}.jpg").write_bytes(data)
        total += len(data)
    return total


def make_synthetic(root: Path, count: int, classes: int = CLASSES, seed: int = 0,
                   workers: int | None = None) -> int:
    """ImageFolder tree root/cNN/NNNNNN.jpg of synthetic JPEGs; returns bytes written."""
    for c in range(classes):
        (root / f"c{c:02d}").mkdir(parents=True, exist_ok=True)
    chunks = [(str(root), s, min(count, s + 64), seed, classes) for s in range(0, count, 64)]
    workers = max(1, min(workers or os.cpu_count() or 1, len(chunks)))
    if workers == 1:
        return sum(map(_write_synthetic, chunks))
    with mp.get_context("fork").Pool(workers) as pool:
        return sum(pool.imap_unordered(_write_synthetic, chunks))



def make_data(tmp: Path, count: int, synthetic: bool) -> tuple[Path, str, dict]:
    """Generate ``count`` images and pack them; returns (dataset path, source, timings)."""
    img = tmp / "img"
    t0 = time.perf_counter()
    mod, why = (None, "--synthetic") if synthetic else photo_generator()
    if mod is not None:
        made = mod.make_images(str(img), count, classes=CLASSES, seed=0)
        source, size = "scripts/make_images.py photos", made["bytes"]
    else:
        log(f"synthetic images ({why})")
        source, size = f"synthetic numpy+Pillow images ({why})", make_synthetic(img, count)
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    shardpack.pack(img, tmp / "ds", shard_format="tar", shard_size="64MB")
    pack_s = time.perf_counter() - t0
    shutil.rmtree(img, ignore_errors=True)  # the packed copy is all the check reads
    source += f", avg {size / max(count, 1) / 1024:.0f} KB"
    return tmp / "ds", source, dict(gen_s=gen_s, pack_s=pack_s)


# -- loaders -------------------------------------------------------------------------------------
def make_loader(run, feed: str, workers: int, *, batch: int | None = None,
                normalize: bool = True):
    """ShardDataset -> DataLoader -> DeviceLoader, as docs/device.md sets it up.  prefetch_factor
    2 (torch's default): at most 2 batches per worker in flight, far from a whole epoch."""
    batch = batch or run.batch
    cuda = run.device.type == "cuda"
    dec = shardpack.CpuDecode(run.size, on_error="skip") if feed == "cpu" else None
    ds = shardpack.ShardDataset(run.need("data")["path"], batch_size=batch, batched=True,
                                decode=dec)
    loader = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0,
                        # raw JPEG bytes for nvJPEG gain nothing from pinning (it reads them on
                        # the host); decoded pixels do
                        pin_memory=cuda and feed != "gpu",
                        prefetch_factor=2 if workers else None)
    backend = standin_backend() if feed == "gpu" and run.smoke else None
    return shardpack.DeviceLoader(loader, device=run.device, decode_on=feed, size=run.size,
                                  normalize=normalize, on_error="skip", decode_backend=backend)


def epochs(dl):
    """``(epoch, position in the epoch, batch)``, epoch after epoch (``set_epoch`` each time),
    never past the data.  Closing this generator closes the loader's iteration."""
    epoch = 0
    while True:
        dl.set_epoch(epoch)
        it = iter(dl)
        pos = 0
        try:
            for batch in it:
                yield epoch, pos, batch
                pos += 1
        finally:
            it.close()
        if not pos:
            raise RuntimeError("the loader yielded no batch in a whole epoch")
        epoch += 1


def close_loader(dl) -> None:
    """Stop persistent DataLoader workers now (not at garbage collection): a run must not share
    the CPUs with the previous run's idle workers."""
    loader = getattr(dl, "loader", None)
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
        loader._iterator = None


def worker_pids(dl) -> list[int]:
    it = getattr(getattr(dl, "loader", None), "_iterator", None)
    return [w.pid for w in getattr(it, "_workers", []) if w.pid]


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pids: list[int]) -> float | None:
    """utime + stime of these processes (Linux /proc), None where unreadable."""
    total = 0.0
    try:
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None
    return total


# -- device sync and memory ----------------------------------------------------------------------
def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Memory:
    """Peak device memory of one run: torch's allocator (max allocated and reserved), and the
    device's used memory (cudaMemGetInfo, sampled every few steps), which also sees what nvJPEG
    and other libraries allocate outside torch's allocator.  None off CUDA."""

    def __init__(self, device, outside0: float = 0.0):
        self.device, self.cuda, self.outside0 = device, device.type == "cuda", outside0

    def used(self) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free, torch.cuda.memory_reserved(self.device)

    def start(self) -> None:
        if not self.cuda:
            return
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        used, reserved = self.used()
        self.used0, self.max_used, self.max_outside = used, used, used - reserved

    def sample(self) -> None:
        if self.cuda:
            used, reserved = self.used()
            self.max_used = max(self.max_used, used)
            self.max_outside = max(self.max_outside, used - reserved)

    def result(self) -> dict:
        if not self.cuda:
            return {}
        self.sample()
        return dict(peak_alloc=torch.cuda.max_memory_allocated(self.device),
                    peak_reserved=torch.cuda.max_memory_reserved(self.device),
                    used_delta=self.max_used - self.used0,
                    outside_torch=max(0, self.max_outside - self.outside0))


# -- the measurement -----------------------------------------------------------------------------
@dataclass
class Mark:
    """``DeviceLoader.idle()`` read between two steps: after ``pos`` steps of the epoch were
    queued (``images`` images in them) and the next batch was handed over, at host time ``t``.
    Its counts end at that hand-over, so the counts between two marks cover exactly the steps
    between them: each step's work (busy) and the wait for the batch after it (idle; at the
    epoch's end, where no batch follows, the last step's work alone)."""

    pos: int
    images: int
    t: float
    idle: dict


def mark(dl, pos: int, images: int) -> Mark:
    """The loader's idle counts now (on CUDA a wait for the events recorded so far: a handful
    of times a run, at window edges)."""
    t = time.perf_counter()
    return Mark(pos, images, t, dl.idle())


def plan_windows(epoch_len: int, warmup: int, windows: int) -> list[range]:
    """Steady windows over positions ``warmup .. epoch_len - 1`` of one epoch, as equal as they
    go: none crosses the epoch's end."""
    steady = max(0, epoch_len - warmup)
    windows = max(1, min(windows, steady))
    size = math.ceil(steady / windows) if steady else 0
    return [range(a, min(a + size, epoch_len)) for a in range(warmup, epoch_len, size)] \
        if size else []


def one_step(step, batch, bad: "torch.Tensor", ends: list) -> int:
    """Queue ``step`` on a fed batch (a dict) or the ceiling's resident one (a tuple), count its
    bad images into ``bad``, and keep the host at most two steps ahead of a CUDA device (``ends``:
    the last steps' end events); returns the images stepped."""
    images, labels = (batch["image"], batch["cls"]) if isinstance(batch, dict) else batch
    step(images, labels)
    if isinstance(batch, dict) and "__bad__" in batch:
        bad += batch["__bad__"].sum()
    if images.is_cuda:
        ends.append(torch.cuda.Event())
        ends[-1].record()
        if len(ends) > 2:
            ends.pop(0).synchronize()
    return int(images.shape[0])


def train_run(run, step, dl, *, warmup: int, epoch_len: int, windows: int, deadline: float,
              mem: Memory, epoch_start: bool = True) -> dict:
    """Run ``step`` on the batches of ``dl`` (a ``DeviceLoader``) as a training loop does: the
    host stays at most two steps ahead of the device (it waits for the step two back, as a loop
    that logs its loss would), never a synchronize per step.  The idle share is the loader's
    own, ``dl.idle()``, read at the edges of the steady windows (:func:`plan_windows`: the first
    epoch after ``warmup`` steps) and at the epoch's end (:class:`Mark`); with ``epoch_start``,
    also once the next epoch's first batch is handed over: its ``start_idle_s`` is the epoch
    start's.  Stops early at ``deadline``."""
    device = run.device
    starts = {w.start for w in plan_windows(epoch_len, warmup, windows)}
    bad = torch.zeros((), dtype=torch.int64, device=device)
    marks: list[Mark] = []
    ends: list = []  # the last steps' end events (CUDA): the host's lead
    cpu_at: dict = {}
    note, images, steps, start = "", 0, 0, None
    for epoch in (0, 1) if epoch_start else (0,):
        dl.set_epoch(epoch)
        it = iter(dl)
        try:
            for pos, batch in enumerate(it):
                if epoch == 1:  # the next epoch's first batch is here: its start, then stop
                    start = mark(dl, pos, images)
                    break
                late = time.perf_counter() > deadline
                if pos in starts or (late and marks):
                    marks.append(mark(dl, pos, images))
                    cpu_at = cpu_at or cpu_start(dl, marks[0].t)
                if late:
                    note = f", stopped at the time budget after {steps} steps"
                    break
                images, steps = images + one_step(step, batch, bad, ends), steps + 1
                if steps % 8 == 0:
                    mem.sample()
        finally:
            it.close()
        if epoch == 0:
            if marks and not note:  # the epoch's end: its last step's busy time is counted
                marks.append(mark(dl, steps, images))
            _cpu_end(cpu_at)
            if note:
                break
    sync(device)
    if not steps and not note:
        raise RuntimeError("the loader yielded no batch in a whole epoch")
    out = summarize(marks, start, epoch_len)
    out.update(steps=steps, bad=int(bad), note=note, **cpu_use(cpu_at), **mem.result())
    return out


def cpu_start(dl, t: float) -> dict:
    pids = worker_pids(dl)
    return dict(t=t, pids=pids, workers=cpu_seconds(pids) if pids else None,
                main=time.process_time())


def _cpu_end(at: dict) -> None:
    if at and "end_t" not in at:
        at["end_t"] = time.perf_counter()
        at["end_workers"] = cpu_seconds(at["pids"]) if at["pids"] else None
        at["end_main"] = time.process_time()


def cpu_use(at: dict) -> dict:
    """Cores busy over the steady part: the DataLoader workers', and the main process's (the
    training thread, DeviceLoader's producer thread, GPU decode's host work)."""
    if not at or "end_t" not in at:
        return dict(worker_cores=None, main_cores=None)
    wall = max(at["end_t"] - at["t"], 1e-9)
    workers = None if at["workers"] is None or at["end_workers"] is None \
        else (at["end_workers"] - at["workers"]) / wall
    return dict(worker_cores=workers, main_cores=(at["end_main"] - at["main"]) / wall)


def summarize(marks: list[Mark], start: Mark | None, epoch_len: int) -> dict:
    """From consecutive marks (``DeviceLoader.idle()`` figures), per steady window: idle and busy
    seconds (together the window's span on the step's device), the idle share and images/s;
    all windows together; the host's wait for data over the windows' host time; and the epoch
    start's idle time (``start_idle_s`` between the epoch's end and ``start``)."""
    rates, idles = [], []
    idle_s = busy_s = wait_s = wall_s = 0.0
    images = count = 0
    for a, b in zip(marks, marks[1:], strict=False):
        idle = b.idle["idle_s"] - a.idle["idle_s"]
        busy = b.idle["busy_s"] - a.idle["busy_s"]
        if idle + busy <= 0 or b.pos <= a.pos:
            continue
        rates.append((b.images - a.images) / (idle + busy))
        idles.append(idle / (idle + busy))
        idle_s, busy_s, images, count = idle_s + idle, busy_s + busy, \
            images + b.images - a.images, count + b.pos - a.pos
        wait_s += b.idle["host_wait_s"] - a.idle["host_wait_s"]
        wall_s += b.t - a.t
    span = idle_s + busy_s
    start_s = None
    if start is not None and marks \
            and start.idle["epoch_starts"] > marks[-1].idle["epoch_starts"]:
        start_s = start.idle["start_idle_s"] - marks[-1].idle["start_idle_s"]
    epoch_s = span / count * epoch_len if count else None
    return dict(rate=images / span if span else 0.0, window_rates=rates,
                idle=idle_s / span if span else None, window_idle=idles,
                timing=marks[-1].idle["timing"] if marks else None, idle_s=idle_s,
                busy_s=busy_s, host_wait=wait_s / wall_s if wall_s else None,
                steady_steps=count, epoch_start_ms=None if start_s is None else start_s * 1000,
                epoch_start_share=start_s / epoch_s if start_s is not None and epoch_s
                else None)


# -- the run -------------------------------------------------------------------------------------
class Run:
    """What the sections share: options, the device, the budget, the report, and what earlier
    sections made (``need`` raises :class:`Unavailable` where one failed)."""

    def __init__(self, args, device, report: Report, budget: Budget):
        self.args, self.device, self.report, self.budget = args, device, report, budget
        self.smoke = args.cpu_smoke
        self.batch, self.size = args.batch, args.size
        self.made: dict = {}
        self.outside0 = 0.0
        if device.type == "cuda":
            free, total = torch.cuda.mem_get_info(device)
            self.outside0 = (total - free) - torch.cuda.memory_reserved(device)

    def need(self, name: str):
        if name not in self.made:
            raise Unavailable(f"needs the {name} section's result, which it did not make")
        return self.made[name]

    def inject(self, name: str) -> None:
        for target in self.args.inject_failure or ():
            if name == target or name.startswith(target + "."):
                raise InjectedFailure(f"injected failure in {name} (--inject-failure {target})")

    def section(self, name: str, title: str, fn, *args, need: float = 1.0) -> None:
        """Run ``fn(self, deadline, *args)`` as section ``name``: any exception becomes a FAILED
        row with its one-line cause (the traceback goes to stderr), and the next section runs."""
        deadline = self.budget.deadline(name, need=NEED_S.get(name.split(".")[0], need))
        if deadline is None:
            self.report.add(name, title, "skipped: out of time budget", status="skipped")
            return
        log(f"-- {name}: {title} ({deadline - time.perf_counter():.0f} s)")
        try:
            self.inject(name)
            fn(self, deadline, *args)
        except Exception as exc:  # noqa: BLE001 - every section stands alone
            traceback.print_exc()
            self.report.add(name, title, f"FAILED: {cause(exc)}", status="FAILED",
                            cause=cause(exc))
            if name.startswith("loader."):
                _, feed, workers = name.split(".")
                self.report.feed(dict(feed=FEED_NAMES[feed], workers=int(workers),
                                      failed=cause(exc)))
        finally:
            gc.collect()
            if self.device.type == "cuda":
                try:
                    torch.cuda.synchronize(self.device)
                    torch.cuda.empty_cache()
                except Exception as exc:  # noqa: BLE001 - a sticky CUDA error: later rows say so
                    log(f"after {name}: {cause(exc)}")

    def model_step(self):
        """The training step, built once (by the model section, or by the first loader run when
        the model section failed)."""
        if "model" not in self.made:
            self.made["model"] = make_model(self.device, self.smoke)
        return self.made["model"]


FEED_NAMES = {"cpu": "CPU decode", "gpu": "GPU decode", "ceiling": "ceiling"}


def make_model(device, smoke: bool):
    """ResNet-50 (torchvision), bf16 autocast, channels-last, SGD; on the CPU smoke run a tiny
    conv net (torchvision need not import there)."""
    if smoke:
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=4), torch.nn.ReLU(),
                                    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                    torch.nn.Linear(8, CLASSES))
    else:
        import torchvision  # the GPU path only

        model = torchvision.models.resnet50(num_classes=CLASSES)
        torch.backends.cudnn.benchmark = True
    model = model.to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(images, labels):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


# -- sections ------------------------------------------------------------------------------------
def sec_data(run: Run, deadline: float) -> None:
    tmp = run.args.tmp
    path, source, t = make_data(Path(tmp), run.args.images, run.args.synthetic)
    run.made["data"] = dict(path=path, source=source, count=run.args.images)
    run.report.head += f"; {run.args.images:,} images: {source}"
    run.report.add("data", f"generate + pack {run.args.images:,} JPEGs (tar shards), "
                   f"{run.args.images // run.batch} batches of {run.batch} an epoch",
                   f"{t['gen_s']:.1f} s + {t['pack_s']:.1f} s")


def decode_difference(run: Run, deadline: float, images: int, batch: int = 64) -> dict:
    """GPU decode (the stand-in on the smoke run) and CPU decode of the same samples with the
    same crops (same seed, epoch, index): mean absolute difference per image, 0-255."""
    gpu = make_loader(run, "gpu", 0, batch=batch, normalize=False)
    cpu = make_loader(run, "cpu", 0, batch=batch, normalize=False)
    means, worst_pixel, n = [], 0.0, 0
    gi, ci = epochs(gpu), epochs(cpu)
    try:
        for (_, _, g), (_, _, c) in zip(gi, ci, strict=False):
            order_g, order_c = g["__index__"].tolist(), c["__index__"].tolist()
            c_img = c["image"]
            if order_g != order_c:  # same dataset, seed and epoch: the same samples, in order
                pos = {k: i for i, k in enumerate(order_c)}
                c_img = c_img[[pos[k] for k in order_g]]
            keep = ~(g["__bad__"] | c["__bad__"][[order_c.index(k) for k in order_g]])
            diff = (g["image"].float() - c_img.float()).abs()[keep]
            means += diff.mean(dim=(1, 2, 3)).tolist()
            worst_pixel = max(worst_pixel, float(diff.amax()) if diff.numel() else 0.0)
            n += int(keep.sum())
            if n >= images or time.perf_counter() > deadline:
                break
    finally:
        gi.close()
        ci.close()
    return dict(mean=sum(means) / max(len(means), 1), worst_image=max(means, default=0.0),
                max_pixel=worst_pixel, n=n, fallbacks=gpu.stats["cpu_fallbacks"])


def sec_decode(run: Run, deadline: float) -> None:
    want = min(DIFF_IMAGES, run.need("data")["count"])
    d = decode_difference(run, deadline, want, batch=min(64, run.batch * 4))
    ok = d["mean"] <= TOL_MEAN and d["worst_image"] <= TOL_IMAGE and d["n"] >= want
    verdict = "PASS" if ok else "FAILED"
    result = (f"{verdict}: mean abs diff {d['mean']:.2f} (tolerance {TOL_MEAN:g}), worst image "
              f"{d['worst_image']:.2f} ({TOL_IMAGE:g}), max pixel {d['max_pixel']:.0f}, over "
              f"{d['n']} images ({d['fallbacks']} decoded on the CPU by the GPU path)")
    run.report.add("decode", f"GPU vs CPU decode, same {want} samples, same crops "
                   f"({run.size}x{run.size}){' [stand-in decoder]' if run.smoke else ''}",
                   result, status="ok" if ok else "FAILED",
                   cause=None if ok else "GPU vs CPU difference over tolerance", **d)


def broken_jpeg() -> "torch.Tensor":
    return torch.frombuffer(bytearray(b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4),
                            dtype=torch.uint8)


def sec_errors(run: Run, deadline: float) -> None:
    """nvJPEG's own message for a broken JPEG (torchvision's text, with its C++ backtrace) and
    how shardpack reads it: an image's fault goes to the CPU, a device's is raised."""
    if run.smoke:
        decode = standin_backend()
    else:
        import torchvision.io as tvio

        def decode(items):
            return tvio.decode_jpeg(items, device=run.device, mode=tvio.ImageReadMode.RGB)
    try:
        decode([broken_jpeg()])
    except RuntimeError as exc:
        text = str(exc)
    else:
        raise AssertionError("a broken JPEG decoded without an error")
    found = nvjpeg_statuses(text)
    head = " ".join(text.split("Exception raised from ")[0].split())[:160].replace("|", "/")
    trace = "with" if "Exception raised from " in text else "without"
    fatal = is_fatal(RuntimeError(text))
    if not found or fatal:
        raise AssertionError(f"classified as {'the device' if fatal else 'unreadable'}'s fault: "
                             f"'{head}'")
    what, status = found[0]
    run.report.add("errors", "nvJPEG's error for a broken JPEG, as shardpack reads it"
                   f"{' [stand-in decoder]' if run.smoke else ''}",
                   f"the image's fault (status {status} {NVJPEG_STATUS.get(status, '?')}, from "
                   f"'{what}'), {trace} a C++ backtrace after it: '{head}'", message=text[:2000])


def sec_nvjpeg(run: Run, deadline: float) -> None:
    encoded = jpeg_bytes(run.need("data")["path"], 64 if run.smoke else 1024)
    per_call = 16 if run.smoke else 256
    rate = batched_decode_rate(run, encoded, per_call, deadline)
    one = cpu_full_decode_rate(encoded[:256], min(deadline, time.perf_counter() + 5))
    run.report.add("nvjpeg", f"nvJPEG batched decode alone, full size ({per_call} images a call)"
                   f"{' [stand-in decoder]' if run.smoke else ''}",
                   f"{rate:,.0f} img/s = {rate / max(one, 1e-9):.1f} cores of simplejpeg "
                   f"({one:,.0f} img/s on one core, full size)", rate=rate, simplejpeg=one)


def jpeg_bytes(ds_path, images: int) -> list[bytes]:
    """The encoded images of the first ``images`` samples, read straight from the shards."""
    reader = shardpack.open_reader(ds_path)
    out = []
    for i in range(min(images, len(reader))):
        sample = reader.read_sample(i)
        name = next(k for k in sample if is_image_field(k))
        out.append(bytes(sample[name]))
    return out


def cpu_full_decode_rate(encoded: list[bytes], deadline: float) -> float:
    """simplejpeg (libjpeg-turbo) full-size decode in one thread: the per-core baseline."""
    import simplejpeg

    simplejpeg.decode_jpeg(encoded[0])
    start, done = time.perf_counter(), 0
    for data in encoded:
        simplejpeg.decode_jpeg(data)
        done += 1
        if time.perf_counter() > deadline:
            break
    return done / (time.perf_counter() - start)


def batched_decode_rate(run: Run, encoded: list[bytes], per_call: int, deadline: float) -> float:
    if run.smoke:
        decode = standin_backend()
    else:
        import torchvision.io as tvio

        def decode(items):
            return tvio.decode_jpeg(items, device=run.device, mode=tvio.ImageReadMode.RGB)
    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in encoded]
    calls = [data[i:i + per_call] for i in range(0, len(data), per_call)]
    decode(calls[0])  # warm-up: nvJPEG handles, allocator
    sync(run.device)
    start, done = time.perf_counter(), 0
    for _ in range(3):
        for chunk in calls:
            decode(chunk)
            done += len(chunk)
        if time.perf_counter() > deadline:
            break
    sync(run.device)
    return done / (time.perf_counter() - start)


def sec_model(run: Run, deadline: float) -> None:
    """The ceiling: the step on one batch already on the device, so no data loading at all (a
    DeviceLoader only hands that batch over, so that the idle share is taken as the fed runs'
    is)."""
    step = run.model_step()
    g = torch.Generator().manual_seed(0)
    images = torch.randn(run.batch, 3, run.size, run.size, generator=g).to(run.device)
    resident = (images.contiguous(memory_format=torch.channels_last),
                torch.randint(0, CLASSES, (run.batch,), generator=g).to(run.device))
    warmup, per = (2, 2) if run.smoke else (6, 8)
    epoch_len = warmup + 3 * per
    # a tuple passes DeviceLoader as it is (a dict's "image" would be converted as a uint8 NHWC
    # batch)
    dl = shardpack.DeviceLoader([resident] * epoch_len, device=run.device)
    mem = Memory(run.device, run.outside0)
    mem.start()
    r = train_run(run, step, dl, warmup=warmup, epoch_len=epoch_len, windows=3,
                  deadline=deadline, mem=mem, epoch_start=False)
    row = dict(feed="ceiling", workers=0, x_ceiling=None, **r)
    run.made["ceiling"] = r["rate"]
    run.report.feed(row)
    run.report.add("model", f"{model_name(run)} bf16 channels-last train step, batch of "
                   f"{run.batch} already on the {run.device.type.upper()} (the ceiling)",
                   f"{r['rate']:,.0f} img/s, GPU idle {_pct(r['idle'])} ({r['timing']} timing)"
                   f"{r['note']}")


def model_name(run: Run) -> str:
    return "tiny conv net (smoke)" if run.smoke else "ResNet-50"


def sec_loader(run: Run, deadline: float, feed: str, workers: int) -> None:
    step = run.model_step()
    dl = make_loader(run, feed, workers)
    mem = Memory(run.device, run.outside0)
    mem.start()
    epoch_len = run.need("data")["count"] // run.batch
    warmup = max(1, min(workers + 2, epoch_len // 3))
    try:
        r = train_run(run, step, dl, warmup=warmup, epoch_len=epoch_len,
                      windows=WINDOWS if not run.smoke else 2, deadline=deadline, mem=mem)
    finally:
        close_loader(dl)
    ceiling = run.made.get("ceiling")
    row = dict(feed=FEED_NAMES[feed], workers=workers,
               x_ceiling=r["rate"] / ceiling if ceiling else None,
               cpu_fallbacks=dl.stats["cpu_fallbacks"], gpu_failed=dl.stats["gpu_failed"],
               loader_idle=dl.idle(), loader_wait=dl.wait_fraction, warmup=warmup, **r)
    run.report.feed(row)
    start = "-" if r["epoch_start_ms"] is None else f"{r['epoch_start_ms']:.0f} ms"
    run.report.add(f"loader.{feed}.{workers}", f"{model_name(run)} fed by DeviceLoader, "
                   f"{FEED_NAMES[feed]}, {workers} workers",
                   f"{r['rate']:,.0f} img/s, GPU idle {_pct(r['idle'])} (epoch start {start}; "
                   f"{r['timing']} timing), "
                   f"host wait {_pct(r['host_wait'])}, {row['cpu_fallbacks']} CPU fallbacks, "
                   f"{row['gpu_failed']} GPU failed, {r['bad']} bad{r['note']}")


def sec_transfer(run: Run, deadline: float) -> None:
    size = (16 << 20) if run.smoke else (256 << 20)
    rates = []
    for pinned in (True, False):
        host = torch.empty(size, dtype=torch.uint8, pin_memory=pinned and not run.smoke)
        host.fill_(1)  # touch the pages: a first-touch fault is no copy cost
        dev = torch.empty(size, dtype=torch.uint8, device=run.device)
        dev.copy_(host, non_blocking=pinned)
        sync(run.device)
        start, done = time.perf_counter(), 0
        while done < 10 and time.perf_counter() < deadline:
            dev.copy_(host, non_blocking=pinned)
            done += 1
        sync(run.device)
        rates.append(done * size / (time.perf_counter() - start) / 1e9)
        del host, dev
    run.report.add("transfer", f"host-to-device copy {size >> 20} MB, pinned / pageable"
                   f"{' [stand-in: host to host]' if run.smoke else ''}",
                   f"{rates[0]:.1f} / {rates[1]:.1f} GB/s")


def sec_tests(run: Run, deadline: float) -> None:
    """The GPU tests, in a process of their own (a hang is killed at the deadline); on the smoke
    run only collected, which checks that they exist."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", *GPU_TESTS]
    if run.smoke:
        cmd.append("--collect-only")
    code, out, _ = child(cmd, max(5.0, deadline - time.perf_counter()), "pytest")
    log("pytest:\n" + out[-6000:])
    lines = [line for line in out.strip().splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else "no output"
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    if code != 0:
        raise AssertionError(f"{summary}; " + "; ".join(failures)[:200])
    if run.smoke:
        count = re.search(r"(\d+) tests? collected", out)
        if not count or int(count.group(1)) != len(GPU_TESTS):
            raise AssertionError(f"expected {len(GPU_TESTS)} GPU tests, {summary}")
        summary += " (smoke: collected, not run)"
    run.report.add("tests", f"GPU tests (pytest, {len(GPU_TESTS)}): no hidden sync, the real "
                   "nvJPEG error, GPU vs CPU decode, 2 ranks on the GPUs there are", summary)


def child(cmd: list[str], timeout: float, what: str, merge: bool = True) -> tuple[int, str, str]:
    """Run ``cmd`` from the repository root with the root on PYTHONPATH (shardpack is not
    installed there; the child's own children inherit it), in a session of its own, killed with
    all its children at ``timeout``; returns (exit code, stdout, stderr; with ``merge`` stderr is
    in stdout)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge else subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(os.environ, PYTHONPATH=path))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        log(((out or "") + (err or ""))[-4000:])
        raise TimeoutError(f"{what} did not finish in its time budget ({timeout:.0f} s)") \
            from None
    return proc.returncode, out, err or ""


def sec_sweep(run: Run, deadline: float) -> None:
    """``shardpack bench --sweep`` on the packed data, as a user runs it (``python -m
    shardpack.cli``, its trials in processes of their own): on CUDA with ResNet-50's train step,
    where pinned memory and GPU decode must be measured; on the smoke run with a simulated 30 ms
    step on the CPU, where they must be listed as not measured.  Its printed table goes to the
    JSON report (``table``) and the log; its figures to ``sweep``."""
    left = int(deadline - time.perf_counter())
    budget = max(10, min(SWEEP_SMOKE_S, left)) if run.smoke else max(SWEEP_MIN_S, left - 5)
    figures = Path(run.args.tmp) / "sweep.json"
    step = ["--step-ms", "30", "--device", "cpu"] if run.smoke else ["--model", "resnet50"]
    cmd = [sys.executable, "-m", "shardpack.cli", "bench", str(run.need("data")["path"]),
           "--sweep", *step, "--batch-size", str(run.batch), "--size", str(run.size),
           "--workers", str(min(run.args.workers, default=2)), "--budget", str(budget),
           "--json", str(figures), "-q"]
    code, out, err = child(cmd, budget + 120, "the sweep", merge=False)
    log("sweep:\n" + out[-6000:])
    if code != 0:
        last = (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"shardpack bench --sweep exited {code}: {last}")
    data = json.loads(figures.read_text())
    result = sweep_result(data, cuda=not run.smoke)
    what = "a simulated 30 ms step" if run.smoke else "ResNet-50's train step"
    run.report.add("sweep", f"shardpack bench --sweep, {what}, batch {run.batch}, "
                   f"{min(run.args.workers, default=2)} workers to start, {budget} s budget",
                   result, table=out, sweep=data)


def sweep_result(data: dict, cuda: bool) -> str:
    """The sweep's row: what it recommends, what bounds the start, each configuration's
    samples/s and wait; raises where a configuration failed, or where pinned memory and GPU
    decode were not measured on CUDA (or claimed measured without it)."""
    configs = data["configurations"]
    failed = [c for c in configs if c.get("error")]
    if not configs or configs[0].get("samples_per_s") is None:
        raise AssertionError("the start was not measured: "
                             f"{configs[0].get('error') if configs else 'no configuration'}")
    if failed:
        raise AssertionError(f"{len(failed)} configuration(s) failed: " + "; ".join(
            f"{c['name']}: {c['error']}" for c in failed)[:240])
    gpu = {"pinned off": [c for c in configs if c["lever"] == "pin"],
           "decode on GPU": [c for c in configs if c["config"]["decode"] == "gpu"]}
    skipped = {n["lever"]: n["why"] for n in data["not_measured"]}
    if cuda:  # (not measured for lack of time: listed under the configuration's name)
        missing = [f"{name} ({skipped.get(name, 'not planned')})"
                   for name, found in gpu.items() if not found]
        if missing:
            raise AssertionError("not measured on CUDA: " + "; ".join(missing))
        place = "pinned off and decode on GPU measured"
    else:
        if any(gpu.values()) or not {"pin", "decode on GPU"} <= set(skipped):
            raise AssertionError("pinned memory or GPU decode measured without CUDA")
        place = "pinned memory and GPU decode not measured (no CUDA)"
    rec, bound = data["recommendation"], data["bound"] or {}
    use = rec["name"] or f"none ({rec.get('why', '')})"
    rows = ", ".join(f"{c['name']} {c['samples_per_s']:,.0f}/s wait "
                     f"{100 * (c['wait_fraction'] or 0):.1f}%" for c in configs)
    return (f"use: {use}; the start bound by {bound.get('kind', '-')}; {rows}; {place}; "
            f"{configs[0].get('timing')} timing, {data['elapsed_s']:.0f} s").replace("|", "/")


# -- main ----------------------------------------------------------------------------------------
def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", "--budget", dest="budget", type=float, default=None,
                   help=f"seconds for the whole run (default {FULL_BUDGET:g}; "
                   f"{SMOKE_BUDGET:g} with --cpu-smoke); the data, windows and sections scale "
                   "to it")
    p.add_argument("--images", type=int, default=None,
                   help=f"images to generate (default {FULL_EPOCH} batches' worth at the default "
                   "budget, scaled with it; 10 batches with --cpu-smoke)")
    p.add_argument("--batch", type=int, default=None, help="batch size (256; 16 smoke)")
    p.add_argument("--size", type=int, default=None, help="crop size (224; 32 smoke)")
    p.add_argument("--workers", default="2,4,12",
                   help="DataLoader worker counts for the fed runs (default 2,4,12)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"sections to run, in this order: {','.join(SECTIONS)}")
    p.add_argument("--inject-failure", action="append", metavar="SECTION",
                   help="raise inside this section (or loader.cpu.2 ...): the others still run")
    p.add_argument("--out", default=None, help="also write the tables to this file (markdown)")
    p.add_argument("--json", default=None, help="also write every figure to this file")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="every section on the CPU (host-clock timing, stand-in decoder), tiny "
                   "sizes (CI)")
    p.add_argument("--synthetic", action="store_true",
                   help="generate numpy+Pillow images even where scikit-image is installed")
    args = p.parse_args(argv)
    smoke = args.cpu_smoke
    args.budget = args.budget or (SMOKE_BUDGET if smoke else FULL_BUDGET)
    args.batch = args.batch or (16 if smoke else 256)
    args.size = args.size or (32 if smoke else 224)
    args.workers = [int(w) for w in str(args.workers).split(",") if w.strip()]
    if args.images is None:  # whole batches; fewer of them on a smaller budget
        per_epoch = 10 if smoke else max(16, min(FULL_EPOCH,
                                                 round(FULL_EPOCH * args.budget / FULL_BUDGET)))
        args.images = per_epoch * args.batch
    # whole batches only: no odd-sized last batch re-tuning cuDNN mid-timing
    args.images = max(args.batch, -(-args.images // args.batch) * args.batch)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in args.sections if s not in SECTIONS]
    names = set(SECTIONS) | {f"loader.{f}.{w}" for f in FEEDS for w in args.workers}
    unknown += [s for s in args.inject_failure or () if s not in names]
    if unknown:
        p.error(f"unknown section(s) {', '.join(unknown)}: choose from {', '.join(SECTIONS)} "
                "(or loader.cpu.N / loader.gpu.N)")
    return args


def plan(args) -> list[tuple]:
    """(budget key, title, function, extra args) in run order."""
    out = []
    titles = {"data": "generate + pack the JPEGs", "decode": "GPU vs CPU decode, same crops",
              "errors": "nvJPEG's error for a broken JPEG, as shardpack reads it",
              "nvjpeg": "nvJPEG batched decode alone", "model": "train step on a resident batch "
              "(the ceiling)", "sweep": "shardpack bench --sweep on the packed data",
              "transfer": "host-to-device copy", "tests": "GPU tests (pytest)"}
    funcs = {"data": sec_data, "decode": sec_decode, "errors": sec_errors, "nvjpeg": sec_nvjpeg,
             "model": sec_model, "sweep": sec_sweep, "transfer": sec_transfer,
             "tests": sec_tests}
    for name in args.sections:
        if name == "loader":
            for w in args.workers:
                for feed in FEEDS:
                    out.append((f"loader.{feed}.{w}", f"fed by DeviceLoader, {FEED_NAMES[feed]}, "
                                f"{w} workers", sec_loader, (feed, w)))
        else:
            out.append((name, titles[name], funcs[name], ()))
    return out


def shares(steps) -> list[tuple[str, float]]:
    loader = [key for key, *_ in steps if key.startswith("loader.")]
    return [(key, SHARES["loader"] / len(loader) if key.startswith("loader.") else SHARES[key])
            for key, *_ in steps]


def main(argv=None) -> int:
    args = parse(argv)
    # the smoke run asks for 12 workers on any machine, on purpose
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device here (torch "
                 f"{torch.__version__}); run with --cpu-smoke to check the script on CPU")
    steps = plan(args)
    budget = Budget(args.budget, shares(steps))
    # a hang becomes a traceback and an exit, before whoever runs this gives up on it
    faulthandler.dump_traceback_later(args.budget + 45, exit=True)
    if smoke:
        device = torch.device("cpu")
        where = f"CPU smoke run (host-clock timing, stand-in decoder) on " \
                f"{platform.processor() or platform.machine()}"
        versions = f"torch {torch.__version__}"
    else:
        device = torch.device("cuda", torch.cuda.current_device())  # "cuda" != "cuda:0"
        where = f"GPU check on {torch.cuda.get_device_name(device)}"
        versions = f"torch {torch.__version__}, torchvision {torchvision_version()}"
    report = Report(args.out, args.json)
    cmd = "python3 scripts/gpu_check.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report.head = (f"{where}, {versions}, {os.cpu_count()} CPUs, "
                   f"{time.strftime('%Y-%m-%d')}: `{cmd.strip()}`")
    report.meta = dict(smoke=smoke, device=str(device), budget_s=args.budget, batch=args.batch,
                       size=args.size, workers=args.workers, tolerance=dict(
                           mean=TOL_MEAN, worst_image=TOL_IMAGE))
    report.save()
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        args.tmp = tmp
        run = Run(args, device, report, budget)
        for name, title, fn, extra in steps:
            run.section(name, title, fn, *extra)
    faulthandler.cancel_dump_traceback_later()
    print(report.text(), flush=True)
    failed = report.failed()
    if failed:
        log(f"gpu_check: {len(failed)} section(s) failed: {', '.join(failed)}")
        return 1
    return 0


def torchvision_version() -> str:
    try:
        import torchvision
    except Exception as exc:  # noqa: BLE001 - reported; the sections that need it fail alone
        return f"not importable ({cause(exc)})"
    return torchvision.__version__


if __name__ == "__main__":
    sys.exit(main())
