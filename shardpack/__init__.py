"""shardpack: pack small files into large indexed shards and stream them into PyTorch training."""

from shardpack.core.version import __version__
from shardpack.core.errors import (
    BrokenImageError,
    CacheError,
    DatasetNotFoundError,
    DecodeError,
    DeviceError,
    FormatError,
    IntegrityError,
    PackError,
    RemoteError,
    ShardpackError,
    SourceError,
    UnsafePathError,
    VersionError,
)
from shardpack.interop.convert import convert
from shardpack.interop.export import ExportSummary, export  # pyarrow is loaded only for Parquet
from shardpack.write.merge import MergeSummary, merge
from shardpack.read.mix import Source
from shardpack.write.pack import PackSummary, pack
from shardpack.read.reader import DatasetReader, open_reader
from shardpack.order.spec import Order
from shardpack.transforms.spec import TransformSpec
from shardpack.write.options import PackOptions

_TORCH_API = {"CpuDecode": "transforms.decode", "Decode": "transforms.operation",
              "DeviceLoader": "transforms.device",
              "Batch": "loader.batches", "ShardDataset": "loader.dataset",
              "MapDataset": "loader.dataset", "open_dataset": "loader.dataset",
              "BytesBatch": "loader.batches", "Keys": "loader.batches",
              "collate": "loader.batches", "pack_bytes": "loader.batches",
              "ShardNode": "loader.node"}


def __getattr__(name):
    """The torch-based API loads on first use, so `shardpack pack` never imports torch."""
    if name in _TORCH_API:
        import importlib

        return getattr(importlib.import_module(f".{_TORCH_API[name]}", __name__), name)
    raise AttributeError(f"module 'shardpack' has no attribute {name!r}")

__all__ = [
    "Batch",
    "BrokenImageError",
    "BytesBatch",
    "CacheError",
    "CpuDecode",
    "DatasetNotFoundError",
    "DatasetReader",
    "Decode",
    "DecodeError",
    "DeviceError",
    "DeviceLoader",
    "ExportSummary",
    "FormatError",
    "IntegrityError",
    "Keys",
    "MapDataset",
    "MergeSummary",
    "Order",
    "PackOptions",
    "PackError",
    "PackSummary",
    "RemoteError",
    "ShardDataset",
    "ShardNode",
    "ShardpackError",
    "Source",
    "SourceError",
    "TransformSpec",
    "UnsafePathError",
    "VersionError",
    "__version__",
    "collate",
    "convert",
    "export",
    "merge",
    "open_dataset",
    "open_reader",
    "pack",
    "pack_bytes",
]
