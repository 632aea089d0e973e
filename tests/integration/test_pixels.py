"""Raw pixels as a stored form (``pack --pixels keep|raw|auto``): the same batches as the encoded
images, read unchanged by numpy and WebDataset, bounded against lying headers, understood by every
command that reads images, and written back as PNG by unpack and export."""

from __future__ import annotations

import glob
import io
import json
import tarfile
import tracemalloc

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

import shardpack
from shardpack import CpuDecode, DeviceLoader, ShardDataset
from shardpack.core.errors import DecodeError, ShardpackError
from shardpack.images.content import check_image, decode_rgb, is_image_field
from shardpack.images.formats.raw import pixels_npy
from shardpack.images.headers import header_info
from shardpack.transforms.gpudecode import standin_backend
from shardpack.write.options import PackOptions
from testbed.helpers import run_cli

MODES = ("RGB", "L", "RGBA", "P", "I;16")


def _tree(root, count: int = 30, low: int = 12, high: int = 90):
    """Class folders of PNGs in every mode the decode rules convert, of varied sizes."""
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        h, w = (int(v) for v in rng.integers(low, high, 2))
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        mode = MODES[i % len(MODES)]
        if mode == "P":
            image = image.convert("P", palette=Image.ADAPTIVE)
        elif mode == "I;16":
            image = Image.fromarray(rng.integers(0, 65536, (h, w), dtype=np.uint16))
        else:
            image = image.convert(mode)
        image.save(folder / f"img.{i}.png")  # a dotted name: the key keeps it
    return root


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pixels")
    src = _tree(root / "src")
    out = {}
    for form in ("keep", "raw", "auto:6kB"):
        out[form] = root / form.replace(":", "-")
        shardpack.pack(src, out[form], pixels=form)
    return src, out


def _batches(path, **kw):
    ds = ShardDataset(path, batch_size=8, batched=True, seed=5,
                      decode=CpuDecode(24, seed=3, **kw))
    return list(ds)


def test_raw_and_png_give_bit_identical_batches(packs):
    _, out = packs
    encoded, raw, auto = (_batches(out[f]) for f in ("keep", "raw", "auto:6kB"))
    assert len(encoded) == len(raw) == len(auto) == 4
    for a, b, c in zip(encoded, raw, auto, strict=True):
        assert a["__key__"] == b["__key__"] == c["__key__"]
        assert torch.equal(a["cls"], b["cls"]) and torch.equal(a["cls"], c["cls"])
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["image"], c["image"])
    manifest = json.loads((out["raw"] / "shardpack.json").read_text())
    assert manifest["fields"] == ["cls", "rgb.npy"]  # the image renamed, the label untouched
    assert manifest["preprocessing"] == {"pixels": "raw"}
    mixed = json.loads((out["auto:6kB"] / "shardpack.json").read_text())
    assert mixed["fields"] == ["cls", "png", "rgb.npy"]
    assert mixed["preprocessing"] == {"pixels": "auto:6000"}


def test_auto_stores_raw_exactly_where_the_raw_bytes_fit(packs):
    src, out = packs
    reader = shardpack.open_reader(str(out["auto:6kB"]))
    for i in range(len(reader)):
        sample = reader.read_sample(i)
        original = Image.open(src / f"{sample['__key__']}.png")
        raw_bytes = original.width * original.height * 3 + 128
        assert ("rgb.npy" in sample) == (raw_bytes <= 6000), (sample["__key__"], raw_bytes)
        assert ("png" in sample) != ("rgb.npy" in sample)


def test_numpy_and_webdataset_read_the_field_unchanged(packs):
    wds = pytest.importorskip("webdataset")
    src, out = packs
    seen = 0
    for shard in sorted(glob.glob(str(out["raw"] / "*.tar"))):
        for sample in wds.WebDataset(shard, shardshuffle=False).decode():
            pixels = sample["rgb.npy"]
            assert isinstance(pixels, np.ndarray) and pixels.dtype == np.uint8
            seen += 1
    assert seen == 30
    reader = shardpack.open_reader(str(out["raw"]))
    sample = reader.read_sample(0)
    pixels = np.load(io.BytesIO(sample["rgb.npy"]), allow_pickle=False)
    expected = decode_rgb((src / f"{sample['__key__']}.png").read_bytes())
    assert pixels.shape == expected.shape and np.array_equal(pixels, expected)


def test_resize_happens_before_the_pixels_are_stored(tmp_path):
    src = _tree(tmp_path / "src", count=6, low=60, high=120)
    shardpack.pack(src, tmp_path / "ds", resize=32, pixels="raw")
    reader = shardpack.open_reader(str(tmp_path / "ds"))
    for i in range(len(reader)):
        (width, height), fmt = header_info(reader.read_sample(i)["rgb.npy"])
        assert fmt == "RAW" and min(width, height) == 32
    manifest = json.loads((tmp_path / "ds" / "shardpack.json").read_text())
    assert manifest["preprocessing"] == {"resize": 32, "quality": 90, "pixels": "raw"}


def test_the_pixels_option_is_checked_once():
    assert PackOptions(pixels="auto:96kB").pixels == "auto:96000"
    assert PackOptions(pixels="AUTO").pixels.startswith("auto:")
    for bad in ("png", "auto:", "auto:lots", "raw:1"):
        with pytest.raises(ShardpackError, match="--pixels"):
            PackOptions(pixels=bad)
    assert is_image_field("rgb.npy") and is_image_field("x.rgb.npy")
    assert not is_image_field("npy") and not is_image_field("emb.npy")  # data, not images


def _lying(shape: str) -> bytes:
    good = pixels_npy(np.zeros((4, 5, 3), np.uint8))
    return good.replace(b"(4, 5, 3)", shape.encode())


@pytest.mark.parametrize("shape,why", [
    ("(400000, 500000, 3)", "image too large"),     # over the decode budget: from the header
    ("(9, 5, 3)", "truncated raw pixels"),           # more than the bytes hold
    ("(4, 5, 4)", "height x width x 3"),
])
def test_a_lying_header_is_one_line_and_no_allocation(shape, why):
    data = _lying(shape)
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError, match=why) as info:
            decode_rgb(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "\n" not in str(info.value) and peak < 1 << 20, peak
    assert check_image(data, "rgb.npy") is not None or why == "image too large"


@pytest.mark.parametrize("header", [
    b"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 5, 3), }",
    b"{'descr': '|u1', 'fortran_order': True, 'shape': (4, 5, 3), }",
    b"__import__('os').system('true')",
])
def test_headers_that_are_not_raw_pixels_are_refused(header):
    body = header.ljust(118) + b"\n"
    data = b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body + bytes(60)
    reason = check_image(data, "rgb.npy")
    assert reason and reason.startswith("corrupt raw pixels"), reason
    with pytest.raises(DecodeError):
        decode_rgb(data)


def test_a_broken_image_names_the_file_when_stored_raw(tmp_path):
    src = _tree(tmp_path / "src", count=3)
    bad = src / "c0" / "img.0.png"
    bad.write_bytes(bad.read_bytes()[:60])
    with pytest.raises(ShardpackError, match="img.0.png"):
        shardpack.pack(src, tmp_path / "ds", pixels="raw")
    assert not (tmp_path / "ds" / "shardpack.json").exists()
    summary = shardpack.pack(src, tmp_path / "ds2", pixels="raw", on_error="skip")
    assert summary.samples == 2 and sum(summary.skipped.values()) == 1


def test_the_gpu_path_copies_raw_pixels_up_without_a_decode(packs):
    _, out = packs
    ds = ShardDataset(out["raw"], batch_size=6, batched=True, shuffle=False)
    dl = DeviceLoader(DataLoader(ds, batch_size=None), device="cpu", decode_on="gpu", size=24,
                      normalize=False, decode_backend=standin_backend())
    ref = DeviceLoader(DataLoader(ShardDataset(out["raw"], batch_size=6, batched=True,
                                               shuffle=False, decode=CpuDecode(24)),
                                  batch_size=None), device="cpu", decode_on="cpu", size=24,
                       normalize=False)
    for g, c in zip(dl, ref, strict=True):
        assert g["image"].shape == c["image"].shape == (6, 3, 24, 24)
        assert (g["image"] - c["image"]).abs().mean() < 3  # float vs uint8 resize kernels
    assert dl.stats["samples"] == 30 and dl.stats["cpu_fallbacks"] == 0


def test_every_command_that_reads_images_understands_raw_pixels(packs, tmp_path):
    src, out = packs
    ds = str(out["auto:6kB"])
    info = run_cli("info", ds, "--stats").output
    assert "stored as raw RGB pixels (rgb.npy) where at most 6,000 bytes" in info
    assert "RAW" in info and "0 unreadable" in info
    assert "OK" in run_cli("verify", ds, "--decode").output
    assert "30 samples" in run_cli("preview", ds, "--out", str(tmp_path / "sheet.png")).output
    run_cli("unpack", ds, str(tmp_path / "files"), "--pixels-as", "png", "-q")
    back = sorted(p.relative_to(tmp_path / "files").as_posix()
                  for p in (tmp_path / "files").rglob("*.png"))
    assert back == sorted(p.relative_to(src).as_posix() for p in src.rglob("*.png"))
    for path in (tmp_path / "files").rglob("*.png"):  # the same pixels as the source
        rel = path.relative_to(tmp_path / "files")
        assert np.array_equal(decode_rgb(path.read_bytes()),
                              decode_rgb((src / rel).read_bytes()))
    run_cli("unpack", ds, str(tmp_path / "npy"), "-q")
    assert len(list((tmp_path / "npy").rglob("*.rgb.npy"))) > 0
    run_cli("export", ds, str(tmp_path / "wds"), "--to", "webdataset", "--pixels-as", "png",
            "-q")
    marker = json.loads((tmp_path / "wds" / "_shardpack_export.json").read_text())
    assert marker["fields"] == ["cls", "png"]
    names = {n.split(".")[-1] for t in (tmp_path / "wds").glob("*.tar")
             for n in tarfile.open(t).getnames()}
    assert names == {"cls", "png"}, names


def test_auto_keeps_jpeg_and_stores_small_lossless_images_raw(tmp_path):
    rng = np.random.default_rng(1)
    src = tmp_path / "src" / "c0"
    src.mkdir(parents=True)
    small = Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8))
    for fmt, ext in (("PNG", "png"), ("JPEG", "jpg"), ("BMP", "bmp"), ("WEBP", "webp")):
        small.save(src / f"small_{ext}.{ext}", fmt)
    Image.fromarray(rng.integers(0, 256, (200, 200, 3), dtype=np.uint8)).save(src / "big.png")
    shardpack.pack(tmp_path / "src", tmp_path / "ds", pixels="auto")
    reader = shardpack.open_reader(str(tmp_path / "ds"))
    stored = {reader.read_sample(i)["__key__"]: sorted(k for k in reader.read_sample(i)
                                                       if not k.startswith("__") and k != "cls")
              for i in range(len(reader))}
    assert stored == {"c0/small_png": ["rgb.npy"], "c0/small_bmp": ["rgb.npy"],
                      "c0/small_jpg": ["jpg"], "c0/small_webp": ["webp"], "c0/big": ["png"]}


def test_two_images_of_one_sample_cannot_both_become_raw_pixels(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    pixels = np.zeros((8, 8, 3), np.uint8)
    Image.fromarray(pixels).save(src / "0001.jpg")
    Image.fromarray(pixels).save(src / "0001.png")  # WebDataset grouping: one sample, two images
    with pytest.raises(ShardpackError, match="two fields would be stored as 'rgb.npy'") as info:
        shardpack.pack(src, tmp_path / "ds", pixels="raw", group="webdataset")
    assert "0001" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "ds" / "shardpack.json").exists()  # nothing published
