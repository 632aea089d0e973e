"""Gather: whole batches read straight from memory-mapped shards (the batched fast path).

A :class:`Gatherer` plans a run of batches (which shard, row and byte range every field of every
sample comes from), checks each sample against its index hash (on every read, or once per
process with the reader's ``check="once"`` memo), parses ``cls`` labels for a planned stretch
at once, and copies each field's bytes once into the batch's tensor.  Where the bytes go and
how a batch travels to the main process is the transport's business (shardpack/loader/batches.py:
Batch, collate, slots).
"""

from __future__ import annotations

import numpy as np

from shardpack.loader.batches import (
    LABEL_FIELDS, Batch, Keys, by_shard, label_value, pack_bytes, slices,
)
from shardpack.read.reader import UNPARSED
from shardpack.loader.torchenv import torch


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
    apply.

    Args:
        reader: the dataset's :class:`~shardpack.read.reader.DatasetReader`.
        ids: int64 sample numbers of the batch.
        repeats: bool per sample, True where it repeats an earlier one (the ``__repeat__`` entry).
        fields: the fields to gather (default: all).
        shared: the batch crosses to another process.
        pool: a slot pool for large fields, or None.
    """
    return Gatherer(reader, ids, len(ids), fields, shared, pool).batch(0, len(ids), repeats)


class Gatherer:
    """Whole batches of a run of samples (``ids``, in order), read straight from memory-mapped
    shards into one tensor per field: each field's bytes are copied once, with no per-sample
    Python objects but one slice per item.  Samples are hash-checked as the reader's
    ``check`` says; msgpack record headers are checked in every batch.

    ``shared``: batches cross to another process (a DataLoader worker); ``pool``: a
    :class:`~shardpack.loader.buffers.SlotPool` to put large fields in.  :meth:`batch` returns
    None when the fast path does not apply (remote storage without a cache, compressed
    records); the caller then reads sample by sample.

    Where every field of every sample lies is worked out from the indexes for a stretch of
    upcoming batches at once (1, then 4, 16 and 64 batches, so the first batch waits for its own
    indexes only): a batch then costs the same few numpy calls however many shards it draws from
    (for 1 KB samples, 10 shards a batch cost ~170 us more than 1 shard when this was per batch).
    Labels are parsed once per sample and process and kept by the reader (``label_memo``); keys
    are not touched here (:class:`Keys` looks them up when used)."""

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
        labels = {f: np.full(n, UNPARSED, dtype=np.int64) for f in self.names
                  if f in LABEL_FIELDS}
        fast, framed = True, False
        for shard, sel in by_shard(shards):
            index = reader.index(shard)
            if index.compression != "none":
                fast = False
                break
            framed |= index.codec.framed_records
            r = rows[sel]
            spans = index.field_spans
            for f in self.names:
                if f in spans:
                    starts[f][sel] = spans[f][0][r]
                    sizes[f][sel] = spans[f][1][r]
                memo = reader.label_memo(shard, f) if f in labels else None
                if memo is not None:
                    labels[f][sel] = memo[r]
        return dict(lo=lo, hi=lo + n, shards=shards, rows=rows, starts=starts, sizes=sizes,
                    labels=labels, fast=fast, framed=framed)

    def batch(self, lo: int, hi: int, repeats: np.ndarray) -> dict | None:
        """The batch of positions ``lo:hi`` of ``ids``, or None where the fast path does not
        apply.

        Args:
            lo: the batch's first position in ``ids``.
            hi: one past its last.
            repeats: bool per sample, True where it repeats an earlier one.
        """
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
        self._check(shards, plan["rows"][a:b], bufs, plan["framed"])
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
            out[f] = pack_bytes(slices(srcs, starts, sizes), out, offsets=offsets,
                                shared=self.shared)
        return out

    def _check(self, shards, rows, bufs, framed: bool) -> None:
        """Check this batch's samples against their index hashes as the reader's ``check``
        says (:meth:`DatasetReader.check_rows`: every read by default, in one C-driven pass a
        shard); record headers (msgpack's: ``framed``) of every sample of every batch, whatever
        the mode (the fast path copies fields straight out of uncompressed records: a header
        zeroed or shifted in place under the memo, or with ``check="none"``, is refused here,
        never copied out as a zero-filled sample)."""
        reader = self.reader
        for shard, sel in by_shard(shards):
            r = rows[sel]
            if framed:
                index = reader.index(shard)
                index.codec.check_record_heads(index, r, bufs[shard], reader.shard_path(shard))
            reader.check_rows(shard, r, bufs[shard])

    def _labels(self, f, plan, a, b, bufs) -> np.ndarray:
        """ASCII decimal labels -> int64 for the batch at plan positions ``a:b``.  A shard's
        unparsed labels are parsed for the whole planned stretch at once, when the first batch
        that reads that shard comes (its buffer is open then); they stay in the plan and in
        the reader's ``label_memo`` (8 bytes a sample).  Labels that are not plain digits (``7\\n``,
        ``-1``) go through ``int()``, for the whole stretch too; if that fails, the shard is
        marked in the plan and only each batch's own labels are parsed from then on, so the
        error is raised by the batch that holds the bad sample."""
        labels, shards, rows = plan["labels"][f], plan["shards"], plan["rows"]
        starts, sizes = plan["starts"][f], plan["sizes"][f]
        todo = np.flatnonzero(labels[a:b] == UNPARSED) + a
        if not len(todo):
            return labels[a:b].copy()
        bad = plan.setdefault("bad_labels", set())
        for shard in sorted(set(shards[todo].tolist())):
            src = np.frombuffer(bufs[shard], dtype=np.uint8)
            mine = todo[shards[todo] == shard]
            if (shard, f) not in bad:
                mine = np.flatnonzero((shards == shard) & (labels == UNPARSED))
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
            self.reader.label_memo(shard, f, create=True)[rows[mine]] = parsed
        return labels[a:b].copy()


def _bad_label(reader, shard: int, field: str, src, starts, sizes, rows, exc):
    """A :class:`~shardpack.core.errors.FormatError` naming the shard and the first sample whose
    label :func:`~shardpack.loader.batches.label_value` refuses."""
    from shardpack.core.errors import FormatError

    for start, size, row in zip(starts.tolist(), sizes.tolist(), rows.tolist(),
                                strict=True):
        text = src[start:start + size].tobytes()
        try:
            label_value(text)
        except ValueError as why:
            index = reader.index(shard)
            return FormatError(f"field {field!r} holds {text[:40]!r}, {why}",
                               path=reader.shard_path(shard), key=index.key(row),
                               offset=int(index.starts[row]))
    return FormatError(str(exc), path=reader.shard_path(shard))


def _parse_ints(field: str, src: np.ndarray, starts: np.ndarray,
                sizes: np.ndarray) -> np.ndarray:
    """Labels that :func:`~shardpack.loader.batches.label_value` accepts (what ``int()`` does,
    within int64); ValueError otherwise."""
    try:
        return np.array([label_value(src[p:p + k].tobytes()) for p, k in
                         zip(starts.tolist(), sizes.tolist(), strict=True)],
                        dtype=np.int64)
    except ValueError:
        raise ValueError(f"field {field!r} holds a value that is not an integer, "
                         "or is missing from some samples") from None
