"""shardpack: pack small files into large indexed shards and stream them into PyTorch training."""

__version__ = "0.1.0"

from .errors import (  # noqa: E402
    DatasetNotFoundError,
    FormatError,
    IntegrityError,
    PackError,
    ShardpackError,
    SourceError,
    UnsafePathError,
    VersionError,
)
from .pack import PackSummary, pack  # noqa: E402
from .reader import DatasetReader, open_reader  # noqa: E402

__all__ = [
    "DatasetNotFoundError",
    "DatasetReader",
    "FormatError",
    "IntegrityError",
    "PackError",
    "PackSummary",
    "ShardpackError",
    "SourceError",
    "UnsafePathError",
    "VersionError",
    "__version__",
    "open_reader",
    "pack",
]
