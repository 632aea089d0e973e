"""Samples -> batches: ship a batch's bytes as ONE uint8 tensor plus offsets.

DataLoader workers hand batches to the main process by pickling them; tensors travel through
shared memory instead.  A list of 256 ``bytes`` objects is 256 pickled strings; one tensor is one
shared-memory segment.  ``collate`` turns every bytes field into a :class:`BytesBatch`, ``cls``
into an int64 tensor, ``__index__`` and ``__repeat__`` into tensors and keys into :class:`Keys`.
A bytes field that some samples of the batch lack collates as an empty item for them.

This module is the transport; how a batch's bytes are read is shardpack/loader/gather.py.

NOTE [batch transport and slots]:
* Who creates: ``ShardDataset`` makes one :class:`~shardpack.loader.buffers.SlotPool` in the
training
  process, before the DataLoader starts its workers (forked workers inherit the mapping; spawned
  ones get none and take the plain path).
* Who leases: a worker, while it fills a batch (:meth:`Batch.buffer`): a field of SLOT_MIN bytes
  or more takes a free slot (``SlotPool.lease``); none free, or a field larger than a slot, gets
  a fresh tensor (shared memory when over INLINE_LIMIT) instead, never a wait.
* Who pickles: the DataLoader's queue pickles the batch in the worker (``Batch.__reduce__``): a
  leased tensor goes as (pool token, slot, size, generation), everything else as usual.
* Who frees: the training process rebuilds a leased tensor as a view of its own mapping
  (``SlotPool.receive``); the slot is released when the last view of it dies, or by the worker
  if the batch was never sent (a lease it did not hand over).
* What it relies on: fork (the pool is inherited, not pickled), the pool's lock (an unlinked
  semaphore) and the per-slot generation, so a slot reused after a dead worker is refused by
  generation rather than read as another batch's bytes.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from shardpack.loader.torchenv import torch

LABEL_FIELDS = ("cls",)
INLINE_LIMIT = 1 << 20  # tensors under 1 MB travel inside the pickle when no slot is leased
# tensors from this size on go into a reusable slot (shardpack.loader.buffers)
SLOT_MIN = 64 << 10
INT64 = (-(1 << 63), (1 << 63) - 1)


def label_value(raw) -> int:
    """A label field's bytes as the int64 a batch holds (what ``int()`` accepts: ``b"7"``,
    ``b"-1"``, ``b" 7\\n"``); ValueError saying why otherwise, also for a number outside
    int64, which no tensor holds."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):  # (bytes(n) of an int: n zeros)
        raise ValueError(f"a value of type {type(raw).__name__}, not the bytes of an integer "
                         "label")
    try:
        value = int(bytes(raw))
    except ValueError:  # (also past Python's 4,300 digits: never an int64)
        raise ValueError("not an integer label") from None
    if not INT64[0] <= value <= INT64[1]:
        raise ValueError("a number outside int64, which no tensor holds")
    return value


def check_labels(sample: dict, reader, shard: int, row: int) -> None:
    """Parse a sample's label fields as collate will: a bad one is this sample's FormatError
    (skippable with ``on_error="skip"``), not the whole batch's.

    Args:
        sample: the sample as read (fields as bytes).
        reader: the reader it came from (the error names its shard and offset).
        shard: the sample's shard.
        row: its row in the shard.
    """
    from shardpack.core.errors import FormatError

    for name in LABEL_FIELDS:
        value = sample.get(name)
        if value is None:
            continue
        try:
            label_value(value)  # collate's own parse: an integer within int64
        except ValueError as exc:
            raise FormatError(f"field {name!r} holds {bytes(value)[:40]!r}, {exc}",
                              path=reader.shard_path(shard), key=sample["__key__"],
                              offset=reader.index(shard).span(row)[0]) from None


class Keys:
    """A batch's sample keys: a read-only sequence of ``str`` (``len``, indexing, slicing,
    iteration, ``in``, ``==`` with a list, ``+`` with a list gives a list; ``list(keys)`` or
    ``keys.tolist()`` for a list).

    Not a ``list`` on purpose: the DataLoader's ``default_convert`` visits every item of a list in
    the worker (335 us for 256 keys here, a third of a tiny-sample batch's cost) and passes other
    objects through.  Held as one UTF-8 blob plus offsets, decoded on first use; or, for batches
    a DataLoader worker sends to the process that made the dataset, as the samples' ids, looked
    up in that process's dataset index on first use (the worker then never touches the keys)."""

    __slots__ = ("_blob", "_offsets", "_strs", "_reader", "_ids")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, blob: bytes, offsets: bytes):
        """``offsets``: native int64 bytes, n + 1 of them, into ``blob``."""
        self._blob, self._offsets, self._strs = blob, offsets, None
        self._reader = self._ids = None

    @classmethod
    def of(cls, keys: Sequence[str]) -> "Keys":
        """Keys held as one UTF-8 blob (undecodable names kept by ``surrogateescape``).

        Args:
            keys: the sample keys, in batch order.
        """
        parts = [k.encode("utf-8", "surrogateescape") for k in keys]
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        return cls(b"".join(parts), offsets.tobytes())

    @classmethod
    def of_samples(cls, reader, ids: np.ndarray) -> "Keys":
        """The keys of global sample ids ``ids`` of ``reader``'s dataset, looked up when first
        used."""
        keys = cls(None, None)  # type: ignore[arg-type]
        keys._reader, keys._ids = reader, np.asarray(ids, dtype=np.int64)
        return keys

    def _resolve(self) -> None:
        if self._blob is None:
            self._blob, self._offsets = key_bytes(self._reader, self._ids)
            self._reader = None

    def tolist(self) -> list[str]:
        """The keys as a list of ``str`` (decoded once, then kept)."""
        if self._strs is None:
            self._resolve()
            blob, off = self._blob, np.frombuffer(self._offsets, dtype=np.int64).tolist()
            self._strs = [blob[a:b].decode("utf-8", "surrogateescape")
                          for a, b in zip(off, off[1:], strict=False)]
        return self._strs

    def __len__(self) -> int:
        return len(self._ids) if self._ids is not None else len(self._offsets) // 8 - 1

    def __getitem__(self, i):
        return self.tolist()[i]

    def __iter__(self):
        return iter(self.tolist())

    def __contains__(self, key) -> bool:
        return key in self.tolist()

    def __eq__(self, other) -> bool:
        if isinstance(other, Keys):
            self._resolve()
            other._resolve()
            return self._blob == other._blob and self._offsets == other._offsets
        if isinstance(other, (list, tuple)):
            return self.tolist() == list(other)
        return NotImplemented

    def __add__(self, other) -> list[str]:  # keys + [..] and sum(batch keys, [])
        return self.tolist() + list(other)

    def __radd__(self, other) -> list[str]:
        return list(other) + self.tolist()

    def __repr__(self) -> str:
        return f"Keys({self.tolist()!r})"

    def __reduce__(self):
        token = getattr(self._reader, "keys_token", None) if self._blob is None else None
        if token is not None:  # a worker's batch on its way to the dataset's own process
            from shardpack.loader.buffers import sending_from_worker

            if sending_from_worker(token):
                return _keys_of_ids, (token, self._ids.tobytes())
        self._resolve()
        return Keys, (self._blob, self._offsets)


def _keys_of_ids(token: str, ids: bytes) -> Keys:
    from shardpack.loader.buffers import pool_for

    return Keys.of_samples(pool_for(token).reader, np.frombuffer(ids, dtype=np.int64))


def key_bytes(reader, ids: np.ndarray) -> tuple[bytes, bytes]:
    """(UTF-8 keys concatenated, int64 offsets as bytes) of global sample ids ``ids``.  Runs when
    keys are first used, not while batches are made."""
    shards, rows = reader.locate_many(ids)
    starts, ends = np.zeros(len(ids), dtype=np.int64), np.zeros(len(ids), dtype=np.int64)
    blobs = {}
    for shard, sel in by_shard(shards):
        index = reader.index(shard)
        starts[sel], ends[sel] = index.key_bounds[0][rows[sel]], index.key_bounds[1][rows[sel]]
        blobs[shard] = memoryview(index.key_blob)
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(ends - starts, out=offsets[1:])
    parts = slices([blobs[s] for s in shards.tolist()], starts, ends - starts)
    return b"".join(parts), offsets.tobytes()


class Batch(dict):
    """A batch (a dict) that crosses from a DataLoader worker to the trainer cheaply.

    Every tensor sent through shared memory costs a new segment and a file descriptor, and a
    fresh segment costs far more to fill than memory already mapped (docs/reading.md, "Batch
    buffers").  So: tensors in a leased slot of a
    :class:`~shardpack.loader.buffers.SlotPool` travel as a slot number; other tensors under
    INLINE_LIMIT bytes are pickled inline (one memcpy); larger ones go through shared memory."""

    pool = None  # the dataset's SlotPool, where the batch was made in a worker that has one

    def __copy__(self):  # copy.copy (default_convert does one) must not go through __reduce__
        out = Batch(self)
        out.__dict__.update(self.__dict__)
        return out

    def buffer(self, nbytes: int) -> "torch.Tensor":
        """A uint8 tensor of ``nbytes`` to put a field in: a leased slot when this batch came from
        a worker with a slot pool, else :func:`new_buffer`."""
        lease = self.pool.lease(nbytes) if self.pool is not None and nbytes >= SLOT_MIN \
            else None
        if lease is None:
            from shardpack.loader.runtime import current

            return new_buffer(nbytes, current().shared and nbytes >= INLINE_LIMIT)
        tensor = torch.from_numpy(lease.array)
        if "_leases" not in self.__dict__:
            self._leases = {}
        self._leases[tensor.data_ptr()] = lease
        return tensor

    def __reduce__(self):
        leases = self.__dict__.get("_leases") or {}
        return _rebuild_batch, ({k: _pack(v, leases) for k, v in self.items()},)


def _leased(value, leases):
    """The lease whose whole slot ``value`` (a contiguous tensor) is, or None."""
    if not leases or not isinstance(value, torch.Tensor) or value.device.type != "cpu":
        return None
    lease = leases.get(value.data_ptr())
    if lease is None or lease.sent or not value.is_contiguous() or \
            value.numel() * value.element_size() != lease.nbytes:
        return None
    return lease


def _pack(value, leases):
    if isinstance(value, BytesBatch):
        return ("bytes", _pack(value.data, leases), _pack(value.offsets, leases))
    lease = _leased(value, leases)
    handle = lease.handle() if lease is not None else None
    if handle is not None:
        array = value.numpy()
        return ("slot", handle, array.dtype.char, array.shape)
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and \
            value.numel() * value.element_size() < INLINE_LIMIT:
        array = value.contiguous().numpy()
        return ("tensor", array.dtype.char, array.shape, array.tobytes())
    return ("value", value)


def _unpack(packed):
    kind = packed[0]
    if kind == "bytes":
        return BytesBatch(_unpack(packed[1]), _unpack(packed[2]))
    if kind == "tensor":
        _, dtype, shape, raw = packed
        return torch.from_numpy(np.frombuffer(bytearray(raw), dtype=dtype).reshape(shape))
    if kind == "slot":
        from shardpack.loader.buffers import receive

        _, handle, dtype, shape = packed
        return torch.from_numpy(receive(*handle).view(dtype).reshape(shape))
    return packed[1]


def _rebuild_batch(items: dict) -> "Batch":
    return Batch({k: _unpack(v) for k, v in items.items()})


class BytesBatch(NamedTuple):
    """Variable-length byte strings in one tensor: item ``i`` is
    ``data[offsets[i]:offsets[i + 1]]``."""

    data: "torch.Tensor"     # uint8 [total bytes]
    offsets: "torch.Tensor"  # int64 [n + 1]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def item(self, i: int) -> bytes:
        """Item ``i`` as ``bytes``.

        Args:
            i: its position in the batch.
        """
        return self.data[int(self.offsets[i]):int(self.offsets[i + 1])].numpy().tobytes()

    def items(self) -> list[bytes]:
        """Every item as ``bytes``, in batch order."""
        data, offsets = self.data.numpy(), self.offsets.tolist()
        return [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)]


def pack_bytes(items: Sequence[bytes], into: "Batch | None" = None, *, offsets=None,
               shared: bool | None = None) -> BytesBatch:
    """Byte strings in one tensor (``offsets``: their int64 bounds, if already known).  With
    ``into`` (the batch they will travel in), from SLOT_MIN bytes on they go into a leased slot
    of its pool, and from INLINE_LIMIT on into memory that crosses processes cheaply when
    ``shared`` (default: where batches cross to another process, in a DataLoader worker
    process), copied once; smaller ones travel inside the pickle."""
    if offsets is None:
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in items], out=offsets[1:])
    total = int(offsets[-1])
    data = into.buffer(total) if into is not None and into.pool is not None and \
        total >= SLOT_MIN else None
    if data is None and (into is None or total < INLINE_LIMIT):
        joined = bytearray().join(items)
        data = torch.frombuffer(joined, dtype=torch.uint8) if total else \
            torch.empty(0, dtype=torch.uint8)
        return BytesBatch(data, torch.from_numpy(offsets))
    if data is None:
        if shared is None:
            from shardpack.loader.runtime import current

            shared = current().shared
        data = new_buffer(total, shared)
    dst = memoryview(data.numpy())
    if total <= _JOIN_LIMIT:  # small items: one C-level join, then one copy
        dst[:] = b"".join(items)
    else:  # large ones: straight into place, no second copy
        for item, a, b in zip(items, offsets[:-1].tolist(), offsets[1:].tolist(),
                                   strict=True):
            dst[a:b] = item
    return BytesBatch(data, torch.from_numpy(offsets))


def collate(batch: Sequence[dict], pool=None) -> dict:
    """Collate sample dicts from :class:`~shardpack.ShardDataset` (fields as bytes); ``pool``: a
    :class:`~shardpack.loader.buffers.SlotPool` for large fields (in a DataLoader worker)."""
    if not batch:
        return Batch()
    out = Batch()
    if pool is not None:
        out.pool = pool
    names = dict.fromkeys(name for sample in batch for name in sample)  # union, in order
    raw = (bytes, bytearray, memoryview)
    for name in names:
        values = [sample.get(name) for sample in batch]
        if any(v is None for v in values):
            lacking = next(i for i, v in enumerate(values) if v is None)
            if name in LABEL_FIELDS or not all(isinstance(v, (*raw, type(None)))
                                               for v in values):
                raise _collate_error(batch, lacking, pool, f"has no field {name!r}, which "
                                     "other samples of the batch have; only bytes fields "
                                     "that are not labels may be absent (they collate as b'')")
            values = [b"" if v is None else v for v in values]
        if name == "__key__":
            out[name] = Keys.of(values)
        elif name in LABEL_FIELDS and isinstance(values[0], raw):
            out[name] = torch.tensor(_labels(batch, name, values, pool), dtype=torch.int64)
        elif isinstance(values[0], raw):
            out[name] = pack_bytes(values, out)
        elif isinstance(values[0], bool):
            out[name] = torch.tensor(values, dtype=torch.bool)
        elif isinstance(values[0], int):
            out[name] = torch.tensor(values, dtype=torch.int64)
        else:
            try:
                out[name] = torch.utils.data.default_collate(values)
            except (TypeError, ValueError, RuntimeError) as exc:
                odd = next((i for i, v in enumerate(values) if _shape(v) != _shape(values[0])),
                           0)
                raise _collate_error(batch, odd, pool, f"field {name!r} cannot be batched "
                                     f"with the first sample's ({_shape(values[odd])} and "
                                     f"{_shape(values[0])}): {str(exc)[:200]}") from None
    return out


def _labels(batch: Sequence[dict], name: str, values: list, pool) -> list[int]:
    """The int64 values of label field ``name``; a FormatError naming the first sample whose
    value is not one."""
    out = []
    for i, v in enumerate(values):
        try:
            out.append(label_value(v))
        except ValueError as exc:
            shown = repr(bytes(v[:40]) if isinstance(v, (bytes, bytearray, memoryview))
                         else v)[:60]
            raise _collate_error(batch, i, pool, f"field {name!r} holds {shown}, {exc}") \
                from None
    return out


def _shape(value) -> str:
    """A value's type and, for an array or tensor, its dtype and shape (for messages)."""
    shape = getattr(value, "shape", None)
    if shape is None:
        return type(value).__name__
    return f"{type(value).__name__} {getattr(value, 'dtype', '')} {tuple(shape)}"


def _collate_error(batch: Sequence[dict], i: int, pool, message: str):
    """A FormatError naming sample ``i`` of ``batch``: its key, its place in the batch and
    the dataset, and its shard where the dataset that read it is at hand (a DataLoader worker
    of a shardpack dataset, or the batched path's slot pool)."""
    from shardpack.core.errors import FormatError

    sample = batch[i]
    key = sample.get("__key__")
    gid = sample.get("__index__")
    where = f"item {i} of the batch" + (f", sample {gid} of the dataset"
                                        if isinstance(gid, (int, np.integer)) else "")
    return FormatError(f"{message} ({where})", key=key if isinstance(key, str) else None,
                       path=_shard_path(pool, gid))


def _shard_path(pool, gid) -> str | None:
    """The shard file of global sample ``gid``, where the reader that read it is known."""
    reader = getattr(pool, "reader", None)
    if reader is None:
        from shardpack.loader.runtime import current

        reader = getattr(current().dataset, "reader", None)
    if reader is None or not isinstance(gid, (int, np.integer)) or isinstance(gid, bool):
        return None
    try:
        shard, _ = reader.locate(int(gid))
        return reader.shard_path(shard)
    except (AttributeError, IndexError, ValueError, TypeError):
        return None


def new_buffer(nbytes: int, shared: bool) -> "torch.Tensor":
    """A uint8 tensor; in shared memory when it will cross to another process anyway, so the
    DataLoader sends a handle instead of copying it again."""
    if shared and nbytes:
        storage = torch.UntypedStorage._new_shared(nbytes)
        return torch.empty(0, dtype=torch.uint8).set_(storage)
    # numpy's allocator, not torch's: numpy asks the kernel for huge pages on arrays of 4 MB and
    # more (madvise), torch's does not.  A batch read without DataLoader workers fills fresh
    # memory every time, and its 4 KB page faults were most of such an epoch, more or fewer of
    # them with the order's batch sizes (docs/benchmarks.md, "Batch memory without workers")
    return torch.from_numpy(np.empty(nbytes, dtype=np.uint8))


def by_shard(shards: np.ndarray):
    """(shard, selection) for each shard in ``shards``, in shard order; the selection indexes
    the positions of that shard (all of them, as a slice, when there is only one)."""
    used = sorted(set(shards.tolist()))  # (np.unique imports numpy.ma, slow in each worker)
    for shard in used:
        yield shard, (np.flatnonzero(shards == shard) if len(used) > 1 else slice(None))


def slices(srcs: list, starts: np.ndarray, sizes: np.ndarray) -> list:
    """``srcs[i][starts[i]:starts[i] + sizes[i]]`` for each i.

    Args:
        srcs: the buffers (one per item).
        starts: where each item starts in its buffer.
        sizes: each item's length.
    """
    return [src[a:a + k] for src, a, k in zip(srcs, starts.tolist(), sizes.tolist(),
                                                            strict=True)]


_JOIN_LIMIT = 1 << 20  # fields up to this size: join, then one copy (docs/reading.md,
#                       "Efficiency")
