"""How images are stored (``pack --pixels``): as they came (``keep``), as raw pixels (``raw``: uint8
RGB in an ``rgb.npy`` field, no decode when training), or raw where that pays (``auto``: images of
a lossless format whose raw bytes are at most a threshold; JPEG and WebP as they came).

A choice made once: :func:`pixel_form` turns the option into a :class:`PixelForm` each shard task
holds.  The converted field is the sample's image: an image field whose name is one part (``jpg``,
``PNG``, ``webp``); image fields with a longer name (``seg.png``, ``depth.png``, often masks whose
palette indices are the data) keep their bytes.  A resize (``--resize``) happens first.  The
threshold and the measurement behind it: docs/images.md, "Raw pixels".
"""

from __future__ import annotations

from shardpack.core.errors import BrokenImageError, DecodeError, SKIP_BAD, ShardpackError
from shardpack.core.sizes import parse_size
from shardpack.images.content import decode_rgb, header_size, is_image_field
from shardpack.images.formats.raw import RAW, pixels_npy
from shardpack.images.registry import sniff_codec

RAW_FIELD = RAW.suffixes[0]  # the field raw pixels are stored in
NPY_HEADER = 128  # bytes numpy writes before an image's pixels
# auto's default threshold (docs/images.md, "Raw pixels"): raw bytes at most this
AUTO_BYTES = 48 * 1024


def parse_pixels(text: str) -> str:
    """``keep``, ``raw``, ``auto`` or ``auto:SIZE`` (``auto:96kB``) -> its normal spelling
    (``auto:49152``); a one-line error for anything else."""
    value = str(text).strip().lower()
    if value in ("keep", "raw"):
        return value
    if value == "auto":
        return f"auto:{AUTO_BYTES}"
    if value.startswith("auto:"):
        try:
            return f"auto:{parse_size(value[5:])}"
        except ShardpackError as exc:
            raise ShardpackError(f"--pixels {text!r}: {exc.message}") from None
    raise ShardpackError(f"--pixels {text!r}: expected keep, raw, auto or auto:SIZE "
                         "(auto:96kB)")


class PixelForm:
    """Keep every image as it came."""

    converts = False

    def names(self, name: str) -> tuple[str, ...]:
        """The names a field planned as ``name`` may be stored under."""
        return (name,)

    def store(self, name: str, data: bytes, where: str) -> tuple[str, bytes]:
        """The field as it is stored: ``(name, bytes)``."""
        return name, data


class RawPixels(PixelForm):
    """Every image as raw pixels."""

    converts = True

    def names(self, name: str) -> tuple[str, ...]:
        """The sample's image becomes ``rgb.npy``."""
        return (RAW_FIELD,) if _the_image(name) else (name,)

    def store(self, name: str, data: bytes, where: str) -> tuple[str, bytes]:
        """The sample's image decoded once (the shared RGB rules, within the decode budget)
        and stored as ``rgb.npy``; other fields as they are."""
        if not self.takes(name, data):
            return name, data
        try:
            pixels = decode_rgb(data)
        except DecodeError as exc:
            raise BrokenImageError(f"cannot store raw pixels: {exc.message}", path=where,
                                   hint=f"fix or remove it, or pass {SKIP_BAD} to skip and "
                                        "count broken images") from None
        return RAW_FIELD, pixels_npy(pixels)

    def takes(self, name: str, data: bytes) -> bool:
        """Whether this field is converted: the sample's image (a one-part image field), not
        already raw."""
        return _the_image(name)


class AutoPixels(RawPixels):
    """Raw pixels for images of a lossless format (PNG, GIF, BMP, TIFF) whose raw bytes are at
    most ``limit``; the file as it came otherwise (JPEG and WebP always: their decode is cheap
    for the bytes they save; docs/images.md, "Raw pixels")."""

    def __init__(self, limit: int):
        self.limit = limit

    def names(self, name: str) -> tuple[str, ...]:
        """The sample's image stays, or becomes ``rgb.npy``."""
        return (name, RAW_FIELD) if _the_image(name) else (name,)

    def takes(self, name: str, data: bytes) -> bool:
        """The sample's image, when its format is lossless and its header's size makes at most
        ``limit`` raw bytes (an image whose header cannot be read is kept, and checked as any
        other)."""
        if not super().takes(name, data):
            return False
        codec = sniff_codec(data)
        if codec is None or not codec.lossless:
            return False
        size = header_size(data)
        return size is not None and size[0] * size[1] * 3 + NPY_HEADER <= self.limit


def _the_image(name: str) -> bool:
    """A one-part image field: the sample's image (``seg.png`` and the like keep their bytes)."""
    return "." not in name and is_image_field(name)


def pixel_form(option: str) -> PixelForm:
    """The form ``PackOptions.pixels`` (normalised by :func:`parse_pixels`) names."""
    if option == "raw":
        return RawPixels()
    if option.startswith("auto:"):
        return AutoPixels(int(option[5:]))
    return PixelForm()
