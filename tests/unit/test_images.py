"""shardpack.images: formats, the quick and full checks, RGB decoding; decode_image and
reference_decode on every format; pack-time resize keeping EXIF."""

import io

import numpy as np
import pytest
from PIL import Image

from shardpack.images import headers

from shardpack.images import content as images
from shardpack.transforms.decode import CropOptions, SampleRandom, decode_image, reference_decode
from shardpack.core.errors import DecodeError, SourceError
from shardpack.images.content import check_image, check_image_full, decode_rgb, image_format, sniff
from shardpack.write.resize import resize_image

from testbed import imagegen as gen

VALID = sorted(gen.ALL_VALID)
BROKEN = sorted(gen.ALL_BROKEN)
FORMAT_OF = {"jpg": "JPEG", "jpeg": "JPEG", "JPG": "JPEG", "jfif": "JPEG", "png": "PNG",
             "webp": "WEBP", "gif": "GIF", "bmp": "BMP", "tif": "TIFF", "tiff": "TIFF"}


def _rgb(gray):
    return np.repeat(gray[:, :, None], 3, axis=2)


def _expected(name):
    """(expected RGB, max mean abs difference): computed from the generators' source pixels, not
    through shardpack (16-bit: the high byte; palette: a numpy lookup; alpha: just dropped)."""
    rgb = gen.rgb_pixels()
    indices, palette = gen.palette_pixels()
    lossless = {
        "png_rgb": rgb, "png_as_jpg": rgb, "png_rgba": rgb, "bmp": rgb, "tiff_8": rgb,
        "webp_lossless_alpha": rgb,
        "png_palette": palette[indices], "png_palette_transparent": palette[indices],
        "gif": palette[indices],
        "png_16": _rgb((gen.gray16_pixels() >> 8).astype(np.uint8)),
        "tiff_16": _rgb((gen.gray16_pixels() >> 8).astype(np.uint8)),
        "png_16_rgb": (gen.rgb16_pixels() >> 8).astype(np.uint8),
        "tiff_16_rgb": (gen.rgb16_pixels() >> 8).astype(np.uint8),
        "png_la": _rgb(gen.gray_pixels()),
        "png_1bit": _rgb(gen.bit_pixels().astype(np.uint8) * 255),
    }
    if name in lossless:
        return lossless[name], 0.0
    if name == "jpeg_gray":
        return _rgb(gen.gray_pixels()), 3.0
    if name == "jpeg_cmyk":  # Pillow's own CMYK -> RGB of the source, never through a JPEG
        return np.asarray(Image.fromarray(gen.cmyk_pixels(), "CMYK").convert("RGB")), 3.0
    # colour JPEG/WebP at 4:2:0 on a noisy checkerboard: ~8.5 measured; a one-pixel shift is ~14,
    # a flip ~44, swapped channels far more (the decode is also compared with Pillow below)
    return rgb, 11.0


def _diff(a, b):
    return float(np.abs(a.astype(int) - b.astype(int)).mean())


# --- formats and fields -------------------------------------------------------------------------

def test_image_format_from_the_last_part_of_the_field_name():
    assert image_format("jpg") == image_format("JPEG") == image_format("x.jfif") == "JPEG"
    assert image_format("jpe") == "JPEG"
    assert image_format("seg.PNG") == "PNG" and image_format("a.b.Tif") == "TIFF"
    assert [image_format(f) for f in ("webp", "gif", "bmp", "tiff")] == ["WEBP", "GIF", "BMP",
                                                                        "TIFF"]
    assert image_format("image") == image_format("IMG") == ""  # an image, format unknown
    assert image_format("png.json") is None and image_format("cls") is None
    assert image_format("jpg.txt") is None and image_format("mask") is None
    assert images.is_image_field("seg.png") and images.is_image_field("image")
    assert not images.is_image_field("txt")


@pytest.mark.parametrize("name", VALID)
def test_sniff_finds_the_content_format(name):
    data, ext = gen.ALL_VALID[name]
    assert sniff(data) == ("PNG" if name == "png_as_jpg" else FORMAT_OF[ext])


def test_sniff_refuses_what_is_no_image():
    assert sniff(gen.html_page()) is None and sniff(b"") is None and sniff(bytes(100)) is None
    assert sniff(b"BMW 320d, 2014, one owner\n" * 3) is None  # "BM" text, no DIB header size
    assert sniff(b"RIFF\x24\0\0\0WAVEfmt ") is None


# --- the quick and the full check ---------------------------------------------------------------

@pytest.mark.parametrize("name", VALID)
def test_every_valid_variant_passes_both_checks(name):
    data, ext = gen.ALL_VALID[name]
    assert check_image(data, f"key.{ext}") is None
    assert check_image_full(data, f"key.{ext}") is None
    assert check_image(data, "image") is None  # format unknown: the bytes decide


BROKEN_REASONS = {
    "empty": "empty image file (0 bytes)",
    "html_page": "not a JPEG image: content looks like HTML",
    "html_as_png": "not a PNG image: content looks like HTML",
    "zeros_as_jpg": "not a JPEG image: content is all zero bytes",
    "text_as_gif": "not a GIF image: content looks like text",
    "truncated_jpeg": "truncated JPEG: no end-of-image marker",
    "truncated_progressive_jpeg": "truncated JPEG: no end-of-image marker",
    "jpeg_missing_eoi": "truncated JPEG: no end-of-image marker",
    "jpeg_headers_only": "truncated JPEG: file ends inside the headers",
    "truncated_exif_thumbnail_jpeg": "truncated JPEG: no end-of-image marker",
    "truncated_png": "truncated PNG: IDAT chunk runs past the end",
    "png_missing_iend": "truncated PNG: no IEND chunk",
    "truncated_webp": "truncated WEBP",
    "truncated_gif": "truncated GIF",
    "truncated_bmp": "truncated BMP",
    "truncated_tiff": "truncated TIFF",
}


@pytest.mark.parametrize("name", BROKEN)
def test_every_broken_variant_fails_the_quick_check_with_its_reason(name):
    data, ext = gen.ALL_BROKEN[name]
    reason = check_image(data, f"key.{ext}")
    assert reason is not None and reason.startswith(BROKEN_REASONS[name]), reason
    assert "\n" not in reason and reason[0].islower() and len(reason) < 120
    assert check_image_full(data, f"key.{ext}") == reason  # the full check runs it first


def test_broken_list_has_an_expected_reason_for_each():
    assert sorted(BROKEN_REASONS) == BROKEN


@pytest.mark.parametrize("name", [n for n in VALID if n != "jpeg_motion_photo"])
def test_every_prefix_of_a_valid_image_fails_the_quick_check(name):
    data, ext = gen.ALL_VALID[name]
    passing = [k for k in range(len(data)) if check_image(data[:k], f"key.{ext}") is None]
    assert passing == []


@pytest.mark.parametrize("fmt,data", [("JPEG", gen.jpeg()), ("PNG", gen.png("RGB")),
                                      ("WEBP", gen.webp()), ("GIF", gen.gif()),
                                      ("BMP", gen.bmp()), ("TIFF", gen.tiff(8)),
                                      ("TIFF", gen.tiff(16, rgb=True))])
@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
def test_truncation_of_each_format_is_caught(fmt, data, keep):
    reason = check_image(gen.truncated(data, keep), f"key.{fmt.lower()}")
    assert reason is not None and reason.startswith(f"truncated {fmt}"), reason


def test_motion_photo_data_after_the_end_of_image_is_accepted():
    data = gen.motion_photo()
    end = len(gen.jpeg())
    assert data[end - 2:end] == b"\xff\xd9" and len(data) - end > 4000
    assert check_image(data, "jpg") is None and check_image(data[:end + 100], "jpg") is None
    assert check_image(data[:end - 1], "jpg").startswith("truncated JPEG")
    assert _diff(decode_rgb(data), decode_rgb(gen.jpeg())) == 0


def test_exif_thumbnail_end_of_image_does_not_count():
    whole = gen.jpeg_with_exif_thumbnail()
    cut, _ = gen.ALL_BROKEN["truncated_exif_thumbnail_jpeg"]
    first_eoi = cut.find(b"\xff\xd9")  # the thumbnail's, inside APP1
    scan = cut.find(b"\xff\xda", first_eoi)  # the main image's scan comes after it
    assert 0 < first_eoi < scan and b"\xff\xd9" not in cut[scan:]
    assert check_image(whole, "jpg") is None
    assert check_image(cut, "jpg").startswith("truncated JPEG")


def test_wrong_extension_is_accepted_and_checked_as_what_it_is():
    data = gen.png_as_jpg()
    assert check_image(data, "x.jpg") is None
    assert np.array_equal(decode_rgb(data), gen.rgb_pixels())
    assert check_image(data[:-12], "x.jpg") == "truncated PNG: no IEND chunk"


def test_gif_cut_just_after_a_0x3b_byte_is_still_truncated():
    data = gen.gif()
    cuts = [k for k in range(20, len(data) - 1) if data[k - 1] == 0x3B]
    assert cuts  # a trailer-byte test alone would pass these
    assert all(check_image(data[:k], "gif").startswith("truncated GIF") for k in cuts)
    assert check_image(data + b"\0" * 5, "gif") is None  # NUL padding after the trailer


def test_bmp_without_a_declared_file_size_is_still_checked():
    data = bytearray(gen.bmp())
    data[2:6] = bytes(4)  # the header's file size is optional (0)
    assert check_image(bytes(data), "bmp") is None
    assert check_image(bytes(data[:-1]), "bmp").startswith("truncated BMP: pixel data needs")


def test_corrupt_jpeg_structure():
    data = gen.jpeg()
    assert check_image(b"\xff\xd8garbage", "jpg") == "corrupt JPEG: no marker at byte 2"
    assert check_image(b"\xff\xd8\xff\xe0\x00\x01" + data[6:], "jpg").startswith(
        "corrupt JPEG: bad segment length")
    sof = data.index(b"\xff\xc0")
    length = int.from_bytes(data[sof + 2:sof + 4], "big")
    no_frame = data[:sof] + data[sof + 2 + length:]
    assert check_image(no_frame, "jpg") == "corrupt JPEG: image data before any frame header"
    assert check_image(b"\xff\xd8\xff\xd9", "jpg").startswith("corrupt JPEG: end-of-image")


def test_other_contents_are_named():
    assert check_image(b"%PDF-1.4\n...", "png") == "not a PNG image: content is a PDF document"
    assert check_image(b"\0\0\0\x18ftypheic" + bytes(30), "jpg") == (
        "not a JPEG image: content is HEIC image data (not supported)")
    assert check_image(b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image") == (
        "not an image: content is an SVG drawing (not supported)")
    assert check_image(b"\x89PN", "png").startswith("truncated PNG")  # a cut signature
    assert check_image(b"anything", "json") is None  # not an image field: not checked


def test_quick_check_accepts_bytes_like_input():
    data = gen.jpeg()
    assert check_image(memoryview(data), "jpg") is None
    assert check_image(np.frombuffer(data, np.uint8), "jpg") is None


# --- decode_rgb -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", VALID)
def test_decode_rgb_matches_an_independent_reference(name):
    data, _ = gen.ALL_VALID[name]
    expected, tolerance = _expected(name)
    pixels = decode_rgb(data)
    assert pixels.dtype == np.uint8 and pixels.shape == (30, 40, 3)
    if tolerance == 0:
        assert np.array_equal(pixels, expected)
    else:
        assert _diff(pixels, expected) < tolerance
    if name.startswith(("jpeg", "webp", "motion")):  # same bytes, Pillow's decoder
        with Image.open(io.BytesIO(data)) as image:
            assert _diff(pixels, np.asarray(image.convert("RGB"))) < 1.0


def test_16_bit_keeps_the_high_byte_where_pillow_convert_clips():
    data = gen.png("I;16")
    pillow = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    right = _rgb((gen.gray16_pixels() >> 8).astype(np.uint8))
    assert _diff(pillow, right) > 50  # what this rule exists for
    assert np.array_equal(decode_rgb(data), right)


def test_cmyk_jpeg_is_not_inverted():
    pixels = decode_rgb(gen.jpeg("CMYK"))
    expected, _ = _expected("jpeg_cmyk")
    assert _diff(pixels, expected) < 3 and _diff(255 - pixels, expected) > 60


def test_exif_orientation_is_not_applied():
    data = gen.jpeg(exif_orientation=6)
    assert Image.open(io.BytesIO(data)).getexif()[0x0112] == 6
    pixels = decode_rgb(data)
    assert pixels.shape == (30, 40, 3) and _diff(pixels, decode_rgb(gen.jpeg())) < 1


def test_gif_gives_its_first_frame():
    first = decode_rgb(gen.gif(frames=3))
    indices, palette = gen.palette_pixels()
    assert np.array_equal(first, palette[indices])
    assert not np.array_equal(first, palette[np.roll(indices, 3, axis=1)])


DECODE_ERRORS = {
    "empty": "cannot decode image: empty", "html_page": "cannot decode image: content looks "
    "like HTML", "zeros_as_jpg": "cannot decode image: content is all zero bytes",
    "truncated_jpeg": "cannot decode JPEG: truncated JPEG",
    "jpeg_headers_only": "cannot decode JPEG: truncated JPEG",
    "truncated_png": "cannot decode PNG: truncated PNG", "truncated_webp": "cannot decode WEBP: "
    "truncated WEBP", "truncated_bmp": "cannot decode BMP: truncated BMP",
    "truncated_tiff": "cannot decode TIFF: truncated TIFF",
}


@pytest.mark.parametrize("name", sorted(DECODE_ERRORS))
def test_decode_error_names_what_is_wrong(name):
    data, _ = gen.ALL_BROKEN[name]
    with pytest.raises(DecodeError) as info:
        decode_rgb(data)
    assert info.value.message.startswith(DECODE_ERRORS[name]), info.value.message
    assert "\n" not in str(info.value) and "0x" not in str(info.value)
    with pytest.raises(DecodeError) as info:
        decode_image(data, CropOptions(size=16, train=False))
    assert info.value.message.startswith(DECODE_ERRORS[name]), info.value.message


def test_only_the_first_frame_must_decode():
    """A GIF cut in its second frame and a PNG without IEND decode (their pixels are all there);
    both checks still refuse them."""
    for name in ("truncated_gif", "png_missing_iend"):
        data, ext = gen.ALL_BROKEN[name]
        assert decode_rgb(data).shape == (30, 40, 3)
        assert check_image_full(data, ext) is not None


def test_decompression_bomb_limit_is_a_decode_error(monkeypatch):
    samples = (gen.png("RGB"), gen.jpeg(), gen.jpeg("CMYK"), gen.gif())
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)  # 40x30 = 1,200 > 2 x 500
    for data in samples:
        with pytest.raises(DecodeError, match=r"image too large: 1,200 pixels"):
            decode_rgb(data)
        with pytest.raises(DecodeError, match=r"image too large: 1,200 pixels"):
            decode_image(data, CropOptions(size=16))
        assert check_image(data, "image") is None  # the quick check reads no sizes
        assert check_image_full(data, "image").startswith("image too large")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # Pillow's "no limit" is honoured
    assert decode_rgb(gen.jpeg()).shape == (30, 40, 3)


# --- decode_image and reference_decode (shardpack.transforms.decode)
# ----------------------------------------

@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("name", VALID)
def test_decode_image_matches_reference_on_every_format(name, train):
    data, _ = gen.ALL_VALID[name]
    opts = CropOptions(size=24, train=train)
    diffs = []
    for index in range(4):
        rnd = SampleRandom(0, 0, index) if train else None
        fast = decode_image(np.frombuffer(data, np.uint8), opts, rnd)  # as CpuDecode passes it
        ref = reference_decode(data, opts, SampleRandom(0, 0, index) if train else None)
        assert fast.shape == ref.shape == (24, 24, 3) and fast.dtype == np.uint8
        diffs.append(_diff(fast, ref))
    # measured <= ~5 here (torch vs Pillow resize kernels on tiny, noisy crops, fast DCT); a
    # wrong crop or flip of these images differs by 15-45
    assert max(diffs) < 8, diffs


def test_decode_image_and_reference_keep_16_bit_high_bytes():
    value = 40000  # >> 8 = 156; Pillow's clipping convert gives 255
    out = io.BytesIO()
    Image.fromarray(np.full((30, 40), value, np.uint16)).save(out, "PNG")
    for fn in (decode_image, reference_decode):
        for train in (True, False):
            pixels = fn(out.getvalue(), CropOptions(size=16, train=train), SampleRandom(0, 0, 1))
            assert np.all(pixels == value >> 8), fn


def test_decode_image_cmyk_jpeg_comes_out_right():
    expected, _ = _expected("jpeg_cmyk")
    opts = CropOptions(size=30, train=False, crop_fraction=1.0)
    pixels = decode_image(gen.jpeg("CMYK"), opts)
    # eval crop of the full 30x30 center: compare with the same center of Pillow's conversion
    assert _diff(pixels, expected[:, 5:35]) < 4


def test_decode_image_falls_back_to_pillow_for_what_simplejpeg_refuses():
    import simplejpeg

    data = gen.jpeg()
    scan = data.index(b"\xff\xda") + 20
    refused = None
    for k in range(scan, len(data) - 4, 7):  # a corrupt byte in the scan data
        bad = bytearray(data)
        bad[k] ^= 0x55
        try:
            simplejpeg.decode_jpeg(bytes(bad))
        except ValueError:
            refused = bytes(bad)
            break
    assert refused is not None
    opts = CropOptions(size=24, train=False)
    assert decode_image(refused, opts).shape == (24, 24, 3)  # as PIL-based loaders decode it
    assert _diff(decode_image(refused, opts), reference_decode(refused, opts)) < 8


# --- resize at pack time ----------------------------------------------------------------------

def test_resize_keeps_exif_orientation_and_does_not_transpose():
    data = gen.jpeg(exif_orientation=6, size=(200, 150))
    out = resize_image(data, "jpg", 64, 90, "src/a.jpg")
    with Image.open(io.BytesIO(out)) as image:
        assert image.format == "JPEG" and image.size == (85, 64)  # not turned to 64x85
        assert image.getexif()[0x0112] == 6


def test_resize_keeps_the_icc_profile():
    from PIL import ImageCms

    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    out = io.BytesIO()
    Image.fromarray(gen.rgb_pixels((200, 150))).save(out, "PNG", icc_profile=icc)
    resized = resize_image(out.getvalue(), "png", 64, 90, "a.png")
    assert Image.open(io.BytesIO(resized)).info["icc_profile"] == icc


def test_resize_reencodes_in_the_content_format_and_passes_other_formats_through():
    png = gen.png("RGB", size=(200, 150))
    for field in ("jpg", "image"):
        with Image.open(io.BytesIO(resize_image(png, field, 64, 90, "a"))) as image:
            assert image.format == "PNG" and image.size == (85, 64)
    for data, field in ((gen.gif(size=(200, 150)), "gif"), (gen.bmp((200, 150)), "bmp"),
                        (gen.tiff(16, size=(200, 150)), "tiff")):
        assert resize_image(data, field, 64, 90, "a") == data


def test_resize_refuses_broken_images_of_every_format():
    for data, field in ((gen.truncated(gen.gif(size=(200, 150))), "gif"),
                        (gen.truncated(gen.jpeg(size=(200, 150))), "jpg"),
                        (gen.html_page(), "image")):
        with pytest.raises(SourceError, match=r"cannot resize: not a valid") as info:
            resize_image(data, field, 64, 90, "src/x")
        assert "src/x" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("mode", ["RGB", "CMYK"])  # (CMYK: Pillow's path, its draft())
def test_decode_rgb_min_side_scales_a_jpeg_in_the_decoder(mode):
    """A preview decodes a JPEG at 1/2-1/8 scale when that still covers the cell: never under
    min_side, the same picture (close to a full decode shrunk alike), and the header keeps the
    full size."""
    data = gen.jpeg(mode, size=(800, 600), quality=90)
    full = decode_rgb(data)
    small = decode_rgb(data, min_side=100)
    assert full.shape == (600, 800, 3)
    assert small.shape[0] >= 100 and small.shape[1] >= 100 and small.shape[0] <= 150
    shrunk = np.asarray(Image.fromarray(full).resize(small.shape[1::-1], Image.Resampling.BOX))
    assert np.abs(shrunk.astype(int) - small.astype(int)).mean() < 8
    assert headers.header_info(data) == ((800, 600), "JPEG")
    assert headers.header_info(gen.png("RGB")) == (gen.SIZE, "PNG")
    with pytest.raises(Exception):  # noqa: B017 - Pillow's own type for unreadable headers
        headers.header_info(b"not an image")
