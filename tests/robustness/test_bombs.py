"""Image bombs under Pillow's limit (tests/robustness/hostile/images/, written by
tests/robustness/hostile/make_images.py): a header's size is checked against the decode budget
before any
decoder runs, in ``--check full``, ``verify --decode``, preview and CpuDecode; and ``--check
full`` refuses a header that claims more pixels than the file's compressed data can hold."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import shardpack
from shardpack.core.errors import DecodeError, ShardpackError
from shardpack.images.content import (DEFAULT_MAX_PIXELS, MAX_PIXELS_ENV, capacity_reason,
                              check_image_full, decode_budget, decode_rgb)

from testbed.helpers import make_tree, run_cli

IMAGES = Path(__file__).resolve().parent / "hostile" / "images"
BUDGET = f"over the decode budget of {DEFAULT_MAX_PIXELS:,} pixels"

# case -> words of the one-line reason --check full gives (and verify --decode)
CASES = {
    "png_13000x13000_gray_zeros.png": ("image too large: 13,000x13,000 = 169,000,000 pixels",
                                       BUDGET),
    "jpeg_13000x13000_no_scan_data.jpg": ("corrupt JPEG: header says 13,000x13,000 pixels",
                                          "more than its 6 bytes of scan data can hold"),
    "jpeg_8000x8000_no_scan_data.jpg": ("corrupt JPEG: header says 8,000x8,000 pixels",
                                        "more than its 6 bytes of scan data can hold"),
    "png_8000x8000_rgb_one_row.png": ("corrupt PNG: header says 8,000x8,000 pixels",
                                      "192,000,000 bytes of 8-bit samples",
                                      "more than its 46 bytes of image data can hold"),
    "webp_12000x12000_lossless.webp": ("image too large: 12,000x12,000 = 144,000,000 pixels",
                                       BUDGET),
    "gif_13000x13000_screen_1x1_frame.gif": ("image too large: 13,000x13,000", BUDGET),
}
OVER_BUDGET = [c for c in CASES if "image too large" in CASES[c][0]]


def _ext(case: str) -> str:
    return case.rsplit(".", 1)[1]


def test_the_corpus_is_complete_and_small():
    assert sorted(p.name for p in IMAGES.iterdir()) == sorted(CASES)
    assert all(p.stat().st_size <= 200_000 for p in IMAGES.iterdir())


RUN = textwrap.dedent("""
    import json, resource, sys, time
    import numpy, PIL.Image, PIL.PngImagePlugin, PIL.JpegImagePlugin, PIL.GifImagePlugin
    import PIL.WebPImagePlugin, simplejpeg  # noqa: F401 - loaded before the limit
    from shardpack.transforms.decode import CropOptions, decode_image
    from shardpack.core.errors import DecodeError
    from shardpack.images.content import check_image_full, decode_rgb

    def vm():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

    limit = vm() + (512 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    results = {}
    for case in json.loads(sys.argv[2]):
        data = open(f"{sys.argv[1]}/{case}", "rb").read()
        started = time.perf_counter()
        got = [check_image_full(data, case.rsplit(".", 1)[1])]
        decodes = (lambda: decode_rgb(data), lambda: decode_rgb(data, min_side=64),
                   lambda: decode_image(data, CropOptions(size=32)))
        for decode in decodes if case in json.loads(sys.argv[3]) else ():
            try:
                decode()
                got.append("decoded")
            except DecodeError as exc:
                got.append(exc.message)
            except BaseException as exc:  # MemoryError: a decode that took what it was told
                got.append(f"{type(exc).__name__}: {exc}")
        results[case] = [got, time.perf_counter() - started]
    print(json.dumps(results))
""")


def test_every_case_is_refused_from_its_header_under_a_memory_limit():
    """One process whose address space is limited to 512 MiB above its start (the PNG bomb
    alone took 1.8 GB): --check full refuses every case with its one-line reason, and decode_rgb
    (preview's and the fallback's decode) and decode_image (CpuDecode's) refuse the ones over
    the budget before decoding (the address-space limit would end a decode of any of them)."""
    result = subprocess.run([sys.executable, "-c", RUN, str(IMAGES), json.dumps(sorted(CASES)),
                             json.dumps(OVER_BUDGET)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.splitlines()[-1])
    for case, (got, _seconds) in results.items():
        reason = got[0]
        assert reason and "\n" not in reason, (case, reason)
        for words in CASES[case]:
            assert words in reason, (case, words, reason)
        if case in OVER_BUDGET:
            assert all(g.startswith(CASES[case][0]) for g in got[1:]), (case, got)


def test_the_png_bomb_is_refused_by_the_budget_not_the_bound():
    """164 KB of deflated zeros: a real 13000x13000 image (the bound cannot refuse it; deflate
    does reach ~1030:1), refused by the budget alone, and decoded when the budget allows it."""
    data = (IMAGES / "png_13000x13000_gray_zeros.png").read_bytes()
    assert capacity_reason(data) is None
    with pytest.raises(DecodeError, match=BUDGET):
        decode_rgb(data)


@pytest.mark.parametrize("case", ["jpeg_8000x8000_no_scan_data.jpg",
                                  "png_8000x8000_rgb_one_row.png"])
def test_a_lying_header_under_the_budget_fails_only_the_full_check(case):
    """8000x8000 is within the budget: training decodes such a file (the decoder fills in what is
    missing), but --check full and verify --decode call it corrupt."""
    data = (IMAGES / case).read_bytes()
    assert 8000 * 8000 <= DEFAULT_MAX_PIXELS
    assert capacity_reason(data).startswith(CASES[case][0])


# -- the bound never refuses a real image ------------------------------------------------------

def _encoded(image: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


@pytest.mark.parametrize("mode", ["1", "L", "RGB", "P"])
def test_flat_pngs_pass_the_bound(mode):
    """The most compressible PNGs there are (one colour, best compression): ~1021:1 for 1-bit,
    under deflate's 1032:1, so they pass."""
    data = _encoded(Image.new(mode, (2048, 2048), 0), "PNG", optimize=True)
    assert capacity_reason(data) is None
    assert check_image_full(data, "png") is None


@pytest.mark.parametrize("kw", [{}, {"progressive": True}, {"quality": 1, "optimize": True},
                                {"quality": 1, "optimize": True, "progressive": True}])
@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_flat_jpegs_pass_the_bound(mode, kw):
    """One-colour JPEGs, the smallest libjpeg writes: ~255 pixels per byte at most (2 bits per
    8x8 block), under the bound's 512."""
    image = Image.new(mode, (2048, 1536), 0)
    data = _encoded(image, "JPEG", **kw)
    assert len(data) * 512 > 2048 * 1536  # the bound holds
    assert capacity_reason(data) is None


# -- the budget: default, option, environment --------------------------------------------------

def _png(width: int, height: int) -> bytes:
    return _encoded(Image.new("RGB", (width, height), (9, 99, 199)), "PNG")


def _jpeg(width: int, height: int) -> bytes:
    return _encoded(Image.new("RGB", (width, height), (9, 99, 199)), "JPEG")


def test_the_default_budget_takes_photos_and_8k():
    assert DEFAULT_MAX_PIXELS == 8192 * 8192
    assert decode_budget() == DEFAULT_MAX_PIXELS
    for width, height in ((4000, 3000), (7680, 4320)):  # 12 MP photo, 8K UHD frame
        assert decode_rgb(_jpeg(width, height), min_side=64).shape[:2] <= (height, width)


def test_the_environment_variable_sets_the_budget_for_every_caller(monkeypatch):
    from shardpack.transforms.decode import CropOptions, decode_image

    data = _png(40, 30)
    monkeypatch.setenv(MAX_PIXELS_ENV, "1_000")
    why = "image too large: 40x30 = 1,200 pixels, over the decode budget of 1,000 pixels"
    assert check_image_full(data, "png").startswith(why)
    with pytest.raises(DecodeError, match=why):
        decode_image(data, CropOptions(size=16))
    with pytest.raises(DecodeError, match=why):
        decode_image(_jpeg(40, 30), CropOptions(size=16))  # the simplejpeg path
    assert decode_rgb(data, max_pixels=1200).shape == (30, 40, 3)  # an argument wins
    monkeypatch.setenv(MAX_PIXELS_ENV, "0")  # no budget (Pillow's limit still applies)
    assert decode_budget() == 0
    assert check_image_full(data, "png") is None
    monkeypatch.setenv(MAX_PIXELS_ENV, "lots")
    with pytest.raises(ShardpackError, match=r"SHARDPACK_MAX_PIXELS='lots': expected a whole "):
        check_image_full(data, "png")


def test_a_bad_max_pixels_is_refused_at_once():
    from shardpack.transforms.decode import CpuDecode

    for bad in (-1, 1.5, "64M", True):
        with pytest.raises(ShardpackError, match="max_pixels="):
            CpuDecode(32, max_pixels=bad)
    with pytest.raises(ShardpackError, match="max_pixels="):
        decode_budget(-5)


# -- each command ---------------------------------------------------------------------------------

def _bomb_ds(root: Path, cases) -> Path:
    """Two good images and ``cases``, packed unchecked (an older release, or --check none)."""
    files = {"ok/a.png": _png(40, 30), "ok/b.jpg": _jpeg(40, 30)}
    files.update({f"bad/{case.rsplit('.', 1)[0]}.{_ext(case)}": (IMAGES / case).read_bytes()
                  for case in cases})
    src = make_tree(root / "src", files)
    shardpack.pack(src, root / "ds", workers=1, check="none")
    return root / "ds"


@pytest.fixture(scope="module")
def bomb_ds(tmp_path_factory):
    return _bomb_ds(tmp_path_factory.mktemp("bombs"), CASES)


@pytest.fixture(scope="module")
def over_ds(tmp_path_factory):
    """Only the cases over the budget (the others take seconds to decode, as they would in
    training: only the full check refuses them)."""
    return _bomb_ds(tmp_path_factory.mktemp("over"), OVER_BUDGET)


def test_pack_check_full_refuses_the_bomb_in_one_line(tmp_path):
    src = make_tree(tmp_path / "src", {
        "x.png": (IMAGES / "png_13000x13000_gray_zeros.png").read_bytes(),
        "y.png": _png(40, 30)})
    result = run_cli("pack", src, tmp_path / "ds", "--check", "full", "--workers", "1", ok=None)
    assert result.exit_code == 2, result.output
    errors = [ln for ln in result.output.splitlines() if ln.startswith("shardpack: error:")]
    assert len(errors) == 1 and str(src / "x.png") in errors[0], result.output
    assert "image too large: 13,000x13,000" in errors[0] and BUDGET in errors[0], errors[0]
    summary = shardpack.pack(src, tmp_path / "ds2", workers=1, check="full", on_error="skip")
    assert summary.samples == 1 and sum(summary.skipped.values()) == 1


def test_pack_resize_refuses_the_bomb_before_decoding(tmp_path):
    """--resize decodes every image it shrinks: the budget applies there too (--check none,
    so that nothing but the resize sees the image)."""
    src = make_tree(tmp_path / "src", {
        "x.png": (IMAGES / "png_13000x13000_gray_zeros.png").read_bytes(),
        "y.png": _png(40, 30)})
    result = run_cli("pack", src, tmp_path / "ds", "--check", "none", "--resize", "16",
                     "--workers", "1", ok=None)
    assert result.exit_code == 2, result.output
    assert str(src / "x.png") in result.output and BUDGET in result.output, result.output
    summary = shardpack.pack(src, tmp_path / "ds2", workers=1, check="none", resize=16,
                             on_error="skip")
    assert summary.samples == 1 and summary.skipped == {"broken-image": 1}


def test_verify_decode_names_every_case(bomb_ds):
    from shardpack.inspect.verify import verify

    report = verify(bomb_ds, decode=True)
    problems = {p.key: p.reason for p in report.problems}
    assert len(problems) == len(CASES), problems
    for case, words in CASES.items():
        reason = problems[f"bad/{case.rsplit('.', 1)[0]}"]
        assert all(w in reason for w in words), (case, reason)
    assert verify(bomb_ds).ok  # without --decode: the bytes are what was packed


def test_preview_marks_the_cells(over_ds, tmp_path):
    from shardpack.inspect.preview import PreviewOptions, preview

    summary = preview(over_ds, tmp_path / "sheet.png", PreviewOptions(n=10, first=True))
    assert summary.cells == len(OVER_BUDGET) + 2 and summary.marked == len(OVER_BUDGET)
    marked = "\n".join(summary.reasons)
    for case in OVER_BUDGET:
        assert f"'bad/{case.rsplit('.', 1)[0]}': image too large" in marked, marked


def test_cpu_decode_refuses_or_skips_over_budget(over_ds):
    from shardpack import ShardDataset
    from shardpack.transforms.decode import CpuDecode

    ds = ShardDataset(over_ds, batch_size=16, batched=True, shuffle=False,
                      decode=CpuDecode(32, on_error="skip"))
    batches = list(ds)
    keys = sum((b["__key__"] for b in batches), [])
    bad = np.concatenate([b["__bad__"].numpy() for b in batches])
    skipped = {k for k, b in zip(keys, bad, strict=True) if b}
    assert {f"bad/{c.rsplit('.', 1)[0]}" for c in OVER_BUDGET} <= skipped
    assert not {"ok/a", "ok/b"} & skipped
    strict = ShardDataset(over_ds, batch_size=16, batched=True, shuffle=False,
                          decode=CpuDecode(32))
    with pytest.raises(DecodeError, match=r"sample 'bad/gif_13000x13000_screen_1x1_frame': "
                                          r"image too large: 13,000x13,000"):
        list(strict)
    # a budget of the caller's: the 40x30 good images are over 1,000 pixels too
    small = ShardDataset(over_ds, batch_size=16, batched=True, shuffle=False,
                         decode=CpuDecode(32, on_error="skip", max_pixels=1000))
    bad = np.concatenate([b["__bad__"].numpy() for b in small])
    assert bad.all()
