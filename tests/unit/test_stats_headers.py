"""Image sizes from headers (headers.read_header / header_info) as real files lay them out, and
``info --stats`` counting them: long JPEG APPn runs (ICC, EXIF thumbnail, XMP, Photoshop), every
WebP kind, BMP core/info/V5 headers, TIFF in both byte orders with the directory anywhere, GIF
frames past the logical screen.  Each size must be Pillow's; only what does not decode is
unreadable; the counts in the report add up."""

from __future__ import annotations

import io
import json
import os
import struct

import numpy as np
import pytest
from PIL import Image

import shardpack
from shardpack.inspect import stats as stats_mod
from shardpack.core.errors import DecodeError
from shardpack.images.headers import HeaderShort, header_info, read_header
from shardpack.images.content import decode_rgb

from testbed.helpers import make_tree, run_cli

# -- file shapes ----------------------------------------------------------------------------------


def _picture(width: int, height: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    """Smooth noise: compresses like a photo, small files even at large sizes."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(2, height // 16), max(2, width // 16), 3), dtype=np.uint8)
    image = Image.fromarray(small).resize((width, height), Image.Resampling.BILINEAR)
    return image.convert(mode)


def _noise(width: int, height: int) -> Image.Image:
    """Noise: a photo's worth of image data (MBs) behind a header."""
    rng = np.random.default_rng(width)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _with_alpha(image: Image.Image) -> Image.Image:
    """RGBA with a real alpha ramp (an opaque one is dropped by the encoders)."""
    alpha = np.linspace(0, 255, image.width * image.height).astype(np.uint8)
    image = image.convert("RGBA")
    image.putalpha(Image.fromarray(alpha.reshape(image.height, image.width)))
    return image


def _save(image: Image.Image, fmt: str, **kwargs) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


def _with_segments(jpeg: bytes, marker: int, payload: bytes, head: bytes = b"") -> bytes:
    """``jpeg`` with ``payload`` inserted after SOI as APPn segments (64 KB each at most, every
    one starting with ``head``, as Photoshop's APP13 and extended XMP do)."""
    room = 65533 - len(head)
    segments = b"".join(
        b"\xff" + bytes([marker]) + struct.pack(">H", 2 + len(head) + len(part)) + head + part
        for part in (payload[at:at + room] for at in range(0, len(payload), room)))
    return jpeg[:2] + segments + jpeg[2:]


def _exif_with_thumbnail(thumbnail: bytes) -> bytes:
    """An APP1 EXIF payload: IFD0, and IFD1 pointing at ``thumbnail`` (a whole JPEG)."""
    ifd0 = struct.pack("<H", 1) + struct.pack("<HHIHH", 0x0112, 3, 1, 1, 0) + struct.pack("<I", 26)
    thumb_at = 26 + 2 + 2 * 12 + 4
    ifd1 = (struct.pack("<H", 2) + struct.pack("<HHII", 0x0201, 4, 1, thumb_at)
            + struct.pack("<HHII", 0x0202, 4, 1, len(thumbnail)) + struct.pack("<I", 0))
    return b"Exif\0\0" + b"II*\0" + struct.pack("<I", 8) + ifd0 + ifd1 + thumbnail


def _big_thumbnail() -> bytes:
    """A thumbnail JPEG just under what one APP1 segment holds with the EXIF around it."""
    rng = np.random.default_rng(3)
    side = 320
    while True:
        noise = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        data = _save(Image.fromarray(noise), "JPEG", quality=90)
        if len(data) < 62_000:
            return data
        side -= 8


def _bmp(width: int, height: int, header: int, top_down: bool = False) -> bytes:
    """A 24-bit BMP with a DIB header of ``header`` bytes: 12 (OS/2 core: 16-bit sizes), 40
    (BITMAPINFOHEADER), 124 (V5, the fields past 40 left zero)."""
    row = (width * 3 + 3) // 4 * 4
    pixels = bytes(np.arange(row * height, dtype=np.uint8) % 251)
    if header == 12:
        dib = struct.pack("<IHHHH", 12, width, height, 1, 24)
    else:
        dib = struct.pack("<IiiHHIIiiII", header, width, -height if top_down else height, 1, 24,
                          0, len(pixels), 2835, 2835, 0, 0).ljust(header, b"\0")
    offset = 14 + len(dib)
    return b"BM" + struct.pack("<IHHI", offset + len(pixels), 0, 0, offset) + dib + pixels


def _tiff(order: str, width: int, height: int, kind: int, directory_last: bool,
          orientation: int | None = None) -> bytes:
    """An uncompressed 8-bit grayscale TIFF written by hand: byte order ``order`` ("<" or ">"),
    width/height of TIFF type ``kind`` (3 SHORT, 4 LONG), the directory before or after the
    pixels (libtiff writes it after them)."""
    pixels = bytes(np.arange(width * height, dtype=np.uint8) % 253)
    pixels += b"\0" * (len(pixels) & 1)  # the directory starts on a word boundary
    entries = [(256, kind, width), (257, kind, height), (258, 3, 8), (259, 3, 1), (262, 3, 1),
               (273, 4, 0), (277, 3, 1), (278, 4, height), (279, 4, width * height)]
    if orientation is not None:
        entries.append((274, 3, orientation))
    entries.sort()
    size = 2 + 12 * len(entries) + 4
    ifd, strip = (8 + len(pixels), 8) if directory_last else (8, 8 + size)
    table = struct.pack(order + "H", len(entries))
    for tag, typ, value in entries:
        value = strip if tag == 273 else value
        packed = (struct.pack(order + "HH", value, 0) if typ == 3  # SHORT, padded to 4 bytes
                  else struct.pack(order + "I", value))
        table += struct.pack(order + "HHI", tag, typ, 1) + packed
    table += struct.pack(order + "I", 0)
    head = (b"II*\0" if order == "<" else b"MM\0*") + struct.pack(order + "I", ifd)
    return head + (pixels + table if directory_last else table + pixels)


def _exif_first(webp: bytes) -> bytes:
    """The extended WebP with its EXIF chunk moved before the image chunk (libwebp's muxer puts
    it after; other writers do not)."""
    chunks, pos = [], 12
    while pos < len(webp):
        size = struct.unpack_from("<I", webp, pos + 4)[0]
        chunks.append(webp[pos:pos + 8 + size + (size & 1)])
        pos += 8 + size + (size & 1)
    chunks.sort(key=lambda c: {b"VP8X": 0, b"EXIF": 1}.get(c[:4], 2))
    body = b"WEBP" + b"".join(chunks)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _gif_past_its_screen() -> bytes:
    """A GIF whose logical screen (40x30) is smaller than its first frame (64x48): Pillow's size
    is the frame's."""
    data = bytearray(_save(_picture(64, 48).convert("P"), "GIF"))
    data[6:10] = struct.pack("<HH", 40, 30)
    return bytes(data)


def _jpeg_with_junk() -> bytes:
    """Two stray bytes between segments: libjpeg and Pillow skip them (a warning), the strict
    segment walk does not: its size has to come from the fallback."""
    data = _save(_picture(90, 70), "JPEG")
    at = 4 + int.from_bytes(data[4:6], "big")  # after APP0
    return data[:at] + b"\x00\x00" + data[at:]


def shapes() -> dict[str, bytes]:
    """name (ending in its field's extension) -> bytes, for every layout the parsers handle."""
    photo = _picture(320, 240, seed=1)
    icc_100k = os.urandom(100_000)
    out = {
        "plain.jpg": _save(photo, "JPEG", quality=90),
        "progressive.jpg": _save(photo, "JPEG", progressive=True),
        "gray.jpg": _save(_picture(97, 61, mode="L"), "JPEG"),
        "cmyk.jpg": _save(_picture(64, 40, mode="CMYK"), "JPEG"),
        "icc100k.jpg": _save(photo, "JPEG", icc_profile=icc_100k),  # 2 APP2 segments
        "icc400k.jpg": _save(_noise(1000, 800), "JPEG", quality=95,
                             icc_profile=os.urandom(400_000)),  # 7 APP2 segments
        "exifthumb.jpg": _save(photo, "JPEG", exif=_exif_with_thumbnail(_big_thumbnail())),
        "xmp.jpg": _save(photo, "JPEG", xmp=os.urandom(60_000)),
        "photoshop.jpg": _with_segments(_save(photo, "JPEG"), 0xED, os.urandom(200_000),
                                        head=b"Photoshop 3.0\0"),
        "fill.jpg": (lambda d: d[:2] + b"\xff\xff\xff" + d[2:])(_save(photo, "JPEG")),
        "mpo.jpg": _save(photo, "MPO", save_all=True, append_images=[_picture(320, 240)]),
        "rgb.png": _save(_picture(123, 45), "PNG"),
        "rgba.png": _save(_with_alpha(_picture(45, 123)), "PNG"),
        "lossy.webp": _save(_picture(333, 217), "WEBP", quality=80),
        "lossless.webp": _save(_picture(333, 217), "WEBP", lossless=True),
        "alpha.webp": _save(_with_alpha(_picture(130, 70)), "WEBP"),  # VP8X, ALPH, VP8
        "icc.webp": _save(photo, "WEBP", icc_profile=os.urandom(30_000)),  # VP8X, ICCP first
        "exif.webp": _exif_first(_save(photo, "WEBP", exif=b"Exif\0\0" + os.urandom(40_000))),
        "animated.webp": _save(_picture(50, 40), "WEBP", save_all=True,
                               append_images=[_picture(50, 40, seed=5)]),
        "wallpaper.webp": _save(_picture(4096, 4096, seed=4), "WEBP", quality=80),
        "screen.gif": _save(_picture(77, 55).convert("P"), "GIF", comment=b"c" * 3000),
        "anim.gif": _save(_picture(30, 20).convert("P"), "GIF", save_all=True,
                          append_images=[_picture(30, 20, seed=6).convert("P")]),
        "pastscreen.gif": _gif_past_its_screen(),
        "info.bmp": _bmp(37, 21, 40),
        "topdown.bmp": _bmp(37, 21, 40, top_down=True),
        "core.bmp": _bmp(29, 13, 12),
        "v5.bmp": _bmp(19, 11, 124),
        "pillow.bmp": _save(_picture(50, 30), "BMP"),
        "little.tif": _save(_picture(70, 50), "TIFF"),
        "lzw.tif": _save(_picture(70, 50), "TIFF", compression="tiff_lzw"),  # libtiff: IFD last
        "big.tif": _save(_picture(70, 50), "TIFF", big_tiff=True),
        "rotated.tif": _save(_picture(70, 50), "TIFF", tiffinfo={274: 6}),  # Pillow swaps
        "be_short.tif": _tiff(">", 61, 43, 3, directory_last=False),
        "be_long_last.tif": _tiff(">", 61, 43, 4, directory_last=True),
        "le_short_last.tif": _tiff("<", 900, 700, 3, directory_last=True),
        "be_rotated.tif": _tiff(">", 61, 43, 3, directory_last=True, orientation=8),
    }
    return out


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    return shapes()


def _pillow(data: bytes) -> tuple[tuple[int, int], str]:
    with Image.open(io.BytesIO(data)) as image:
        return image.size, "JPEG" if image.format == "MPO" else image.format


# -- the header parsers ---------------------------------------------------------------------------

def test_header_sizes_are_pillows_for_every_layout(files):
    assert len(files) == len(shapes())  # (names unique)
    for name, data in files.items():
        want = _pillow(data)
        # the parser itself, not a fallback, finds it
        assert read_header([(0, data)], len(data)) == want, name
        assert header_info(data) == want, name
        assert header_info(memoryview(data)) == want, name


def _segments(data: bytes) -> tuple[dict, int]:
    """A JPEG's bytes per APPn/other marker before its frame header, and where that is."""
    pos, total = 2, {}
    while data[pos + 1] not in (0xC0, 0xC1, 0xC2):
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        total[data[pos + 1]] = total.get(data[pos + 1], 0) + length
        pos += 2 + length
    return total, pos


def test_the_layouts_are_what_the_tests_mean(files):
    """The shapes hold what their names say (so the parsers above really met them)."""
    def app_bytes(data, marker):
        return _segments(data)[0].get(marker, 0)

    assert app_bytes(files["icc100k.jpg"], 0xE2) > 100_000
    assert app_bytes(files["icc400k.jpg"], 0xE2) > 400_000
    assert len(files["icc400k.jpg"]) > 1_000_000  # image data well past the header
    assert 50_000 < app_bytes(files["exifthumb.jpg"], 0xE1) < 65_536
    assert app_bytes(files["photoshop.jpg"], 0xED) > 200_000
    for name in ("alpha", "icc", "exif", "animated"):
        assert files[f"{name}.webp"][12:16] == b"VP8X", name
    assert files["icc.webp"][30:34] == b"ICCP" and files["exif.webp"][30:34] == b"EXIF"
    assert files["lossy.webp"][12:16] == b"VP8 " and files["lossless.webp"][12:16] == b"VP8L"
    assert files["wallpaper.webp"][12:16] == b"VP8 " and len(files["wallpaper.webp"]) > 256 << 10
    assert files["lzw.tif"][:2] == b"II" and struct.unpack("<I", files["lzw.tif"][4:8])[0] > 8
    assert files["big.tif"][:4] == b"II+\0" and files["be_short.tif"][:4] == b"MM\0*"
    assert _pillow(files["rotated.tif"])[0] == (50, 70)
    assert _pillow(files["pastscreen.gif"])[0] == (64, 48)


def _prefix_reads(data: bytes) -> list[tuple[int, int]]:
    """The spans ``info --stats`` reads to size ``data`` (its loop, without a dataset)."""
    parts, spans, span = [], [], (0, min(len(data), stats_mod.HEAD_BYTES))
    while True:
        spans.append(span)
        stats_mod._merge(parts, span[0], data[span[0]:span[1]])
        try:
            read_header(parts, len(data))
        except HeaderShort as short:
            span = stats_mod._next_span(parts, short, len(data))
            continue
        return spans


def test_header_reads_grow_as_the_header_needs_and_stop_there(files):
    """16 KB first; long JPEG headers read on to their frame header (a few rounds, not one a
    segment); a TIFF directory at the end of the file is read alone; never the image data."""
    read = {name: sum(b - a for a, b in _prefix_reads(data)) for name, data in files.items()}
    rounds = {name: len(_prefix_reads(data)) for name, data in files.items()}
    for name in ("wallpaper.webp", "icc.webp", "exif.webp", "plain.jpg", "lossless.webp"):
        assert rounds[name] == 1 and read[name] <= 16 << 10, name
    frame = _segments(files["icc400k.jpg"])[1]
    assert frame < read["icc400k.jpg"] < 2 * frame < len(files["icc400k.jpg"]) * 0.7
    assert rounds["icc400k.jpg"] <= 6
    assert read["photoshop.jpg"] < 2 * _segments(files["photoshop.jpg"])[1]
    big = files["le_short_last.tif"]
    assert len(big) > 600_000 and read["le_short_last.tif"] < 40 << 10
    assert rounds["le_short_last.tif"] == 2


def test_headers_that_do_not_parse(files):
    """Cut inside the header: the parser says so (a whole-file question, not a read to make);
    header_info says why it does not decode.  Junk Pillow tolerates: sized by the fallback."""
    cut = files["icc100k.jpg"][:50_000]  # inside the ICC profile
    with pytest.raises(ValueError, match="truncated"):
        read_header([(0, cut)], len(cut))
    with pytest.raises(HeaderShort):  # the same bytes as the start of a longer file: read on
        read_header([(0, cut)], len(files["icc100k.jpg"]))
    with pytest.raises(DecodeError, match="cannot decode JPEG"):
        header_info(cut)
    with pytest.raises(DecodeError, match="not an image"):
        header_info(os.urandom(3000))
    junk = _jpeg_with_junk()
    with pytest.raises(ValueError, match="no JPEG marker"):
        read_header([(0, junk)], len(junk))
    assert header_info(junk) == ((90, 70), "JPEG") == (decode_rgb(junk).shape[1::-1], "JPEG")


# -- info --stats ---------------------------------------------------------------------------------

BROKEN = {"broken/cut.jpg": "cut", "broken/random.jpg": "random"}


@pytest.fixture(scope="module")
def packed(files, tmp_path_factory):
    root = tmp_path_factory.mktemp("headers")
    tree = {f"{name.rsplit('.', 1)[1]}/{name.split('.')[0]}.{name.rsplit('.', 1)[1]}": data
            for name, data in files.items()}
    tree["jpg/junk.jpg"] = _jpeg_with_junk()
    tree["broken/cut.jpg"] = files["icc100k.jpg"][:50_000]  # truncated inside the header
    tree["broken/random.jpg"] = np.random.default_rng(9).bytes(5000)
    src = make_tree(root / "src", tree)
    shardpack.pack(src, root / "ds", check="none", workers=1, max_samples=7)
    sizes = {key.rsplit(".", 1)[0]: _pillow(data)[0] for key, data in tree.items()
             if not key.startswith("broken/")}
    return root / "ds", sizes


def test_stats_sizes_every_image_that_decodes_and_the_counts_add_up(packed, monkeypatch):
    ds, sizes = packed
    spans = []
    real = stats_mod.read_spans

    def spy(reader, wanted):
        spans.extend(wanted)
        return real(reader, wanted)

    monkeypatch.setattr(stats_mod, "read_spans", spy)
    result = run_cli("info", ds, "--stats")
    out = result.output
    # headers only: nothing near the whole dataset is read
    shard_bytes = sum(p.stat().st_size for p in ds.glob("*.tar"))
    assert sum(b - a for _, a, b in spans) < shard_bytes / 3
    total = len(sizes) + len(BROKEN)
    data = json.loads(run_cli("info", ds, "--stats", "--json").output)["stats"]["images"]
    assert data["read"] == data["total"] == total
    assert (data["sized"], data["unreadable"], data["no_image"]) == (len(sizes), 2, 0)
    assert data["sized"] + data["unreadable"] + data["no_image"] == data["read"]
    widths = sorted(w for w, _ in sizes.values())
    assert data["width"]["min"] == widths[0] and data["width"]["max"] == widths[-1] == 4096
    assert f"images    pixel sizes of all {total} samples\n" in out
    assert (f"  {total} samples: {len(sizes)} sized (", "), 2 unreadable (do not decode), "
            "0 without an image field\n") == tuple(_split_count(out))
    assert "'broken/cut'" in out and "'broken/random'" in out
    assert "not a JPEG image" in out and "truncated" in out
    assert f"histogram 7 classes, all {total} samples" in out
    assert f"  {total} samples: {total} in the classes below\n" in out


def _split_count(out: str):
    line = next(ln for ln in out.splitlines() if " sized (" in ln) + "\n"
    head, rest = line.split(" sized (", 1)
    yield head + " sized ("
    yield rest[rest.index("), "):]


def test_stats_sizes_match_pillow_per_image(packed):
    from shardpack.read.reader import DatasetReader
    from shardpack.inspect.stats import StatsOptions, dataset_stats

    ds, sizes = packed
    im = dataset_stats(DatasetReader(ds), StatsOptions()).images
    assert sorted(im.sizes) == sorted(sizes.values())
    assert sorted(r.split(":")[0] for r in im.unreadable) == ["'broken/cut'", "'broken/random'"]
    assert im.formats["WEBP"] == 7 and im.formats["TIFF"] == 8 and im.formats["BMP"] == 5


def test_compressed_shards_count_the_same(files, tmp_path):
    tree = {name: files[name] for name in ("icc400k.jpg", "wallpaper.webp", "v5.bmp")}
    tree["bad.jpg"] = b"\xff\xd8\xff\xe1\x10\x00" + b"\0" * 100  # cut inside APP1
    tree["two.jpg"], tree["two.png"] = files["plain.jpg"], files["rgb.png"]  # no image field
    src = make_tree(tmp_path / "src", tree)
    shardpack.pack(src, tmp_path / "ds", check="none", workers=1, shard_format="msgpack",
                   compression="zstd")
    data = json.loads(run_cli("info", tmp_path / "ds", "--stats", "--json").output)["stats"]
    im = data["images"]
    assert im["hash_checked"] and (im["sized"], im["unreadable"], im["no_image"]) == (3, 1, 1)
    assert im["read"] == 5 == im["sized"] + im["unreadable"] + im["no_image"]


def test_class_counts_add_up_with_unlabelled_and_unreadable_samples(tmp_path):
    """Labels read from whole samples: one sample has no label, one fails its hash.  The
    heading says all samples were looked at (not "a random 12 of 13"), and the count line
    accounts for every one; the image sizes count the unreadable sample too."""
    from shardpack.read.reader import DatasetReader

    files = {}
    for i in range(12):
        files[f"{i:04d}.jpg"] = _save(_picture(40 + i, 30), "JPEG")
        files[f"{i:04d}.cls"] = str(i % 3).encode()
    files["0012.jpg"] = _save(_picture(40, 30), "JPEG")  # no label
    src = make_tree(tmp_path / "src", files)
    ds = tmp_path / "ds"
    shardpack.pack(src, ds, workers=1, shard_format="msgpack", compression="zstd")
    reader = DatasetReader(ds)
    start, end = reader.index(0).span(4)
    shard = ds / reader.shards[0].name
    data = bytearray(shard.read_bytes())
    data[(start + end) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    out = run_cli("info", ds, "--stats").output
    assert "histogram 3 classes, labels of all 13 samples\n" in out
    assert "  13 samples: 11 in the classes below, 1 without a label, 1 could not be read\n" in out
    assert "warning   1 samples have no label" in out
    assert "not classes of the manifest" not in out
    assert "  13 samples: 12 sized (jpg 12), 1 unreadable (do not decode, or fail their hash " \
        "check), 0 without an image field\n" in out
    stats = json.loads(run_cli("info", ds, "--stats", "--json").output)["stats"]
    cc = stats["classes"]
    assert cc["looked"] == 13 == cc["read"] + cc["unread"]
    assert cc["read"] == sum(cc["counts"]) + sum(cc["outside"].values())
