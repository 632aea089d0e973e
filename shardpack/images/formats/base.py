"""What an image format is to shardpack: one :class:`Codec` object per format, owning its magic
bytes, its extensions, its header parser, its structure check, its pixel-budget check, its decode
and its re-encode.  Everything else asks :mod:`shardpack.images.registry` for the codec and calls
it; nothing outside ``images/formats/`` names a format (tests/unit/test_layout.py checks it).

Decode rules shared by every format (docs/images.md): 8-bit RGB out; 16-bit samples keep their
high byte; palettes looked up; alpha dropped; CMYK through Pillow; the first frame; no EXIF
orientation.
"""

from __future__ import annotations

import io
import re

import numpy as np

from shardpack.core.errors import DecodeError, ShardpackError


class Codec:
    """One image format.  Subclasses set the class attributes and override what differs.

    Attributes:
        name: the format's name, as Pillow spells it (``"JPEG"``).
        extensions: file extensions (lower case, no dot) naming it.
        suffixes: longer field-name endings naming it (``"rgb.npy"``), where the last part
            alone (``npy``) also names other data.
        magics: byte strings the file starts with.
        reencodes: ``pack --resize`` shrinks and re-encodes it (else it passes through).
        nvjpeg: nvJPEG can decode it on the GPU.
        region: the CPU decode can take only a crop's region at a DCT scale (the JPEG path of
            :mod:`shardpack.transforms.decode`).
        pillow: Pillow decodes it (the default decode).
        stored_pixels: the bytes hold the pixels themselves (:meth:`layout` says where): the GPU
            path copies them up, no decode.
        lossless: the format keeps every pixel, and its decode costs far more than its bytes
            save (``pack --pixels auto`` stores such images raw; docs/images.md).
        batch_crops: :meth:`crop_batch` crops a whole batch's images of this format in one call.
    """

    name = ""
    extensions: tuple = ()
    suffixes: tuple = ()  # field names ending with these (two parts: "rgb.npy") name it too
    magics: tuple = ()
    reencodes = False
    nvjpeg = False
    region = False
    pillow = True
    stored_pixels = False
    lossless = False
    batch_crops = False

    def __repr__(self) -> str:
        return f"<codec {self.name}>"

    def crop_batch(self, data, offsets, rows, ids, out, crop: tuple, max_pixels: int | None):
        """Crop, flip and resize the images of samples ``rows`` of a batch into ``out`` in one
        call (:attr:`batch_crops` formats; docs/images.md, "Raw pixels").  Returns a bool array,
        True where a row's image was written; None where this machine has no batch path.  A row
        not written is left to the per-sample decode, which decodes it or names what is wrong.

        Args:
            data: the field's bytes for the whole batch (uint8).
            offsets: int64 ``[n + 1]``: sample i is ``data[offsets[i]:offsets[i + 1]]``.
            rows: int64, the samples to do.
            ids: int64 ``[n]``, the samples' global indices (their draws' key).
            out: uint8 ``[n, size, size, 3]``, C-contiguous, the batch's images.
            crop: (size, train, flip, seed, epoch, scale_lo, scale_hi, ratio_lo, ratio_hi,
                crop_fraction): what the transform spec and the epoch say.
            max_pixels: the decode budget.
        """
        return None

    def sniff(self, head: bytes) -> bool:
        """Whether ``head`` (a file's first 18 bytes or fewer) is this format's signature."""
        return any(head.startswith(m) for m in self.magics)

    def cut_signature(self, head: bytes) -> bool:
        """Whether ``head``, shorter than a whole signature, is the start of one (a truncated
        file of this format, not other data)."""
        return any(head[:len(m)] == m[:len(head)] for m in self.magics)

    def size(self, get) -> tuple[int, int]:
        """(width, height) from the header, reading bytes with ``get(offset, n)``; ValueError
        where the structure is not what is expected."""
        raise ValueError(f"no header parser for {self.name}")

    def check(self, data: bytes) -> str | None:
        """None if the bytes look whole, else a one-line reason.  Cheap: a header and chunk
        walk, no pixels."""
        return None

    def capacity(self, data: bytes) -> str | None:
        """Why the header claims more pixels than the file's compressed data can hold, or None
        (also where the format has no such bound)."""
        return None

    def decode(self, data: bytes, min_side: int, max_pixels: int | None) -> np.ndarray | str:
        """uint8 ``[H, W, 3]`` RGB, or why the decode failed (a string); the decode budget's
        refusal raises.  Pillow by default."""
        return pillow_rgb(data, self.name, min_side, max_pixels, draft=False)

    def reencode(self, image, quality: int, keep: dict) -> bytes:
        """A Pillow image saved in this format with :meth:`save_options` (``keep``: EXIF and
        ICC profile to carry)."""
        out = io.BytesIO()
        image.save(out, self.name, **self.save_options(quality), **keep)
        return out.getvalue()

    def save_options(self, quality: int) -> dict:
        """Pillow's save options of this format at ``quality`` (none by default)."""
        return {}

    def prepare(self, image, size: tuple[int, int]):
        """The opened image before a resize to ``size`` (JPEG: a DCT-domain draft)."""
        return image

    def encode(self, image, quality: int = 90) -> bytes:
        """A Pillow image (thumbnails, sheets, converted pixels) in this format."""
        return self.reencode(image, quality, {})

    def layout(self, data) -> tuple[int, int, int]:
        """(height, width, offset) of stored uint8 RGB pixels (:attr:`stored_pixels` formats);
        ValueError where the bytes do not hold exactly that."""
        raise ValueError(f"{self.name} stores encoded pixels")


def pillow_rgb(data: bytes, fmt: str, min_side: int, max_pixels: int | None, draft: bool):
    """The image decoded by Pillow as ``fmt``: its pixels, or why Pillow failed (a string).  The
    budget's refusals and a decompression bomb raise.  ``draft``: Pillow's DCT scaling down to
    ``min_side`` (JPEG)."""
    from PIL import Image

    from shardpack.images.budget import check_size, too_large_message

    try:
        with Image.open(io.BytesIO(data), formats=[fmt]) as image:
            check_size(*image.size, max_pixels)  # (headers our parser did not read)
            if min_side and draft:
                image.draft(image.mode, (min_side, min_side))
            image.load()
            return rgb_array(image)
    except ShardpackError:  # the budget's refusal, or a bad budget setting: as they are
        raise
    except Image.DecompressionBombError as exc:
        count = re.search(r"(\d+) pixels", str(exc))
        raise DecodeError(too_large_message(int(count.group(1))) if count else str(exc)) from None
    except Exception as exc:  # Pillow raises many types for bad data
        if isinstance(exc, Image.UnidentifiedImageError):  # its message holds an object repr
            return "Pillow does not recognise the data"
        return str(exc) or type(exc).__name__


def rgb_array(image) -> np.ndarray:
    """A loaded Pillow image -> uint8 ``[H, W, 3]`` by shardpack's rules: 16-bit (and 32-bit int)
    samples keep their high byte, where Pillow's ``convert("RGB")`` clips them at 255; palettes are
    looked up directly (transparency ignored, no warning); alpha is dropped; every other mode
    (CMYK, LA, 1-bit, YCbCr) goes through Pillow's ``convert("RGB")``."""
    mode = image.mode
    if mode == "RGB":
        return np.asarray(image)
    if mode.startswith("I") or mode == "F":  # I;16, I;16B, I;16L, I (32-bit), F (float)
        samples = np.asarray(image)
        samples = np.clip(samples, 0, 255) if mode == "F" else np.clip(samples, 0, 65535) >> 8
        gray = samples.astype(np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if mode == "P" and image.palette is not None:
        palette = np.zeros((256, 3), np.uint8)
        colours = np.frombuffer(bytes(image.getpalette("RGB") or ()), np.uint8).reshape(-1, 3)
        palette[:len(colours)] = colours[:256]
        return palette[np.asarray(image)]
    if mode == "RGBA":
        return np.ascontiguousarray(np.asarray(image)[:, :, :3])
    return np.asarray(image.convert("RGB"))
