"""The peers' own writers (webdataset's ShardWriter, MosaicML streaming's MDSWriter, LitData's
optimize) over an ImageFolder tree: the pack suite's contenders, and how the convert and peers
suites make their inputs. Each runs in the interpreter of the venv that has the peer
(``python -m benchmarks.child benchmarks.suites.writers:peer_main ...``); standard library at
the top, the peer imported inside.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import time
import types

from benchmarks.common import list_tree, split_key

SHARD_BYTES = 256 * 10**6


def _single_ext(items) -> str:
    exts = {split_key(rel)[1] for rel, _ in items}
    if len(exts) != 1:
        raise SystemExit(f"expected one file extension in the tree, found {sorted(exts)}")
    return exts.pop()


def peer_webdataset(src, out, items, shard_bytes=SHARD_BYTES) -> float:
    """webdataset's ShardWriter: key = relative path without extension, field = extension,
    ``cls`` = class index as ASCII decimal; shards cut by size only. Returns its start time."""
    import webdataset as wds
    t0 = time.perf_counter()
    # maxcount huge: shards are cut by size only, like the other contenders
    with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxsize=shard_bytes,
                         maxcount=10**12, verbose=0) as sink:
        for rel, ci in items:
            key, ext = split_key(rel)
            with open(os.path.join(src, rel), "rb") as f:
                sink.write({"__key__": key, ext: f.read(), "cls": str(ci).encode()})
    return t0


def mds_writer_class():
    """streaming/__init__.py imports streaming.vision, hence torchvision, which is absent (or
    broken beside the CPU torch wheel); the writer needs neither. Register a bare `streaming`
    package object so that importing streaming.base skips that __init__."""
    spec = importlib.util.find_spec("streaming")
    pkg = types.ModuleType("streaming")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["streaming"] = pkg
    from streaming.base import MDSWriter
    return MDSWriter


def peer_mds(src, out, items, shard_bytes=SHARD_BYTES) -> float:
    """MDSWriter(columns key str, EXT bytes, cls int; no compression). Returns its start time."""
    writer_cls = mds_writer_class()
    ext = _single_ext(items)
    t0 = time.perf_counter()
    with writer_cls(out=out, columns={"key": "str", ext: "bytes", "cls": "int"},
                    compression=None, hashes=None, size_limit=shard_bytes) as sink:
        for rel, ci in items:
            with open(os.path.join(src, rel), "rb") as f:
                sink.write({"key": split_key(rel)[0], ext: f.read(), "cls": ci})
    return t0


def litdata_sample(src, item) -> dict:
    """LitData's ``fn``: one file as {key, EXT: bytes, cls}."""
    rel, ci = item
    key, ext = split_key(rel)
    with open(os.path.join(src, rel), "rb") as f:
        return {"key": key, ext: f.read(), "cls": ci}


def peer_litdata(src, out, items, shard_bytes=SHARD_BYTES) -> float:
    """LitData's optimize with 2 workers, chunks of the shard size. Returns its start time."""
    from litdata import optimize
    _single_ext(items)
    t0 = time.perf_counter()
    optimize(fn=functools.partial(litdata_sample, src), inputs=items, output_dir=out,
             chunk_bytes=f"{shard_bytes // 10**6}MB", num_workers=2)
    return t0


WRITERS = {"webdataset": peer_webdataset, "mds": peer_mds, "litdata": peer_litdata}


def peer_main(name: str, src: str, out: str, shard_bytes: int = SHARD_BYTES) -> dict:
    """Write the tree ``src`` into ``out`` with peer ``name``. ``inner_s`` is the time after the
    imports (listing + reading + writing); the process's wall time also counts its start."""
    t_list = time.perf_counter()
    items = list_tree(src)
    t_list = time.perf_counter() - t_list
    t0 = WRITERS[name](src, out, items, shard_bytes)
    return {"inner_s": time.perf_counter() - t0 + t_list}
