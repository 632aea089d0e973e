"""Batch decode (shardpack.transforms.batchdecode, libjpegcrop.decode_many): CpuDecode's batches
are the per-sample path's, bit for bit, whatever the batch holds (fallbacks, broken images, other
formats, images over the decode budget, missing images), with one thread or several, one chunk
or many; and the batch call answers each box as the single-box call does."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch
from PIL import Image

from shardpack.core.errors import DecodeError
from shardpack.images import jpegcrop
from shardpack.loader.batches import BytesBatch
from shardpack.transforms import batchdecode
from shardpack.transforms.decode import CpuDecode, decode_image
from testbed import jpegfuzz

needs_extension = pytest.mark.skipif(not jpegcrop.available(),
                                     reason="the region decode extension is not built here")
SIZE = 48
BUDGET = 2_500_000  # the 2000x1500 JPEG below is over it, the 1600x1200 one under


def _photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * (seed + 1)) % 256, (y * 3) % 256, ((x + y) * 2) % 256], -1)
    noise = np.random.default_rng(seed).normal(0, 8, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _encoded(width: int, height: int, seed: int = 0, mode: str = "RGB", fmt: str = "JPEG",
             **kwargs) -> bytes:
    out = io.BytesIO()
    Image.fromarray(_photo(width, height, seed)).convert(mode).save(out, fmt, **kwargs)
    return out.getvalue()


def _damaged(data: bytes) -> bytes:
    """Flipped bytes in the middle of the scan, the end-of-image marker kept: libjpeg warns."""
    cut = len(data) // 2
    return data[:cut] + bytes(b ^ 0x5A for b in data[cut:cut + 64]) + data[cut + 64:]


def _mixed() -> list[bytes]:
    """Clean JPEGs of every layout and scale, and everything the batch call must leave to the
    per-sample path, in between."""
    photo = _encoded(500, 375, 1, quality=90)
    return [
        photo, _encoded(640, 480, 2, progressive=True), _encoded(1600, 1200, 3),
        _encoded(40, 30, 4, mode="CMYK"),                      # CMYK: Pillow converts
        _encoded(900, 600, 5, subsampling=0), photo[:-300],     # truncated: no end marker
        _encoded(333, 250, 6, mode="L"), _damaged(_encoded(700, 500, 7)),
        _encoded(60, 50, 8, mode="RGBA", fmt="PNG"),            # a PNG in the JPEG field
        b"\xff\xd8 not a jpeg \xff\xd9", _encoded(2000, 1500, 9),  # over the decode budget
        b"", _encoded(37, 29, 10, restart_marker_rows=1), _encoded(480, 640, 11),
        _encoded(1201, 803, 12, subsampling=1), b"\x89PNG truncated",
    ]


def _batch(items: list[bytes], first: int = 100) -> dict:
    offsets = np.zeros(len(items) + 1, np.int64)
    offsets[1:] = np.cumsum([len(item) for item in items])
    data = torch.from_numpy(np.frombuffer(b"".join(items) or b"\0", np.uint8).copy())
    return {"__index__": torch.arange(first, first + len(items)),
            "__key__": [f"sample-{first + i}" for i in range(len(items))],
            "jpg": BytesBatch(data, torch.from_numpy(offsets))}


def _per_sample(items: list[bytes], stage: CpuDecode, first: int = 100):
    """What the per-sample path gives: images, bad flags, the first error (index, message)."""
    images = np.zeros((len(items), SIZE, SIZE, 3), np.uint8)
    bad, first_error = np.zeros(len(items), bool), None
    for i, data in enumerate(items):
        try:
            if not data:
                raise DecodeError("no image")
            decode_image(data, stage.spec, stage.spec.random(stage.epoch, first + i),
                         BUDGET, out=images[i])
        except DecodeError as exc:
            bad[i] = True
            first_error = first_error or (i, exc.message)
    return images, bad, first_error


@pytest.fixture
def calls(monkeypatch):
    """How often each region decode entry point answered: boxes decoded by the batch call,
    boxes it declined, and single-box calls."""
    seen = {"batch": 0, "declined": 0, "single": 0}
    many, one = jpegcrop.decode_boxes, jpegcrop.decode_box

    def decode_boxes(*args):
        statuses = many(*args)
        if statuses is not None:
            seen["batch"] += int((statuses == 0).sum())
            seen["declined"] += int((statuses != 0).sum())
        return statuses

    def decode_box(*args):
        seen["single"] += 1
        return one(*args)

    monkeypatch.setattr(jpegcrop, "decode_boxes", decode_boxes)
    monkeypatch.setattr(jpegcrop, "decode_box", decode_box)
    return seen


@needs_extension
@pytest.mark.parametrize("threads", [0, 2])
@pytest.mark.parametrize("chunk", [batchdecode.CHUNK_BYTES, 1, 200_000])
def test_a_batch_is_the_per_sample_path_bit_for_bit(monkeypatch, calls, threads, chunk):
    monkeypatch.setattr(batchdecode, "CHUNK_BYTES", chunk)
    items = _mixed()
    stage = CpuDecode(SIZE, on_error="skip", max_pixels=BUDGET, threads=threads)
    stage.begin(3)
    out = stage(_batch(items))
    # the eight clean JPEGs came from the batch call; only what it declined (the truncated and
    # the damaged one) went through the single-box decoder, in the per-sample fallback
    assert calls == {"batch": 8, "declined": 2, "single": 2}
    images, bad, _ = _per_sample(items, stage)
    assert out["__bad__"].tolist() == bad.tolist()
    assert bad.sum() >= 5 and not bad.all()
    assert np.array_equal(out["image"].numpy(), images)


@needs_extension
@pytest.mark.parametrize("threads", [0, 2])
def test_the_first_bad_sample_is_raised_as_the_per_sample_path_raises_it(threads):
    items = _mixed()
    stage = CpuDecode(SIZE, max_pixels=BUDGET, threads=threads)
    with pytest.raises(DecodeError) as caught:
        stage(_batch(items))
    _, _, (i, message) = _per_sample(items, stage)
    assert caught.value.message == message and f"sample-{100 + i}" in str(caught.value)


def test_without_the_extension_a_batch_decodes_sample_by_sample(monkeypatch):
    monkeypatch.setenv(jpegcrop.ENV, "0")
    jpegcrop.extension.cache_clear()
    try:
        items = _mixed()
        stage = CpuDecode(SIZE, on_error="skip", max_pixels=BUDGET)
        out = stage(_batch(items))
        images, bad, _ = _per_sample(items, stage)
        assert np.array_equal(out["image"].numpy(), images)
        assert out["__bad__"].tolist() == bad.tolist()
    finally:
        monkeypatch.delenv(jpegcrop.ENV)
        jpegcrop.extension.cache_clear()


@needs_extension
def test_decode_boxes_answers_each_box_as_decode_box_does():
    """Over the fuzz corpus: each status is 0 exactly where decode_box decodes, with its
    pixels; the boxes lie in one buffer without touching each other."""
    cases = list(jpegfuzz.cases(600, seed=7))
    for start in range(0, len(cases), 25):
        part = cases[start:start + 25]
        sizes = [(y1 - y0) * (x1 - x0) * 3 for _, _, y0, y1, x0, x1 in part]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]) + 7 * np.arange(len(part))
        out = np.full(int(offsets[-1] + sizes[-1] + 7), 0xAB, np.uint8)
        jobs = np.array([(s, y0, y1, x0, x1, at) for (_, s, y0, y1, x0, x1), at
                         in zip(part, offsets, strict=True)], np.int64)
        statuses = jpegcrop.decode_boxes([case[0] for case in part], jobs, out)
        for (data, s, y0, y1, x0, x1), at, n, status in zip(part, offsets, sizes, statuses,
                                                             strict=True):
            box = jpegcrop.decode_box(data, s, y0, y1, x0, x1)
            assert (status == 0) == (box is not None)
            if box is not None:
                assert np.array_equal(out[at:at + n].reshape(box.shape), box)
        gaps = np.concatenate([out[at + n:at + n + 7] for at, n in zip(offsets, sizes,
                                                                        strict=True)])
        assert (gaps == 0xAB).all()  # nothing written between the boxes


@needs_extension
def test_decode_boxes_refuses_malformed_jobs():
    photo = _encoded(64, 48)
    out = np.zeros(64 * 48 * 3, np.uint8)
    with pytest.raises(ValueError, match="job 1"):
        jpegcrop.decode_boxes([photo, photo], np.array([(8, 0, 48, 0, 64, 0),
                                                        (8, 0, 48, 0, 64, 3)]), out)
    for job in [(3, 0, 1, 0, 1, 0), (8, 5, 5, 0, 1, 0), (8, 0, 1, 0, 1, -1)]:
        with pytest.raises(ValueError, match="job 0"):
            jpegcrop.decode_boxes([photo], np.array([job]), out)
    with pytest.raises(ValueError, match="int64"):
        jpegcrop.decode_boxes([photo, photo], np.array([(8, 0, 1, 0, 1, 0)]), out)
    statuses = jpegcrop.decode_boxes(
        [photo[:-2], _encoded(40, 30, mode="CMYK"), photo],
        np.array([(8, 0, 1, 0, 1, 0), (8, 0, 1, 0, 1, 0), (8, 0, 49, 0, 1, 0)]), out)
    assert statuses.tolist() == [5, 2, 3]  # no end marker, CMYK, box outside the image
    assert jpegcrop.decode_boxes([], np.zeros((0, 6), np.int64), out).size == 0


@needs_extension
def test_a_batch_of_random_crops_matches_sample_by_sample_over_epochs():
    rng = random.Random(3)
    items = [_encoded(rng.randint(100, 1400), rng.randint(100, 1000), seed,
                      progressive=seed % 3 == 0) for seed in range(12)]
    for epoch in range(3):
        stage = CpuDecode(SIZE, max_pixels=BUDGET, train=epoch != 2)
        stage.begin(epoch)
        out = stage(_batch(items, first=epoch * 50))
        images, bad, _ = _per_sample(items, stage, first=epoch * 50)
        assert not bad.any() and np.array_equal(out["image"].numpy(), images)


@needs_extension
def test_an_extension_built_before_the_batch_call_decodes_sample_by_sample(monkeypatch, calls):
    from types import SimpleNamespace

    stale = SimpleNamespace(decode=jpegcrop.extension().decode)  # no decode_many
    monkeypatch.setattr(jpegcrop, "extension", lambda: stale)
    items = _mixed()
    stage = CpuDecode(SIZE, on_error="skip", max_pixels=BUDGET)
    out = stage(_batch(items))
    assert calls["batch"] == 0 and calls["single"] == 10  # every JPEG went the per-sample way
    images, bad, _ = _per_sample(items, stage)
    assert np.array_equal(out["image"].numpy(), images)
    assert out["__bad__"].tolist() == bad.tolist()
