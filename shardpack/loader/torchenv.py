"""The one place that imports torch.

Everything torch-related in shardpack imports from here, so the packer and the CLI never pay for
importing torch.  Where a pipeline runs (rank, worker, thread or process) is
:mod:`shardpack.loader.runtime`'s.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

__all__ = ["DataLoader", "IterableDataset", "dist", "get_worker_info", "torch"]
