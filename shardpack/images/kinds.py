"""Which fields hold images and what image bytes are: the field name's format, the format the
bytes' magic says, and a description of bytes that are no supported image (docs/images.md: the
bytes, not the field name, decide an image's format)."""

from __future__ import annotations

from shardpack.images.registry import claimed_codec, codec_for_field, extensions, sniff_codec

IMAGE_WORDS = ("image", "img")  # image fields that do not name a format (Parquet/HF image columns)
IMAGE_EXTENSIONS = extensions()  # extension -> format name, from the codecs


def image_format(field: str) -> str | None:
    """Format named by the field's last dot-separated part ("JPEG", "PNG", ...), "" for a generic
    image field (format unknown: sniff the bytes), None for a field that is not an image."""
    if field.rsplit(".", 1)[-1].lower() in IMAGE_WORDS:
        return ""
    codec = codec_for_field(field)
    return codec.name if codec is not None else None


def is_image_field(field: str) -> bool:
    """Whether ``field`` holds an image (:func:`image_format` is not None).

    Args:
        field: the field name.
    """
    return image_format(field) is not None


def sniff(data) -> str | None:
    """Format from the leading magic bytes, or None if they are no supported image.

    Args:
        data: the image file's bytes (the first 18 are read).
    """
    codec = sniff_codec(data)
    return codec.name if codec is not None else None


def content_format(data) -> str | None:
    """The format shardpack decodes these bytes (or their first bytes) as; None for content that
    is no supported image (no decode can read it).

    Args:
        data: the image file's bytes (the first 18 are read).
    """
    return sniffed_kind(bytes(data[:18]))


def sniffed_kind(data: bytes) -> str | None:
    """The format whose structural check applies (:func:`~shardpack.images.registry.claimed_codec`:
    a JPEG start-of-image followed by garbage is a corrupt JPEG, and a cut-off signature a
    truncated image, not "other data")."""
    codec = claimed_codec(data)
    return codec.name if codec is not None else None


_CONTENT = ((b"%PDF", "is a PDF document"), (b"PK\x03\x04", "is a ZIP archive"),
            (b"\x1f\x8b", "is gzip data"), (b"\xff\x0a", "is JPEG XL data (not supported)"),
            (b"<?xml", "looks like XML"), (b"{", "looks like JSON"), (b"[", "looks like JSON"))


def describe_content(data: bytes) -> str:
    """What bytes that are no supported image look like, for the error message.

    Args:
        data: the file's bytes (the first 512 are read).
    """
    head = data[:512]
    text = head.lstrip().lower()
    if text.startswith((b"<!doctype html", b"<html")) or b"<body" in text or b"<head" in text:
        return "content looks like HTML"
    if b"<svg" in text:
        return "content is an SVG drawing (not supported)"
    if head[4:8] == b"ftyp":  # ISO media: HEIF/AVIF stills or video
        brand = head[8:12]
        if brand in (b"heic", b"heix", b"mif1", b"msf1", b"hevc", b"avif"):
            return f"content is {'AVIF' if brand == b'avif' else 'HEIC'} image data (not supported)"
        return "content is MP4/QuickTime video data"
    for magic, what in _CONTENT:
        if text.startswith(magic.lower()):
            return f"content {what}"
    if data.count(0) == len(data):
        return f"content is all zero bytes ({len(data)} bytes)"
    if all(32 <= b < 127 or b in b"\t\n\r" for b in head):
        return "content looks like text"
    return "content is unrecognised binary data"
