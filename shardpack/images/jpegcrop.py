"""Region decode: one box of a JPEG at a DCT scale, through the optional C extension
``shardpack.images.libjpegcrop`` (docs/device.md, "Region decode").

The extension is built at install time when a C compiler and the libjpeg-turbo headers are there
(``scripts/setup.sh`` installs them on Debian).  Without it, :func:`decode_box` returns None and
the caller decodes the whole image at the same DCT scale (simplejpeg): the same pixels, 10-30%
slower.  :func:`notice_once` says so once per process; the loader calls it where it is built, in
the main process, so the workers stay quiet.
"""

from __future__ import annotations

import functools
import os
import warnings

import numpy as np

from shardpack.core.extensions import optional_extension

__all__ = ["ENV", "EOI", "MAX_SCANS", "available", "decode_box", "decode_boxes", "extension",
           "notice_once"]

ENV = "SHARDPACK_JPEG_REGION"  # "0": never use the extension (benchmarks compare both paths)
EOI = b"\xff\xd9"
# Progressive JPEGs have about ten scans; thousands are a decode-time bomb (djpeg -maxscans).
MAX_SCANS = 100


@functools.lru_cache(maxsize=None)
def extension():
    """The extension module, or None: not built, libjpeg.so.62 missing, or turned off by ENV."""
    return optional_extension("shardpack.images.libjpegcrop", ENV)


def available() -> bool:
    """Whether JPEGs decode only their crop's region here (the extension is built and on)."""
    return extension() is not None


@functools.lru_cache(maxsize=None)
def notice_once() -> None:
    """Warn once per process when the extension is missing (not when ENV turned it off)."""
    if extension() is None and os.environ.get(ENV, "1") != "0":
        warnings.warn("shardpack: region JPEG decode is not built here, so JPEGs decode whole at "
                      "a reduced DCT scale (same pixels, 10-30% slower); to build it: apt-get "
                      "install gcc libjpeg62-turbo-dev (and pythonX.Y-dev for Debian's Python), "
                      "then reinstall shardpack "
                      f"(set {ENV}=0 to silence this)", RuntimeWarning, stacklevel=3)


def decode_box(data, scale_num: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray | None:
    """Rows ``[y0, y1)`` and columns ``[x0, x1)`` of a JPEG decoded at ``scale_num``/8 (1, 2, 4
    or 8), as uint8 ``[y1 - y0, x1 - x0, 3]`` RGB: the same pixels as simplejpeg's whole decode
    at that scale (fast IDCT and upsampling), cropped.

    None whenever this path does not answer and the caller's whole decode must: no extension;
    data that does not end with the end-of-image marker (a truncated file whose damage lies below
    the box would decode cleanly here, and must not); CMYK/YCCK; anything libjpeg warns about or
    refuses (the whole decode then raises or recovers exactly as it does without the extension).

    Args:
        data: the JPEG (bytes-like).
        scale_num: the DCT scale's numerator over 8.
        y0, y1, x0, x1: the box in the scaled image's pixels.
    """
    module = extension()
    if module is None or bytes(data[-2:]) != EOI:
        return None
    try:
        raw, rows, cols, skew = module.decode(data, scale_num, y0, y1, x0, x1, MAX_SCANS)
    except (ValueError, NotImplementedError):
        return None
    return np.frombuffer(raw, np.uint8).reshape(rows, cols, 3)[:, skew:skew + x1 - x0]


def decode_boxes(datas: list, jobs: np.ndarray, out: np.ndarray) -> np.ndarray | None:
    """Many boxes at once, as :func:`decode_box` decodes one, with the GIL released once for the
    whole call (a loader of threads: Python holds it between calls only).  Box ``k`` lands at
    byte ``jobs[k, 5]`` of ``out`` as uint8 ``[y1 - y0, x1 - x0, 3]``, C-contiguous.  Returns the
    statuses, uint8 ``[N]``: 0 where the box was decoded, else not (no end-of-image marker,
    CMYK/YCCK, anything libjpeg warns about or refuses; that box's bytes are undefined and the
    caller decodes the image its own way, as where :func:`decode_box` returns None).  None
    without the extension, or with one built before it had this call (the caller then decodes
    each image its own way: a stale build is slower, never wrong).

    Args:
        datas: the JPEGs (bytes-like, C-contiguous).
        jobs: int64 ``[N, 6]``: ``scale_num, y0, y1, x0, x1`` as :func:`decode_box` takes them,
            and the byte offset of the box in ``out``.
        out: a writable C-contiguous uint8 buffer holding every box.
    """
    module = extension()
    if module is None or not hasattr(module, "decode_many"):
        return None
    jobs = np.ascontiguousarray(jobs, np.int64)
    return np.frombuffer(module.decode_many(datas, jobs, out, MAX_SCANS), np.uint8)
