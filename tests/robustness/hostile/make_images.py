"""Write the hostile images of tests/robustness/hostile/images/ (for
tests/robustness/test_bombs.py): headers that claim
huge sizes, each a valid file of its format, at most a few hundred KB.

Regenerate (the files are committed, so the corpus stays fixed; rerun only to add a case)::

    .venv/bin/python tests/robustness/hostile/make_images.py

Standard library only (zlib's output may differ between zlib builds: the committed bytes are
the corpus).  The expected refusal of each case is listed in tests/robustness/test_bombs.py (CASES).
"""

from __future__ import annotations

import shutil
import struct
import zlib
from pathlib import Path

OUT = Path(__file__).resolve().parent / "images"


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(width: int, height: int, colour: int, channels: int, rows: int | None = None) -> bytes:
    """An 8-bit PNG whose IDAT holds ``rows`` rows of zeros (default: all of them), deflated at
    level 9 one row at a time (never the whole image in memory)."""
    deflate = zlib.compressobj(9)
    row = bytes(1 + width * channels)  # filter byte 0, then zero samples
    idat = b"".join(deflate.compress(row) for _ in range(height if rows is None else rows))
    idat += deflate.flush()
    return (b"\x89PNG\r\n\x1a\n"
            + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0))
            + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b""))


def jpeg(width: int, height: int, scan: bytes) -> bytes:
    """A baseline gray JPEG: one quantisation table, one-code Huffman tables (DC category 0, AC
    end-of-block: 2 bits per 8x8 block), then ``scan`` as its entropy-coded data."""
    def segment(marker: int, body: bytes) -> bytes:
        return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body

    dqt = segment(0xDB, b"\x00" + bytes([1] * 64))
    sof = segment(0xC0, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")
    one_code = b"\x01" + bytes(15) + b"\x00"  # one code of length 1, for symbol 0
    dht = segment(0xC4, b"\x00" + one_code + b"\x10" + one_code)
    sos = segment(0xDA, b"\x01\x01\x00\x00\x3f\x00")
    return b"\xff\xd8" + dqt + sof + dht + sos + scan + b"\xff\xd9"


def webp_lossless(width: int, height: int) -> bytes:
    """A VP8L header claiming ``width`` x ``height`` and a few bytes of bitstream."""
    bits = (width - 1) | (height - 1) << 14
    body = b"\x2f" + struct.pack("<I", bits) + bytes(8)
    chunk = b"VP8L" + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def gif_screen(width: int, height: int) -> bytes:
    """A GIF whose logical screen is ``width`` x ``height``, holding one 1x1 frame."""
    head = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + bytes(6)  # 2 colours
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    return head + frame + b"\x3b"


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir()
    cases = {
        # the real bomb: 164 KB of deflated zeros, 169 MB of gray samples, 1.8 GB to decode
        "png_13000x13000_gray_zeros.png": png(13000, 13000, 0, 1),
        # headers whose data cannot hold the pixels claimed (the decoder fills them in)
        "jpeg_13000x13000_no_scan_data.jpg": jpeg(13000, 13000, bytes(4)),
        "jpeg_8000x8000_no_scan_data.jpg": jpeg(8000, 8000, bytes(4)),
        "png_8000x8000_rgb_one_row.png": png(8000, 8000, 2, 3, rows=1),
        # formats without a bound on their data: the budget alone refuses them
        "webp_12000x12000_lossless.webp": webp_lossless(12000, 12000),
        "gif_13000x13000_screen_1x1_frame.gif": gif_screen(13000, 13000),
    }
    for name, data in cases.items():
        (OUT / name).write_bytes(data)


if __name__ == "__main__":
    main()
