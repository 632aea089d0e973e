"""Decode: JPEG/PNG/WebP bytes -> uint8 pixels, with the usual training crops done cheaply.

Runs inside DataLoader workers.  For each image:

1. read the header only, choose the crop box in original pixels (random-resized-crop for training,
   resize + center-crop for evaluation);
2. decode JPEGs with libjpeg-turbo (simplejpeg) at the smallest DCT scale (1/2, 1/4, 1/8) that
   still leaves the crop at least as large as the target: a crop twice the target size or more is
   never decoded at full resolution;
3. crop, then resize only the crop (Pillow's ``resize(box=...)``), flip by slicing.

Other formats decode with Pillow.  Randomness is a pure function of (seed, epoch, sample index), so
a resumed epoch gets the same crops.  Output: ``batch["image"]``, uint8 NHWC ``[B, size, size, 3]``
(channels-last: the layout GPUs prefer; :class:`shardpack.DeviceLoader` makes it float NCHW).
"""

from __future__ import annotations

import io
import math
import os
import struct
from dataclasses import dataclass

import numpy as np
import xxhash

from shardpack.core.errors import DecodeError
from shardpack.loader.headstart import HeadStart

JPEG_MAGIC = b"\xff\xd8"


@dataclass(frozen=True)
class CropOptions:
    size: int = 224
    train: bool = True
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    crop_fraction: float = 0.875  # eval: resize the short side to size / 0.875, crop the center
    seed: int = 0


class SampleRandom:
    """Uniform floats from a hash of (seed, epoch, index, draw): cheap, and the same in any
    process or worker, so resumed epochs crop identically."""

    __slots__ = ("key", "n")

    def __init__(self, seed: int, epoch: int, index: int):
        self.key = struct.pack("<qqq", seed, epoch, index)
        self.n = 0

    def uniform(self, lo: float = 0.0, hi: float = 1.0) -> float:
        self.n += 1
        bits = xxhash.xxh3_64_intdigest(self.key + struct.pack("<q", self.n))
        return lo + (hi - lo) * (bits >> 11) / float(1 << 53)


def crop_box(height: int, width: int, opts: CropOptions, rnd: SampleRandom | None
             ) -> tuple[int, int, int, int]:
    """(top, left, crop_height, crop_width) in original pixels; same rule as torchvision's
    RandomResizedCrop (10 tries, then a center crop at the nearest allowed ratio) for training,
    resize-then-center-crop for evaluation."""
    if opts.train and rnd is not None:
        area = height * width
        log_lo, log_hi = math.log(opts.ratio[0]), math.log(opts.ratio[1])
        for _ in range(10):
            target = area * rnd.uniform(*opts.scale)
            aspect = math.exp(rnd.uniform(log_lo, log_hi))
            cw = int(round(math.sqrt(target * aspect)))
            ch = int(round(math.sqrt(target / aspect)))
            if 0 < cw <= width and 0 < ch <= height:
                top = int(rnd.uniform(0, height - ch + 1))
                left = int(rnd.uniform(0, width - cw + 1))
                return min(top, height - ch), min(left, width - cw), ch, cw
        in_ratio = width / height
        if in_ratio < opts.ratio[0]:
            cw, ch = width, int(round(width / opts.ratio[0]))
        elif in_ratio > opts.ratio[1]:
            ch, cw = height, int(round(height * opts.ratio[1]))
        else:
            cw, ch = width, height
        return (height - ch) // 2, (width - cw) // 2, ch, cw
    side = min(height, width) * opts.crop_fraction
    ch = cw = max(1, int(round(side)))
    return (height - ch) // 2, (width - cw) // 2, min(ch, height), min(cw, width)


def should_flip(rnd: SampleRandom | None, opts: CropOptions) -> bool:
    """Whether this sample is flipped horizontally (training with ``flip`` on: one draw)."""
    return bool(opts.train and opts.flip and rnd is not None and rnd.uniform() < 0.5)


def decode_image(data, opts: CropOptions, rnd: SampleRandom | None = None,
                 max_pixels: int | None = None) -> np.ndarray:
    """One image -> uint8 ``[size, size, 3]``, the fast way.  JPEGs (found by their magic bytes,
    whatever the field name) decode with simplejpeg at a reduced DCT scale; CMYK/YCCK JPEGs, JPEGs
    simplejpeg refuses and every other format decode whole with :func:`images.decode_rgb` (same RGB
    rules as :func:`reference_decode`).  The crop box is drawn once, from the header's size when
    there is one, so a fallback decode crops exactly as the fast path would have.  An image whose
    header is over the decode budget ``max_pixels`` (:func:`images.decode_budget`) is a
    DecodeError before any decoder runs, whatever the DCT scale would have been."""
    from shardpack.images.content import check_size, decode_rgb

    crop = box = None
    if bytes(data[:2]) == JPEG_MAGIC:
        import simplejpeg

        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            colorspace = None  # decode_rgb below says what is wrong
        if colorspace is not None:
            check_size(width, height, max_pixels)
            box = top, left, ch, cw = crop_box(height, width, opts, rnd)
        if colorspace not in (None, "CMYK", "YCCK"):  # libjpeg-turbo's RGB output is right
            factor = 1
            while factor < 8 and min(ch, cw) >= 2 * factor * opts.size:
                factor *= 2
            try:
                pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True,
                                                fastupsample=True, min_height=-(-height // factor),
                                                min_width=-(-width // factor))
            except ValueError:
                pixels = None  # e.g. a recoverable libjpeg warning: Pillow may still decode it
            if pixels is not None:
                sy, sx = pixels.shape[0] / height, pixels.shape[1] / width
                y0, x0 = int(round(top * sy)), int(round(left * sx))
                y1 = max(y0 + 1, min(pixels.shape[0], int(round((top + ch) * sy))))
                x1 = max(x0 + 1, min(pixels.shape[1], int(round((left + cw) * sx))))
                crop = pixels[y0:y1, x0:x1]
    if crop is None:
        pixels = decode_rgb(data, max_pixels=max_pixels)  # DecodeError naming what is wrong
        if box is None or pixels.shape[:2] != (height, width):
            box = crop_box(pixels.shape[0], pixels.shape[1], opts, rnd)
        top, left, ch, cw = box
        crop = pixels[top:top + ch, left:left + cw]
    out = _resize(crop, opts.size)
    return out[:, ::-1] if should_flip(rnd, opts) else out


def _resize(pixels: np.ndarray, size: int) -> np.ndarray:
    """Antialiased bilinear resize of uint8 HWC with torch's channels-last uint8 kernel, several
    times faster than Pillow's resize here (docs/device.md)."""
    from shardpack.loader.torchenv import torch

    if pixels.flags.c_contiguous and not pixels.flags.writeable:
        # Pillow's pixels (PNG, WebP, ...) are a read-only view of a bytes object that NumPy
        # will not mark writable, and torch.from_numpy warns on read-only arrays.  Only a crop
        # that spans whole rows gets here: any other crop is copied below anyway, so this copy
        # costs no more than that one (and far less than the decode that made the pixels).
        pixels = pixels.copy()
    x = torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1)[None]
    y = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True,
                                        align_corners=False)
    return y[0].permute(1, 2, 0).numpy()


def reference_decode(data: bytes, opts: CropOptions, rnd: SampleRandom | None = None
                     ) -> np.ndarray:
    """The straightforward Pillow pipeline (full decode, crop, resize): what the fast path must
    match within a tested tolerance.  Pixels go through the same RGB rules as decode_image
    (:func:`images.rgb_array`: 16-bit high byte, palette lookup, alpha dropped, CMYK by Pillow)."""
    from PIL import Image

    from shardpack.images.content import rgb_array

    with Image.open(io.BytesIO(bytes(data))) as source:
        source.load()
        image = Image.fromarray(rgb_array(source))
    top, left, ch, cw = crop_box(image.height, image.width, opts, rnd)
    out = np.asarray(image.crop((left, top, left + cw, top + ch)).resize(
        (opts.size, opts.size), Image.Resampling.BILINEAR))
    return out[:, ::-1] if should_flip(rnd, opts) else out


def _image_fields(batch: dict, field: str | None) -> tuple[list, list]:
    """Pop a batch's image bytes.  Returns (names, choice): the image fields used,
    ``[(name, BytesBatch)]``, and for each sample the position in it of the sample's image, -1
    when it has none.  ``field`` None finds image fields by name
    (:func:`shardpack.images.content.is_image_field`): a batch of mixed formats has several
    (``jpg``,
    ``JPEG``, ``png``), each sample holding one, the others empty; a sample with several takes
    the primary one (:func:`_primary`).  Image fields no sample's choice used stay in the batch
    (``seg.png`` beside ``jpg``)."""
    from shardpack.images.content import is_image_field

    names = [field] if field is not None else [n for n in batch if is_image_field(n)]
    if not names or names[0] not in batch:
        have = ", ".join(n for n in batch if not n.startswith("__"))
        what = f"no field {field!r}" if field is not None else "no image field"
        raise DecodeError(f"{what} in the batch (fields: {have}); name one with field=...")
    if len(names) == 1:
        items = batch.pop(names[0])
        return [(names[0], items)], [0] * len(items)
    sizes = np.stack([np.diff(batch[name].offsets.numpy()) for name in names])  # [F, n]
    choice = []
    for i in range(sizes.shape[1]):
        found = np.flatnonzero(sizes[:, i]).tolist()
        choice.append(-1 if not found else found[0] if len(found) == 1 else
                      names.index(_primary([names[f] for f in found])))
    used = sorted(set(choice) - {-1})
    position = {f: k for k, f in enumerate(used)}
    return ([(names[f], batch.pop(names[f])) for f in used],
            [position.get(c, -1) for c in choice])


def _primary(found: list[str]) -> str:
    """The image field of a sample that has several: the one named by an extension alone
    (``jpg`` beside ``seg.png`` and ``depth.png``, as WebDataset samples have them).  Two such
    (``jpg`` and ``png``) is a question only the user can answer: a ValueError, which
    ``on_error="skip"`` does not turn into a zero image."""
    plain = [name for name in found if "." not in name]
    if len(plain) != 1:
        raise ValueError(f"a sample has {len(found)} image fields ({', '.join(found)}) and none "
                         "is the obvious one: choose with CpuDecode(field=...) / "
                         "DeviceLoader(field=...)")
    return plain[0]


def image_items(batch: dict, field: str | None):
    """Pop a batch's image bytes (:func:`_image_fields`); returns ``image_of(i)``, sample i's
    image as a bytes-like.  A sample without an image raises :class:`DecodeError`."""
    parts, choice = _image_fields(batch, field)
    parts = [(items.data.numpy(), items.offsets.numpy()) for _, items in parts]

    def image_of(i: int):
        if choice[i] < 0:
            raise DecodeError("sample has no image field")
        raw, offsets = parts[choice[i]]
        return raw[offsets[i]:offsets[i + 1]]

    return image_of


def image_batch(batch: dict, field: str | None):
    """Pop a batch's image bytes as one :class:`~shardpack.loader.batches.BytesBatch` (the GPU
    path).
    With several image fields, each sample's image is copied into a new batch; a sample with
    none gets an empty item, which fails its decode."""
    from shardpack.loader.batches import BytesBatch
    from shardpack.loader.torchenv import torch

    parts, choice = _image_fields(batch, field)
    if len(parts) == 1:
        return parts[0][1]
    empty = torch.empty(0, dtype=torch.uint8)
    chosen = [empty if c < 0 else parts[c][1].data[int(parts[c][1].offsets[i]):
                                                  int(parts[c][1].offsets[i + 1])]
              for i, c in enumerate(choice)]
    offsets = torch.zeros(len(chosen) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor([len(c) for c in chosen], dtype=torch.int64), 0)
    return BytesBatch(torch.cat(chosen) if chosen else empty, offsets)


HEAD_START_WAIT = 1.0  # seconds a worker waits at most for worker 0's first batch


class CpuDecode:
    """A batch stage for ``ShardDataset(..., batched=True, decode=CpuDecode(...))``: replaces the
    image field's bytes with ``image`` (uint8 NHWC).  Undecodable images raise
    :class:`~shardpack.core.errors.DecodeError` naming the sample, or with ``on_error="skip"``
    become
    zero images counted in ``batch["__bad__"]``.

    ``head_start`` (default on): when DataLoader workers start (each worker process's first
    iteration: the first epoch with persistent workers, every epoch without), worker 0 decodes its
    first batch with one thread per CPU while the other workers wait for it (at most
    HEAD_START_WAIT seconds), so the first batch arrives in about the time of one batch on all
    cores instead of after every worker's first batch at once (docs/device.md, "First batch").

    ``max_pixels``: the decode budget (docs/images.md, "Decode budget"); None: the
    ``SHARDPACK_MAX_PIXELS`` environment variable, else 8192 x 8192; 0: none.  An image over it
    is refused from its header, before decoding, like any broken image (skipped with
    ``on_error="skip"``)."""

    def __init__(self, size: int = 224, *, train: bool = True, field: str | None = None,
                 seed: int = 0, flip: bool = True, on_error: str = "raise",
                 head_start: bool = True, max_pixels: int | None = None):
        from shardpack.images.content import decode_budget

        if max_pixels is not None:
            decode_budget(max_pixels)  # a bad value is refused here, not in every worker
        self.opts = CropOptions(size=size, train=train, flip=flip, seed=seed)
        self.field = field
        self.on_error = on_error
        self.max_pixels = max_pixels
        self.epoch = 0  # set by ShardDataset at the start of every epoch
        self.head_start = head_start
        self._head = HeadStart(HEAD_START_WAIT) if head_start else None
        self._first = False    # the next batch is this process's first iteration's first
        self._pool = None      # worker 0's decode threads, made in the worker when first needed

    def begin(self, epoch: int) -> None:
        """Called by ShardDataset when an iteration starts (in the process that iterates)."""
        self.epoch = epoch
        self._first = self._head is not None and self._head.begin(epoch) == 1  # the start-up

    def __getstate__(self):
        return dict(self.__dict__, _pool=None)

    def _threads(self, batch: dict) -> int:
        """Threads for worker 0's head-start batch (all its CPUs), else 0: decode in this thread.
        Another worker's first batch first waits for worker 0's."""
        if not self._first:
            return 0
        self._first = False
        from shardpack.loader.torchenv import get_worker_info

        info = get_worker_info()
        if info is None:
            return 0
        if info.id != 0:
            self._head.wait()
            return 0
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else os.cpu_count() or 1)

    def __call__(self, batch: dict) -> dict:
        from shardpack.loader.batches import Batch
        from shardpack.loader.torchenv import torch

        image_of = image_items(batch, self.field)
        count = len(batch["__index__"])
        size = self.opts.size
        nbytes = count * size * size * 3
        data = batch.buffer(nbytes) if isinstance(batch, Batch) else Batch().buffer(nbytes)
        images = data.numpy().reshape(count, size, size, 3)
        bad = np.zeros(count, dtype=bool)
        ids = batch["__index__"].tolist()

        failed: list[tuple[int, str]] = []  # (sample, message): the first bad one is raised

        def run(part: range) -> None:
            for i in part:
                rnd = SampleRandom(self.opts.seed, self.epoch, ids[i]) if self.opts.train else None
                try:
                    images[i] = decode_image(image_of(i), self.opts, rnd, self.max_pixels)
                except DecodeError as exc:
                    if self.on_error != "skip":
                        failed.append((i, exc.message))
                        return  # this part's later samples can only be later in the batch
                    images[i] = 0
                    bad[i] = True

        threads = self._threads(batch)  # 0: not worker 0's head start
        if min(threads, count) > 1:  # simplejpeg and torch's resize release the GIL
            from concurrent.futures import ThreadPoolExecutor

            if self._pool is None:
                self._pool = ThreadPoolExecutor(threads, thread_name_prefix="shardpack-decode")
            for future in [self._pool.submit(run, range(t, count, threads))
                           for t in range(threads)]:
                future.result()
        else:
            run(range(count))
        if threads:  # worker 0's head start is over (failed or not): the others may go
            self._head.done()
        if failed:  # the lowest bad sample, whatever the number of threads
            i, message = min(failed)
            raise DecodeError(message, key=batch["__key__"][i])
        batch["image"] = data.view(count, size, size, 3)
        batch["__bad__"] = torch.from_numpy(bad)
        return batch
