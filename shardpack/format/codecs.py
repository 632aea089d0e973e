"""The registry of shard formats: one :class:`~shardpack.format.shardcodec.ShardCodec` instance
each, by name.  Adding a format is one codec module and one entry in :data:`CODECS`
(docs/format.md)."""

from __future__ import annotations

from types import MappingProxyType

from shardpack.core.errors import VersionError

from .msgpackcodec import MsgpackCodec
from .shardcodec import ShardCodec
from .tarcodec import TarCodec

# Order matters: the first is the default and the CLI lists them in this order.
CODECS = MappingProxyType({codec.name: codec for codec in (TarCodec(), MsgpackCodec())})
_BY_CODE = {codec.code: codec for codec in CODECS.values()}
SHARD_FORMATS = tuple(CODECS)
SHARD_SUFFIX = MappingProxyType({name: codec.suffix for name, codec in CODECS.items()})
SHARD_SUFFIXES = tuple(SHARD_SUFFIX.values())
FORMAT_CODES = tuple(_BY_CODE)


def codec_for(shard_format: str) -> ShardCodec:
    """The codec of the shard format named ``shard_format``; :class:`VersionError` for a name
    this release does not know.

    Args:
        shard_format: a manifest's or the CLI's ``shard_format`` (one of :data:`SHARD_FORMATS`).
    """
    codec = CODECS.get(shard_format) if isinstance(shard_format, str) else None
    if codec is None:
        raise VersionError(f"unknown shard format: expected one of {SHARD_FORMATS}, found "
                           f"{shard_format!r}")
    return codec


def codec_by_code(code: int) -> ShardCodec:
    """The codec whose index format code is ``code`` (:data:`FORMAT_CODES`).

    Args:
        code: the index header's format code.
    """
    codec = _BY_CODE.get(code)
    if codec is None:
        raise VersionError(f"unknown shard format code {code}: expected one of "
                           f"{sorted(FORMAT_CODES)}")
    return codec


def shard_name(number: int, shard_format: str) -> str:
    """The file name of shard ``number`` of a dataset in ``shard_format``.

    Args:
        number: the shard's position in the manifest.
        shard_format: one of :data:`SHARD_FORMATS`.
    """
    return codec_for(shard_format).shard_name(number)
