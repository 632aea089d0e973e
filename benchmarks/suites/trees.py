"""Three image trees through the README pipeline and through a plain Pillow loader, side by side:
48 px PNG icons, ~500x375 JPEG photos and 3000x2000 JPEGs; images/s, CPU per image, the first
batch and memory, each measurement in a fresh interpreter, the contenders alternated."""

from __future__ import annotations

import glob
import importlib.util
import io
import math
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common as c
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure

BATCH, WORKERS, SIZE, EPOCHS = 256, 2, 224, 2
HERE = "benchmarks.suites.trees"
TREES = ("icons", "photos", "large")
PILLOWS = ("pillow", "pillow-uint8")
CONTENDERS = PILLOWS + ("shardpack", "shardpack-uint8", "shardpack-whole", "shardpack-threads")
RATIOS = (("shardpack", "pillow"), ("shardpack-uint8", "pillow-uint8"),
          ("shardpack-uint8", "pillow"))
TARGET = 1.3
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
ICONS = "/usr/share/icons/*/48x48/*/*.png"
MIN_ICONS = 50
# 3000x2000 (a share portrait), sigma-8 noise on an upscaled photo: ~1.7 MB at quality 90, 4:2:0
LARGE = dict(size=(3000, 2000), portrait=0.15, sigma=8.0, bias=64, quality=90)
SAMPLE_S = 0.2  # the memory sampling interval
REGION_ENV = "SHARDPACK_JPEG_REGION"
_LARGE: dict = {}  # the large tree's sources, set before forking its writers


def options(p) -> None:
    """The trees suite's options."""
    p.add_argument("--trees", default=",".join(TREES),
                   help=f"the trees to run, comma-separated [{','.join(TREES)}]")
    p.add_argument("--skip", default="",
                   help=f"contenders to leave out, comma-separated ({', '.join(CONTENDERS)})")
    p.add_argument("--icons", type=int, default=5000, help="48 px PNG icons [5000]")
    p.add_argument("--photos", type=int, default=5000, help="~100 KB generated JPEGs [5000]")
    p.add_argument("--large", type=int, default=512,
                   help="3000x2000 JPEGs [512: one whole batch per worker and epoch]")


# ------------------------------------------------------------------------------ the trees

def ensure_icons(data_dir: Path, count: int) -> tuple[Path, str]:
    """An ImageFolder tree of ``count`` 48x48 PNGs in DATA_DIR/trees/icons-COUNT: the real icons
    of /usr/share/icons/*/48x48/CONTEXT/ (class THEME-CONTEXT), cycled, each copy named
    NNNNNN-NAME.png; generated RGBA PNGs where fewer than MIN_ICONS are found. Returns (the
    tree, what it holds)."""
    src = Path(data_dir) / "trees" / f"icons-{count}"
    done = Path(f"{src}.done")
    if not done.exists():
        shutil.rmtree(src, ignore_errors=True)
        icons = [p for p in sorted(glob.glob(ICONS)) if os.path.isfile(p)]
        if len(icons) >= MIN_ICONS:
            for i in range(count):
                parts = Path(icons[i % len(icons)]).parts  # .../THEME/48x48/CONTEXT/NAME.png
                folder = src / f"{parts[-4]}-{parts[-2]}"
                folder.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(icons[i % len(icons)], folder / f"{i:06d}-{parts[-1]}")
            what = (f"{count:,} copies of the {len(icons):,} real 48x48 PNG icons (mostly RGBA) "
                    f"of /usr/share/icons/*/48x48/, cycled, {len(os.listdir(src))} classes")
        else:
            _generate_icons(src, count)
            what = (f"{count:,} generated 48x48 RGBA PNGs (only {len(icons)} real icons in "
                    "/usr/share/icons/*/48x48/ here)")
        done.write_text(what + "\n")
    return src, done.read_text().strip()


def _generate_icons(src: Path, count: int) -> None:
    """Deterministic 48x48 RGBA PNGs (shapes on a transparent ground), 8 classes."""
    from PIL import Image, ImageDraw

    for i in range(count):
        rng = random.Random(f"trees-icon:{i}")
        img = Image.new("RGBA", (48, 48), (0, 0, 0, 0))
        draw = ImageDraw.Draw(img)
        for _ in range(rng.randint(2, 5)):
            box = sorted(rng.sample(range(48), 2)) + sorted(rng.sample(range(48), 2))
            colour = tuple(rng.randrange(256) for _ in range(3)) + (rng.randint(128, 255),)
            shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
            shape((box[0], box[2], box[1], box[3]), fill=colour)
        folder = src / f"generated-{i % 8}"
        folder.mkdir(parents=True, exist_ok=True)
        img.save(folder / f"{i:06d}-icon.png")


def ensure_large(data_dir: Path, count: int) -> tuple[Path, str]:
    """An ImageFolder tree of ``count`` 3000x2000 JPEGs in DATA_DIR/trees/large-COUNT, made
    once (2 processes) from the scikit-image photos of scripts/make_images.py: image i is a
    random crop of photo i mod 9 (its class) upscaled with LANCZOS, maybe flipped, with a colour
    cast and Gaussian noise, so that it compresses like a photo. Returns (the tree, what it
    holds)."""
    src = Path(data_dir) / "trees" / f"large-{count}"
    done = Path(f"{src}.done")
    if not done.exists():
        shutil.rmtree(src, ignore_errors=True)
        print(f"generating {count} 3000x2000 JPEGs in {src}", file=sys.stderr, flush=True)
        _LARGE.update(_large_sources(), out=src)
        for name in _LARGE["names"]:
            (src / name).mkdir(parents=True, exist_ok=True)
        try:
            with mp.get_context("fork").Pool(2) as pool:
                total = sum(pool.imap_unordered(_write_large, range(count), chunksize=4))
        finally:
            _LARGE.clear()
        w, h = LARGE["size"]
        done.write_text(
            f"{count:,} {w}x{h} JPEGs ({LARGE['portrait']:.0%} portrait; average "
            f"{total / max(count, 1) / 1e6:.2f} MB, quality {LARGE['quality']}, 4:2:0): crops "
            f"of scikit-image's sample photos upscaled with LANCZOS, a colour cast and Gaussian "
            f"noise of sigma {LARGE['sigma']:g}\n")
    return src, done.read_text().strip()


def _large_sources() -> dict:
    """The photos, their class names and a noise field (a random window of it per image)."""
    import numpy as np
    from PIL import Image

    spec = importlib.util.spec_from_file_location("make_images", c.MAKE_IMAGES)
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    folder = make.skimage_data_dir()
    photos = [Image.open(os.path.join(folder, p)).convert("RGB") for p in make.PHOTOS]
    names = [f"n{k}_{p.split('.')[0]}" for k, p in enumerate(make.PHOTOS)]
    side = max(LARGE["size"]) + 200
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((side, side, 3), dtype=np.float32) * LARGE["sigma"]
    noise = Image.fromarray(np.clip(noise + LARGE["bias"], 0, 255).astype(np.uint8))
    return dict(photos=photos, names=names, noise=noise)


def render_large(i: int) -> bytes:
    """The JPEG bytes of large image ``i`` (depends on ``i`` only)."""
    from PIL import Image, ImageChops

    rng = random.Random(f"trees-large:{i}")
    photo = _LARGE["photos"][i % len(_LARGE["photos"])]
    w, h = LARGE["size"]
    if rng.random() < LARGE["portrait"]:
        w, h = h, w
    # the largest box of the output's aspect inside the photo, shrunk to 60-100% of its side
    cw = min(photo.width, photo.height * w / h) * rng.uniform(0.6, 1.0)
    ch = cw * h / w
    x0, y0 = rng.uniform(0, photo.width - cw), rng.uniform(0, photo.height - ch)
    img = photo.resize((w, h), Image.LANCZOS, box=(x0, y0, x0 + cw, y0 + ch))
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    gains, shift = [rng.uniform(0.85, 1.15) for _ in range(3)], rng.randint(-15, 15)
    img = img.point([min(255, max(0, round(v * g + shift))) for g in gains for v in range(256)])
    noise = _LARGE["noise"]
    nx, ny = rng.randrange(noise.width - w + 1), rng.randrange(noise.height - h + 1)
    img = ImageChops.add(img, noise.crop((nx, ny, nx + w, ny + h)), offset=-LARGE["bias"])
    out = io.BytesIO()
    img.save(out, "JPEG", quality=LARGE["quality"], subsampling=2)
    return out.getvalue()


def _write_large(i: int) -> int:
    data = render_large(i)
    names = _LARGE["names"]
    (_LARGE["out"] / names[i % len(names)] / f"{i:06d}.jpg").write_bytes(data)
    return len(data)


def prepare(run, tree: str) -> tuple[Path, Path, str]:
    """(the source tree, its tar pack, what it holds) of ``tree``, made where missing."""
    count = getattr(run.args, tree)
    if tree == "icons":
        src, what = ensure_icons(run.data_dir, count)
    elif tree == "photos":
        src, _ = c.ensure_images(run.data_dir, count)
        what = (f"{count:,} ~500x375 JPEGs of ~100 KB made by scripts/make_images.py from "
                "scikit-image's photos")
    else:
        src, what = ensure_large(run.data_dir, count)
    packed = c.ensure_pack(src, run.data_dir / "trees" / f"{tree}-{count}-tar",
                           "--format", "tar", "--shard-size", "64MB")
    return src, packed, what


# ------------------------------------------------------------------------------ the plain loader

def rrc_params(width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` written out (torch's generator, 10 tries,
    then the central crop of the clamped aspect): (top, left, height, width)."""
    import torch

    area = width * height
    log_ratio = torch.log(torch.tensor(RATIO))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(SCALE[0], SCALE[1]).item()
        aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = torch.randint(0, height - h + 1, size=(1,)).item()
            left = torch.randint(0, width - w + 1, size=(1,)).item()
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(RATIO):
        w, h = width, int(round(width / min(RATIO)))
    elif in_ratio > max(RATIO):
        w, h = int(round(height * max(RATIO))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class PillowTree:
    """The plain loader's map-style dataset (``__len__`` + ``__getitem__``, what DataLoader
    takes; no torchvision): the tree's files in ImageFolder order, each opened with Pillow,
    converted to RGB, random-resized-cropped, resized bilinear and flipped as torchvision does;
    the sample is a float CHW tensor normalised as ``ToTensor()`` + ``Normalize()`` make it,
    or with ``uint8`` the uint8 CHW tensor, ``size`` a side. Returns (tensor, class index)."""

    def __init__(self, root, uint8: bool, size: int = SIZE):
        self.items = [(os.path.join(root, rel), ci) for rel, ci in c.list_tree(root)]
        self.uint8, self.size = uint8, size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        import numpy as np
        import torch
        from PIL import Image

        path, label = self.items[index]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        top, left, h, w = rrc_params(*img.size)
        img = img.crop((left, top, left + w, top + h)).resize((self.size, self.size),
                                                              Image.BILINEAR)
        if torch.rand(1) < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.array(img)).permute(2, 0, 1)
        if not self.uint8:
            x = x.contiguous().float().div(255)
            x = (x - torch.tensor(MEAN).view(-1, 1, 1)) / torch.tensor(STD).view(-1, 1, 1)
        return x, label


# ------------------------------------------------------------------------------ measurements

def _loader(kind: str, path: str):
    """(the iterable, its set_epoch, the batch's images) of one contender."""
    from torch.utils.data import DataLoader

    if kind in PILLOWS:
        dl = DataLoader(PillowTree(path, kind == "pillow-uint8"), batch_size=BATCH, shuffle=True,
                        num_workers=WORKERS, persistent_workers=True)
        return dl, lambda epoch: None, lambda batch: batch[0]
    import shardpack

    threads = kind == "shardpack-threads"
    decode = shardpack.CpuDecode(SIZE, threads=WORKERS) if threads else shardpack.CpuDecode(SIZE)
    ds = shardpack.ShardDataset(path, batch_size=BATCH, batched=True, shuffle=True, decode=decode)
    if threads:
        dl = DataLoader(ds, batch_size=None, num_workers=0)
    else:
        dl = DataLoader(ds, batch_size=None, num_workers=WORKERS, persistent_workers=True)
    out = {} if kind == "shardpack" else dict(normalize=False, dtype="uint8")
    loader = shardpack.DeviceLoader(dl, device="cpu", decode_on="cpu", **out)
    return loader, loader.set_epoch, lambda batch: batch["image"]


def measure(kind: str, path: str) -> dict:
    """Child: one contender, EPOCHS epochs, each batch's images touched (one element read): the
    2nd epoch's images/s and CPU seconds (this process and its workers, from /proc), the 1st
    epoch's time to the first batch from the loader's construction (imports before it)."""
    import torch  # noqa: F401  (imported before the clock starts, as the loaders' modules are)

    if kind not in PILLOWS:
        import shardpack  # noqa: F401
    t0 = time.perf_counter()
    loader, set_epoch, images = _loader(kind, path)
    epochs = []
    for epoch in range(EPOCHS):
        set_epoch(epoch)
        cpu0 = c.process_cpu(c.descendants(os.getpid()))
        start = t0 if epoch == 0 else time.perf_counter()
        first, n = None, 0
        for batch in loader:
            x = images(batch)
            x[0, 0, 0, 0].item()
            n += len(x)
            if first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        cpu = c.process_cpu(c.descendants(os.getpid())) - cpu0
        epochs.append(dict(n=n, seconds=end - start, first=first - start, cpu=cpu))
    last = epochs[-1]
    return dict(rate=last["n"] / last["seconds"], ttfb=epochs[0]["first"], cpu=last["cpu"],
                per_core=last["n"] / last["cpu"] if last["cpu"] else None,
                cores=last["cpu"] / last["seconds"], n=last["n"])


def _memory_kb(pid: int) -> tuple[int, int, int]:
    """(Rss, Pss, Pss less its file-backed pages) of a process in kB from /proc/PID/smaps_rollup;
    zeros once it is gone.  File-backed pages are the page cache: mapped shards (shardpack reads
    local shards through mmap) and the libraries' code, shared and reclaimable; what is left is
    what the process allocated (heap, shared-memory batch slots)."""
    found = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("Rss", "Pss", "Pss_File"):
                    found[name] = int(rest.split()[0])
    except (OSError, ValueError):
        pass
    pss = found.get("Pss", 0)
    return found.get("Rss", 0), pss, pss - found.get("Pss_File", 0)


def run_child(kind: str, path, env: dict | None = None, timeout: float = 900) -> dict:
    """:func:`measure` in a fresh interpreter (benchmarks.child), with the peaks of its process
    tree's summed RSS and PSS, sampled from here every SAMPLE_S s: outside the measured
    processes, whose CPU figures stay clean."""
    cmd = c.child_cmd(f"{HERE}:measure", kind, str(path))
    rss = pss = own = 0
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=c.child_env(env))
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                break
            mem = [_memory_kb(p) for p in c.descendants(proc.pid)]
            rss, pss = max(rss, sum(m[0] for m in mem)), max(pss, sum(m[1] for m in mem))
            own = max(own, sum(m[2] for m in mem))
            time.sleep(SAMPLE_S)
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())
    result = c.parse_child(done, kind)
    return dict(result, rss_mb=rss / 1024, pss_mb=pss / 1024, own_mb=own / 1024)


def _contenders(run, tree: str, notes: list) -> list[str]:
    """The contenders that run on ``tree``: less --skip, shardpack-whole on PNGs, and
    shardpack-threads where CpuDecode has no ``threads`` keyword yet."""
    import inspect

    import shardpack

    skip = {s.strip() for s in run.args.skip.split(",") if s.strip()}
    kinds = [k for k in CONTENDERS if k not in skip and not (tree == "icons"
                                                             and k == "shardpack-whole")]
    if "shardpack-threads" in kinds and \
            "threads" not in inspect.signature(shardpack.CpuDecode).parameters:
        kinds.remove("shardpack-threads")
        notes.append("shardpack-threads skipped: this shardpack's CpuDecode has no threads=")
    return kinds


def measure_tree(run, tree: str, src: Path, packed: Path, kinds: list[str]) -> dict:
    """Every contender on one tree, alternated, ``run.reps`` times: {kind: [results]}."""
    c.warm(c.files_under(src) + c.files_under(packed))
    runs = {k: [] for k in kinds}
    for rep in range(run.reps):
        for kind in c.rotated(kinds, rep):
            path = src if kind in PILLOWS else packed
            env = {REGION_ENV: "0"} if kind == "shardpack-whole" else None
            r = run_child(kind, path, env=env)
            runs[kind].append(r)
            run.log(f"{tree} rep {rep} {kind:17s} {r['rate']:8.1f} images/s, "
                    f"{r['per_core'] or 0:7.1f}/CPU-s, first batch {r['ttfb']:6.2f} s, "
                    f"PSS {r['pss_mb']:6.0f} MB, less file pages {r['own_mb']:6.0f} MB")
    return runs


# ------------------------------------------------------------------------------ figures

def _headline(values: dict) -> str:
    """The contender a one-row figure shows (the README pipeline where it ran)."""
    return next((k for k in CONTENDERS if k not in PILLOWS and k in values), next(iter(values)))


def _row(tree: str, label: str, unit: str, values: dict, note: str) -> dict:
    """One figure holding every contender's median: the headline's as the value, the others as
    peers."""
    head = _headline(values)
    return figure(f"{tree}: {label}, {head}", values[head], unit,
                  {k: v for k, v in values.items() if k != head}, {}, note)


def tree_figures(tree: str, runs: dict) -> list[dict]:
    """The figures of one tree from its runs."""
    def median(key):
        return {k: c.med(r[key] for r in v) for k, v in runs.items()}

    rate = median("rate")
    pillows = {k: rate[k] for k in PILLOWS if k in rate}
    figures = []
    for kind in (k for k in runs if k not in PILLOWS):
        spread = c.spread([r["rate"] for r in runs[kind]], "{:,.0f}")
        figures.append(figure(f"{tree}: {kind}, 2nd epoch", rate[kind], "images/s", pillows, {},
                              f"runs {spread}; on {c.med(r['cores'] for r in runs[kind]):.2f} "
                              "cores"))
    for a, b in RATIOS:
        if a in rate and b in rate:
            x = rate[a] / rate[b]
            spread = c.spread([r["rate"] for r in runs[b]], "{:,.0f}")
            figures.append(figure(f"{tree}: {a} / {b}", x, "x", {}, {"target": TARGET},
                                  f"target >= {TARGET}x: {c.verdict(x >= TARGET)}; {b} runs "
                                  f"{spread}"))
    if "shardpack-whole" in rate and "shardpack-uint8" in rate:
        gain = rate["shardpack-uint8"] / rate["shardpack-whole"]
        figures.append(figure(f"{tree}: region decode gain", gain, "x", {}, {},
                              "shardpack-uint8 over shardpack-whole (SHARDPACK_JPEG_REGION=0: "
                              "whole image at the DCT scale)"))
    if not runs:
        return figures
    figures.append(_row(tree, "images/s per loader core", "images/CPU-s", median("per_core"),
                        "2nd epoch's images over the CPU seconds of the main process and its "
                        "workers"))
    figures.append(_row(tree, "time to first batch", "s", median("ttfb"),
                        "1st epoch, from the loader's construction (imports before it)"))
    pss = median("pss_mb")
    figures.append(_row(tree, "peak memory (PSS less file pages)", "MB", median("own_mb"),
                        "summed over the main process and its workers (shared pages split "
                        "among them), less the file-backed pages (the page cache: mapped "
                        "shards, the libraries' code), sampled every 0.2 s; with them: "
                        + ", ".join(f"{k} {v:,.0f}" for k, v in pss.items())))
    return figures


@suite("trees", title="Trees: the README pipeline against a plain Pillow loader", options=options,
       quick=dict(icons=600, photos=600, large=40),
       measures="""Three ImageFolder trees, each read by a plain Pillow loader from its files and
       by shardpack from its tar pack (64 MB shards): 48x48 PNG icons (the machine's own, in
       /usr/share/icons), ~500x375 JPEGs of ~100 KB, and 3000x2000 JPEGs of ~1.7 MB. Batch 256,
       224x224 random-resized crops (scale 0.08-1, ratio 3/4-4/3) and flips, shuffled, a
       DataLoader with 2 persistent workers, 2 epochs, no model (each batch is touched). `pillow`
       is torchvision's recipe written out without torchvision (open, RGB, crop, bilinear resize,
       flip, ToTensor + Normalize; `pillow-uint8` stops at the uint8 CHW tensor). `shardpack` is
       the README pipeline (`CpuDecode(224)` in the workers, `DeviceLoader(device="cpu",
       decode_on="cpu")`, normalised float NCHW); `shardpack-uint8` leaves the normalisation to
       the device (uint8 NCHW); `shardpack-whole` is that with the region decoder off
       (`SHARDPACK_JPEG_REGION=0`: the whole JPEG at its DCT scale); `shardpack-threads` decodes
       in 2 threads of the main process (`CpuDecode(224, threads=2)`, no workers). Figures: the
       2nd epoch's images/s, its images per CPU second of the main process and its workers, the
       1st epoch's time to the first batch, the peak memory of the process tree (PSS less the
       page cache). Each measurement in a fresh interpreter, the contenders alternated, medians.""",
       bounds="""On 2 cores the CPU is the ceiling: where a contender keeps both busy (the notes
       give the cores it used) images/s follows the CPU cost of an image, which images per CPU
       second shows without the noise of a shared machine. Icons are tiny: per-sample Python (open,
       convert, transforms, collate) weighs on the Pillow loader; shardpack decodes the PNGs whole
       with Pillow too, but in batches. For photos the JPEG decode dominates; shardpack decodes at a
       reduced DCT scale and only the crop's region where it can. A 3000x2000 baseline JPEG must be
       Huffman-decoded from its top to the crop's last row whatever is kept, a floor for every
       loader; Pillow also runs the IDCT, upsampling and colour conversion of all 6 megapixels,
       which the DCT scale and the region mostly save. The float contenders also pay the
       normalisation and 4x the bytes per image.""")
def run_trees(run) -> Outcome:
    """The trees suite: each tree made and packed once, then every contender, alternated."""
    from shardpack.images import jpegcrop

    trees = [t.strip() for t in run.args.trees.split(",") if t.strip()]
    skip = {s.strip() for s in run.args.skip.split(",") if s.strip()}
    unknown = (set(trees) - set(TREES)) | (skip - set(CONTENDERS))
    if unknown:
        raise SystemExit(f"trees: unknown tree or contender {', '.join(sorted(unknown))}")
    figures, raw, notes, described = [], {}, [], []
    for tree in trees:
        src, packed, what = prepare(run, tree)
        described.append(f"{tree}: {what}")
        raw[tree] = measure_tree(run, tree, src, packed, _contenders(run, tree, notes))
        figures += tree_figures(tree, raw[tree])
    region = "built" if jpegcrop.available() else "not built (shardpack-uint8 decodes whole too)"
    setup = (f"{'; '.join(described)}. Batch {BATCH}, {SIZE}x{SIZE}, {WORKERS} DataLoader "
             f"workers (shardpack-threads: {WORKERS} threads, no workers), {EPOCHS} epochs, "
             f"{run.reps} repetitions, warm page cache; the region decoder is {region}. "
             + " ".join(notes))
    skipped = run.args.skip.strip()
    part = None if tuple(trees) == TREES and not skipped else "-".join(trees) + (
        "-partial" if skipped else "")
    return Outcome(figures, setup, part=part, raw=raw)
