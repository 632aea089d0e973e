"""The manifest (``shardpack.json``), the commit point of a pack: deterministic JSON out, and in,
a checked, typed, read-only :class:`Manifest` (docs/format.md, "Manifest").  The checks are in
:mod:`shardpack.format.manifest_checks`."""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from functools import cached_property
from types import MappingProxyType
from typing import Mapping

from shardpack.core.errors import FormatError

from .hashing import content_hash
from .manifest_checks import SHARD_KEYS, check_manifest, parse_manifest

# The most a manifest may be: room for 10^6 shard entries (10^9 samples at 1,000 samples a shard)
# of at most 256 bytes each (a 12-digit shard size and a 6-digit shard number encode to 247), and
# 32 MiB for everything else (classes, fields, notes).  docs/format.md, "Manifest".
MANIFEST_CAP = 10**6 * 256 + (32 << 20)


def encode_manifest(manifest: dict) -> bytes:
    """Deterministic JSON: sorted keys, no timestamps, so two packs of one tree are identical.

    Args:
        manifest: the manifest as a JSON object.
    """
    return (json.dumps(manifest, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()


@dataclass(frozen=True, slots=True)
class ShardEntry:
    """One ``shards`` entry of a decoded manifest (docs/format.md): shard N's file names, its
    sample count, and the size and xxh3-128 of the shard and of its index."""
    name: str
    index: str
    samples: int
    bytes: int
    hash: str
    index_bytes: int
    index_hash: str

    @classmethod
    def from_dict(cls, entry: dict) -> ShardEntry:
        """The entry of a (checked) ``shards`` object.

        Args:
            entry: the JSON object, with every key of :data:`SHARD_KEYS`.
        """
        return cls(*_shard_values(entry))

    def to_dict(self) -> dict:
        """The entry as its JSON object."""
        return {k: getattr(self, k) for k in SHARD_KEYS}


_shard_values = operator.itemgetter(*SHARD_KEYS)
_index_hash = operator.attrgetter("index_hash")


@dataclass(frozen=True, slots=True)
class Part:
    """``pack --part I/N``: the manifest's ``part`` record."""
    index: int
    count: int


def _freeze(value):
    """JSON values made read-only: lists to tuples, objects to read-only mappings."""
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def thaw(value):
    """The JSON value of a manifest attribute: the inverse of the read-only forms (tuples to
    lists, mappings to dicts, :class:`Part` and :class:`ShardEntry` to objects).

    Args:
        value: a manifest attribute's value.
    """
    if isinstance(value, (ShardEntry, Part)):
        return {k: getattr(value, k) for k in value.__slots__}
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class Manifest:
    """A decoded, checked manifest (docs/format.md): every key pack, merge and convert write, as
    read-only values (lists as tuples, objects as read-only mappings).  An optional key the
    file lacks is None.  ``raw`` is the decoded JSON as read, for keys a newer release may add
    and for tools that print it; :meth:`to_dict` gives the JSON of the typed values."""
    format: str
    version: int
    shard_format: str
    compression: str
    hash: str
    fields: tuple[str, ...]
    shards: tuple[ShardEntry, ...]
    num_samples: int | None = None
    num_shards: int | None = None
    num_bytes: int | None = None
    classes: tuple[str, ...] | None = None
    layout: str | None = None
    skipped: Mapping[str, int] | None = None  # reason -> count, read-only
    hidden: int | None = None
    group: str | None = None
    ignored: int | None = None
    preprocessing: Mapping[str, int | str] | None = None
    part: Part | None = None
    merged_from: int | None = None
    source: Mapping | None = None
    skip_report: Mapping | None = None  # {"name": SKIPS_NAME, "entries": N, "bytes": B}
    raw: dict = dataclass_field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, manifest: dict, path: str | None = None) -> Manifest:
        """Check ``manifest`` as :func:`decode_manifest` does, and type it; raises
        :class:`FormatError` or :class:`VersionError`.

        Args:
            manifest: a decoded JSON object.
            path: the manifest file, for errors.
        """
        check_manifest(manifest, path)
        try:
            return cls._typed(manifest)
        except RecursionError:  # a 'source' or 'preprocessing' nested past the stack
            raise FormatError("manifest is nested too deeply", path=path) from None

    @classmethod
    def _typed(cls, manifest: dict, shards: tuple | None = None) -> Manifest:
        """A checked manifest object, typed (``shards``: its entries, already typed)."""
        part = manifest.get("part")
        values = {k: _freeze(manifest.get(k)) for k in _MANIFEST_KEYS}
        if shards is None:
            shards = tuple(ShardEntry(*_shard_values(s)) for s in manifest["shards"])
        values.update(shards=shards,
                      part=Part(part["index"], part["count"]) if part is not None else None)
        return cls(**values, raw=manifest)

    def __reduce__(self):
        # read-only mappings do not pickle: a reader travels to DataLoader workers as its JSON,
        # but with the ShardEntry tuple itself, which the reader and its access mode share (one
        # copy in the pickle and in the worker)
        raw = self.to_dict()
        raw.pop("shards", None)
        return (_typed_manifest_with, (raw, self.shards))

    @cached_property
    def identity(self) -> str:
        """The dataset's identity, as resume states record it (docs/reading.md, "Resume"): the
        xxh3-128 (hex) of its shards' index hashes in shard order, one a line.  An index hash
        covers its shard's samples (keys, sizes, hashes) in their order, so the same samples
        packed into other shards (or another order) have another identity, and a pack repeated
        byte for byte the same one; it is read from the manifest alone, no index fetched."""
        return content_hash("\n".join(map(_index_hash, self.shards)).encode())

    def to_dict(self) -> dict:
        """The manifest as a JSON object: ``raw``'s keys (unknown ones included, their values
        shared with ``raw``), each typed key from its attribute; an optional key the file
        lacked stays out while it is None."""
        out = dict(self.raw)
        for key in _MANIFEST_KEYS + ("shards", "part"):
            value = getattr(self, key)
            if value is not None or key in self.raw:
                out[key] = thaw(value)
        return out


def _typed_manifest_with(manifest: dict, shards: tuple) -> Manifest:
    return Manifest._typed(manifest, shards)


_MANIFEST_KEYS = ("format", "version", "shard_format", "compression", "hash", "fields",
                  "num_samples", "num_shards", "num_bytes", "classes", "layout", "skipped",
                  "hidden", "group", "ignored", "preprocessing", "merged_from", "source",
                  "skip_report")


def decode_manifest(data: bytes, path: str | None = None) -> Manifest:
    """The manifest file's bytes, parsed and checked: a :class:`Manifest`.

    Args:
        data: the file's bytes.
        path: the manifest file, for errors.
    """
    return Manifest.from_dict(parse_manifest(data, path), path)
