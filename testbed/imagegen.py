"""Deterministic test images as file bytes, valid and broken, for building messy image trees.

Every function returns the same bytes on every call (fixed seeds, Pillow and numpy only).  Images
are small (40x30 by default) but have structure: gradients, an 8-pixel checkerboard and noise.

Stable names (other tests import them):

* pixel sources, for computing expected values: ``rgb_pixels``, ``gray_pixels``,
  ``gray16_pixels``, ``rgb16_pixels``, ``palette_pixels`` (-> indices, palette), ``alpha_pixels``,
  ``cmyk_pixels``, ``bit_pixels``;
* valid images: ``jpeg(mode="RGB"|"L"|"CMYK", progressive=False, exif_orientation=None)``,
  ``png(mode="RGB"|"RGBA"|"P"|"P-transparent"|"I;16"|"RGB16"|"LA"|"1")``, ``webp(mode, lossless)``,
  ``gif(frames=2)``, ``bmp()``, ``tiff(bits=8|16, rgb=None)``, ``motion_photo()`` (a JPEG with a
  few KB of video appended after its end-of-image marker), ``jpeg_with_exif_thumbnail()`` (APP1
  holds a whole thumbnail JPEG, EOI included), ``png_as_jpg()`` (PNG bytes, meant for a .jpg
  name);  every generator takes ``size=(width, height)``;
* broken data: ``empty()``, ``truncated(data, keep=0.6)`` (the first ``keep`` fraction),
  ``html_page()`` (an HTTP error page saved under an image name);
* ``ALL_VALID`` and ``ALL_BROKEN``: ``{name: (bytes, extension)}`` covering every variant; write
  ``f"{key}.{extension}"`` files from them.  Keys of ALL_VALID: jpeg_rgb, jpeg_gray, jpeg_cmyk,
  jpeg_progressive, jpeg_exif_rotated (orientation tag 6), jpeg_exif_thumbnail, jpeg_upper_ext,
  jpeg_jfif_ext, jpeg_motion_photo, png_rgb, png_rgba, png_palette, png_palette_transparent,
  png_16 (16-bit gray), png_16_rgb, png_la, png_1bit, png_as_jpg, webp, webp_lossless_alpha,
  gif, bmp, tiff_8, tiff_16 (16-bit gray), tiff_16_rgb.  Keys of ALL_BROKEN: empty, html_page,
  html_as_png, zeros_as_jpg, text_as_gif, truncated_jpeg, truncated_progressive_jpeg,
  jpeg_missing_eoi, jpeg_headers_only, truncated_exif_thumbnail_jpeg, truncated_png,
  png_missing_iend, truncated_webp, truncated_gif, truncated_bmp, truncated_tiff.  Every key
  fails ``shardpack.images.content.check_image`` (the quick check) under its extension.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image

SIZE = (40, 30)  # width, height


def _grid(size):
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    return x, y, x / max(width - 1, 1), y / max(height - 1, 1)


def _noise(shape, seed, spread):
    return np.random.default_rng(seed).integers(-spread, spread + 1, shape)


def rgb_pixels(size=SIZE, seed=0) -> np.ndarray:
    """uint8 [h, w, 3]: red ramps left to right, green top to bottom, blue is a checkerboard."""
    x, y, fx, fy = _grid(size)
    checker = ((x // 8 + y // 8) % 2) * 150 + 50
    base = np.stack([fx * 230 + 10, fy * 230 + 10, checker], -1)
    return np.clip(base + _noise(base.shape, seed, 10), 0, 255).astype(np.uint8)


def gray_pixels(size=SIZE, seed=1) -> np.ndarray:
    x, y, fx, fy = _grid(size)
    base = fx * 150 + fy * 60 + ((x // 8 + y // 8) % 2) * 40
    return np.clip(base + _noise(base.shape, seed, 8), 0, 255).astype(np.uint8)


def gray16_pixels(size=SIZE, seed=2) -> np.ndarray:
    """uint16 over the whole 16-bit range with busy low bytes: clipping to 255 (Pillow's convert)
    or keeping the low byte gives something far from ``>> 8``."""
    _, _, fx, fy = _grid(size)
    base = (fx * 0.75 + fy * 0.25) * 65535
    return np.clip(base + _noise(base.shape, seed, 400), 0, 65535).astype(np.uint16)


def rgb16_pixels(size=SIZE, seed=3) -> np.ndarray:
    _, _, fx, fy = _grid(size)
    base = np.stack([fx, fy, 1 - (fx + fy) / 2], -1) * 65535
    return np.clip(base + _noise(base.shape, seed, 400), 0, 65535).astype(np.uint16)


def palette_pixels(size=SIZE, seed=4) -> tuple[np.ndarray, np.ndarray]:
    """(indices uint8 [h, w], palette uint8 [256, 3]): 48 colours in 5-pixel bands and blocks."""
    x, y, _, _ = _grid(size)
    indices = ((x // 5 + (y // 5) * 7) % 48).astype(np.uint8)
    palette = np.random.default_rng(seed).integers(0, 256, (256, 3)).astype(np.uint8)
    return indices, palette


def alpha_pixels(size=SIZE) -> np.ndarray:
    _, _, fx, fy = _grid(size)
    return (fx * 200 + fy * 55).astype(np.uint8)


def cmyk_pixels(size=SIZE, seed=5) -> np.ndarray:
    x, y, fx, fy = _grid(size)
    base = np.stack([fx * 200, fy * 200, ((x // 8 + y // 8) % 2) * 120 + 20, fx * fy * 90], -1)
    return np.clip(base + _noise(base.shape, seed, 6), 0, 255).astype(np.uint8)


def bit_pixels(size=SIZE) -> np.ndarray:
    x, y, _, _ = _grid(size)
    return ((x // 4 + y // 3) % 3 == 0)


def _save(image: Image.Image, fmt: str, **kwargs) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


def jpeg(mode="RGB", progressive=False, exif_orientation=None, size=SIZE, quality=95) -> bytes:
    pixels = {"RGB": rgb_pixels, "L": gray_pixels, "CMYK": cmyk_pixels}[mode](size)
    kwargs = {"quality": quality, "progressive": progressive}
    if exif_orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        kwargs["exif"] = exif.tobytes()
    return _save(Image.fromarray(pixels, mode), "JPEG", **kwargs)


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return (struct.pack(">I", len(payload)) + kind + payload
            + struct.pack(">I", zlib.crc32(kind + payload)))


def _png16_rgb(pixels: np.ndarray) -> bytes:
    """16-bit RGB PNG written by hand: Pillow cannot write one."""
    height, width, _ = pixels.shape
    rows = pixels.astype(">u2").reshape(height, -1)
    raw = b"".join(b"\0" + row.tobytes() for row in rows)  # filter type 0 per row
    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header)
            + _png_chunk(b"IDAT", zlib.compress(raw, 9)) + _png_chunk(b"IEND", b""))


def png(mode="RGBA", size=SIZE) -> bytes:
    if mode == "RGB16":
        return _png16_rgb(rgb16_pixels(size))
    if mode == "RGB":
        return _save(Image.fromarray(rgb_pixels(size)), "PNG")
    if mode == "RGBA":
        pixels = np.dstack([rgb_pixels(size), alpha_pixels(size)])
        return _save(Image.fromarray(pixels, "RGBA"), "PNG")
    if mode in ("P", "P-transparent"):
        indices, palette = palette_pixels(size)
        image = Image.fromarray(indices, "P")
        image.putpalette(palette.tobytes())
        if mode == "P":
            return _save(image, "PNG")
        alphas = bytes(range(0, 256, 8)) + b"\xff" * 224  # per-entry alpha (a tRNS chunk)
        return _save(image, "PNG", transparency=alphas)
    if mode == "I;16":
        return _save(Image.fromarray(gray16_pixels(size)), "PNG")
    if mode == "LA":
        pixels = np.dstack([gray_pixels(size), alpha_pixels(size)])
        return _save(Image.fromarray(pixels, "LA"), "PNG")
    if mode == "1":
        return _save(Image.fromarray(bit_pixels(size)).convert("1"), "PNG")
    raise ValueError(f"unknown PNG mode {mode!r}")


def webp(mode="RGB", lossless=False, size=SIZE) -> bytes:
    pixels = rgb_pixels(size) if mode == "RGB" else np.dstack([rgb_pixels(size),
                                                               alpha_pixels(size)])
    return _save(Image.fromarray(pixels, mode), "WEBP", lossless=lossless, quality=90, exact=True)


def gif(frames=2, size=SIZE) -> bytes:
    """An animation whose first frame is ``palette_pixels``; later frames shift it."""
    indices, palette = palette_pixels(size)
    images = []
    for i in range(frames):
        image = Image.fromarray(np.roll(indices, 3 * i, axis=1), "P")
        image.putpalette(palette.tobytes())
        images.append(image)
    return _save(images[0], "GIF", save_all=frames > 1, append_images=images[1:], duration=100,
                 loop=0)


def bmp(size=SIZE) -> bytes:
    return _save(Image.fromarray(rgb_pixels(size)), "BMP")


def _tiff16_rgb(pixels: np.ndarray) -> bytes:
    """Uncompressed 16-bit RGB TIFF (little-endian, one strip) written by hand: Pillow cannot."""
    height, width, _ = pixels.shape
    data = pixels.astype("<u2").tobytes()
    entries = [(256, 4, 1, width), (257, 4, 1, height), (258, 3, 3, None), (259, 3, 1, 1),
               (262, 3, 1, 2), (273, 4, 1, None), (277, 3, 1, 3), (278, 4, 1, height),
               (279, 4, 1, len(data)), (284, 3, 1, 1)]
    ifd_size = 2 + 12 * len(entries) + 4
    bits_at = 8 + ifd_size                  # the 3 BitsPerSample values live after the IFD
    strip_at = bits_at + 6
    out = bytearray(b"II*\0" + struct.pack("<I", 8) + struct.pack("<H", len(entries)))
    for tag, kind, count, value in entries:
        value = {258: bits_at, 273: strip_at}.get(tag, value)
        packed = struct.pack("<H", value) + b"\0\0" if kind == 3 else struct.pack("<I", value)
        out += struct.pack("<HHI", tag, kind, count) + packed
    out += struct.pack("<I", 0) + struct.pack("<3H", 16, 16, 16) + data
    return bytes(out)


def tiff(bits=8, rgb=None, size=SIZE) -> bytes:
    """bits=8: RGB; bits=16: grayscale unless rgb=True (then hand-written 16-bit RGB)."""
    rgb = bits == 8 if rgb is None else rgb
    if bits == 8:
        pixels = rgb_pixels(size) if rgb else gray_pixels(size)
        return _save(Image.fromarray(pixels), "TIFF")
    if rgb:
        return _tiff16_rgb(rgb16_pixels(size))
    return _save(Image.fromarray(gray16_pixels(size)), "TIFF")


def motion_photo(size=SIZE) -> bytes:
    """A JPEG followed by ~6 KB of (fake) MP4 video, as phone "motion photos" store it: valid."""
    video = b"\0\0\0\x18ftypmp42\0\0\0\0mp42isom"
    video += np.random.default_rng(6).integers(0, 256, 6000, dtype=np.uint8).tobytes()
    return jpeg(size=size) + video


def _exif_with_thumbnail(thumbnail: bytes) -> bytes:
    """APP1 payload: 'Exif\\0\\0', a little-endian TIFF header, IFD0 (orientation 1) and IFD1
    pointing at the thumbnail JPEG, which follows the IFDs."""
    ifd0 = struct.pack("<H", 1) + struct.pack("<HHIHH", 0x0112, 3, 1, 1, 0) + struct.pack("<I", 26)
    thumb_at = 26 + 2 + 2 * 12 + 4
    ifd1 = (struct.pack("<H", 2) + struct.pack("<HHII", 0x0201, 4, 1, thumb_at)
            + struct.pack("<HHII", 0x0202, 4, 1, len(thumbnail)) + struct.pack("<I", 0))
    return b"Exif\0\0" + b"II*\0" + struct.pack("<I", 8) + ifd0 + ifd1 + thumbnail


def jpeg_with_exif_thumbnail(size=SIZE) -> bytes:
    """Valid; its APP1 holds a whole 8x6 thumbnail JPEG (an EOI marker inside the headers)."""
    thumbnail = _save(Image.fromarray(rgb_pixels((8, 6))), "JPEG", quality=80)
    return _save(Image.fromarray(rgb_pixels(size)), "JPEG", quality=95,
                 exif=_exif_with_thumbnail(thumbnail))


def png_as_jpg(size=SIZE) -> bytes:
    """A valid PNG, meant to be saved under a .jpg name."""
    return png("RGB", size=size)


def empty() -> bytes:
    return b""


def truncated(data: bytes, keep: float = 0.6) -> bytes:
    return data[:int(len(data) * keep)]


def html_page() -> bytes:
    return (b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n"
            b"<body><h1>Not Found</h1><p>The requested URL was not found on this server.</p>"
            b"</body></html>\n")


def _headers_only(data: bytes) -> bytes:
    """A JPEG cut right after its scan header: every header segment there, no image data."""
    at = data.index(b"\xff\xda")
    return data[:at + 2 + int.from_bytes(data[at + 2:at + 4], "big")]


ALL_VALID: dict[str, tuple[bytes, str]] = {
    "jpeg_rgb": (jpeg(), "jpg"),
    "jpeg_gray": (jpeg("L"), "jpeg"),
    "jpeg_cmyk": (jpeg("CMYK"), "jpg"),
    "jpeg_progressive": (jpeg(progressive=True), "jpg"),
    "jpeg_exif_rotated": (jpeg(exif_orientation=6), "jpg"),
    "jpeg_exif_thumbnail": (jpeg_with_exif_thumbnail(), "jpg"),
    "jpeg_upper_ext": (jpeg(), "JPG"),
    "jpeg_jfif_ext": (jpeg(), "jfif"),
    "jpeg_motion_photo": (motion_photo(), "jpg"),
    "png_rgb": (png("RGB"), "png"),
    "png_rgba": (png("RGBA"), "png"),
    "png_palette": (png("P"), "png"),
    "png_palette_transparent": (png("P-transparent"), "png"),
    "png_16": (png("I;16"), "png"),
    "png_16_rgb": (png("RGB16"), "png"),
    "png_la": (png("LA"), "png"),
    "png_1bit": (png("1"), "png"),
    "png_as_jpg": (png_as_jpg(), "jpg"),
    "webp": (webp(), "webp"),
    "webp_lossless_alpha": (webp("RGBA", lossless=True), "webp"),
    "gif": (gif(), "gif"),
    "bmp": (bmp(), "bmp"),
    "tiff_8": (tiff(8), "tif"),
    "tiff_16": (tiff(16), "tiff"),
    "tiff_16_rgb": (tiff(16, rgb=True), "tiff"),
}

ALL_BROKEN: dict[str, tuple[bytes, str]] = {
    "empty": (empty(), "jpg"),
    "html_page": (html_page(), "jpg"),
    "html_as_png": (html_page(), "png"),
    "zeros_as_jpg": (bytes(4096), "jpg"),
    "text_as_gif": (b"placeholder: image not yet downloaded\n", "gif"),
    "truncated_jpeg": (truncated(jpeg()), "jpg"),
    "truncated_progressive_jpeg": (truncated(jpeg(progressive=True)), "jpg"),
    "jpeg_missing_eoi": (jpeg()[:-2], "jpg"),
    "jpeg_headers_only": (_headers_only(jpeg()), "jpg"),
    "truncated_exif_thumbnail_jpeg": (truncated(jpeg_with_exif_thumbnail(), 0.8), "jpg"),
    "truncated_png": (truncated(png("RGB")), "png"),
    "png_missing_iend": (png("RGB")[:-12], "png"),
    "truncated_webp": (truncated(webp()), "webp"),
    "truncated_gif": (truncated(gif()), "gif"),
    "truncated_bmp": (truncated(bmp()), "bmp"),
    "truncated_tiff": (truncated(tiff(8)), "tif"),
}


def ramp_photo(seed: int, w: int, h: int, fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    """Smooth colour ramps plus a little noise, like a photo: a decoded image has real variance,
    and a crop or flip that is off shows (pure noise would make every resize differ)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * (seed + 2)) % 256, (y * 3) % 256, ((x + y) * 2) % 256], -1)
    arr = np.clip(base + rng.normal(0, 6, base.shape), 0, 255).astype("uint8")
    image = Image.fromarray(arr).convert(mode)
    return _save(image, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
