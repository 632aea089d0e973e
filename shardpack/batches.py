"""Samples -> batches: ship a batch's bytes as ONE uint8 tensor plus offsets.

DataLoader workers hand batches to the main process by pickling them; tensors travel through
shared memory instead.  A list of 256 ``bytes`` objects is 256 pickled strings; one tensor is one
shared-memory segment.  ``collate`` turns every bytes field into a :class:`BytesBatch`, ``cls``
into an int64 tensor, ``__index__`` and ``__repeat__`` into tensors and keeps keys as a list.
A bytes field that some samples of the batch lack collates as an empty item for them.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from .torchenv import torch

LABEL_FIELDS = ("cls",)


class BytesBatch(NamedTuple):
    """Variable-length byte strings in one tensor: item ``i`` is
    ``data[offsets[i]:offsets[i + 1]]``."""

    data: "torch.Tensor"     # uint8 [total bytes]
    offsets: "torch.Tensor"  # int64 [n + 1]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def item(self, i: int) -> bytes:
        return self.data[int(self.offsets[i]):int(self.offsets[i + 1])].numpy().tobytes()

    def items(self) -> list[bytes]:
        data, offsets = self.data.numpy(), self.offsets.tolist()
        return [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)]


def pack_bytes(items: Sequence[bytes]) -> BytesBatch:
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in items], out=offsets[1:])
    joined = b"".join(items)
    data = torch.frombuffer(bytearray(joined), dtype=torch.uint8) if joined else \
        torch.empty(0, dtype=torch.uint8)
    return BytesBatch(data, torch.from_numpy(offsets))


def collate(batch: Sequence[dict]) -> dict:
    """Collate sample dicts from :class:`~shardpack.ShardDataset` (fields as bytes)."""
    if not batch:
        return {}
    out: dict = {}
    names = dict.fromkeys(name for sample in batch for name in sample)  # union, in order
    for name in names:
        values = [sample.get(name) for sample in batch]
        if any(v is None for v in values):
            if not all(isinstance(v, (bytes, type(None))) for v in values):
                raise ValueError(f"field {name!r} is missing from some samples of the batch; "
                                 "only bytes fields may be absent (they collate as b'')")
            values = [b"" if v is None else v for v in values]
        if name == "__key__":
            out[name] = values
        elif name in LABEL_FIELDS and isinstance(values[0], (bytes, bytearray)):
            out[name] = torch.tensor([int(v) for v in values], dtype=torch.int64)
        elif isinstance(values[0], (bytes, bytearray, memoryview)):
            out[name] = pack_bytes(values)
        elif isinstance(values[0], bool):
            out[name] = torch.tensor(values, dtype=torch.bool)
        elif isinstance(values[0], int):
            out[name] = torch.tensor(values, dtype=torch.int64)
        else:
            out[name] = torch.utils.data.default_collate(values)
    return out
