"""The pixels suite's children, each run in a fresh interpreter: the loaders' epochs (a plain Pillow
loader, shardpack, FFCV), FFCV's raw-mode writer, the per-image decode probe behind the ``auto``
threshold, and the HTTP server and reader. Runs in the venv that has the loader (.venv or
.bench-loaders-venv): standard library at the top, each loader imported inside its function."""

from __future__ import annotations

import json
import os
import random
import sys
import time

from benchmarks import common as c

BATCH, WORKERS = 256, 2
# the crossover probe's tile sides (square crops of the photos)
SIDES = (32, 48, 64, 96, 128, 192, 256, 384)
PASSES = 5  # timed passes of each form and side


# ------------------------------------------------------------------------------ the images

def photos():
    """scikit-image's sample photos as RGB Pillow images (scripts/make_images.py's list)."""
    import importlib.util

    from PIL import Image

    spec = importlib.util.spec_from_file_location("make_images", c.MAKE_IMAGES)
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    folder = make.skimage_data_dir()
    return [(name.split(".")[0], Image.open(os.path.join(folder, name)).convert("RGB"))
            for name in make.PHOTOS]


def tile(photo, width: int, height: int, rng: random.Random):
    """A random crop of ``photo`` 1-6 times the output's size, resized (LANCZOS) to
    ``width`` x ``height``: a small image with a photo's texture."""
    from PIL import Image

    most = min(6.0, photo.width / width, photo.height / height)  # a photo smaller: upscaled
    k = rng.uniform(min(1.0, most), most)
    cw, ch = width * k, height * k
    x0, y0 = rng.uniform(0, photo.width - cw), rng.uniform(0, photo.height - ch)
    return photo.resize((width, height), Image.LANCZOS, box=(x0, y0, x0 + cw, y0 + ch))


def make_tiles(out: str, count: int, lo: int, hi: int, formats: list) -> dict:
    """Child: ``count`` tiles of sides ``lo``..``hi`` (each side drawn apart), class = photo,
    written once per format into ``out``-FORMAT (``jpg``: quality 90, 4:2:0; ``png``)."""
    src = photos()
    for i in range(count):
        rng = random.Random(f"pixels-tile:{out}:{i}")
        name, photo = src[i % len(src)]
        img = tile(photo, rng.randint(lo, hi), rng.randint(lo, hi), rng)
        for fmt in formats:
            folder = os.path.join(f"{out}-{fmt}", name)
            os.makedirs(folder, exist_ok=True)
            kw = dict(quality=90, subsampling=2) if fmt == "jpg" else {}
            img.save(os.path.join(folder, f"{i:06d}.{fmt}"), **kw)
    return {}


# ------------------------------------------------------------------------------ the loaders

def _loader(kind: str, path: str, size: int):
    """(the iterable, its set_epoch, the batch's images) of one contender."""
    if kind == "ffcv-raw":
        from ffcv.fields.basics import IntDecoder
        from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
        from ffcv.loader import Loader, OrderOption
        from ffcv.transforms import RandomHorizontalFlip, ToTensor
        loader = Loader(path, batch_size=BATCH, num_workers=WORKERS, order=OrderOption.RANDOM,
                        os_cache=True, drop_last=False,
                        pipelines={"image": [RandomResizedCropRGBImageDecoder((size, size)),
                                             RandomHorizontalFlip(), ToTensor()],
                                   "label": [IntDecoder(), ToTensor()]})
        return loader, lambda epoch: None, lambda batch: batch[0]
    from torch.utils.data import DataLoader
    if kind == "pillow":
        from benchmarks.suites.trees import PillowTree  # the trees suite's loader, at this side

        dl = DataLoader(PillowTree(path, True, size), batch_size=BATCH, shuffle=True,
                        num_workers=WORKERS, persistent_workers=True)
        return dl, lambda epoch: None, lambda batch: batch[0]
    import shardpack
    threads = kind.endswith("-threads")  # the same pipeline in threads of this process
    ds = shardpack.ShardDataset(path, batch_size=BATCH, batched=True, shuffle=True,
                                decode=shardpack.CpuDecode(size),
                                execution="threads" if threads else "processes",
                                workers=WORKERS if threads else None)
    dl = ds if threads else DataLoader(ds, batch_size=None, num_workers=WORKERS,
                                       persistent_workers=True)
    loader = shardpack.DeviceLoader(dl, device="cpu", decode_on="cpu", normalize=False,
                                    dtype="uint8")
    return loader, loader.set_epoch, lambda batch: batch["image"]


def epochs(kind: str, path: str, size: int, count: int, min_s: float = 0.0) -> dict:
    """Child: ``count`` epochs of one contender, and more while those after the first have run
    less than ``min_s`` seconds (an epoch of 5,000 small images can take 20 ms: a few of them are
    too short a time to measure on a shared machine), each batch's images touched; images/s and
    CPU seconds (this process, its threads and workers, from /proc) over the epochs after the
    first (the first pays the workers' start and FFCV's compilation), epoch starts included."""
    import torch  # noqa: F401  (imported before the clock starts, as the loaders' modules are)
    loader, set_epoch, images = _loader(kind, path, size)
    n = seconds = cpu = 0.0
    epoch = 0
    while epoch < count or (count > 1 and seconds < min_s):
        set_epoch(epoch)
        cpu0, t0, k = c.process_cpu(c.descendants(os.getpid())), time.perf_counter(), 0
        for batch in loader:
            x = images(batch)
            # one element read, no copy: flatten() copied shardpack's channels-last batches
            # (NCHW shape, NHWC memory) whole, a cost the others' contiguous batches never paid
            x[(0,) * x.dim()].item()
            k += len(x)
        if epoch or count == 1:
            n, seconds = n + k, seconds + time.perf_counter() - t0
            cpu += c.process_cpu(c.descendants(os.getpid())) - cpu0
        epoch += 1
    return dict(rate=n / seconds, cpu_per_image=cpu / n, cores=cpu / seconds, n=int(n),
                epochs=epoch)


def ffcv_version() -> str:
    """Child (.bench-loaders-venv): FFCV's version, once its loader imports."""
    import importlib.metadata

    import ffcv.loader  # noqa: F401
    return importlib.metadata.version("ffcv")


def write_ffcv(src: str, out: str) -> dict:
    """Child (.bench-loaders-venv): the tree ``src`` as an FFCV .beton of
    ``RGBImageField(write_mode="raw")`` + IntField, the images converted to RGB."""
    import numpy as np
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from PIL import Image

    items = c.list_tree(src)

    class Items:
        def __len__(self):
            return len(items)

        def __getitem__(self, i):
            with Image.open(os.path.join(src, items[i][0])) as img:
                return np.asarray(img.convert("RGB")), items[i][1]
    tmp = f"{out}.tmp"
    DatasetWriter(tmp, {"image": RGBImageField(write_mode="raw"), "label": IntField()},
                  num_workers=2).from_indexed_dataset(Items())
    os.replace(tmp, out)
    return {}


# ------------------------------------------------------------------------------ the crossover

def crossover(sides: list, per_side: int, min_s: float) -> dict:
    """Child, one thread: for each side, ``per_side`` square tiles stored as JPEG (quality 90),
    PNG and raw (.npy); the median over passes (each at least ``min_s`` s) of the per-image time
    of CpuDecode's decode of them as one batch (``decode_samples``: the README pipeline's crop +
    resize to min(side, 224), flip; JPEG crops by the region decoder a chunk at a time, raw
    pixels by the batch crop, PNG one by one) and the mean bytes of each form. The time is this
    thread's CPU time (a neighbour's load on a shared machine does not count), the forms
    alternating pass by pass. {side: {form: {"s": ..., "bytes":
    ...}}}."""
    import io
    import statistics

    import numpy as np

    from shardpack.images.formats.raw import pixels_npy
    from shardpack.loader.batches import BytesBatch
    from shardpack.transforms.batchdecode import decode_samples
    from shardpack.transforms.decode import image_items
    from shardpack.transforms.spec import TransformSpec

    import torch

    torch.set_num_threads(1)  # as in a DataLoader worker: one thread, its time all counted
    src, out = photos(), {}
    for side in sides:
        forms = {"jpg": [], "png": [], "raw": []}
        for i in range(per_side):
            rng = random.Random(f"pixels-cross:{side}:{i}")
            img = tile(src[i % len(src)][1], side, side, rng)
            for fmt, kw in (("jpg", dict(quality=90, subsampling=2)), ("png", {})):
                buf = io.BytesIO()
                img.save(buf, fmt.replace("jpg", "jpeg"), **kw)
                forms[fmt].append(buf.getvalue())
            forms["raw"].append(pixels_npy(np.asarray(img)))
        spec = TransformSpec(size=min(side, 224))
        ids = np.arange(per_side, dtype=np.int64)
        images = np.empty((per_side, spec.size, spec.size, 3), np.uint8)
        fields = {"jpg": "jpg", "png": "png", "raw": "rgb.npy"}
        items = {}
        for form, blobs in forms.items():
            data = torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8)
            offsets = torch.tensor([0, *np.cumsum([len(b) for b in blobs])], dtype=torch.int64)
            items[form] = image_items({fields[form]: BytesBatch(data, offsets)}, fields[form])

        def decode(form: str, spec=spec, items=items, ids=ids, images=images) -> None:
            decode_samples(items[form], range(per_side), spec, lambda index: spec.random(0, index),
                           None, images, lambda index, exc: False, batch_draws=(0, ids))

        for form in forms:  # warm: the codecs' first calls
            decode(form)
        times = {form: [] for form in forms}
        for _ in range(PASSES):  # the forms alternate, pass by pass
            for form, blobs in forms.items():
                t0, k = time.thread_time(), 0
                while k == 0 or time.thread_time() - t0 < min_s:
                    decode(form)
                    k += len(blobs)
                times[form].append((time.thread_time() - t0) / k)
        out[side] = {form: {"s": statistics.median(times[form]),
                            "bytes": sum(map(len, blobs)) / len(blobs)}
                     for form, blobs in forms.items()}
    return out


def read_bandwidth(paths: list, min_s: float) -> dict:
    """Child, one thread: MB/s of reading ``paths`` (in the page cache) into one buffer, the
    median of passes of at least ``min_s`` s."""
    import statistics
    buf = bytearray(1 << 22)
    rates = []
    for _ in range(5):
        t0, n = time.perf_counter(), 0
        while n == 0 or time.perf_counter() - t0 < min_s:
            for p in paths:
                with open(p, "rb", buffering=0) as f:
                    while (got := f.readinto(buf)) > 0:
                        n += got
        rates.append(n / (time.perf_counter() - t0) / 1e6)
    return {"mb_s": statistics.median(rates)}


# ------------------------------------------------------------------------------ over HTTP

def serve(root: str, bps: float) -> None:
    """Child: a FaultServer over ``root`` sending every body at ``bps`` bytes/s (per response);
    print its port, serve until stdin ends."""
    from benchmarks import testbed
    with testbed.servers().FaultServer(root, drip_bps=bps) as server:
        print(json.dumps({"port": server.port}), flush=True)
        sys.stdin.read()


def http_epoch(url: str, size: int) -> dict:
    """Child: one epoch of ShardDataset over ``url`` (batched, CpuDecode(size), 2 workers);
    images/s from the loader's construction."""
    import torch  # noqa: F401
    from torch.utils.data import DataLoader

    import shardpack
    t0 = time.perf_counter()
    ds = shardpack.ShardDataset(url, batch_size=BATCH, batched=True, shuffle=True,
                                decode=shardpack.CpuDecode(size))
    n = 0
    for batch in DataLoader(ds, batch_size=None, num_workers=WORKERS):
        n += int((~batch["__repeat__"]).sum()) if "__repeat__" in batch else len(batch["image"])
    took = time.perf_counter() - t0
    return dict(rate=n / took, seconds=took, n=n)
