"""The dataset's first two stages: order (this worker's share of the epoch, in parts of a batch)
and read (checked sample bytes, a batch gathered at once where it can be).

They hold what a pass needs (the share, the position, the prefetcher) and nothing of where they
run: that is :func:`shardpack.loader.runtime.current`'s answer.
"""

from __future__ import annotations

import threading
import warnings

from shardpack.core.errors import ShardpackError
from shardpack.loader.batches import check_labels, collate
from shardpack.loader.fetching import fast_start, prefetcher
from shardpack.loader.gather import Gatherer
from shardpack.loader.pipeline import Samples, Stage
from shardpack.loader.runtime import current
from shardpack.loader.torchenv import torch
from shardpack.read.prefetch import NOTHING

FETCH_STEP = 64  # samples the sample-by-sample path reads between telling the prefetcher
_TALLY = threading.Lock()  # the named counts' lock: a dataset's worker threads share them


class OrderStage(Stage):
    """This worker's share of the epoch, in parts of ``batch_size`` positions: ``(start, part)``
    with ``part`` a :class:`~shardpack.order.partition.Share`.  Its state is the dataset's
    worker-level state at the position the chain's last stage has reached.

    Args:
        dataset: the :class:`~shardpack.ShardDataset` whose order it follows.
    """

    name = "order"

    def __init__(self, dataset):
        super().__init__(None)
        self.dataset = dataset
        self.position = self.share = None
        self.opened = None  # the pass, where an execution opened it for several workers
        self._next = 0

    def reset(self, state: dict | None = None) -> None:
        """Begin a pass: resume ``state`` (a worker-level state of this dataset) or what
        ``load_state_dict`` left, else the epoch's start.

        Args:
            state: what :meth:`state` returned (None: the dataset's own resume, if any).
        """
        opened, self.opened = self.opened, None
        if state is not None:
            self.dataset.load_state_dict(state)
            opened = None
        if opened is None:
            opened = self.dataset.open_pass()
        self.position, self.share = self.dataset.begin_pass(opened)
        self._next = self.position.yielded.value

    @property
    def handed_out(self) -> int:
        """The end of the last part handed out (positions in the share)."""
        return self._next

    def state(self) -> dict:
        """The dataset's worker-level state at this chain's position."""
        return self.dataset.position_state(self.position)

    def step(self):
        """The next part of a batch: ``(start, part)``."""
        start = self._next
        if start >= len(self.share):
            raise StopIteration
        stop = min(len(self.share), start + self.dataset.batch_size)
        self._next = stop
        self.position.yielded.value = stop
        return start, self.share[start:stop]


class ReadStage(Stage):
    """Checked samples of each part: a whole batch gathered straight into tensors
    (``batched``), else sample dicts.  Remote data is fetched ahead here (the fast start's
    first batch by ranged reads, then whole shards or chunks; docs/remote.md).

    Args:
        dataset: the dataset read (reader, fields, on_error, batch size, slot pool, mixture).
        source: its :class:`OrderStage`.
    """

    name = "read"

    def __init__(self, dataset, source: OrderStage):
        super().__init__(source)
        self.dataset = dataset
        self.reader = dataset.reader
        self._items = iter(())
        self._fetcher = NOTHING

    def reset(self, state: dict | None = None) -> None:
        """Begin the pass (the order stage's) and start fetching ahead for it."""
        self.close()
        super().reset(state)
        order, ds = self.source, self.dataset
        skip, ids = order.position.yielded.value, order.share.ids
        here = current()
        if self.reader.prefetch > 0 and not here.thread:  # cold cache: ranged reads first
            fast_start(self.reader, ds.stats, order.position, ids[skip:skip + ds.batch_size])
        self._fetcher = prefetcher(self.reader, ids[skip:], batch_size=ds.batch_size,
                                   num_workers=order.position.num_workers,
                                   window=ds.order.window if ds.order.shuffle else 0)
        self._items = self._batches(skip) if ds.batched else self._samples(skip)

    def state(self) -> dict:
        """The order stage's state (the chain's outlet moves it sample by sample)."""
        return self.source.state()

    def step(self):
        """The next batch, or (sample by sample) the next part's :class:`Samples`."""
        return next(self._items)

    def close(self) -> None:
        """Stop fetching ahead; forget fast-start pieces not read."""
        self._fetcher.close()
        self._fetcher = NOTHING
        if not current().thread:
            self.reader.drop_pieces()

    def tally(self, name: str, count: int = 1) -> None:
        """Add to the dataset's named counts (under a lock: worker threads share them)."""
        with _TALLY:
            self.dataset.stats[name] += count

    def _parts(self):
        """The order stage's parts, until it has none left."""
        while True:
            try:
                part = self.pull()
            except StopIteration:
                return
            yield part

    def _batches(self, skip: int):
        """Whole batches, gathered straight into (shared-memory) tensors: the fast path."""
        ds, reader, fetcher = self.dataset, self.reader, self._fetcher
        position = self.source.position
        gatherer = Gatherer(reader, self.source.share.ids, ds.batch_size, ds.fields,
                            current().shared, ds.slot_pool)
        for start, part in self._parts():
            end = start + len(part)
            if not reader.has_pieces:  # (pieces: the fast start's batch goes out first)
                fetcher.reading(end - skip)
            batch = None
            try:
                if not reader.has_pieces:  # else: the fast start's pieces, sample by sample
                    batch = gatherer.batch(start, end, part.repeat)
            except ShardpackError:
                if ds.on_error == "raise":
                    raise
            if batch is None:  # remote, compressed, or a bad sample to skip: sample by sample
                batch = self._collated(part, position)
                if batch is None:
                    continue
            else:
                self.tally("yielded", len(part))
                self.tally("repeats", int(part.repeat.sum()))
            position.yielded.value = end
            # the epoch travels with the batch: GPU crops in the training process follow it
            batch["__epoch__"] = torch.full((len(batch["__index__"]),), position.epoch,
                                            dtype=torch.int64)
            if ds.is_mixture:
                batch["__source__"] = torch.from_numpy(
                    reader.source_of(batch["__index__"].numpy()))
            if not fetcher.started:  # the fast start's batch is made: downloads start
                fetcher.reading(min(len(self.source.share), end + ds.batch_size) - skip)
            yield batch

    def _collated(self, part, position):
        """One part read sample by sample and collated (None: every sample was skipped)."""
        samples = self._read_part(part, raw=True)
        self.reader.drop_pieces()  # the fast start serves one batch only
        if not samples:
            return None
        pool = self.dataset.slot_pool if current().shared else None
        return collate(samples, pool)

    def _samples(self, skip: int):
        """Sample by sample: each part's samples as one :class:`Samples` (the stages after
        this one map over it, the chain's end hands its samples out one by one)."""
        for start, part in self._parts():
            yield self._read_part(part, first=start - skip, start=start)

    def _read_part(self, part, raw: bool = False, first: int | None = None,
                   start: int = 0) -> "Samples":
        """The samples of ``part`` (``raw``: as read, for a batch to collate; else with the
        dataset's fields only).  ``first``: the part's place in the pass, for the prefetcher
        and the fast start (which serves the pass's first batch only); None: a batch's part,
        whose fetching the batch path tells.  ``start``: its place in the share."""
        ds, reader, fetcher = self.dataset, self.reader, self._fetcher
        shards, rows = reader.locate_many(part.ids)
        fields, mixture = ds.fields, ds.is_mixture
        out = Samples(start, start + len(part))
        repeats = 0
        for pos, (gid, shard, row, rep) in enumerate(zip(
                part.ids.tolist(), shards.tolist(), rows.tolist(), part.repeat.tolist(),
                strict=True)):
            if first is not None:  # (inline: a call a sample is a few percent of a small one)
                at = first + pos
                if at == ds.batch_size:
                    reader.drop_pieces()  # the fast start serves the first batch only
                if (at % FETCH_STEP == 0 or not fetcher.started) and not reader.has_pieces:
                    fetcher.reading(at + FETCH_STEP)
            try:
                sample = reader.read(shard, row, views=raw)  # (raw: copied into a batch)
                if raw:  # collate parses labels: a bad one is this sample's, skippable
                    check_labels(sample, reader, shard, row)
            except ShardpackError as exc:
                self._skip(exc)
                continue
            if fields is not None:
                sample = {k: v for k, v in sample.items() if k == "__key__" or k in fields}
            sample["__index__"] = gid
            sample["__repeat__"] = rep
            if mixture:
                sample["__source__"] = int(reader.source_of([gid])[0])
            repeats += rep
            out.append(sample)
            out.positions.append(start + pos + 1)
        self.tally("yielded", len(out))
        self.tally("repeats", repeats)
        return out

    def _skip(self, exc: ShardpackError) -> None:
        """A bad sample: raised, or with ``on_error="skip"`` counted, with a warning."""
        if self.dataset.on_error == "raise":
            raise exc
        self.tally("skipped")
        warnings.warn(f"shardpack: skipped a bad sample ({exc}); "
                      f"{self.dataset.stats['skipped']} skipped so far", stacklevel=3)
