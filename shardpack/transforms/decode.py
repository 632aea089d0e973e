"""Decode: JPEG/PNG/WebP bytes -> uint8 pixels, with the usual training crops done cheaply.

Runs inside DataLoader workers.  For each image:

1. read the header only, choose the crop box in original pixels and the flip
   (:func:`shardpack.transforms.spec.plan_crop`, the rule the GPU path shares: random-resized-crop
   for training, resize + center-crop for evaluation);
2. decode JPEGs with libjpeg-turbo at the smallest DCT scale (1/2, 1/4, 1/8) that still leaves
   the crop at least as large as the target (a crop twice the target size or more is never
   decoded at full resolution), and only the crop's rows and columns where the region decoder is
   built (:mod:`shardpack.images.jpegcrop`; else the whole image, simplejpeg: the same pixels);
   :class:`CpuDecode` decodes a chunk of samples' crops in one call that holds no GIL
   (:mod:`shardpack.transforms.batchdecode`), the same pixels as :func:`decode_image` per sample;
3. flip the crop by slicing, resize it (torch's antialiased bilinear kernel) straight into the
   batch's slot.

Other formats decode with Pillow.  Randomness is a pure function of (seed, epoch, sample index), so
a resumed epoch gets the same crops.  What the crops are is a
:class:`~shardpack.transforms.spec.TransformSpec` (``CropOptions`` is its older name).  Output:
``batch["image"]``, uint8 NHWC ``[B, size, size, 3]`` (channels-last: the layout GPUs prefer;
:class:`shardpack.DeviceLoader` makes it the spec's dtype and layout, normalised).
"""

from __future__ import annotations

import io
import os
from typing import NamedTuple

import numpy as np

from shardpack.core.errors import DecodeError
from shardpack.images.registry import claimed_codec
from shardpack.loader.headstart import HeadStart
from shardpack.loader.stages import EpochStage
from shardpack.transforms.spec import (
    Crop, SampleRandom, TransformSpec, crop_box, plan_crop, should_flip, spec_of,
)

__all__ = ["HEAD_START_WAIT", "CpuDecode", "CropOptions", "ImageItems", "JpegPlan",
           "SampleRandom", "TransformSpec", "crop_box", "decode_image", "image_batch",
           "image_items", "jpeg_plan", "reference_decode", "resize_crop", "should_flip"]

CropOptions = TransformSpec  # the crop options' older name: the spec holds them now


def decode_image(data, opts: TransformSpec, rnd: SampleRandom | None = None,
                 max_pixels: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """One image -> uint8 ``[size, size, 3]``, the fast way.  JPEGs (found by their magic bytes,
    whatever the field name) decode at a reduced DCT scale, only the crop's region where the
    region decoder is built, else whole with simplejpeg; CMYK/YCCK JPEGs, JPEGs both refuse and
    every other format decode whole with :func:`images.decode_rgb` (same RGB rules as
    :func:`reference_decode`).  The crop box and flip are planned once
    (:func:`~shardpack.transforms.spec.plan_crop`), from the header's size when there is one, so
    a fallback decode crops exactly as the fast path would have.  An image whose header is over
    the decode budget ``max_pixels`` (:func:`images.decode_budget`) is a DecodeError before any
    decoder runs, whatever the DCT scale would have been.

    Args:
        data: the encoded image (bytes-like).
        opts: the transform spec (its crop part).
        rnd: the sample's draws (:meth:`TransformSpec.random`); None: no randomness.
        max_pixels: the decode budget (None: the environment's or the default).
        out: a C-contiguous uint8 ``[size, size, 3]`` array to write the image into (a slot of
            the batch: the resize writes there directly); the result is then ``out``.
    """
    from shardpack.images.content import decode_rgb

    plan = size = crop = None
    codec = claimed_codec(data)
    if codec is not None and codec.stored_pixels:
        pixels = codec.decode(data, 0, max_pixels)  # a view of the bytes (writable where they
        if not isinstance(pixels, str):           # are: a batch slot's memoryview), no decode
            plan = plan_crop(pixels.shape[0], pixels.shape[1], opts, rnd)
            crop = pixels[plan.top:plan.top + plan.height, plan.left:plan.left + plan.width]
            return resize_crop(crop, opts.size, out, flip=plan.flip)
    if codec is not None and codec.region:
        plan, size, crop = _jpeg_crop(data, opts, rnd, max_pixels)
    if crop is None:
        pixels = decode_rgb(data, max_pixels=max_pixels)  # DecodeError naming what is wrong
        if plan is None or pixels.shape[:2] != size:
            plan = plan_crop(pixels.shape[0], pixels.shape[1], opts, rnd)
        crop = pixels[plan.top:plan.top + plan.height, plan.left:plan.left + plan.width]
    return resize_crop(crop, opts.size, out, flip=plan.flip)


class JpegPlan(NamedTuple):
    """A JPEG's crop, planned from its header (:func:`jpeg_plan`)."""

    crop: Crop                      # the crop box in original pixels, and the flip
    size: tuple[int, int]           # the image's (height, width)
    scaled: tuple[int, int]         # its (height, width) decoded at the DCT scale
    scale_num: int                  # the DCT scale over 8: 8, 4, 2 or 1
    box: tuple[int, int, int, int]  # the crop (y0, y1, x0, x1) in the scaled image's pixels
    cmyk: bool                      # CMYK/YCCK: libjpeg-turbo's RGB is wrong, Pillow converts


def jpeg_plan(data, opts: TransformSpec, rnd: SampleRandom | None,
              max_pixels: int | None) -> JpegPlan | None:
    """A JPEG's crop plan from its header (simplejpeg): the crop, and the smallest DCT scale that
    keeps it at least ``opts.size``, with its box at that scale.  None for a header simplejpeg
    cannot read; an image over the decode budget raises :class:`DecodeError`.  Shared by the
    per-sample and the batch decode, so both decode the same box.

    Args:
        data: the JPEG (bytes-like).
        opts: the transform spec (its crop part).
        rnd: the sample's draws; None: no randomness.
        max_pixels: the decode budget (None: the environment's or the default).
    """
    import simplejpeg

    from shardpack.images.content import check_size

    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None  # decode_rgb says what is wrong
    check_size(width, height, max_pixels)
    plan = plan_crop(height, width, opts, rnd)
    factor = 1
    while factor < 8 and min(plan.height, plan.width) >= 2 * factor * opts.size:
        factor *= 2
    scaled = (-(-height // factor), -(-width // factor))  # libjpeg's size at scale 1/factor
    return JpegPlan(plan, (height, width), scaled, 8 // factor,
                    _scaled_box(plan, (height, width), scaled), colorspace in ("CMYK", "YCCK"))


def _jpeg_crop(data, opts: TransformSpec, rnd: SampleRandom | None, max_pixels: int | None
               ) -> tuple[Crop | None, tuple | None, np.ndarray | None]:
    """A JPEG's crop plan and size from its header (:func:`jpeg_plan`), and its crop decoded at
    the plan's DCT scale: only the crop's region where the extension is built
    (:func:`shardpack.images.jpegcrop.decode_box`), else the whole image with simplejpeg (the
    same pixels).  (None, None, None) for a header simplejpeg cannot read; the crop None where it
    does not decode (CMYK, YCCK, refused)."""
    import simplejpeg

    from shardpack.images.jpegcrop import decode_box

    jpeg = jpeg_plan(data, opts, rnd, max_pixels)
    if jpeg is None:
        return None, None, None
    plan, size = jpeg.crop, jpeg.size
    if jpeg.cmyk:  # libjpeg-turbo's RGB output is wrong for these
        return plan, size, None
    crop = decode_box(data, jpeg.scale_num, *jpeg.box)
    if crop is not None:
        return plan, size, crop
    try:
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True,
                                        min_height=jpeg.scaled[0], min_width=jpeg.scaled[1])
    except ValueError:
        return plan, size, None  # e.g. a recoverable libjpeg warning: Pillow may still decode it
    y0, y1, x0, x1 = _scaled_box(plan, size, pixels.shape[:2])
    return plan, size, pixels[y0:y1, x0:x1]


def _scaled_box(plan: Crop, size: tuple, scaled: tuple) -> tuple[int, int, int, int]:
    """The crop box ``(y0, y1, x0, x1)`` in the pixels of the image decoded at a DCT scale:
    ``size`` is the image's (height, width), ``scaled`` the decoded one's; at least 1 px."""
    sy, sx = scaled[0] / size[0], scaled[1] / size[1]
    y0, x0 = int(round(plan.top * sy)), int(round(plan.left * sx))
    y1 = max(y0 + 1, min(scaled[0], int(round((plan.top + plan.height) * sy))))
    x1 = max(x0 + 1, min(scaled[1], int(round((plan.left + plan.width) * sx))))
    return y0, y1, x0, x1


def resize_crop(pixels: np.ndarray, size: int, out: np.ndarray | None = None,
                flip: bool = False) -> np.ndarray:
    """Antialiased bilinear resize of uint8 HWC into ``out`` (uint8 ``[size, size, 3]``, C
    contiguous; None: a new array), with torch's uint8 kernel: several times faster than Pillow's
    resize here (docs/device.md).  The kernel works in channels-last memory; given an HWC
    destination it writes there directly, where ``interpolate`` would return channels-first
    memory that then costs as much again to copy into the batch.  ``flip``: mirrored left-right,
    before the resize (the kernel is symmetric: the same pixels as flipping after it), by torch,
    whose copy of a crop is several times faster than NumPy's reversed-stride one.

    Args:
        pixels: uint8 ``[H, W, 3]``, any strides.
        size: the output's side.
        out: where to write (see above).
        flip: mirror left-right.
    """
    from shardpack.loader.torchenv import torch

    if not pixels.flags.writeable or min(pixels.strides) < 0:
        # torch.from_numpy warns on read-only arrays (Pillow's pixels are a read-only view of a
        # bytes object) and takes no negative strides; a crop of any other array, strided or
        # not, goes to the kernel as it is.  The copy is of the crop, far less than its decode.
        pixels = np.array(pixels, order="C")
    x = torch.from_numpy(pixels)
    if flip:
        x = x.flip(1)
    x = x.permute(2, 0, 1)[None]
    if out is None:
        out = np.empty((size, size, 3), np.uint8)
    target = torch.from_numpy(out).permute(2, 0, 1)[None]
    resize_into = getattr(getattr(torch.ops.aten, "_upsample_bilinear2d_aa", None), "out", None)
    if resize_into is None:  # a torch without the op's out= form
        target.copy_(torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear",
                                                     antialias=True, align_corners=False))
    else:
        resize_into(x, [size, size], False, None, None, out=target)
    return out


def reference_decode(data: bytes, opts: TransformSpec, rnd: SampleRandom | None = None
                     ) -> np.ndarray:
    """The straightforward Pillow pipeline (full decode, crop, resize): what the fast path must
    match within a tested tolerance.  Pixels go through the same RGB rules as decode_image
    (:func:`images.rgb_array`: 16-bit high byte, palette lookup, alpha dropped, CMYK by Pillow)."""
    from PIL import Image

    from shardpack.images.content import rgb_array

    with Image.open(io.BytesIO(bytes(data))) as source:
        source.load()
        image = Image.fromarray(rgb_array(source))
    plan = plan_crop(image.height, image.width, opts, rnd)
    out = np.asarray(image.crop((plan.left, plan.top, plan.left + plan.width,
                                 plan.top + plan.height)).resize(
        (opts.size, opts.size), Image.Resampling.BILINEAR))
    return out[:, ::-1] if plan.flip else out


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
        # an empty item is a sample without that field (or with an empty file): no image
        present = np.diff(items.offsets.numpy()) > 0
        return [(names[0], items)], np.where(present, 0, -1).tolist()
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


class ImageItems:
    """A batch's image bytes, popped from it (:func:`_image_fields`): ``items(i)`` is sample i's
    image as a bytes-like (a :class:`DecodeError` for a sample without one); ``parts`` the image
    fields used, ``(data, offsets)`` each (uint8 and int64 arrays), and ``choice`` each sample's
    part (-1: none), for the paths that take a whole batch at once."""

    def __init__(self, batch: dict, field: str | None):
        parts, choice = _image_fields(batch, field)
        self.names = [name for name, _ in parts] or [field or "image"]
        self.parts = [(items.data.numpy(), np.ascontiguousarray(items.offsets.numpy(), np.int64))
                      for _, items in parts]
        self.choice = choice
        self._batch = batch

    def __call__(self, i: int):
        if self.choice[i] < 0:
            raise DecodeError(f"sample has no image (no {' or '.join(self.names)} field, or an "
                              f"empty one; its fields: {_fields_of(self._batch, i)})")
        raw, offsets = self.parts[self.choice[i]]
        return raw[offsets[i]:offsets[i + 1]]


def image_items(batch: dict, field: str | None) -> ImageItems:
    """Pop a batch's image bytes: an :class:`ImageItems` (``image_of(i)``: sample i's image)."""
    return ImageItems(batch, field)


def _fields_of(batch: dict, i: int) -> str:
    """The fields sample ``i`` of a batch holds (non-empty), for messages."""
    held = [name for name, items in batch.items() if not name.startswith("__")
            and (not hasattr(items, "offsets") or items.offsets[i + 1] > items.offsets[i])]
    return ", ".join(held) or "none"


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


class CpuDecode(EpochStage):
    """A batch stage for ``ShardDataset(..., batched=True, decode=CpuDecode(...))``: replaces the
    image field's bytes with ``image`` (uint8 NHWC), cropped and flipped as its
    :class:`~shardpack.transforms.spec.TransformSpec` says.  Undecodable images raise
    :class:`~shardpack.core.errors.DecodeError` naming the sample, or with ``on_error="skip"``
    become zero images counted in ``batch["__bad__"]``.

    ``head_start`` (default on): when DataLoader workers start (each worker process's first
    iteration: the first epoch with persistent workers, every epoch without), worker 0 decodes its
    first batch with one thread per CPU while the other workers wait for it (at most
    HEAD_START_WAIT seconds), so the first batch arrives in about the time of one batch on all
    cores instead of after every worker's first batch at once (docs/device.md, "First batch").

    Args:
        size: output side in pixels (default 224).
        train: random-resized crops and flips (default); False: resize and centre crop.
        field: the image field (None: found by name; docs/device.md).
        seed: the crops' seed (default 0).
        flip: flip half the training images (default on).
        on_error: ``"raise"`` or ``"skip"`` (a zero image, flagged) an image that cannot be
            decoded.
        head_start: worker 0 decodes its first batch on every CPU (see above).
        max_pixels: the decode budget (docs/images.md, "Decode budget"); None: the
            ``SHARDPACK_MAX_PIXELS`` environment variable, else 8192 x 8192; 0: none.  An image
            over it is refused from its header, before decoding, like any broken image.
        spec: the whole transform spec instead of ``size``, ``train``, ``seed`` and ``flip``
            (its crop part is read here; DeviceLoader reads the rest).
        threads: decode each batch with this many threads of the process that runs the stage
            (0: in its own thread).  With ``DataLoader(num_workers=0)`` that is a loader of
            threads: no worker processes, less memory, a faster first batch (docs/device.md,
            "Threads or processes").
    """

    def __init__(self, size: int | None = None, *, train: bool | None = None,
                 field: str | None = None, seed: int | None = None, flip: bool | None = None,
                 on_error: str = "raise", head_start: bool = True, max_pixels: int | None = None,
                 spec: TransformSpec | None = None, threads: int = 0):
        from shardpack.images.content import decode_budget
        from shardpack.images.jpegcrop import notice_once

        if not isinstance(threads, int) or threads < 0:
            raise ValueError(f"threads must be an int >= 0, got {threads!r}")
        if max_pixels is not None:
            decode_budget(max_pixels)  # a bad value is refused here, not in every worker
        notice_once()  # here, in the main process: not once per worker
        self.spec = spec_of(spec, size=size, train=train, seed=seed, flip=flip)
        self.field = field
        self.on_error = on_error
        self.max_pixels = max_pixels
        self.epoch = 0  # set by ShardDataset at the start of every iteration
        self.head_start = head_start
        self._head = HeadStart(HEAD_START_WAIT) if head_start else None
        self._first = False    # the next batch is this process's first iteration's first
        self.threads = threads
        self._pool = None      # decode threads, made in the process that decodes, when needed
        self._pool_size = 0
        self._pool_pid = 0

    @property
    def opts(self) -> TransformSpec:
        """The spec (its older name)."""
        return self.spec

    def begin(self, epoch: int) -> None:
        """Called by ShardDataset when an iteration starts (in the process that iterates): keep
        the epoch, and start the head start on this process's first iteration.

        Args:
            epoch: the epoch the iteration reads.
        """
        super().begin(epoch)
        self._first = self._head is not None and self._head.begin(epoch) == 1  # the start-up

    def __getstate__(self):
        return dict(self.__dict__, _pool=None, _pool_size=0)

    def _threads(self) -> tuple[int, bool]:
        """Threads to decode this batch with (0 or 1: this thread), and whether it is worker 0's
        head-start batch (all its CPUs).  Another worker's first batch first waits for worker
        0's."""
        if not self._first:
            return self.threads, False
        self._first = False
        from shardpack.loader.runtime import current

        here = current()
        if not here.forked:  # the training process, or worker threads: one start for all
            return self.threads, False
        if here.worker != 0:
            self._head.wait()
            return self.threads, False
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        return max(1, self.threads, cpus or os.cpu_count() or 1), True

    def _decode_all(self, run, count: int, threads: int) -> None:
        """``run(part)`` over ``range(count)``: split among ``threads`` pool threads (simplejpeg,
        the region decoder, Pillow and torch's resize release the GIL), or in this thread."""
        if min(threads, count) <= 1:
            run(range(count))
            return
        if self._pool is None or self._pool_size < threads or self._pool_pid != os.getpid():
            from concurrent.futures import ThreadPoolExecutor

            if self._pool is not None and self._pool_pid == os.getpid():
                self._pool.shutdown(wait=False)
            # A pool inherited through fork (a DataLoader worker forked after the training
            # process decoded with threads) has no threads left but thinks it has idle ones:
            # submit() would start none and the batch would wait forever.  Never reuse one.
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="shardpack-decode")
            self._pool_size, self._pool_pid = threads, os.getpid()
        for future in [self._pool.submit(run, range(t, count, threads)) for t in range(threads)]:
            future.result()

    def __call__(self, batch: dict) -> dict:
        from shardpack.loader.batches import Batch
        from shardpack.loader.torchenv import torch
        from shardpack.transforms.batchdecode import decode_samples  # (it imports this module)

        image_of = image_items(batch, self.field)
        count = len(batch["__index__"])
        index = np.ascontiguousarray(batch["__index__"].numpy(), np.int64)
        size = self.spec.size
        nbytes = count * size * size * 3
        data = batch.buffer(nbytes) if isinstance(batch, Batch) else Batch().buffer(nbytes)
        images = data.numpy().reshape(count, size, size, 3)
        bad = np.zeros(count, dtype=bool)
        ids = index.tolist()

        failed: list[tuple[int, str]] = []  # (sample, message): the first bad one is raised

        def on_bad(i: int, exc: DecodeError) -> bool:
            if self.on_error != "skip":
                failed.append((i, exc.message))
                return False  # this part's later samples can only be later in the batch
            images[i] = 0
            bad[i] = True
            return True

        def run(part: range) -> None:  # JPEG crops a chunk at a time, the GIL released once
            decode_samples(image_of, part, self.spec, lambda i: self.spec.random(
                self.epoch, ids[i]), self.max_pixels, images, on_bad,
                batch_draws=(self.epoch, index))

        threads, head_start = self._threads()
        try:
            self._decode_all(run, count, threads)
        finally:
            if head_start:  # worker 0's head start is over (failed or not): the others may go
                self._head.done()
        if failed:  # the lowest bad sample, whatever the number of threads
            i, message = min(failed)
            raise DecodeError(message, key=batch["__key__"][i])
        batch["image"] = data.view(count, size, size, 3)
        batch["__bad__"] = torch.from_numpy(bad)
        return batch
