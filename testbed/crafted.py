"""Datasets no pack writes: a one-shard dataset holding exactly the samples given, whatever
their keys and field names, every hash consistent (for the crafted-input tests and the faults
benchmark)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import shardpack
from shardpack import format as fmt


def tar_record(key: str, fields: list) -> tuple[bytes, list[int]]:
    parts, offsets, pos = [], [], 0
    for name, data in fields:
        member = fmt.tar_member_name(key, name)
        try:
            header = fmt.tar_header(member, len(data))
        except UnicodeEncodeError:  # a key that is not UTF-8: its raw bytes in a ustar header
            header = fmt.ustar_block(member.encode("utf-8", "surrogateescape"), len(data), b"0")
        pos += len(header)
        offsets.append(pos)
        pos += len(data) + fmt.tar_padding(len(data))
        parts += [header, data, bytes(fmt.tar_padding(len(data)))]
    return b"".join(parts), offsets


def craft(tmp_path: Path, samples: list, shard_format: str = "tar", name: str = "ds") -> Path:
    """A one-shard dataset holding exactly ``samples`` (``(key, [(field, bytes), ...])``),
    whatever their keys and field names: a real pack's manifest, then the shard, index and
    manifest entry rewritten with every hash matching."""
    src = tmp_path / f"{name}-src"
    src.mkdir()
    (src / "1.bin").write_bytes(b"x")
    listing = tmp_path / f"{name}.csv"
    listing.write_text(f"path,key\n{src}/1.bin,k\n")
    out = tmp_path / name
    shardpack.pack(listing, out, shard_format=shard_format, workers=1)
    names = sorted({n for _, fields in samples for n, _ in fields})
    column = {n: i for i, n in enumerate(names)}
    offsets = np.full((len(samples), len(names)), fmt.MISSING, dtype="<u8")
    sizes = np.zeros((len(samples), len(names)), dtype="<u8")
    shard = bytearray(fmt.msgpack_file_header() if shard_format == "msgpack" else b"")
    starts, raw_sizes, hashes = [], [], []
    for row, (key, fields) in enumerate(samples):
        fields = sorted(fields)
        if shard_format == "tar":
            record, where = tar_record(key, fields)
            raw = len(record)
        else:
            payload, where = fmt.encode_payload(key, fields)
            record, raw = fmt.record_header(payload, len(payload), False) + payload, len(payload)
        for (field, data), off in zip(fields, where, strict=True):
            offsets[row, column[field]], sizes[row, column[field]] = off, len(data)
        starts.append(len(shard))
        raw_sizes.append(raw)
        hashes.append(fmt.sample_hash(record))
        shard += record
    end = len(shard)
    if shard_format == "tar":
        shard += fmt.TAR_END
    shard = bytes(shard)
    index = fmt.encode_index(
        shard_format=shard_format, compression="none", shard_bytes=len(shard),
        shard_hash=bytes.fromhex(fmt.content_hash(shard)), plan_digest=0, skipped=0,
        fields=names, starts=starts + [end], raw_sizes=raw_sizes, sample_hashes=hashes,
        field_offsets=offsets, field_sizes=sizes, keys=[k for k, _ in samples])
    manifest = json.loads((out / fmt.MANIFEST_NAME).read_text())
    entry = manifest["shards"][0]
    (out / entry["name"]).write_bytes(shard)
    (out / entry["index"]).write_bytes(index)
    entry.update(samples=len(samples), bytes=len(shard), hash=fmt.content_hash(shard),
                 index_bytes=len(index), index_hash=fmt.content_hash(index))
    manifest.update(num_samples=len(samples), num_bytes=len(shard), fields=names)
    (out / fmt.MANIFEST_NAME).write_bytes(fmt.encode_manifest(manifest))
    return out
