"""Raw pixels: uint8 RGB, height x width x 3, stored as a ``.npy`` file (numpy's own format, so
``numpy.load`` and WebDataset's ``.npy`` decoder read the field unchanged).  The field is named
``rgb.npy`` (a sample ``cat/0001.rgb.npy`` in a tar shard), which keeps it apart from ``.npy``
fields of other arrays: those are data, not images.

Nothing is decoded: the pixels are a view of the stored bytes.  The header is parsed within
:data:`MAX_HEADER` bytes, and its shape is checked against the bytes that follow it and against
the decode budget before any array is made, so a lying header is a one-line reason, never an
allocation (docs/images.md, "Raw pixels").

A batch's raw images are cropped, flipped and resized in one call of the optional C extension
``libpixels`` (:meth:`RawCodec.crop_batch`): the same pixels as the per-sample path, which takes
every sample the extension declines and all of them where it is not built."""

from __future__ import annotations

import ast
import functools
import io
import re

import numpy as np

from shardpack.core.extensions import optional_extension
from shardpack.images.formats.base import Codec, rgb_array

ENV = "SHARDPACK_RAW_BATCH"  # "0": crop raw pixels one sample at a time (benchmarks compare)
MAGIC = b"\x93NUMPY"
MAX_HEADER = 4096  # numpy writes ~118 bytes for an image; far more is no header of ours
DESCR = "|u1"
USUAL = re.compile(r"\{'descr': '\|u1', 'fortran_order': False, 'shape': \((\d{1,9}), (\d{1,9}), "
                   r"3\), \} *\n")


def parse_header(get) -> tuple[int, int, int]:
    """(height, width, offset of the pixels) from a raw-pixel ``.npy`` header, reading bytes with
    ``get(offset, n)``; ValueError naming what is wrong."""
    head = get(0, 10)
    if head[:6] != MAGIC:
        raise ValueError("no .npy signature")
    major = head[6]
    if major == 1:
        length, start = int.from_bytes(head[8:10], "little"), 10
    elif major in (2, 3):
        length, start = int.from_bytes(get(8, 4), "little"), 12
    else:
        raise ValueError(f".npy version {major} is not one numpy writes")
    if length > MAX_HEADER:
        raise ValueError(f".npy header of {length:,} bytes (at most {MAX_HEADER:,})")
    text = get(start, length).decode("latin-1")
    usual = USUAL.fullmatch(text)
    if usual:  # what numpy writes: no literal parse (it costs more than a small image's copy)
        height, width = int(usual.group(1)), int(usual.group(2))
        if height > 0 and width > 0:
            return height, width, start + length
    try:
        fields = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ValueError("the .npy header is not a Python literal") from None
    if not isinstance(fields, dict) or set(fields) != {"descr", "fortran_order", "shape"}:
        raise ValueError("the .npy header is not numpy's {descr, fortran_order, shape}")
    shape = fields["shape"]
    if fields["descr"] != DESCR or fields["fortran_order"] is not False:
        order = ", Fortran order" if fields["fortran_order"] else ""
        raise ValueError(f"raw pixels are uint8 in C order, the header says "
                         f"{fields['descr']!r}{order}")
    if (not isinstance(shape, tuple) or len(shape) != 3 or shape[2] != 3
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)):
        raise ValueError(f"raw pixels are height x width x 3, the header says shape {shape!r}")
    return shape[0], shape[1], start + length


class RawCodec(Codec):
    """Raw uint8 RGB pixels in a ``.npy`` file (``pack --pixels raw|auto``)."""

    name = "RAW"
    extensions = ()
    suffixes = ("rgb.npy",)
    magics = (MAGIC,)
    pillow = False
    stored_pixels = True
    batch_crops = True

    def layout(self, data) -> tuple[int, int, int]:
        """(height, width, offset of the pixels), the header checked against the bytes."""
        height, width, offset = parse_header(_getter(data))
        if len(data) != offset + height * width * 3:
            raise ValueError(self.check(data))
        return height, width, offset

    def size(self, get) -> tuple[int, int]:
        """(width, height) from the ``.npy`` header."""
        height, width, _ = parse_header(get)
        return width, height

    def check(self, data: bytes) -> str | None:
        """The header, and exactly height x width x 3 bytes after it."""
        try:
            height, width, offset = parse_header(_getter(data))
        except ValueError as exc:
            return f"corrupt raw pixels: {exc}"
        need = offset + height * width * 3
        if len(data) != need:
            return (f"{'truncated' if len(data) < need else 'corrupt'} raw pixels: "
                    f"{height:,}x{width:,}x3 needs {need:,} bytes, the field holds "
                    f"{len(data):,}")
        return None

    def decode(self, data: bytes, min_side: int, max_pixels: int | None):
        """The pixels themselves (a read-only view of ``data``), once the header's shape is
        within the decode budget and matches the bytes."""
        from shardpack.images.budget import check_size

        try:
            height, width, offset = self.layout(data)
        except ValueError as exc:
            return str(exc)
        check_size(width, height, max_pixels)
        return np.frombuffer(data, np.uint8, height * width * 3, offset).reshape(height, width, 3)

    def crop_batch(self, data, offsets, rows, ids, out, crop: tuple, max_pixels: int | None):
        """:meth:`Codec.crop_batch` by the extension: headers, crop plans and resizes in C, the
        GIL released; a row whose header is not numpy's usual one, whose length does not match
        it, or over the decode budget is left to the per-sample path."""
        from shardpack.images.budget import pixel_limit

        module = batch_extension()
        if module is None:
            return None
        done = np.zeros(len(rows), np.uint8)
        module.crop_batch(data, offsets, rows, ids, out, done, *crop, pixel_limit(max_pixels))
        return done.view(bool)

    def encode(self, image, quality: int = 90) -> bytes:
        """A Pillow image's pixels by the shared RGB rules, as ``.npy``."""
        return pixels_npy(rgb_array(image))


@functools.lru_cache(maxsize=None)
def batch_extension():
    """The batch crop extension, or None: not built (no C compiler or libxxhash headers at
    install), or turned off by ENV."""
    return optional_extension("shardpack.images.formats.libpixels", ENV)


def pixels_npy(pixels: np.ndarray) -> bytes:
    """uint8 ``[H, W, 3]`` pixels as the bytes of a ``.npy`` file."""
    out = io.BytesIO()
    np.save(out, np.ascontiguousarray(pixels, dtype=np.uint8), allow_pickle=False)
    return out.getvalue()


def _getter(data):
    def get(pos: int, n: int) -> bytes:
        if pos + n > len(data):
            raise ValueError(f"the .npy header runs past the end of the {len(data):,}-byte field")
        return bytes(data[pos:pos + n])
    return get


RAW = RawCodec()
