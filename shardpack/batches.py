"""Samples -> batches: ship a batch's bytes as ONE uint8 tensor plus offsets.

DataLoader workers hand batches to the main process by pickling them; tensors travel through
shared memory instead.  A list of 256 ``bytes`` objects is 256 pickled strings; one tensor is one
shared-memory segment.  ``collate`` turns every bytes field into a :class:`BytesBatch`, ``cls``
into an int64 tensor, ``__index__`` and ``__repeat__`` into tensors and keys into :class:`Keys`.
A bytes field that some samples of the batch lack collates as an empty item for them.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple, Sequence

import numpy as np

from .torchenv import torch

LABEL_FIELDS = ("cls",)
INLINE_LIMIT = 1 << 20  # tensors under 1 MB travel inside the pickle when no slot is leased
SLOT_MIN = 64 << 10     # tensors from this size on go into a reusable slot (shardpack.buffers)


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
        if self._strs is None:
            self._resolve()
            blob, off = self._blob, np.frombuffer(self._offsets, dtype=np.int64).tolist()
            self._strs = [blob[a:b].decode("utf-8", "surrogateescape")
                          for a, b in zip(off, off[1:])]
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
            from .buffers import sending_from_worker

            if sending_from_worker(token):
                return _keys_of_ids, (token, self._ids.tobytes())
        self._resolve()
        return Keys, (self._blob, self._offsets)


def _keys_of_ids(token: str, ids: bytes) -> Keys:
    from .buffers import pool_for

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
    parts = _slices([blobs[s] for s in shards.tolist()], starts, ends - starts)
    return b"".join(parts), offsets.tobytes()


class Batch(dict):
    """A batch (a dict) that crosses from a DataLoader worker to the trainer cheaply.

    Measured here: every tensor sent through shared memory costs about 2.5 ms (a new segment and a
    file descriptor passed per tensor), and a fresh 25.6 MB segment costs 28 ms to fill against
    4 ms for memory already mapped.  So: tensors in a leased slot of a
    :class:`~shardpack.buffers.SlotPool` travel as a slot number; other tensors under
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
            from .torchenv import get_worker_info

            return new_buffer(nbytes, get_worker_info() is not None and nbytes >= INLINE_LIMIT)
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
        from .buffers import receive

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
        return self.data[int(self.offsets[i]):int(self.offsets[i + 1])].numpy().tobytes()

    def items(self) -> list[bytes]:
        data, offsets = self.data.numpy(), self.offsets.tolist()
        return [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)]


def pack_bytes(items: Sequence[bytes], into: "Batch | None" = None, *, offsets=None,
               shared: bool | None = None) -> BytesBatch:
    """Byte strings in one tensor (``offsets``: their int64 bounds, if already known).  With
    ``into`` (the batch they will travel in), from SLOT_MIN bytes on they go into a leased slot
    of its pool, and from INLINE_LIMIT on into memory that crosses processes cheaply when
    ``shared`` (default: in a DataLoader worker), copied once; smaller ones travel inside the
    pickle."""
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
            from .torchenv import get_worker_info

            shared = get_worker_info() is not None
        data = new_buffer(total, shared)
    dst = memoryview(data.numpy())
    if total <= _JOIN_LIMIT:  # small items: one C-level join, then one copy
        dst[:] = b"".join(items)
    else:  # large ones: straight into place, no second copy
        for item, a, b in zip(items, offsets[:-1].tolist(), offsets[1:].tolist()):
            dst[a:b] = item
    return BytesBatch(data, torch.from_numpy(offsets))


def collate(batch: Sequence[dict], pool=None) -> dict:
    """Collate sample dicts from :class:`~shardpack.ShardDataset` (fields as bytes); ``pool``: a
    :class:`~shardpack.buffers.SlotPool` for large fields (in a DataLoader worker)."""
    if not batch:
        return Batch()
    out = Batch()
    if pool is not None:
        out.pool = pool
    names = dict.fromkeys(name for sample in batch for name in sample)  # union, in order
    for name in names:
        values = [sample.get(name) for sample in batch]
        if any(v is None for v in values):
            if not all(isinstance(v, (bytes, memoryview, type(None))) for v in values):
                raise ValueError(f"field {name!r} is missing from some samples of the batch; "
                                 "only bytes fields may be absent (they collate as b'')")
            values = [b"" if v is None else v for v in values]
        if name == "__key__":
            out[name] = Keys.of(values)
        elif name in LABEL_FIELDS and isinstance(values[0], (bytes, bytearray, memoryview)):
            out[name] = torch.tensor([int(bytes(v)) for v in values], dtype=torch.int64)
        elif isinstance(values[0], (bytes, bytearray, memoryview)):
            out[name] = pack_bytes(values, out)
        elif isinstance(values[0], bool):
            out[name] = torch.tensor(values, dtype=torch.bool)
        elif isinstance(values[0], int):
            out[name] = torch.tensor(values, dtype=torch.int64)
        else:
            out[name] = torch.utils.data.default_collate(values)
    return out


def new_buffer(nbytes: int, shared: bool) -> "torch.Tensor":
    """A uint8 tensor; in shared memory when it will cross to another process anyway, so the
    DataLoader sends a handle instead of copying it again."""
    if shared and nbytes:
        storage = torch.UntypedStorage._new_shared(nbytes)
        return torch.empty(0, dtype=torch.uint8).set_(storage)
    return torch.empty(nbytes, dtype=torch.uint8)


def _parse_decimal(src: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray | None:
    """ASCII decimal labels -> int64, vectorised; None if any value is not plain digits."""
    if not len(sizes):
        return np.zeros(0, dtype=np.int64)
    width, narrowest = int(sizes.max()), int(sizes.min())
    if narrowest == 0 or width > 18:
        return None
    if width == 1:  # labels 0-9: one byte each
        digits = src[starts].astype(np.int64) - 48
        return digits if not np.any((digits < 0) | (digits > 9)) else None
    # right-align every label in `width` columns; the columns left of a label read as '0'
    cols = np.arange(width - 1, -1, -1)  # distance from the last digit
    pad = cols[None, :] >= sizes[:, None]
    at = np.where(pad, 0, (starts + sizes - 1)[:, None] - cols[None, :])
    digits = np.where(pad, 48, src[at]).astype(np.int64) - 48
    if np.any((digits < 0) | (digits > 9)):
        return None
    return digits @ (10 ** cols)


def gather_batch(reader, ids: np.ndarray, repeats: np.ndarray, fields=None,
                 shared: bool = False, pool=None) -> dict | None:
    """One batch of samples ``ids`` (see :class:`Gatherer`); None where the fast path does not
    apply."""
    return Gatherer(reader, ids, len(ids), fields, shared, pool).batch(0, len(ids), repeats)


class Gatherer:
    """Whole batches of a run of samples (``ids``, in order), read straight from memory-mapped
    shards into one tensor per field: each field's bytes are copied once, with no per-sample
    Python objects but one slice per item.  msgpack records are CRC-checked.

    ``shared``: batches cross to another process (a DataLoader worker); ``pool``: a
    :class:`~shardpack.buffers.SlotPool` to put large fields in.  :meth:`batch` returns None when
    the fast path does not apply (remote storage without a cache, compressed records); the
    caller then reads sample by sample.

    Where every field of every sample lies is worked out from the indexes for a stretch of
    upcoming batches at once (1, then 4, 16 and 64 batches, so the first batch waits for its own
    indexes only): a batch then costs the same few numpy calls however many shards it draws from
    (for 1 KB samples, 10 shards a batch cost ~170 us more than 1 shard when this was per batch).
    Labels are parsed once per sample and process and kept in ``reader.labels``; keys are not
    touched here (:class:`Keys` looks them up when used)."""

    STRETCH = (1, 4, 16, 64)  # batches planned at once, growing

    def __init__(self, reader, ids: np.ndarray, batch_size: int, fields=None,
                 shared: bool = False, pool=None):
        self.reader, self.ids, self.batch_size = reader, np.asarray(ids, dtype=np.int64), \
            max(1, batch_size)
        self.names = list(fields) if fields else list(reader.fields)
        self.shared, self.pool = shared, pool
        self._plans = 0
        self._plan: dict | None = None

    def _make_plan(self, lo: int) -> dict:
        count = self.STRETCH[min(self._plans, len(self.STRETCH) - 1)] * self.batch_size
        self._plans += 1
        if count > self.batch_size:
            try:
                plan = self._plan_for(lo, count)
            except Exception:  # a bad index further on: report it when its batch comes
                plan = None
            if plan is not None and plan["fast"]:
                return plan
            self._plans = 0  # plan the next batches one by one, past the trouble
        return self._plan_for(lo, self.batch_size)

    def _plan_for(self, lo: int, count: int) -> dict:
        reader = self.reader
        ids = self.ids[lo:lo + count]
        n = len(ids)
        shards, rows = reader.locate_many(ids)
        starts = {f: np.zeros(n, dtype=np.int64) for f in self.names}
        sizes = {f: np.zeros(n, dtype=np.int64) for f in self.names}
        labels = {f: np.full(n, _UNPARSED, dtype=np.int64) for f in self.names
                  if f in LABEL_FIELDS}
        fast, msgpack = True, False
        for shard, sel in by_shard(shards):
            index = reader.index(shard)
            if index.compression != "none":
                fast = False
                break
            msgpack |= index.shard_format == "msgpack"
            r = rows[sel]
            spans = index.field_spans
            for f in self.names:
                if f in spans:
                    starts[f][sel] = spans[f][0][r]
                    sizes[f][sel] = spans[f][1][r]
                if f in labels and (shard, f) in reader.labels:
                    labels[f][sel] = reader.labels[(shard, f)][r]
        return dict(lo=lo, hi=lo + n, shards=shards, rows=rows, starts=starts, sizes=sizes,
                    labels=labels, fast=fast, msgpack=msgpack)

    def batch(self, lo: int, hi: int, repeats: np.ndarray) -> dict | None:
        """The batch of positions ``lo:hi`` of ``ids``."""
        plan = self._plan
        if plan is None or not plan["lo"] <= lo < hi <= plan["hi"]:
            plan = self._plan = self._make_plan(lo)
        if not plan["fast"]:
            return None
        reader, a, b = self.reader, lo - plan["lo"], hi - plan["lo"]
        ids, shards, n = self.ids[lo:hi], plan["shards"][a:b], hi - lo
        used = sorted(set(shards.tolist()))
        bufs = {}
        for shard in used:
            buf = reader.shard_buffer(shard)
            if buf is None:
                return None
            bufs[shard] = memoryview(buf)
        self._check(shards, plan["rows"][a:b], bufs, plan["msgpack"])
        out = Batch({"__key__": Keys.of_samples(reader, ids),
                     "__index__": torch.from_numpy(ids.copy()),
                     "__repeat__": torch.from_numpy(np.array(repeats, dtype=bool))})
        if self.shared:
            out.pool = self.pool
        srcs = [bufs[s] for s in shards.tolist()]
        for f in self.names:
            starts, sizes = plan["starts"][f][a:b], plan["sizes"][f][a:b]
            if f in LABEL_FIELDS:
                out[f] = torch.from_numpy(self._labels(f, plan, a, b, bufs))
                continue
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(sizes, out=offsets[1:])
            out[f] = pack_bytes(_slices(srcs, starts, sizes), out, offsets=offsets,
                                shared=self.shared)
        return out

    def _check(self, shards, rows, bufs, msgpack: bool) -> None:
        """Check this batch's samples against their index hashes, each once per process
        (:meth:`DatasetReader.check_rows`); msgpack record headers too (the fast path copies
        fields straight out of uncompressed records)."""
        from . import format as fmt
        from .errors import IntegrityError

        reader = self.reader
        for shard, sel in by_shard(shards):
            r = rows[sel]
            if msgpack and reader.index(shard).shard_format == "msgpack":
                seen = reader.checked.get(shard)
                todo = r if seen is None else r[~seen[r]]
                if len(todo):
                    _check_records(reader.index(shard), todo, bufs[shard],
                                   reader.shard_path(shard), IntegrityError, fmt)
            reader.check_rows(shard, r, bufs[shard])

    def _labels(self, f, plan, a, b, bufs) -> np.ndarray:
        """ASCII decimal labels -> int64 for the batch at plan positions ``a:b``.  A shard's
        unparsed labels are parsed for the whole planned stretch at once, when the first batch
        that reads that shard comes (its buffer is open then); they stay in the plan and in
        ``reader.labels`` (8 bytes a sample).  Labels that are not plain digits (``7\\n``,
        ``-1``) go through ``int()``, for the whole stretch too; if that fails, the shard is
        marked in the plan and only each batch's own labels are parsed from then on, so the
        error is raised by the batch that holds the bad sample."""
        labels, shards, rows = plan["labels"][f], plan["shards"], plan["rows"]
        starts, sizes = plan["starts"][f], plan["sizes"][f]
        todo = np.flatnonzero(labels[a:b] == _UNPARSED) + a
        if not len(todo):
            return labels[a:b].copy()
        bad = plan.setdefault("bad_labels", set())
        for shard in sorted(set(shards[todo].tolist())):
            src = np.frombuffer(bufs[shard], dtype=np.uint8)
            mine = todo[shards[todo] == shard]
            if (shard, f) not in bad:
                mine = np.flatnonzero((shards == shard) & (labels == _UNPARSED))
            parsed = _parse_decimal(src, starts[mine], sizes[mine])
            if parsed is None:
                try:
                    parsed = _parse_ints(f, src, starts[mine], sizes[mine])
                except ValueError as exc:
                    if (shard, f) in bad:
                        raise _bad_label(self.reader, shard, f, src, starts[mine],
                                         sizes[mine], rows[mine], exc) from None
                    bad.add((shard, f))  # somewhere in the stretch: this batch's rows only
                    mine = todo[shards[todo] == shard]
                    try:
                        parsed = _parse_ints(f, src, starts[mine], sizes[mine])
                    except ValueError as exc:  # name the shard and the first bad sample
                        raise _bad_label(self.reader, shard, f, src, starts[mine],
                                         sizes[mine], rows[mine], exc) from None
            labels[mine] = parsed
            memo = self.reader.labels.get((shard, f))
            if memo is None:
                memo = self.reader.labels[(shard, f)] = np.full(
                    self.reader.index(shard).num_samples, _UNPARSED, dtype=np.int64)
            memo[rows[mine]] = parsed
        return labels[a:b].copy()


def _bad_label(reader, shard: int, field: str, src, starts, sizes, rows, exc):
    """A :class:`~shardpack.errors.FormatError` naming the shard and the first sample whose
    label ``int()`` refuses."""
    from .errors import FormatError

    for start, size, row in zip(starts.tolist(), sizes.tolist(), rows.tolist()):
        text = src[start:start + size].tobytes()
        try:
            int(text)
        except ValueError:
            index = reader.index(shard)
            return FormatError(f"field {field!r} holds {text[:40]!r}, not an integer label",
                               path=reader.shard_path(shard), key=index.key(row),
                               offset=int(index.starts[row]))
    return FormatError(str(exc), path=reader.shard_path(shard))


def _parse_ints(field: str, src: np.ndarray, starts: np.ndarray,
                sizes: np.ndarray) -> np.ndarray:
    """Labels that ``int()`` accepts (signs, surrounding whitespace); ValueError otherwise."""
    try:
        return np.array([int(src[p:p + k].tobytes()) for p, k in
                         zip(starts.tolist(), sizes.tolist())], dtype=np.int64)
    except ValueError:
        raise ValueError(f"field {field!r} holds a value that is not an integer, "
                         "or is missing from some samples") from None


def by_shard(shards: np.ndarray):
    """(shard, selection) for each shard in ``shards``, in shard order; the selection indexes
    the positions of that shard (all of them, as a slice, when there is only one)."""
    used = sorted(set(shards.tolist()))  # (np.unique imports numpy.ma: 0.15 s a worker)
    for shard in used:
        yield shard, (np.flatnonzero(shards == shard) if len(used) > 1 else slice(None))


def _slices(srcs: list, starts: np.ndarray, sizes: np.ndarray) -> list:
    return [src[a:a + k] for src, a, k in zip(srcs, starts.tolist(), sizes.tolist())]


_UNPARSED = np.iinfo(np.int64).min
_JOIN_LIMIT = 1 << 20  # fields up to this size: join, then one copy (faster to ~2 MB here)


def _check_records(index, rows, buf, path, IntegrityError, fmt) -> None:
    """Record headers (stored size, no flags) of msgpack records ``rows`` of ``buf``, read in
    one numpy gather.  Their bytes are checked by the sample hash
    (:meth:`DatasetReader.check_rows`), so the CRC32C is not computed again here."""
    size = fmt.RECORD_HEADER.size
    src = np.frombuffer(buf, dtype=np.uint8)
    starts = index.starts[rows].astype(np.int64)
    ends = index.starts[rows + 1].astype(np.int64)
    bad = (ends - starts < size) | (starts + size > len(src))
    heads = np.zeros(len(rows), dtype=fmt.RECORD_HEADER_DTYPE)
    ok = np.flatnonzero(~bad)
    if len(ok):
        windows = np.lib.stride_tricks.as_strided(src, shape=(len(src) - size + 1, size),
                                                  strides=(1, 1))
        heads[ok] = windows[starts[ok]].view(fmt.RECORD_HEADER_DTYPE).ravel()
    bad |= (heads["stored"].astype(np.int64) != ends - starts - size) | (heads["flags"] != 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise IntegrityError("record header mismatch (stored size or flags)", path=path,
                             offset=int(starts[i]), key=index.key(int(rows[i])))
