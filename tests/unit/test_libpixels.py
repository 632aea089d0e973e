"""The batch crop of raw pixels (shardpack.images.formats.libpixels through RawCodec.crop_batch):
the same pixels as the per-sample path (numpy's header, plan_crop's draws, torch's antialiased
resize) bit for bit, with AVX2 and without; every sample it cannot vouch for declined, never
guessed; bad arguments refused before a byte is read; CpuDecode gives the same batches with the
extension on and off."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
from torch.utils.data import DataLoader

import shardpack
from shardpack.images.formats import raw
from shardpack.images.formats.raw import RAW, pixels_npy
from shardpack.transforms.decode import decode_image
from shardpack.transforms.spec import TransformSpec


@pytest.fixture(autouse=True)
def built():
    raw.batch_extension.cache_clear()
    if raw.batch_extension() is None:
        pytest.skip("libpixels is not built here (apt-get install gcc libxxhash-dev, then "
                    "bash scripts/setup.sh)")
    yield
    raw.batch_extension.cache_clear()


def _crop(spec: TransformSpec, epoch: int) -> tuple:
    return (spec.size, spec.train, spec.flip, spec.seed, epoch, *spec.scale, *spec.ratio,
            spec.crop_fraction)


def _batch(blobs: list[bytes]):
    data = np.frombuffer(b"".join(blobs), np.uint8) if blobs else np.zeros(0, np.uint8)
    offsets = np.zeros(len(blobs) + 1, np.int64)
    offsets[1:] = np.cumsum([len(b) for b in blobs])
    return data, offsets


def _run(blobs, spec, epoch, ids, max_pixels=None):
    data, offsets = _batch(blobs)
    out = np.zeros((len(blobs), spec.size, spec.size, 3), np.uint8)
    rows = np.arange(len(blobs), dtype=np.int64)
    done = RAW.crop_batch(data, offsets, rows, np.asarray(ids, np.int64), out,
                          _crop(spec, epoch), max_pixels)
    return out, done


def random_cases(seed: int, trials: int):
    """(blobs, spec, epoch, ids) batches over sizes, crops, flips, eval, odd ratios and seeds:
    the fallback centre crop of plan_crop (ratios an image cannot meet), one-pixel images and
    outputs, upscales and downscales by large factors."""
    pick = random.Random(seed)
    rng = np.random.default_rng(seed)
    for _ in range(trials):
        spec = TransformSpec(
            size=pick.choice([1, 2, 7, 32, 48, 64, 224, pick.randint(1, 300)]),
            train=pick.random() < 0.8, flip=pick.random() < 0.8,
            seed=pick.randint(-5, 10**12),
            scale=(pick.choice([0.01, 0.08, 0.5, 0.99]), 1.0),
            ratio=pick.choice([(3 / 4, 4 / 3), (0.1, 10.0), (1.0, 1.0), (0.5, 0.6), (3.0, 4.0)]),
            crop_fraction=pick.choice([0.875, 1.0, 0.5, 0.3]), mean=None, std=None,
            dtype="uint8")
        blobs = []
        for _ in range(8):
            h = pick.choice([1, 2, 3, pick.randint(1, 80), pick.randint(1, 600)])
            w = pick.choice([1, 2, h, pick.randint(1, 80), pick.randint(1, 600)])
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            if pick.random() < 0.3:  # smooth content: rounding ties, not noise
                pixels = np.cumsum(pixels, axis=1, dtype=np.uint16).astype(np.uint8)
            blobs.append(pixels_npy(pixels))
        yield blobs, spec, pick.randint(0, 1000), [pick.randint(0, 2**40) for _ in blobs]


def check_cases(seed: int, trials: int) -> int:
    """Mismatches between the batch crop and decode_image over ``random_cases``."""
    bad = 0
    for blobs, spec, epoch, ids in random_cases(seed, trials):
        out, done = _run(blobs, spec, epoch, ids)
        for i, blob in enumerate(blobs):
            want = decode_image(blob, spec, spec.random(epoch, ids[i]))
            bad += not (done[i] and np.array_equal(out[i], want))
    return bad


def test_the_same_pixels_as_the_per_sample_path():
    assert check_cases(0, 150) == 0


def test_the_same_pixels_without_avx2():
    """The SSE2 kernel (chosen when the module loads: a fresh interpreter)."""
    code = ("import sys; sys.path[:0] = [%r]; from tests.unit.test_libpixels import check_cases; "
            "print(check_cases(1, 60))") % os.getcwd()
    env = dict(os.environ, SHARDPACK_PIXELS_NO_AVX2="1")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300, check=True)
    assert done.stdout.split()[-1] == "0"


def _header(text: str, version: int = 1) -> bytes:
    body = text.encode("latin-1")
    if version == 1:
        return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body
    return b"\x93NUMPY\x02\x00" + len(body).to_bytes(4, "little") + body


def _npy(shape_text: str, pixels: bytes, descr: str = "|u1", order: str = "False",
         pad: int = 0, version: int = 1) -> bytes:
    text = f"{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape_text}, }}"
    return _header(text + " " * pad + "\n", version) + pixels


def test_what_it_cannot_vouch_for_is_declined():
    """Each of these goes to the per-sample path, which reads or refuses it; nothing is
    written for them."""
    good = pixels_npy(np.full((4, 5, 3), 7, np.uint8))
    px = bytes(60)
    cases = {
        "usual": good,
        "version 2": _npy("(4, 5, 3)", px, version=2),
        "fortran order": _npy("(4, 5, 3)", px, order="True"),
        "other dtype": _npy("(4, 5, 3)", px, descr="<u2"),
        "two channels": _npy("(4, 5, 2)", bytes(40)),
        "a byte short": _npy("(4, 5, 3)", px[:-1]),
        "a byte over": _npy("(4, 5, 3)", px + b"\0"),
        "zero height": _npy("(0, 5, 3)", b""),
        "ten digits": _npy("(0000000004, 5, 3)", px),
        "header over 4 KiB": _npy("(4, 5, 3)", px, pad=4200),
        "no newline": _header("{'descr': '|u1', 'fortran_order': False, 'shape': (4, 5, 3), }")
                      + px,
        "cut header": good[:40],
        "png": b"\x89PNG\r\n\x1a\n" + bytes(60),
        "empty": b"",
    }
    spec = TransformSpec(size=8, mean=None, std=None, dtype="uint8")
    out, done = _run(list(cases.values()), spec, 0, list(range(len(cases))))
    assert dict(zip(cases, done.tolist(), strict=True)) == {k: k == "usual" for k in cases}
    assert not out[1:].any()  # declined rows are left as they were
    # the per-sample path still reads what numpy would (a padded or version-2 header)
    for name in ("version 2",):
        want = np.load(io.BytesIO(cases[name]))
        got = RAW.decode(cases[name], 0, None)
        assert np.array_equal(got, want)


def test_the_decode_budget_declines_and_the_per_sample_path_names_it():
    blob = pixels_npy(np.zeros((30, 40, 3), np.uint8))
    spec = TransformSpec(size=8, mean=None, std=None, dtype="uint8")
    assert not _run([blob], spec, 0, [0], max_pixels=1199)[1][0]
    assert _run([blob], spec, 0, [0], max_pixels=1200)[1][0]
    with pytest.raises(shardpack.DecodeError, match="image too large"):
        decode_image(blob, spec, spec.random(0, 0), max_pixels=1199)


def test_bad_arguments_are_refused_before_any_pixel_is_read():
    module = raw.batch_extension()
    blob = pixels_npy(np.zeros((4, 4, 3), np.uint8))
    data, offsets = _batch([blob, blob])
    ids = np.arange(2, dtype=np.int64)
    out = np.zeros((2, 8, 8, 3), np.uint8)
    crop = _crop(TransformSpec(size=8), 0)

    def call(offsets=offsets, rows=None, out=out, done=None):
        rows = np.arange(2, dtype=np.int64) if rows is None else rows
        done = np.zeros(len(rows), np.uint8) if done is None else done
        module.crop_batch(data, offsets, rows, ids, out, done, *crop, 0)

    for wrong in (np.array([0, len(blob), len(data) + 1], np.int64),   # past the data
                  np.array([0, len(blob) + 5, len(blob)], np.int64),    # decreasing
                  np.array([-1, len(blob), len(data)], np.int64),
                  np.array([0, len(data)], np.int64)):                  # one sample too few
        with pytest.raises(ValueError):
            call(offsets=wrong)
    with pytest.raises(ValueError, match="row 2 of a batch of 2"):
        call(rows=np.array([0, 2], np.int64))
    with pytest.raises(ValueError):
        call(out=np.zeros((2, 7, 8, 3), np.uint8))
    with pytest.raises(ValueError):
        call(done=np.zeros(1, np.uint8))
    assert not out.any()


def _tree(root, sides=(20, 48, 64, 31)):
    from PIL import Image

    rng = np.random.default_rng(3)
    for i in range(40):
        folder = root / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        h, w = sides[i % len(sides)], sides[(i + 1) % len(sides)]
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(
            folder / f"{i}.png")
    return root


@pytest.mark.parametrize("execution", ["processes", "threads"])
def test_cpu_decode_gives_the_same_batches_with_the_extension_off(tmp_path, monkeypatch,
                                                                  execution):
    shardpack.pack(_tree(tmp_path / "src"), tmp_path / "raw", pixels="raw")

    def batches(train: bool) -> list:
        ds = shardpack.ShardDataset(tmp_path / "raw", batch_size=7, batched=True, shuffle=True,
                                    decode=shardpack.CpuDecode(24, train=train),
                                    execution=execution,
                                    workers=2 if execution == "threads" else None)
        loader = ds if execution == "threads" else DataLoader(ds, batch_size=None,
                                                              num_workers=2)
        ds.set_epoch(3)
        return [(b["__index__"].tolist(), b["image"].numpy().copy()) for b in loader]

    fast = {train: batches(train) for train in (True, False)}
    monkeypatch.setenv(raw.ENV, "0")
    raw.batch_extension.cache_clear()
    assert raw.batch_extension() is None
    slow = {train: batches(train) for train in (True, False)}
    for train in (True, False):
        assert [i for i, _ in fast[train]] == [i for i, _ in slow[train]]
        assert sum(len(i) for i, _ in fast[train]) == 40
        for (_, a), (_, b) in zip(fast[train], slow[train], strict=True):
            assert np.array_equal(a, b)


def test_the_crop_path_is_taken(tmp_path, monkeypatch):
    """A spy on the extension: CpuDecode over a raw pack crops every sample there (else this
    file's other tests could pass on the per-sample path alone)."""
    shardpack.pack(_tree(tmp_path / "src"), tmp_path / "raw", pixels="raw")
    module, calls = raw.batch_extension(), []

    class Spy:
        def crop_batch(self, *args):
            module.crop_batch(*args)
            calls.append(int(np.asarray(args[5]).sum()))

    monkeypatch.setattr(raw, "batch_extension", lambda: Spy())
    ds = shardpack.ShardDataset(tmp_path / "raw", batch_size=16, batched=True,
                                decode=shardpack.CpuDecode(24), execution="threads", workers=1)
    assert sum(len(b["image"]) for b in ds) == 40
    assert sum(calls) == 40, json.dumps(calls)
