"""GPU checks in one short run (< 5 minutes on a CUDA machine); prints a markdown table.

    python tools/gpu_check.py [--images 8192] [--workers 8] [--budget 270] [--out FILE.md]
    python tools/gpu_check.py --cpu-smoke [--synthetic]   # the CPU parts on any machine

Measures: GPU (nvJPEG) vs CPU decode difference on the same crops; nvJPEG batched decode
images/s; end-to-end DeviceLoader images/s with CPU decode and with GPU decode at the same worker
count; a torchvision ResNet-50 bf16 training step fed by the loader (images/s, data wait) against
the same step on a batch already on the GPU; pinned vs pageable host-to-device GB/s.

Data is generated in a temp dir (tools/make_images.py when scikit-image and its photos are there,
else a numpy + Pillow generator of smooth gradients + noise; ``--synthetic`` forces the latter)
and packed.  Runs from the working tree: the repository root goes on sys.path, shardpack need not
be installed (its wheels: ``bash tools/gpu_wheels.sh``, docs/device.md "GPU checks").

Every section has a time budget and the whole run one more (``--budget``): a section that would
overrun stops early or is skipped, with a note in the table.  Rows are printed, and written to
``--out``, as they come, so a killed run still leaves what it measured.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import importlib
import importlib.util
import io
import itertools
import math
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from the working tree: shardpack is not installed there
    sys.path.insert(0, str(ROOT))

# what `import shardpack` and its read/decode path need (pyproject.toml dependencies)
NEEDED = ("numpy", "torch", "PIL", "msgpack", "xxhash", "crc32c", "fsspec", "click", "simplejpeg")


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
             "`bash tools/gpu_wheels.sh` and install .whl/ first (docs/device.md, GPU checks)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image, ImageDraw, ImageFilter  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import shardpack  # noqa: E402
from shardpack.images import is_image_field  # noqa: E402

CLASSES = 10
SMOKE_IMAGES, SMOKE_BATCH, SMOKE_WORKERS = 300, 32, 2


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- time budget -------------------------------------------------------------------------------
class Budget:
    """A deadline for the whole run; each section gets min(its own cap, what is left)."""

    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()

    def section(self, cap: float, need: float) -> float | None:
        """Deadline for a section of at most ``cap`` s, or None (skip) if under ``need`` s left."""
        left = self.left()
        if left < need:
            return None
        return time.perf_counter() + min(cap, left)


class Table:
    """Rows of (check, result), printed as they come and rewritten to ``out`` each time."""

    def __init__(self, out: str | None):
        self.out, self.head, self.rows = out, "", []

    def add(self, check: str, result: str) -> None:
        self.rows.append((check, result))
        log(f"{check}: {result}")
        self.save()

    def text(self) -> str:
        lines = [self.head, "", "| check | result |", "|---|---|"]
        return "\n".join(lines + [f"| {a} | {b} |" for a, b in self.rows])

    def save(self) -> None:
        if self.out:
            Path(self.out).write_text(self.text() + "\n")


# -- data ----------------------------------------------------------------------------------------
def _load_make_images():
    spec = importlib.util.spec_from_file_location("make_images", ROOT / "tools" / "make_images.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def photo_generator():
    """tools/make_images.py if scikit-image and its sample photos are there, else (None, why)."""
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


def make_data(tmp: Path, count: int, synthetic: bool, table: Table) -> tuple[Path, str]:
    """Generate ``count`` images and pack them; returns (dataset path, what generated them)."""
    img = tmp / "img"
    t0 = time.perf_counter()
    mod, why = (None, "--synthetic") if synthetic else photo_generator()
    if mod is not None:
        made = mod.make_images(str(img), count, classes=CLASSES, seed=0)
        source, size = "tools/make_images.py photos", made["bytes"]
    else:
        log(f"synthetic images ({why})")
        source, size = f"synthetic numpy+Pillow images ({why})", make_synthetic(img, count)
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    shardpack.pack(img, tmp / "ds", format="tar", shard_size="64MB")
    pack_s = time.perf_counter() - t0
    source += f", avg {size / max(count, 1) / 1024:.0f} KB"
    table.add(f"generate + pack {count:,} JPEGs (tar shards)",
              f"{gen_s:.1f} s + {pack_s:.1f} s ({count / pack_s:,.0f} img/s packed)")
    return tmp / "ds", source


# -- loaders -------------------------------------------------------------------------------------
def make_loader(ds_path, device, workers: int, decode: str | None, batch: int, *,
                normalize: bool = True, size: int = 224):
    """ShardDataset -> DataLoader -> DeviceLoader, as docs/device.md sets it up."""
    dec = shardpack.CpuDecode(size, on_error="skip") if decode == "cpu" else None
    ds = shardpack.ShardDataset(ds_path, batch_size=batch, batched=True, decode=dec)
    loader = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0,
                        # raw JPEG bytes for nvJPEG gain nothing from pinning (it reads them on
                        # the host); decoded pixels do
                        pin_memory=device.type == "cuda" and decode != "gpu",
                        prefetch_factor=4 if workers else None)
    return shardpack.DeviceLoader(loader, device=device, decode=decode, size=size,
                                  normalize=normalize, on_error="skip")


def full_batches(dl, batch: int) -> int:
    """Full batches in one epoch of this rank (len(dataset) counts samples)."""
    return len(dl.loader.dataset) // batch


def stream(dl, first_epoch: int = 0):
    """Batches epoch after epoch (``set_epoch`` each time), never past the data: the caller
    decides how many it takes.  Closing this generator closes the loader's iteration."""
    for epoch in itertools.count(first_epoch):
        dl.set_epoch(epoch)
        it = iter(dl)
        got = 0
        try:
            for batch in it:
                got += 1
                yield batch
        finally:
            it.close()
        if not got:
            raise RuntimeError("the loader yielded no batch in a whole epoch")


def close_loader(dl) -> None:
    """Stop persistent DataLoader workers now (not at garbage collection): sections must not share
    the CPUs with the previous section's idle workers."""
    loader = getattr(dl, "loader", None)
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
        loader._iterator = None


def reset_stats(dl) -> bool:
    """Zero the loader's live counters if it can (DeviceLoader.reset_stats, newer shardpack)."""
    reset = getattr(dl, "reset_stats", None)
    if reset is None:
        return False
    reset()
    return True


def _sync(device):
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _n(batch) -> int:
    return int(batch["image"].shape[0])


# -- sections ------------------------------------------------------------------------------------
def end_to_end(dl, device, batch: int, want: int, deadline: float, warmup: int = 2) -> dict:
    """Images/s the DeviceLoader hands over, ``want`` batches after ``warmup`` (start-up excluded),
    over as many epochs as that takes; stops early at ``deadline``."""
    sync = _sync(device)
    per_epoch = full_batches(dl, batch)
    src = stream(dl)
    try:
        for _ in range(warmup):
            next(src)
        sync()
        reset_stats(dl)
        start, images, got = time.perf_counter(), 0, 0
        for b in src:
            images, got = images + _n(b), got + 1
            if got >= want or time.perf_counter() > deadline:
                break
        sync()
        wall = time.perf_counter() - start
    finally:
        src.close()
        close_loader(dl)
    note = "" if got >= want else f", stopped at the time budget after {got} batches"
    epochs = (warmup + got) / max(per_epoch, 1)
    return dict(rate=images / wall, batches=got, epochs=epochs, note=note)


def decode_difference(ds_path, device, deadline: float, first: str = "gpu", batches: int = 4,
                      batch: int = 64) -> dict:
    """``first`` ("gpu"; "cpu" on the smoke run, which must then give 0) and CPU decode of the
    same samples with the same crops (same seed, epoch, index): abs differences in 0-255."""
    gpu = make_loader(ds_path, device, 0, first, batch, normalize=False)
    cpu = make_loader(ds_path, device, 0, "cpu", batch, normalize=False)
    means, worst_pixel, n = [], 0.0, 0
    gi, ci = stream(gpu), stream(cpu)
    try:
        for g, c in itertools.islice(zip(gi, ci, strict=False), batches):
            order_g, order_c = g["__index__"].tolist(), c["__index__"].tolist()
            if order_g != order_c:  # same dataset, seed and epoch: the same samples in order
                pos = {k: i for i, k in enumerate(order_c)}
                c_img = c["image"][[pos[k] for k in order_g]]
            else:
                c_img = c["image"]
            diff = (g["image"].float() - c_img.float()).abs()
            means += diff.mean(dim=(1, 2, 3)).tolist()
            worst_pixel = max(worst_pixel, float(diff.amax()))
            n += len(order_g)
            if time.perf_counter() > deadline:
                break
    finally:
        gi.close()
        ci.close()
    return dict(mean=sum(means) / len(means), worst_image=max(means), max_pixel=worst_pixel, n=n)


def jpeg_bytes(ds_path, images: int) -> list[bytes]:
    """The encoded images of the first ``images`` samples, read straight from the shards."""
    reader = shardpack.open_reader(ds_path)
    out = []
    for i in range(min(images, len(reader))):
        sample = reader.read_sample(i)
        field = next(k for k in sample if is_image_field(k))
        out.append(bytes(sample[field]))
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


def nvjpeg_rate(encoded: list[bytes], device, deadline: float, per_call: int = 256):
    import torchvision.io as tvio

    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in encoded]
    calls = [data[i:i + per_call] for i in range(0, len(data), per_call)]
    tvio.decode_jpeg(calls[0], device=device)  # warm-up: nvJPEG handles, allocator
    torch.cuda.synchronize(device)
    start, done = time.perf_counter(), 0
    for _ in range(3):
        for chunk in calls:
            tvio.decode_jpeg(chunk, device=device)
            done += len(chunk)
        if time.perf_counter() > deadline:
            break
    torch.cuda.synchronize(device)
    return done / (time.perf_counter() - start), per_call


def make_model(device, smoke: bool):
    """ResNet-50 (torchvision), or on the CPU smoke run a tiny conv net (no torchvision there)."""
    if smoke:
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=4), torch.nn.ReLU(),
                                    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                    torch.nn.Linear(8, CLASSES))
    else:
        import torchvision

        model = torchvision.models.resnet50(num_classes=CLASSES)
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


def train(step, batches, device, steps: int, warmup: int, deadline: float, dl=None) -> dict:
    """Run ``step`` on ``batches`` like a training loop: the host runs at most two steps ahead of
    the device (it reads the loss of the step two back, as a loop that logs it does), never a
    synchronize per step; synchronized only where the timing starts and ends.  ``wait`` is the
    host time spent getting the next batch."""
    sync = _sync(device)
    pending: collections.deque = collections.deque()
    loss_value = float("nan")

    def one(batch):
        nonlocal loss_value
        pending.append(step(batch["image"], batch["cls"]).detach())
        if len(pending) > 2:
            loss_value = pending.popleft().item()

    it = iter(batches)
    for _ in range(warmup):
        one(next(it))
    sync()
    pending.clear()
    own_stats = dl is not None and reset_stats(dl)
    start, waited, images, done = time.perf_counter(), 0.0, 0, 0
    while done < steps and time.perf_counter() < deadline:
        t0 = time.perf_counter()
        batch = next(it)
        waited += time.perf_counter() - t0
        one(batch)
        images, done = images + _n(batch), done + 1
    sync()
    wall = time.perf_counter() - start
    out = dict(rate=images / wall, wait=waited / wall, steps=done, loss=loss_value,
               note="" if done >= steps else f", stopped at the time budget after {done} steps")
    if own_stats:  # the loader's own measure (host wait + device stalls), live since the reset
        frac = getattr(dl, "wait_fraction", None)
        if frac is None and dl.stats.get("wall_s"):
            frac = dl.stats["wait_s"] / dl.stats["wall_s"]
        out["loader_wait"] = frac
    return out


def training(ds_path, device, workers: int, batch: int, budget: Budget, table: Table,
             smoke: bool, caps: dict) -> None:
    name = "tiny conv net (smoke)" if smoke else "ResNet-50"
    steps, warmup = (6, 2) if smoke else (40, 5)
    deadline = budget.section(caps["resident"], need=caps["need"])
    if deadline is None:
        table.add(f"{name} bf16 training", "skipped: out of time budget")
        return
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    step = make_model(device, smoke)
    # the same step on one batch already on the device: what the step costs without a loader
    first = make_loader(ds_path, device, 0, "cpu" if smoke else "gpu", batch)
    src = stream(first)
    resident = next(src)
    src.close()
    resident = {"image": resident["image"].clone(), "cls": resident["cls"].clone()}
    base = train(step, itertools.repeat(resident), device, steps=steps + 10,
                 warmup=warmup + (0 if smoke else 5), deadline=deadline)
    table.add(f"{name} bf16 train step, batch already on the {device.type.upper()} "
              f"(batch {batch})", f"{base['rate']:,.0f} img/s ({base['steps']} steps"
              f"{base['note']})")
    for decode in (("cpu",) if smoke else ("gpu", "cpu")):
        label = f"{name} bf16 training fed by DeviceLoader, {decode.upper()} decode, " \
                f"{workers} workers"
        deadline = budget.section(caps["fed"], need=caps["need"])
        if deadline is None:
            table.add(label, "skipped: out of time budget")
            continue
        dl = make_loader(ds_path, device, workers, decode, batch)
        src = stream(dl)
        try:
            fed = train(step, src, device, steps=steps, warmup=warmup, deadline=deadline, dl=dl)
        finally:
            src.close()
            close_loader(dl)
        own = fed.get("loader_wait")
        own = f"; loader's wait_fraction {100 * own:.1f}%" if own is not None else ""
        table.add(label, f"{fed['rate']:,.0f} img/s = {fed['rate'] / max(base['rate'], 1e-9):.2f}x "
                         f"resident; host waited for data {100 * fed['wait']:.1f}% of wall{own} "
                         f"({fed['steps']} steps{fed['note']})")


def h2d_rates(device, deadline: float, size: int = 256 << 20, reps: int = 10):
    rates = []
    for pinned in (True, False):
        host = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
        host.fill_(1)  # touch the pages: a first-touch fault is no copy cost
        dev = torch.empty(size, dtype=torch.uint8, device=device)
        dev.copy_(host, non_blocking=pinned)
        torch.cuda.synchronize(device)
        start, done = time.perf_counter(), 0
        while done < reps and time.perf_counter() < deadline:
            dev.copy_(host, non_blocking=pinned)
            done += 1
        torch.cuda.synchronize(device)
        rates.append(done * size / (time.perf_counter() - start) / 1e9)
        del host, dev
    return rates[0], rates[1]


# -- runs ----------------------------------------------------------------------------------------
def run_gpu(ds_path, args, budget: Budget, table: Table) -> None:
    device = torch.device("cuda", torch.cuda.current_device())  # "cuda" != "cuda:0" to torchvision
    batch, w = 256, args.workers
    deadline = budget.section(30, need=10)
    if deadline is None:
        table.add("GPU vs CPU decode, same crops", "skipped: out of time budget")
    else:
        d = decode_difference(ds_path, device, deadline)
        table.add("GPU vs CPU decode, same crops: mean abs diff (0-255), worst image's mean, "
                  "max pixel", f"{d['mean']:.2f}, {d['worst_image']:.2f}, {d['max_pixel']:.0f} "
                  f"over {d['n']} images")
    deadline = budget.section(25, need=5)
    if deadline is None:
        table.add("nvJPEG batched decode", "skipped: out of time budget")
    else:
        encoded = jpeg_bytes(ds_path, 1024)
        rate, per_call = nvjpeg_rate(encoded, device, deadline)
        table.add(f"nvJPEG batched decode alone, full size ({per_call} images / call)",
                  f"{rate:,.0f} img/s")
        one = cpu_full_decode_rate(encoded[:256], min(deadline, time.perf_counter() + 5))
        table.add("simplejpeg decode alone, full size, 1 thread", f"{one:,.0f} img/s")
    rates = {}
    for decode in ("cpu", "gpu"):
        label = f"DeviceLoader end to end, {decode.upper()} decode, {w} workers"
        deadline = budget.section(40, need=10)
        if deadline is None:
            table.add(label, "skipped: out of time budget")
            continue
        r = end_to_end(make_loader(ds_path, device, w, decode, batch), device, batch,
                       want=40, deadline=deadline)
        rates[decode] = r["rate"]
        extra = f" ({r['rate'] / rates['cpu']:.2f}x CPU decode)" if decode == "gpu" and \
            "cpu" in rates else ""
        table.add(label, f"{r['rate']:,.0f} img/s{extra} ({r['batches']} batches of {batch}, "
                         f"{r['epochs']:.1f} epochs{r['note']})")
    training(ds_path, device, w, batch, budget, table, smoke=False,
             caps=dict(resident=45, fed=50, need=15))
    deadline = budget.section(20, need=5)
    if deadline is None:
        table.add("host-to-device copy", "skipped: out of time budget")
    else:
        pinned, pageable = h2d_rates(device, deadline)
        table.add("host-to-device copy 256 MB, pinned / pageable",
                  f"{pinned:.1f} / {pageable:.1f} GB/s")


def run_smoke(ds_path, args, budget: Budget, table: Table) -> None:
    device, batch, w = torch.device("cpu"), SMOKE_BATCH, args.workers
    d = decode_difference(ds_path, device, time.perf_counter() + 10, first="cpu", batches=2,
                          batch=batch)
    table.add("CPU vs CPU decode, same crops (smoke: checks the comparison; must be 0)",
              f"{d['mean']:.2f}, {d['worst_image']:.2f}, {d['max_pixel']:.0f} over {d['n']} "
              "images")
    one = cpu_full_decode_rate(jpeg_bytes(ds_path, 64), time.perf_counter() + 5)
    table.add("simplejpeg decode alone, full size, 1 thread", f"{one:,.0f} img/s")
    dl = make_loader(ds_path, device, w, "cpu", batch)
    want = full_batches(dl, batch) + 3  # past one epoch: exercises the epoch loop
    deadline = budget.section(30, need=0) or time.perf_counter() + 5
    r = end_to_end(dl, device, batch, want=want, deadline=deadline, warmup=1)
    table.add(f"DeviceLoader end to end, CPU decode, {w} workers, device cpu (smoke)",
              f"{r['rate']:,.0f} img/s ({r['batches']} batches of {batch}, "
              f"{r['epochs']:.1f} epochs{r['note']})")
    training(ds_path, device, w, batch, budget, table, smoke=True,
             caps=dict(resident=15, fed=20, need=3))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=None,
                   help="images to generate (default 8192; 300 with --cpu-smoke)")
    p.add_argument("--workers", type=int, default=None,
                   help="DataLoader workers for both decodes (default min(8, CPUs); 2 smoke)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole run (default 270; 50 with --cpu-smoke)")
    p.add_argument("--out", default=None, help="also write the table to this file")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="run the CPU-side parts on a small set (no GPU): checks the script")
    p.add_argument("--synthetic", action="store_true",
                   help="generate numpy+Pillow images even where scikit-image is installed")
    args = p.parse_args(argv)
    smoke = args.cpu_smoke
    budget = Budget(args.budget or (50 if smoke else 270))
    if not smoke:
        if not torch.cuda.is_available():
            sys.exit("gpu_check: no CUDA device here (torch "
                     f"{torch.__version__}); run with --cpu-smoke to check the script on CPU")
        if importlib.util.find_spec("torchvision") is None:
            sys.exit("gpu_check: torchvision is not installed (needed for nvJPEG and ResNet-50)")
    # a hang becomes a traceback and an exit, before whoever runs this gives up on it
    faulthandler.dump_traceback_later(budget.left() + 90, exit=True)
    args.workers = args.workers or (SMOKE_WORKERS if smoke else min(8, os.cpu_count() or 2))
    batch = SMOKE_BATCH if smoke else 256
    count = args.images or (SMOKE_IMAGES if smoke else 8192)
    if not smoke:  # whole batches only: no odd-sized last batch re-tuning cuDNN mid-timing
        count = -(-count // batch) * batch
    table = Table(args.out)
    if torch.cuda.is_available() and not smoke:
        name = torch.cuda.get_device_name()
        import torchvision

        versions = f"torch {torch.__version__}, torchvision {torchvision.__version__}"
    else:
        name, versions = platform.processor() or platform.machine(), f"torch {torch.__version__}"
    cmd = "python tools/gpu_check.py" + (" --cpu-smoke" if smoke else "") + \
        (" --synthetic" if args.synthetic else "")
    table.head = f"GPU checks on {name}, {versions}, {os.cpu_count()} CPUs: `{cmd}`"
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        ds_path, source = make_data(Path(tmp), count, args.synthetic, table)
        table.head += f"; {count:,} images: {source}"
        table.save()
        (run_smoke if smoke else run_gpu)(ds_path, args, budget, table)
    faulthandler.cancel_dump_traceback_later()
    print(table.text(), flush=True)


if __name__ == "__main__":
    main()
