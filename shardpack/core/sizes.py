"""Sizes and counts as people write and read them: the small helpers every layer shares.

This module imports nothing of shardpack but the error hierarchy, so any layer may use it.
"""

from __future__ import annotations

import re

from shardpack.core.errors import ShardpackError

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


def parse_size(text: str | int) -> int:
    """``"256MB"`` -> 256000000; ``"1GiB"`` -> 1073741824; ints pass through."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
        if not m or m.group(2).lower() not in _UNITS:
            raise ShardpackError(f"cannot read size {text!r}: use a number with an optional unit "
                                 "(B, KB, MB, GB, KiB, MiB, GiB)")
        value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise ShardpackError(f"size must be positive, got {text!r}")
    return value


def plural(n: int, one: str, many: str | None = None) -> str:
    """``plural(1, "shard")`` -> "1 shard"; ``plural(2, "shard")`` -> "2 shards"."""
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def human(n: float) -> str:
    """``human(1234567)`` -> "1.2 MB": a byte count in decimal units, one decimal."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{int(n):,} B"
