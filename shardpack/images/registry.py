"""The image formats shardpack knows, one :class:`~shardpack.images.formats.base.Codec` each, and
the lookups everything else goes through: by name, by file extension, by the bytes' signature.
Adding a format is one module in ``images/formats/`` and one line here (docs/design.md)."""

from __future__ import annotations

from shardpack.images.formats.base import Codec
from shardpack.images.formats.bmp import BMP
from shardpack.images.formats.gif import GIF
from shardpack.images.formats.jpeg import JPEG
from shardpack.images.formats.png import PNG
from shardpack.images.formats.raw import RAW
from shardpack.images.formats.tiff import TIFF
from shardpack.images.formats.webp import WEBP

CODECS: tuple[Codec, ...] = (JPEG, PNG, GIF, TIFF, WEBP, BMP, RAW)  # sniffed in this order

_BY_NAME = {codec.name: codec for codec in CODECS}
BATCH_CROPS = tuple(codec for codec in CODECS if codec.batch_crops)  # crop a batch in one call
# the codecs to ask by a file's first byte: sniffing is once per image read, so one dict lookup
# and one or two signature tests, not one test per format
_BY_FIRST: dict[int, tuple[Codec, ...]] = {}
for _codec in CODECS:
    for _first in sorted({m[0] for m in _codec.magics}):
        _BY_FIRST[_first] = _BY_FIRST.get(_first, ()) + (_codec,)
_BY_EXTENSION = {ext: codec for codec in CODECS for ext in codec.extensions}


def codec_named(name: str) -> Codec:
    """The codec of the format ``name`` (``"JPEG"``); KeyError for an unknown one."""
    return _BY_NAME[name]


def codec_for_extension(extension: str) -> Codec | None:
    """The codec a file extension (or a field name's last part) names, any case; None."""
    return _BY_EXTENSION.get(extension.lower())


def codec_for_field(field: str) -> Codec | None:
    """The codec a field name names: a longer suffix first (``x.rgb.npy``: raw pixels), else its
    last dot-separated part as an extension; None for a field that names no image format."""
    lowered = field.lower()
    for codec in CODECS:
        for suffix in codec.suffixes:
            if lowered == suffix or lowered.endswith("." + suffix):
                return codec
    return codec_for_extension(lowered.rsplit(".", 1)[-1])


def sniff_codec(data) -> Codec | None:
    """The codec whose signature the bytes start with, or None (no supported image)."""
    head = bytes(data[:18])
    for codec in _BY_FIRST.get(head[0], ()) if head else ():
        if codec.sniff(head):
            return codec
    return None


def claimed_codec(data) -> Codec | None:
    """The codec whose checks apply to these bytes: the sniffed one; a JPEG start-of-image
    followed by garbage is a corrupt JPEG, and a cut-off signature a truncated image of that
    format, not other data."""
    head = bytes(data[:18])
    found = sniff_codec(head)
    if found is not None:
        return found
    if JPEG.claims(head):
        return JPEG
    if 2 <= len(head) < 18:
        for codec in CODECS:
            if codec.cut_signature(head):
                return codec
    return None


def extensions() -> dict[str, str]:
    """Every image extension -> its format's name."""
    return {ext: codec.name for ext, codec in _BY_EXTENSION.items()}


def region_decodes(data) -> bool:
    """Whether these bytes take the region path of the CPU decode (their codec's
    :attr:`~shardpack.images.formats.base.Codec.region`: a crop planned from the header,
    decoded at a DCT scale)."""
    codec = claimed_codec(data)
    return codec is not None and codec.region
