"""Pack-time preprocessing: shrink images once while packing, so the training loop never decodes
pixels it will throw away.

Rule (docs/packing.md): JPEG, PNG and WebP fields whose shorter side is longer than ``short_side``
are resized so the shorter side equals it (aspect kept, EXIF orientation applied) and re-encoded in
their own format (JPEG and WebP at ``quality``, PNG lossless).  Smaller images are kept byte for
byte: shardpack never upscales.  Other fields pass through unchanged.
"""

from __future__ import annotations

import io

from .errors import SourceError

IMAGE_FIELDS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}


def is_image_field(field: str) -> bool:
    return field.rsplit(".", 1)[-1].lower() in IMAGE_FIELDS


def resize_image(data: bytes, field: str, short_side: int, quality: int, path: str) -> bytes:
    from PIL import Image, ImageOps  # imported here: only packs with --resize need Pillow

    fmt = IMAGE_FIELDS[field.rsplit(".", 1)[-1].lower()]
    try:
        with Image.open(io.BytesIO(data)) as img:
            w, h = img.size
            if min(w, h) <= short_side:
                img.verify()  # still refuse a corrupt image, even when it is kept as it is
                return data
            scale = short_side / min(w, h)
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            if fmt == "JPEG":
                img.draft("RGB", size)  # DCT-domain downscale: decode at 1/2, 1/4 or 1/8
            img = ImageOps.exif_transpose(img)
            w, h = img.size
            scale = short_side / min(w, h)
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            img = img.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
            if fmt == "JPEG" and img.mode not in ("RGB", "L"):
                img = img.convert("RGB")
            out = io.BytesIO()
            kwargs = {"quality": quality} if fmt in ("JPEG", "WEBP") else {"optimize": False}
            img.save(out, fmt, **kwargs)
            return out.getvalue()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise SourceError(f"cannot resize: not a valid {fmt} image ({exc})", path=path,
                          hint="remove it, or pass --skip-bad to skip and count it") from None
