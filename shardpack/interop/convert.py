"""Other tools' datasets -> a shardpack dataset: ``shardpack convert SRC OUT --from FORMAT``.

A conversion is a pack whose samples come from a reader of another format
(:mod:`shardpack.sources`) instead of a file walk: same planner, same shard writer, same options,
same atomic publish and ``--resume``.  Sources are read through the storage layer, so SRC may be a
local path or any fsspec URL (``s3://``, ``https://``); ImageFolder, CSV and JSONL sources are
local file trees and go through ``pack`` itself.

Format detection (``--from auto``), documented in docs/convert.md:

* a file: ``.tar``/``.tar.gz``/``.tgz`` -> webdataset, ``.parquet`` -> parquet, ``.csv`` -> csv,
  ``.jsonl`` -> jsonl;
* a folder with ``index.json``: MDS when its shards say ``"format": "mds"``, LitData when it has
  ``chunks`` and ``config``;
* a folder of tar files -> webdataset; of parquet files, or with parquet files up to 3 folders
  down (Hugging Face ``data/train-*.parquet``) -> parquet (tar and parquet: ambiguous, an error);
* a local folder holding only sub-folders -> imagefolder.
"""

from __future__ import annotations

import importlib
import json
import os

from shardpack import format as fmt
from shardpack.core.errors import DatasetNotFoundError, RemoteError, ShardpackError, SourceError
from shardpack.write.pack import PackSummary, make_options, pack, pack_source
from shardpack.storage import Storage

CONTAINER_FORMATS = {  # --from name -> (module, class) under shardpack.interop.sources
    "webdataset": ("webdataset", "WebDatasetSource"),
    "mds": ("mds", "MDSSource"),
    "litdata": ("litdata", "LitDataSource"),
    "parquet": ("parquet", "ParquetSource"),
}
PACK_FORMATS = ("imagefolder", "csv", "jsonl")
FORMATS = tuple(CONTAINER_FORMATS) + PACK_FORMATS


def source_class(name: str):
    module, cls = CONTAINER_FORMATS[name]
    return getattr(importlib.import_module(f"shardpack.interop.sources.{module}"), cls)


def detect_format(src, storage_options: dict | None = None) -> str:
    """The ``--from`` format of ``src``, or a :class:`SourceError` saying why it is ambiguous."""
    src = os.fspath(src)
    lowered = src.rstrip("/").lower()
    if lowered.endswith((".tar", ".tar.gz", ".tgz")):
        return "webdataset"
    for suffix, name in ((".parquet", "parquet"), (".csv", "csv"), (".jsonl", "jsonl")):
        if lowered.endswith(suffix):
            return name
    storage = Storage(src, storage_options)
    try:  # MDS / LitData first: their index.json needs no folder listing (plain HTTP has none)
        index = storage.read_bytes("index.json")
    except (DatasetNotFoundError, RemoteError, OSError):
        index = None
    if index is not None:
        found = _index_kind(index)
        if found:
            return found
        raise SourceError("index.json is neither an MDS nor a LitData index",
                          path=storage.display("index.json"), hint="pass --from")
    names = storage.listdir()
    if not names and not storage.exists():
        raise SourceError("source does not exist", path=src)
    tars = [n for n in names if n.endswith((".tar", ".tar.gz", ".tgz"))]
    parquets = [n for n in names if n.endswith(".parquet")]
    if tars and parquets:
        raise SourceError("source holds both tar and parquet files: cannot tell the format",
                          path=src, hint="pass --from webdataset or --from parquet")
    if tars:
        return "webdataset"
    if parquets:
        return "parquet"
    visible = [n for n in names if not n.startswith(".")]
    if _has_parquet_below(storage):  # Hugging Face layouts: data/train-0000-of-0001.parquet
        return "parquet"
    if storage.local and visible and all(os.path.isdir(storage.path(n)) for n in visible):
        return "imagefolder"
    raise SourceError("cannot tell the source format", path=src,
                      hint=f"pass --from, one of {', '.join(FORMATS)}")


def _has_parquet_below(storage: Storage, depth: int = 3, peek: int = 64) -> bool:
    """Parquet files in sub-folders, at most ``depth`` levels down.  Locally only the first
    ``peek`` entries of each folder are looked at, so an ImageFolder tree of a million images is
    not walked just to tell it from a Hugging Face ``data/train-*.parquet`` layout."""
    if not storage.local:
        try:
            found = storage.fs.find(storage.root, maxdepth=depth)
        except (OSError, ValueError):
            return False
        return any(p.endswith(".parquet") and "/." not in p for p in found)

    def look(folder: str, level: int) -> bool:
        try:
            with os.scandir(folder) as it:
                for n, entry in enumerate(it):
                    if n >= peek:
                        return False
                    if entry.name.startswith("."):
                        continue
                    if entry.name.endswith(".parquet"):
                        return True
                    if level < depth and entry.is_dir() and look(entry.path, level + 1):
                        return True
        except OSError:
            return False
        return False

    return look(storage.root, 1)


def _refuse_shardpack_source(src: str, storage_options: dict | None) -> None:
    """A shardpack dataset is not a source: its tar shards would be read as plain WebDataset
    tars, without the index hashes every shardpack reader checks (docs/convert.md)."""
    storage = Storage(src, storage_options)
    try:
        is_dataset = storage.exists(fmt.MANIFEST_NAME)
    except (ShardpackError, OSError):
        return
    if is_dataset:
        raise SourceError("source is already a shardpack dataset", path=src,
                          hint="open it with shardpack.ShardDataset; to change its shard "
                               "options, 'shardpack export --to files' it and pack the result")


def _index_kind(data: bytes) -> str | None:
    try:
        index = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(index, dict):
        return None
    shards = index.get("shards")
    if isinstance(shards, list) and shards and isinstance(shards[0], dict) \
            and shards[0].get("format") == "mds":
        return "mds"
    if "chunks" in index and "config" in index:
        return "litdata"
    return None


def convert(src, out, *, from_: str = "auto", allow_pickle: bool = False,
            label_column: str | None = None, format: str = "tar", shard_size="256MB",
            max_samples: int | None = None, compression: str = "none", zstd_level: int = 3,
            resize: int | None = None, quality: int = 90, skip_bad: bool = False,
            check: str = "quick", workers: int | None = None, resume: bool = False,
            overwrite: bool = False, executor=None, engine: str = "local",
            address: str | None = None, progress: bool = False,
            storage_options: dict | None = None) -> PackSummary:
    """Convert a dataset in another format (``from_``: one of :data:`FORMATS`, or ``"auto"``)
    into a shardpack dataset at ``out``; the options are those of :func:`shardpack.pack`.

    ``storage_options`` apply to both SRC and OUT.  Pickle-encoded columns (MDS ``pkl``,
    LitData's pickle serializer) are refused unless ``allow_pickle``: unpickling runs code from
    the file.  ``label_column`` (Parquet sources only) names a column that becomes the class
    label field ``cls`` (docs/convert.md)."""
    src = os.fspath(src)
    _refuse_shardpack_source(src, storage_options)
    name = detect_format(src, storage_options) if from_ in (None, "auto") else from_
    if name not in FORMATS:
        raise SourceError(f"unknown --from format {name!r}: expected one of {FORMATS}")
    if label_column is not None and name != "parquet":
        raise SourceError(f"--label-column is only for Parquet sources (this source is {name})",
                          path=src)
    common = dict(format=format, shard_size=shard_size, max_samples=max_samples,
                  compression=compression, zstd_level=zstd_level, resize=resize,
                  quality=quality, skip_bad=skip_bad, check=check, workers=workers,
                  resume=resume, overwrite=overwrite, executor=executor, engine=engine,
                  address=address, progress=progress, storage_options=storage_options)
    if name in PACK_FORMATS:
        if name == "imagefolder":
            if not os.path.isdir(src):
                raise SourceError("an ImageFolder source must be a local folder", path=src)
            return pack(src, out, layout="imagefolder", **common)
        if not src.endswith(f".{name}"):
            raise SourceError(f"--from {name} needs a .{name} listing file", path=src)
        return pack(src, out, **common)
    options = make_options(format=format, shard_size=shard_size, max_samples=max_samples,
                           compression=compression, zstd_level=zstd_level, resize=resize,
                           quality=quality, skip_bad=skip_bad, layout=name, check=check)
    extra = {"label_column": label_column} if label_column is not None else {}
    source = source_class(name)(src, storage_options=storage_options, skip_bad=skip_bad,
                                allow_pickle=allow_pickle, **extra)
    origin = {"source": os.path.abspath(src) if source.storage.local else src, "from": name,
              "allow_pickle": allow_pickle, **extra}
    return pack_source(source, out, options, origin=origin, workers=workers, resume=resume,
                       overwrite=overwrite, executor=executor, engine=engine, address=address,
                       progress=progress, storage_options=storage_options,
                       source_options=storage_options)
