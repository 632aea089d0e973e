"""Region JPEG decode (shardpack.images.jpegcrop): a box decoded alone is the whole decode at the
same DCT scale, cropped, in every JPEG layout; without the extension the loader decodes as before
after one notice."""

from __future__ import annotations

import io
import os
import random
import sys
import warnings

import numpy as np
import pytest
import simplejpeg
from PIL import Image

import shardpack
from shardpack.images import jpegcrop
from shardpack.transforms.decode import SampleRandom, TransformSpec, decode_image

needs_extension = pytest.mark.skipif(not jpegcrop.available(),
                                     reason="the region decode extension is not built here")


def test_the_extension_is_built_where_the_test_script_requires_it():
    if os.environ.get("SHARDPACK_REQUIRE_JPEGCROP") != "1":
        pytest.skip("SHARDPACK_REQUIRE_JPEGCROP is not set (scripts/test.sh sets it)")
    assert jpegcrop.available(), (
        "the region JPEG decoder is not built: apt-get install gcc libjpeg62-turbo-dev, then "
        "bash scripts/setup.sh (docs/device.md, Region decode)")


def _photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * (seed + 1)) % 256, (y * 3) % 256, ((x + y) * 2) % 256], -1)
    noise = np.random.default_rng(seed).normal(0, 8, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _jpeg(pixels: np.ndarray, mode: str = "RGB", **kwargs) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, "JPEG", quality=90, **kwargs)
    return out.getvalue()


LAYOUTS = {
    "420": {}, "422": {"subsampling": 1}, "444": {"subsampling": 0},
    "progressive": {"progressive": True}, "restarts": {"restart_marker_rows": 1},
    "grey": {"mode": "L"},
}


@needs_extension
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("width,height", [(500, 375), (1201, 803), (37, 29)])
def test_a_box_is_the_whole_decode_cropped(layout, width, height):
    kwargs = dict(LAYOUTS[layout])
    data = _jpeg(_photo(width, height), kwargs.pop("mode", "RGB"), **kwargs)
    rng = random.Random(width + len(layout))
    for scale in (8, 4, 2, 1):
        whole = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True,
                                       min_height=-(-height * scale // 8),
                                       min_width=-(-width * scale // 8))
        rows, cols = whole.shape[:2]
        for _ in range(6):
            y0, x0 = rng.randrange(rows), rng.randrange(cols)
            y1, x1 = rng.randint(y0 + 1, rows), rng.randint(x0 + 1, cols)
            box = jpegcrop.decode_box(data, scale, y0, y1, x0, x1)
            assert box is not None and np.array_equal(box, whole[y0:y1, x0:x1]), \
                (scale, y0, y1, x0, x1)


@needs_extension
def test_the_decoder_declines_what_the_whole_decode_must_judge():
    data = _jpeg(_photo(200, 160))
    assert jpegcrop.decode_box(data[:-300], 8, 0, 10, 0, 10) is None  # truncated: no end marker
    assert jpegcrop.decode_box(_jpeg(_photo(40, 30), "CMYK"), 8, 0, 5, 0, 5) is None
    assert jpegcrop.decode_box(data, 8, 0, 161, 0, 10) is None  # box outside the image
    assert jpegcrop.decode_box(b"\xff\xd8 not a jpeg \xff\xd9", 8, 0, 1, 0, 1) is None
    with pytest.raises(ValueError):
        from shardpack.images import libjpegcrop
        libjpegcrop.decode(data, 3, 0, 1, 0, 1)  # only the SIMD scales 1, 2, 4, 8


@needs_extension
def test_decode_image_is_identical_with_and_without_the_extension(monkeypatch):
    spec = TransformSpec(size=64)
    photos = [_jpeg(_photo(w, h, i), **LAYOUTS[k]) for i, (w, h, k) in enumerate(
        [(500, 375, "420"), (2000, 1500, "420"), (640, 480, "progressive"), (900, 600, "444")])]

    def decoded():
        jpegcrop.extension.cache_clear()
        return [decode_image(p, spec, SampleRandom(0, e, i)) for e in range(3)
                for i, p in enumerate(photos)]

    answered = []
    real = jpegcrop.decode_box

    def counted(*args):
        box = real(*args)
        answered.append(box is not None)
        return box

    monkeypatch.setattr(jpegcrop, "decode_box", counted)
    region = decoded()
    assert answered and all(answered)  # every crop came from the region decoder
    monkeypatch.setenv(jpegcrop.ENV, "0")
    whole = decoded()
    assert not any(answered[len(region):])  # and none of these did
    monkeypatch.delenv(jpegcrop.ENV)
    jpegcrop.extension.cache_clear()
    assert all(np.array_equal(a, b) for a, b in zip(region, whole, strict=True))


def test_without_the_extension_the_loader_decodes_after_one_notice(monkeypatch):
    monkeypatch.setitem(sys.modules, "shardpack.images.libjpegcrop", None)  # as if not built
    monkeypatch.delenv(jpegcrop.ENV, raising=False)
    jpegcrop.extension.cache_clear()
    jpegcrop.notice_once.cache_clear()
    try:
        assert not jpegcrop.available()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            shardpack.CpuDecode(32)
            shardpack.CpuDecode(64)
        notices = [w for w in caught if "region JPEG decode is not built" in str(w.message)]
        assert len(notices) == 1 and "libjpeg62-turbo-dev" in str(notices[0].message)
        photo = _jpeg(_photo(300, 200))
        assert decode_image(photo, TransformSpec(size=32), SampleRandom(0, 0, 1)).shape == \
            (32, 32, 3)
    finally:
        jpegcrop.extension.cache_clear()
        jpegcrop.notice_once.cache_clear()


def test_the_flip_before_the_resize_gives_the_flip_after_it():
    from shardpack.transforms.decode import resize_crop

    rng = np.random.default_rng(5)
    for height, width in [(40, 44), (375, 500), (333, 301), (17, 3), (1, 9)]:
        crop = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        for size in (224, 24):
            assert np.array_equal(resize_crop(crop, size, flip=True),
                                  resize_crop(crop, size)[:, ::-1])
