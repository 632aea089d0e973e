#!/usr/bin/env python3
"""Deterministic generator of an ImageNet-like JPEG tree (ImageFolder layout).

    OUT/<class_name>/<NNNNNN>.jpg      e.g. OUT/n00_astronaut/000000.jpg

Normal mode: every image is a crop of random size/aspect (ImageNet-like: mostly
500x375, 500x333, 375x500, ...) at a random position and scale of one of the real
colour photos shipped inside scikit-image, maybe flipped, with a random colour cast,
brightness and a little noise, saved as JPEG (~100 KB on average).  Class c uses
photo c mod 9; further classes permute the colour channels (54 distinct looks).
--tiny: ~1 KB 32x32 JPEGs; a pool of distinct byte strings is rendered once and
written round-robin, fast enough for millions of files.

Image i belongs to class i % C and depends only on (seed, i): the tree is
byte-identical for the same arguments whatever the worker count.
Usable as a script (see --help) or imported by path:  make_images(out, count, ...)
"""
import argparse
import importlib.util
import math
import multiprocessing as mp
import os
import queue
import random
import shutil
import sys
import time
import traceback
from io import BytesIO

import numpy as np
from PIL import Image, ImageChops

# Real RGB photographs in skimage/data (no synthetic, grayscale or RGBA images).
PHOTOS = ["astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "hubble_deep_field.jpg",
          "retina.jpg", "motorcycle_left.png", "ihc.png", "motorcycle_right.png"]
PERMS = [(0, 1, 2), (2, 0, 1), (1, 2, 0), (2, 1, 0), (0, 2, 1), (1, 0, 2)]
ASPECTS = [4 / 3] * 5 + [3 / 2] * 3 + [1.0, 5 / 4, 16 / 9]  # long/short side ratios
DEFAULT_QUALITY, TINY_QUALITY, TINY_SIZE = 95, 85, 32
NOISE_SIGMA, NOISE_BIAS = 8.0, 64  # Gaussian noise sigma (grey levels); tile offset
LEVELS = (512, 680, 900, 1200)  # short sides of the source scale pyramid
TINY_POOL = 512        # distinct tiny JPEGs (rounded up to a multiple of the class count)
_S = {}                # per-run state; set before forking, so workers inherit it


def skimage_data_dir():
    """Locate skimage/data without importing skimage (fast startup, no fetchers)."""
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("scikit-image is not installed; its sample photos are the source images")
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


def class_names(classes):
    width = max(2, len(str(classes - 1)))
    names = []
    for c in range(classes):
        photo, variant = PHOTOS[c % len(PHOTOS)].split(".")[0], c // len(PHOTOS)
        names.append(f"n{c:0{width}d}_{photo}" + (f"_v{variant}" if variant else ""))
    return names


def render(index, tiny=False):
    """JPEG bytes of image `index`; depends only on (seed, index, mode, quality)."""
    rng = random.Random(f"make_images:{_S['seed']}:{index}")  # str seeds are stable (sha512)
    c = index % _S["classes"]
    levels = _S["sources"][c % len(PHOTOS)]  # the class's photo at several scales
    if tiny:  # a random square patch (6..100% of the short side) shrunk to 32x32
        src = levels[0]  # smallest level: cheapest to shrink from
        side = rng.uniform(0.06, 1.0) * min(src.size)
        x0, y0 = rng.uniform(0, src.width - side), rng.uniform(0, src.height - side)
        img = src.resize((TINY_SIZE,) * 2, Image.BILINEAR, box=(x0, y0, x0 + side, y0 + side))
    else:
        # ImageNet-like size: long side mostly 500, else 400..640; aspect 1..16:9; 25% portrait
        long = 500 if rng.random() < 0.7 else rng.randrange(400, 641)
        w, h = long, max(280, round(long / rng.choice(ASPECTS)))
        if rng.random() < 0.25:
            w, h = h, w
        # Random crop at a random scale: cut w x h pixels straight out of one pyramid
        # level (no per-image resampling, which would cost more than everything else).
        src = rng.choice([im for im in levels if im.width >= w and im.height >= h])
        x0, y0 = rng.randrange(src.width - w + 1), rng.randrange(src.height - h + 1)
        img = src.crop((x0, y0, x0 + w, y0 + h))
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    variant = c // len(PHOTOS)
    if variant:  # classes beyond the photo count: permute the colour channels
        bands = img.split()
        img = Image.merge("RGB", [bands[j] for j in PERMS[1 + (variant - 1) % 5]])
    # Noise + colour cast + brightness in one C pass: add a random window of one of the
    # pre-made noise tiles (each has its own per-channel cast) with a random offset.
    tile, nx, ny = rng.choice(_S["noise"]), rng.randrange(64), rng.randrange(64)
    img = ImageChops.add(img, tile.crop((nx, ny, nx + img.width, ny + img.height)),
                         offset=rng.randint(-20, 20) - NOISE_BIAS)
    out = BytesIO()
    img.save(out, "JPEG", quality=_S["quality"])
    return out.getvalue()


def _write_chunk(start, stop):
    """Write images start..stop-1; returns bytes written."""
    out, names, total = _S["out"], _S["names"], 0
    fds = {}
    try:
        for i in range(start, stop):
            c = i % len(names)
            if c not in fds:
                fds[c] = os.open(os.path.join(out, names[c]), os.O_RDONLY | os.O_DIRECTORY)
            data = _S["pool"][i % len(_S["pool"])] if _S["tiny"] else render(i)
            fd = os.open(f"{i:0{_S['width']}d}.jpg", os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                         0o644, dir_fd=fds[c])
            try:
                os.write(fd, data)  # < 2 GB: a single write is complete on regular files
            finally:
                os.close(fd)
            total += len(data)
    finally:
        for fd in fds.values():
            os.close(fd)
    return total


def _worker(next_chunk, results):
    """Forked worker: claims chunks from a shared counter, reports (n, bytes) per chunk."""
    try:
        size, count = _S["chunk"], _S["count"]
        while True:
            with next_chunk.get_lock():
                start = next_chunk.value * size
                next_chunk.value += 1
            if start >= count:
                break
            stop = min(count, start + size)
            results.put((stop - start, _write_chunk(start, stop)))
    except BaseException:
        results.put(("error", traceback.format_exc()))
    results.put(None)


def _prepare_out(out, overwrite):
    if os.path.isdir(out) and os.listdir(out):
        if not overwrite:
            raise FileExistsError(f"output directory {out!r} is not empty (use --overwrite)")
        if any(not e.is_dir(follow_symlinks=False) for e in os.scandir(out)):
            raise FileExistsError(f"{out!r} holds files besides class folders; "
                                  "refusing to clear it")
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)


def _progress_bar(total, enabled):
    """tqdm bar (by default only on a terminal), or None without tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="img", smoothing=0.05,
                disable=not (sys.stderr.isatty() if enabled is None else enabled))


def make_images(out, count, classes=10, seed=0, tiny=False, workers=None, quality=None,
                overwrite=False, progress=None):
    """Generate the tree; returns {count, bytes, classes, seconds, out}."""
    if count < 0 or classes < 1:
        raise ValueError("count must be >= 0 and classes >= 1")
    t0 = time.perf_counter()
    _prepare_out(out, overwrite)
    names = class_names(classes)
    for name in names:
        os.makedirs(os.path.join(out, name), exist_ok=True)
    sources = _load_sources(classes, tiny)
    rng = np.random.default_rng(seed)
    noise = rng.normal(NOISE_BIAS, NOISE_SIGMA, (704, 704, 3))
    tiles = [Image.fromarray(np.clip(noise + rng.uniform(-12, 12, 3), 0, 255).astype(np.uint8))
             for _ in range(8)]  # same noise, 8 colour casts; windows differ per image
    _S.clear()
    _S.update(out=out, names=names, classes=classes, seed=seed, tiny=tiny, count=count,
              sources=sources, noise=tiles, width=max(6, len(str(max(count - 1, 0)))),
              quality=quality or (TINY_QUALITY if tiny else DEFAULT_QUALITY),
              chunk=10000 if tiny else 64)  # images per work unit
    if tiny:  # distinct tiny JPEGs; pool index i % P keeps class i % classes (P % classes == 0)
        size = min(count, math.ceil(TINY_POOL / classes) * classes)
        _S["pool"] = [render(i, tiny=True) for i in range(size)]
    workers = max(1, min(workers or os.cpu_count() or 1, math.ceil(count / _S["chunk"])))
    if workers == 1:
        total = _write_serial(count, progress)
    else:
        total = _write_parallel(count, workers, progress)
    _S.clear()
    return dict(count=count, bytes=total, classes=classes,
                seconds=time.perf_counter() - t0, out=out)


def _load_sources(classes, tiny):
    """{photo index: its scale pyramid} for the photos the classes use."""
    data_dir = skimage_data_dir()
    used = sorted({c % len(PHOTOS) for c in range(min(classes, len(PHOTOS)))})
    sources = {}
    for p in used:  # scale pyramid: crops from a level of short side 512 see most of the photo
        photo = Image.open(os.path.join(data_dir, PHOTOS[p])).convert("RGB")
        sources[p] = [photo.resize((round(photo.width * k), round(photo.height * k)),
                                   Image.BILINEAR)
                      for k in (s / min(photo.size) for s in LEVELS[:1 if tiny else None])]
    return sources


def _write_serial(count, progress):
    """Every chunk in this process; the bytes written."""
    total, bar = 0, _progress_bar(count, progress)
    for start in range(0, count, _S["chunk"]):
        stop = min(count, start + _S["chunk"])
        total += _write_chunk(start, stop)
        bar and bar.update(stop - start)
    bar and bar.close()
    return total


def _write_parallel(count, workers, progress):
    """The chunks on ``workers`` forked processes; the bytes written."""
    ctx = mp.get_context("fork")
    next_chunk, results = ctx.Value("q", 0), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(next_chunk, results), daemon=True)
             for _ in range(workers)]
    for p in procs:
        p.start()
    total, running, bar = 0, workers, _progress_bar(count, progress)  # its thread: after fork
    try:
        while running:
            try:
                msg = results.get(timeout=1.0)
            except queue.Empty:  # a worker killed hard (e.g. OOM) never reports
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError("an image worker died unexpectedly") from None
                continue
            if msg is None:
                running -= 1
            elif msg[0] == "error":
                raise RuntimeError("image worker failed:\n" + msg[1])
            else:
                total += msg[1]
                bar and bar.update(msg[0])
    finally:
        for p in procs:
            if p.is_alive() and running:
                p.terminate()
            p.join()
    bar and bar.close()
    return total


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Write a deterministic ImageNet-like JPEG tree OUT/<class>/<NNNNNN>.jpg "
                    "(image i goes to class i mod CLASSES). Normal images average ~100 KB; "
                    "--tiny writes ~1 KB files, fast enough for millions of files.",
        epilog="example: python scripts/make_images.py demo-data/images --count 2000")
    ap.add_argument("out", metavar="OUT", help="output directory (must be empty or missing)")
    ap.add_argument("--count", "-n", type=int, required=True, help="number of images")
    ap.add_argument("--classes", type=int, default=10, help="number of class folders (default 10)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--tiny", action="store_true", help="write ~1 KB 32x32 JPEGs")
    ap.add_argument("--workers", "-j", type=int, default=None,
                    help="worker processes (default: os.cpu_count()); no effect on the output")
    ap.add_argument("--quality", type=int, default=None,
                    help=f"JPEG quality (default {DEFAULT_QUALITY}, tiny {TINY_QUALITY})")
    ap.add_argument("--overwrite", action="store_true",
                    help="delete OUT's existing class folders first instead of refusing")
    args = ap.parse_args(argv)
    if args.count < 0 or args.classes < 1:
        ap.error("--count must be >= 0 and --classes >= 1")
    try:
        r = make_images(args.out, args.count, classes=args.classes, seed=args.seed,
                        tiny=args.tiny, workers=args.workers, quality=args.quality,
                        overwrite=args.overwrite)
    except FileExistsError as e:
        ap.error(str(e))  # exit status 2
    avg = r["bytes"] / max(r["count"], 1) / 1024
    print(f"{r['count']} files in {r['classes']} classes -> {r['out']}: "
          f"{r['bytes'] / 1e6:.1f} MB, avg {avg:.1f} KB, {r['seconds']:.1f} s")


if __name__ == "__main__":
    main()
