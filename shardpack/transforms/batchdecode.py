"""Batch decode: the JPEG crops of a run of samples decoded by one call of the region decoder,
which holds the GIL for none of them (docs/device.md, "Threads or processes").

:func:`decode_image` decodes one sample: its Python work and three GIL hand-offs (into libjpeg,
back for the result's memory, back at the end) come once per image, and in a loader of threads
every hand-off may wait for the other threads' Python.  :func:`decode_samples` plans every JPEG
of a chunk of samples first (header and crop in Python, :func:`jpeg_plan`, the rule the
per-sample path uses), decodes all their boxes in one
:func:`~shardpack.images.jpegcrop.decode_boxes` call into one buffer, then resizes each into the
batch: the same pixels as :func:`decode_image`.  Every sample that call does not answer (no
extension, not a JPEG, a header simplejpeg refuses, over the decode budget, CMYK/YCCK, damaged,
truncated) goes through :func:`decode_image` in its turn, which decodes it or raises exactly as
it does alone.

Before that, the formats that crop a whole batch in one call (raw pixels,
:meth:`~shardpack.images.formats.base.Codec.crop_batch`) take their samples: header, crop plan and
resize of each in C, the same pixels as :func:`decode_image`; the samples they decline go on as
above.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from shardpack.core.errors import DecodeError
from shardpack.images.registry import BATCH_CROPS, region_decodes
from shardpack.transforms.decode import (
    JpegPlan, decode_image, jpeg_plan, resize_crop,
)
from shardpack.transforms.spec import SampleRandom, TransformSpec

__all__ = ["CHUNK_BYTES", "decode_samples"]

# Decoded crops held at once per thread before their resize: bounds the scratch memory (a
# 3000x2000 photo's crop at its DCT scale is up to ~0.8 MB; a ~500x375 photo's ~0.1-0.4 MB)
# while a chunk still spans tens of photos, so the GIL is handed over once per chunk.
CHUNK_BYTES = 8 << 20


def decode_samples(image_of: Callable, part, spec: TransformSpec,
                   rnd_of: Callable[[int], SampleRandom | None], max_pixels: int | None,
                   images: np.ndarray, on_bad: Callable[[int, DecodeError], bool],
                   batch_draws: tuple | None = None) -> None:
    """Decode samples ``part`` of a batch into ``images[i]``, the same pixels as
    :func:`decode_image` gives each, in chunks of at most about CHUNK_BYTES of JPEG crops
    (module docstring).  A sample that cannot be decoded calls ``on_bad(i, error)`` in its turn
    (in ``part``'s order); False stops there.

    Args:
        image_of: sample ``i``'s image bytes (:func:`image_items`); raises DecodeError for none.
        part: the samples (indices into the batch), in order.
        spec: the transform spec.
        rnd_of: sample ``i``'s draws, a new :class:`SampleRandom` each call.
        max_pixels: the decode budget.
        images: uint8 ``[B, size, size, 3]``, the batch's images.
        on_bad: called with a sample that failed and its error; returns whether to go on.
        batch_draws: (epoch, int64 global indices of the batch's samples): the draws of
            ``rnd_of`` as numbers, for the batch crop (:func:`_batch_cropped`); None: none.
    """
    from shardpack.images.jpegcrop import available

    if batch_draws is not None and hasattr(image_of, "parts"):
        part = _batch_cropped(image_of, part, spec, batch_draws, max_pixels, images)
    region = available()
    chunk, held, scratch = [], 0, np.empty(0, np.uint8)
    for i in part:
        planned = _planned(image_of, i, spec, rnd_of, max_pixels) if region else None
        chunk.append((i, planned))
        held += _nbytes(planned[1]) if planned else 0
        if held >= CHUNK_BYTES:
            scratch = _grown(scratch, held)
            if not _finish(chunk, image_of, spec, rnd_of, max_pixels, images, on_bad, scratch):
                return
            chunk, held = [], 0
    if chunk:
        _finish(chunk, image_of, spec, rnd_of, max_pixels, images, on_bad, _grown(scratch, held))


def _batch_cropped(items, part, spec: TransformSpec, batch_draws: tuple,
                   max_pixels: int | None, images: np.ndarray) -> list:
    """Crop the samples of ``part`` whose format crops a batch in one call (each image field's
    samples in one call per such format); returns the samples left, in ``part``'s order."""
    if not BATCH_CROPS or not len(part):
        return part
    epoch, ids = batch_draws
    crop = (spec.size, spec.train, spec.flip, spec.seed, epoch, *spec.scale, *spec.ratio,
            spec.crop_fraction)
    rows = np.asarray(part, np.int64)
    choice = np.asarray(items.choice, np.int64)[rows]
    done = np.zeros(len(rows), bool)
    for which, (data, offsets) in enumerate(items.parts):
        mine = np.flatnonzero(choice == which)
        for codec in BATCH_CROPS:
            if not len(mine):
                break
            wrote = codec.crop_batch(data, offsets, rows[mine], ids, images, crop, max_pixels)
            if wrote is None:
                continue
            done[mine[wrote]] = True
            mine = mine[~wrote]
    return rows[~done].tolist() if done.any() else part


def _planned(image_of: Callable, i: int, spec: TransformSpec, rnd_of: Callable,
             max_pixels: int | None) -> tuple | None:
    """(data, plan) of sample ``i`` when it is a JPEG the region decoder may take; None where
    :func:`decode_image` must judge it (its error, if any, is raised there, in the sample's
    turn)."""
    try:
        data = image_of(i)
        if not region_decodes(data):
            return None
        plan = jpeg_plan(data, spec, rnd_of(i), max_pixels)
    except DecodeError:
        return None
    return None if plan is None or plan.cmyk else (data, plan)


def _nbytes(plan: JpegPlan) -> int:
    y0, y1, x0, x1 = plan.box
    return (y1 - y0) * (x1 - x0) * 3


def _grown(scratch: np.ndarray, nbytes: int) -> np.ndarray:
    """``scratch``, or a larger one where it holds fewer than ``nbytes``: one allocation per
    part of a batch, not one per chunk."""
    return scratch if scratch.size >= nbytes else np.empty(max(nbytes, CHUNK_BYTES), np.uint8)


def _finish(chunk: list, image_of: Callable, spec: TransformSpec, rnd_of: Callable,
            max_pixels: int | None, images: np.ndarray, on_bad: Callable,
            scratch: np.ndarray) -> bool:
    """Decode a chunk's planned JPEG boxes in one call into ``scratch``, then each sample in
    order: resize its box, or :func:`decode_image` it.  False: ``on_bad`` said stop."""
    from shardpack.images.jpegcrop import decode_boxes

    planned = [p for _, p in chunk if p is not None]
    where, offset = [], 0
    for _, plan in planned:
        where.append(offset)
        offset += _nbytes(plan)
    statuses = []
    if planned:
        jobs = np.array([(plan.scale_num, *plan.box, at)
                         for (_, plan), at in zip(planned, where, strict=True)], np.int64)
        found = decode_boxes([data for data, _ in planned], jobs, scratch)
        # None: an extension built before the batch call; each image then decodes alone
        statuses = [1] * len(planned) if found is None else found.tolist()
    done = iter(zip(planned, where, statuses, strict=True))
    for i, p in chunk:
        if p is not None:
            (_, plan), at, status = next(done)
            if status == 0:
                y0, y1, x0, x1 = plan.box
                crop = scratch[at:at + _nbytes(plan)].reshape(y1 - y0, x1 - x0, 3)
                resize_crop(crop, spec.size, images[i], flip=plan.crop.flip)
                continue
        try:  # not planned, or declined by the region decoder: the per-sample path
            decode_image(image_of(i), spec, rnd_of(i), max_pixels, out=images[i])
        except DecodeError as exc:
            if not on_bad(i, exc):
                return False
    return True
