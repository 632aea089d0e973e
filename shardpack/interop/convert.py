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

import dataclasses
import importlib
import json
import os

from shardpack import format as fmt
from shardpack.core.errors import DatasetNotFoundError, RemoteError, ShardpackError, SourceError
from shardpack.storage import Storage
from shardpack.write.options import PackOptions, takes_options
from shardpack.write.pack import PackSummary, pack_files, pack_source

CONTAINER_FORMATS = {  # --from name -> (module, class) under shardpack.interop.sources
    "webdataset": ("webdataset", "WebDatasetSource"),
    "mds": ("mds", "MDSSource"),
    "litdata": ("litdata", "LitDataSource"),
    "parquet": ("parquet", "ParquetSource"),
}
PACK_FORMATS = ("imagefolder", "csv", "jsonl")  # packed by the file walk (``pack``)
FORMATS = tuple(CONTAINER_FORMATS) + PACK_FORMATS
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
LABELLED = ("parquet", "csv", "jsonl")  # sources whose label column --label-column names
FILE_FORMATS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl"}


def source_class(name: str):
    """The source class that reads the container format ``name`` (imported on first use: each
    needs its own optional libraries).

    Args:
        name: a key of :data:`CONTAINER_FORMATS`.
    """
    module, cls = CONTAINER_FORMATS[name]
    return getattr(importlib.import_module(f"shardpack.interop.sources.{module}"), cls)


def detect_format(src, storage_options: dict | None = None) -> str:
    """The ``--from`` format of ``src``, or a :class:`SourceError` saying why it is ambiguous.

    Args:
        src: the source's path or URL.
        storage_options: fsspec options for a remote ``src``.
    """
    src = os.fspath(src)
    lowered = src.rstrip("/").lower()
    if lowered.endswith(TAR_SUFFIXES):
        return "webdataset"
    for suffix, name in FILE_FORMATS.items():
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
    return _folder_format(storage, src)


def _folder_format(storage: Storage, src: str) -> str:
    """The format of a folder without index.json, from what it holds."""
    names = storage.listdir()
    if not names and not storage.exists():
        raise SourceError("source does not exist", path=src)
    tars = [n for n in names if n.endswith(TAR_SUFFIXES)]
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
    if visible and storage.every_folder(visible):
        return "imagefolder"
    raise SourceError("cannot tell the source format", path=src,
                      hint=f"pass --from, one of {', '.join(FORMATS)}")


def _has_parquet_below(storage: Storage, depth: int = 3, peek: int = 64) -> bool:
    """Parquet files in sub-folders, at most ``depth`` levels down.  Locally only the first
    ``peek`` entries of each folder are looked at, so an ImageFolder tree of a million images is
    not walked just to tell it from a Hugging Face ``data/train-*.parquet`` layout."""
    return storage.has_file_below(".parquet", depth, peek)


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


@takes_options("convert")
def convert(src, out, *, from_: str = "auto", allow_pickle: bool = False,
            options: PackOptions, executor=None,
            storage_options: dict | None = None) -> PackSummary:
    """Convert a dataset in another format into a shardpack dataset at ``out``.

    Takes the options of :func:`shardpack.pack` but the file walk's (``layout``, ``group``,
    ``allow_empty_classes``, ``part``) as keywords (each a field of
    :class:`~shardpack.write.options.PackOptions`; the old ``format=`` and ``skip_bad=`` still
    work, with a DeprecationWarning), or all at once as ``options=PackOptions(...)``.

    Args:
        src: the source's path or URL.
        out: the dataset's folder or URL.
        from_: the source's format, one of :data:`FORMATS`, or ``"auto"``
            (:func:`detect_format`).
        allow_pickle: accept pickle-encoded columns (MDS ``pkl``, LitData's pickle serializer),
            refused by default: unpickling runs code from the file.
        options: the pack options (given as keywords, or as ``options=``).
        executor: any ``concurrent.futures.Executor``; overrides ``engine``.
        storage_options: fsspec options for both ``src`` and ``out``.

    Returns:
        A :class:`~shardpack.write.summary.PackSummary`.
    """
    src = os.fspath(src)
    _refuse_shardpack_source(src, storage_options)
    name = detect_format(src, storage_options) if from_ in (None, "auto") else from_
    if name not in FORMATS:
        raise SourceError(f"unknown --from format {name!r}: expected one of {FORMATS}")
    label_column = options.label_column
    if label_column is not None and name not in LABELLED:
        raise SourceError(f"--label-column is only for Parquet, CSV and JSONL sources (this "
                          f"source is {name})", path=src)
    if name in PACK_FORMATS:
        if name == "imagefolder":
            if not os.path.isdir(src):
                raise SourceError("an ImageFolder source must be a local folder", path=src)
            options = dataclasses.replace(options, layout="imagefolder")
        elif not src.endswith(f".{name}"):
            raise SourceError(f"--from {name} needs a .{name} listing file", path=src)
        return pack_files(src, out, options, executor=executor, storage_options=storage_options)
    options = dataclasses.replace(options, layout=name)
    extra = {"label_column": label_column} if label_column is not None else {}
    source = source_class(name)(src, storage_options=storage_options, skip_bad=options.skip_bad,
                                allow_pickle=allow_pickle, follow_links=options.follow_links,
                                **extra)
    # --follow-links decides which files are read: recorded as pack records it (absent when off)
    origin = {"source": source.origin, "from": name, "allow_pickle": allow_pickle, **extra,
              **({"follow_links": True} if options.follow_links else {})}
    return pack_source(source, out, options, origin=origin, executor=executor,
                       storage_options=storage_options, source_options=storage_options)
