"""Fuzzing the region JPEG decoder (shardpack.images.libjpegcrop) with the hostile corpus and
mutants of every JPEG layout: whatever the bytes and the box, it returns a box of the asked size
or raises ValueError / NotImplementedError, and the loader's decode_image gives the same answer
with and without it.  A long run under AddressSanitizer: scripts/fuzz_jpegcrop.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shardpack.core.errors import DecodeError
from shardpack.images import jpegcrop
from shardpack.transforms.decode import SampleRandom, TransformSpec, decode_image
from testbed import jpegfuzz

pytestmark = pytest.mark.skipif(not jpegcrop.available(),
                                reason="the region decode extension is not built here")
ROOT = Path(__file__).resolve().parents[2]


def test_region_decoder_returns_the_box_or_raises_a_value_error():
    from shardpack.images import libjpegcrop

    outcomes = {"ok": 0, "refused": 0}
    for data, scale, y0, y1, x0, x1 in jpegfuzz.cases(3000, seed=1):
        try:
            raw, rows, cols, skew = libjpegcrop.decode(data, scale, y0, y1, x0, x1)
        except (ValueError, NotImplementedError):
            outcomes["refused"] += 1
            continue
        assert rows == y1 - y0 and len(raw) == rows * cols * 3 and skew + x1 - x0 <= cols
        outcomes["ok"] += 1
    assert outcomes["ok"] > 100 and outcomes["refused"] > 100, outcomes  # both paths exercised


def test_decode_image_answers_alike_with_and_without_the_extension(monkeypatch):
    import random

    rng, spec = random.Random(2), TransformSpec(size=32)
    pool = jpegfuzz.seeds()
    samples = [jpegfuzz.mutate(rng.choice(pool), rng) if i % 3 else rng.choice(pool)
               for i in range(300)]
    samples = [data for data in samples if len(data) < 1 << 20]

    def outcomes():
        jpegcrop.extension.cache_clear()
        found = []
        for i, data in enumerate(samples):
            try:
                found.append(decode_image(data, spec, SampleRandom(0, 0, i), max_pixels=1 << 24))
            except DecodeError:
                found.append(None)
        return found

    with_region = outcomes()
    monkeypatch.setenv(jpegcrop.ENV, "0")
    without = outcomes()
    monkeypatch.delenv(jpegcrop.ENV)
    jpegcrop.extension.cache_clear()
    # a damaged JPEG (libjpeg warns) is decoded whole by Pillow's recovery without the
    # extension; the region decoder decodes the box exactly when the damage lies below it.
    # Nothing else may differ: an intact JPEG decodes to identical pixels both ways
    differ = [i for i, (a, b) in enumerate(zip(with_region, without, strict=True))
              if (a is None) != (b is None) or (a is not None and not np.array_equal(a, b))]
    assert all(_damaged(samples[i]) for i in differ), differ
    assert sum(not _damaged(data) for data in samples) > 50


def _damaged(data: bytes) -> bool:
    import simplejpeg

    try:
        simplejpeg.decode_jpeg(data, strict=True)
    except ValueError:
        return True
    return False


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("gcc") or sys.platform != "linux",
                    reason="needs gcc and AddressSanitizer")
def test_region_decoder_under_address_sanitizer(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "fuzz_jpegcrop.py"),
                          "--cases", "4000", "--work", str(tmp_path)],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if run.returncode == 3:
        pytest.skip(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "4000 cases" in run.stdout
