"""JPEG mutants for fuzzing the region decoder (shardpack.images.libjpegcrop): seeds of every
layout the decoder takes (4:2:0, 4:2:2, 4:4:4, grey, progressive, restart markers, CMYK) plus the
hostile corpus's JPEGs, and mutations that hit the parser where it is weakest (truncation, flipped
bytes, stray markers, rewritten frame sizes, cut or repeated chunks, junk after the data).

Used by tests/robustness/test_fuzz_jpegcrop.py (the normal build) and scripts/fuzz_jpegcrop.py
(an AddressSanitizer build, for long runs)."""

from __future__ import annotations

import io
import random
import struct
from pathlib import Path

import numpy as np

HOSTILE = Path(__file__).resolve().parent.parent / "tests" / "robustness" / "hostile" / "images"


def seeds() -> list[bytes]:
    """The seed JPEGs: a small noisy photo in every layout, and the hostile corpus's JPEGs."""
    import simplejpeg
    from PIL import Image

    def encode(image, **kwargs) -> bytes:
        out = io.BytesIO()
        image.save(out, "JPEG", **kwargs)
        return out.getvalue()

    pixels = np.random.default_rng(0).integers(0, 256, (61, 83, 3), dtype=np.uint8)
    base = Image.fromarray(pixels).resize((167, 123))
    found = [encode(base, quality=90, **kw) for kw in (
        {}, {"subsampling": 0}, {"subsampling": 1}, {"progressive": True},
        {"progressive": True, "subsampling": 0}, {"restart_marker_rows": 1})]
    found += [encode(base, quality=30), encode(base.convert("L"), quality=85),
              encode(base.convert("L"), progressive=True), encode(base.convert("CMYK"))]
    # 4:4:0 and 4:1:1: the unusual subsamplings partial decompression is least tested with
    found += [simplejpeg.encode_jpeg(np.asarray(base), quality=90, colorsubsampling=mode)
              for mode in ("440", "411")]
    return found + [p.read_bytes() for p in sorted(HOSTILE.glob("*.jpg"))]


def _frame_size(data: bytes, height: int, width: int) -> bytes:
    """``data`` with the first SOFn marker's frame size rewritten."""
    for i in range(2, len(data) - 9):
        if data[i] == 0xFF and 0xC0 <= data[i + 1] <= 0xCF and data[i + 1] not in (0xC4, 0xC8,
                                                                                   0xCC):
            return data[:i + 5] + struct.pack(">HH", height, width) + data[i + 9:]
    return data


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One random mutation of ``data``."""
    if len(data) < 8:
        return data + bytes(rng.randrange(256) for _ in range(8))
    kind, cut = rng.randrange(7), rng.randrange(2, len(data))
    if kind == 0:
        return data[:cut]
    if kind == 1:
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        return bytes(flipped)
    if kind == 2:
        return data[:cut] + bytes([0xFF, rng.randrange(256)]) + data[cut:]
    if kind == 3:
        sides = [1, 7, 8, 9, 16, 17, 65500, 13000]
        return _frame_size(data, rng.choice(sides), rng.choice(sides))
    if kind == 4:
        end = rng.randrange(cut, len(data))
        return data[:cut] + data[end:]
    if kind == 5:
        return data[:cut] + data[cut:cut + rng.randrange(1, 200)] * 3 + data[cut:]
    return data[:-2] + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))) + b"\xff\xd9"


def cases(count: int, seed: int = 0):
    """``count`` fuzz cases: ``(data, scale_num, y0, y1, x0, x1)``, nine in ten mutated, boxes
    drawn inside (mostly) or across the image's scaled size when its header reads."""
    import warnings

    from PIL import Image

    warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # rewritten frame sizes
    rng, pool = random.Random(seed), seeds()
    for _ in range(count):
        data = rng.choice(pool)
        if rng.random() < 0.9:
            data = mutate(data, rng)
            if rng.random() < 0.3:
                data = mutate(data, rng)
        scale = rng.choice([1, 2, 4, 8])
        try:
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
        except Exception:  # noqa: BLE001 - any header: the decoder must cope with it anyway
            height, width = rng.randint(1, 300), rng.randint(1, 300)
        height, width = (max(1, min(2000, -(-side * scale // 8))) for side in (height, width))
        y0, x0 = rng.randrange(height), rng.randrange(width)
        y1, x1 = rng.randint(y0 + 1, height + (rng.random() < 0.05)), rng.randint(x0 + 1, width)
        yield data, scale, y0, y1, x0, x1
