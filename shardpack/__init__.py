"""shardpack: pack small files into large indexed shards and stream them into PyTorch training."""

__version__ = "0.1.0"

from .errors import (  # noqa: E402
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
from .convert import convert  # noqa: E402
from .export import ExportSummary, export  # noqa: E402  (pyarrow is loaded only for Parquet)
from .merge import MergeSummary, merge  # noqa: E402
from .mix import Source  # noqa: E402
from .pack import PackSummary, pack  # noqa: E402
from .reader import DatasetReader, open_reader  # noqa: E402

_TORCH_API = {"CpuDecode": "decode", "DeviceLoader": "device", "Batch": "batches",
              "ShardDataset": "dataset", "MapDataset": "dataset", "open_dataset": "dataset",
              "BytesBatch": "batches", "Keys": "batches", "collate": "batches",
              "pack_bytes": "batches"}


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
    "DecodeError",
    "DeviceError",
    "DeviceLoader",
    "ExportSummary",
    "FormatError",
    "IntegrityError",
    "Keys",
    "MapDataset",
    "MergeSummary",
    "PackError",
    "PackSummary",
    "RemoteError",
    "ShardDataset",
    "ShardpackError",
    "Source",
    "SourceError",
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
