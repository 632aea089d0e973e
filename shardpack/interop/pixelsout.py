"""Raw pixels written back out (``unpack --pixels-as``, ``export --pixels-as``): as the ``.npy``
field they are stored as (``npy``, the default: numpy and WebDataset read it), or encoded again
as lossless PNG (``png``: ``x.rgb.npy`` becomes ``x.png``, the same pixels), for tools that
want image files.  Other fields pass through unchanged."""

from __future__ import annotations

from shardpack.core.errors import DecodeError
from shardpack.images.formats.png import PNG
from shardpack.images.formats.raw import RAW
from shardpack.images.registry import codec_for_field

PIXELS_AS = ("npy", "png")


class AsStored:
    """Every field as it is stored."""

    def name(self, field: str) -> str:
        """The name ``field`` is written under."""
        return field

    def __call__(self, field: str, data) -> tuple[str, bytes]:
        """``(name, bytes)`` to write for one field."""
        return field, data


class RawAsPng(AsStored):
    """Raw-pixel fields as PNG files; the rest as stored."""

    def name(self, field: str) -> str:
        """``x.rgb.npy`` -> ``x.png``; ``rgb.npy`` -> ``png``."""
        if codec_for_field(field) is not RAW:
            return field
        stem = field[:-len(RAW.suffixes[0])]
        return f"{stem}{PNG.extensions[0]}"

    def __call__(self, field: str, data) -> tuple[str, bytes]:
        """A raw-pixel field's pixels (checked against its header) encoded as PNG."""
        if codec_for_field(field) is not RAW:
            return field, data
        from PIL import Image

        pixels = RAW.decode(bytes(data), 0, None)
        if isinstance(pixels, str):
            raise DecodeError(f"cannot write {field!r} as PNG: {pixels}")
        return self.name(field), PNG.encode(Image.fromarray(pixels))


def pixels_writer(pixels_as: str) -> AsStored:
    """The writer ``pixels_as`` (one of :data:`PIXELS_AS`) names."""
    if pixels_as not in PIXELS_AS:
        raise ValueError(f"pixels_as must be one of {PIXELS_AS}, got {pixels_as!r}")
    return RawAsPng() if pixels_as == "png" else AsStored()
