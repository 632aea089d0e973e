"""MDS and LitData folders written by hand, byte for byte as their writers lay them out, with no
peer library: the hostile conversion inputs (tests/robustness/hostile/make_sources.py), the
converters' source-file tests and the fault benchmark build on them."""

from __future__ import annotations

import json
import struct
from pathlib import Path


# -- MDS ------------------------------------------------------------------------------------------
def mds_shard(rows: list[list[bytes]]) -> bytes:
    """uint32 n | uint32 offsets[n + 1] | samples; every column variable-size."""
    bodies = [b"".join(struct.pack("<I", len(v)) for v in row) + b"".join(row) for row in rows]
    offsets = [4 + 4 * (len(rows) + 1)]
    for body in bodies:
        offsets.append(offsets[-1] + len(body))
    return struct.pack(f"<I{len(offsets)}I", len(rows), *offsets) + b"".join(bodies)


def mds(folder: Path, columns: dict[str, str], rows, *, zstd: bytes | None = None,
        raw_bytes: int | None = None) -> None:
    """An MDS folder with one shard: plain, or ``zstd`` bytes standing for the compressed one."""
    raw = mds_shard(rows)
    folder.mkdir(parents=True)
    entry = {"column_encodings": list(columns.values()), "column_names": list(columns),
             "column_sizes": [None] * len(columns), "compression": None, "format": "mds",
             "hashes": [], "raw_data": {"basename": "shard.00000.mds",
                                        "bytes": len(raw) if raw_bytes is None else raw_bytes},
             "samples": len(rows), "size_limit": 1 << 26, "version": 2, "zip_data": None}
    if zstd is None:
        (folder / "shard.00000.mds").write_bytes(raw)
    else:
        (folder / "shard.00000.mds.zstd").write_bytes(zstd)
        entry.update(compression="zstd",
                     zip_data={"basename": "shard.00000.mds.zstd", "bytes": len(zstd)})
    (folder / "index.json").write_text(json.dumps({"shards": [entry], "version": 2}, indent=1))


# -- LitData --------------------------------------------------------------------------------------
LEAF = {"type": None, "context": None, "children_spec": []}


def spec(names: list[str]) -> str:
    """The data_spec torch writes for a flat dict sample."""
    return json.dumps([1, {"type": "builtins.dict", "context": json.dumps(names),
                           "children_spec": [LEAF] * len(names)}])


def litdata(folder: Path, formats: list[str], items: list[list[bytes]] | None,
            data_spec: object) -> None:
    """A LitData folder with one uncompressed chunk of ``items`` (None: index.json only)."""
    folder.mkdir(parents=True)
    chunks = []
    if items is not None:
        bodies = [b"".join(struct.pack("<I", len(v)) for v in it) + b"".join(it) for it in items]
        offsets = [4 + 4 * (len(items) + 1)]
        for body in bodies:
            offsets.append(offsets[-1] + len(body))
        chunk = struct.pack(f"<I{len(offsets)}I", len(items), *offsets) + b"".join(bodies)
        (folder / "chunk-0-0.bin").write_bytes(chunk)
        chunks.append({"chunk_bytes": len(chunk), "chunk_size": len(items), "dim": None,
                       "filename": "chunk-0-0.bin"})
    config = {"chunk_bytes": 1 << 26, "chunk_size": None, "compression": None,
              "data_format": formats, "data_spec": data_spec, "encryption": None,
              "item_loader": "PyTreeLoader"}
    (folder / "index.json").write_text(json.dumps({"chunks": chunks, "config": config,
                                                   "updated_at": "0"}, indent=1))
