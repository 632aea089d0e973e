"""Reader -> partition -> samples: the PyTorch datasets.

``ShardDataset`` is an ``IterableDataset`` with exact-once epochs under DDP, a deterministic block +
window shuffle, and resumable state; ``open_dataset`` gives map-style random access (``ds[i]``,
``ds.get(key)``).  Order and partition come from :mod:`shardpack.partition` (pure functions); this
module only reads what they say, lazily, in whichever process iterates.
"""

from __future__ import annotations

import dataclasses
import operator
import warnings
from typing import Callable, Iterator, Sequence

import numpy as np

from shardpack.order import partition
from shardpack.read.access import Burst
from shardpack.core.errors import ShardpackError
from shardpack.read.prefetch import NOTHING
from shardpack.loader.shared import SharedInt
from shardpack.loader.buffers import SlotPool
from shardpack.read.mix import MixReader, Source, sources_of
from shardpack.read.reader import DatasetReader
from shardpack.loader.torchenv import IterableDataset, dist, placement, settle_worker, torch

STATE_VERSION = 3  # changes whenever the order of a (seed, epoch) changes (docs/reading.md)


class ShardDataset(IterableDataset):
    """Stream a packed dataset into a DataLoader.

    Each rank yields ``len(ds)`` samples per epoch, the same for every rank.  Samples are dicts:
    ``__key__`` (str), ``__index__`` (int, global sample id), ``__repeat__`` (bool, True for a
    padding repeat) and one entry per field: ``bytes``, or whatever ``decode`` makes of them.
    Batches (``batched=True``) also carry ``__epoch__``, the epoch they were read in.

    Pass ``batch_size`` equal to the DataLoader's: workers then take whole batches round-robin, the
    loader's output is this rank's sequence in order, and ``state_dict(samples_seen=k)`` can resume
    from any plain DataLoader.  With ``torchdata``'s ``StatefulDataLoader`` the loader's own
    ``state_dict()`` carries each worker's position.

    Every sample is checked against its index hash each time it is read (docs/reading.md,
    "Integrity"): ``check="every"`` (the default); ``check="once"`` checks it the first time a
    process reads it from a copy of its shard (then missed: bytes changed with no trace in the
    file's stat, and a cached copy changed in place); ``check="none"`` (or
    ``trust_storage=True``) skips it for storage you trust.
    Mapped shards are stat-ed at each epoch's start and their size before each use, in every
    mode: a shard changed in place is mapped again, or refused in one line.
    """

    def __init__(self, path, *, shuffle: bool = True, seed: int = 0,
                 fields: Sequence[str] | None = None, decode: Callable | None = None,
                 transform: Callable | None = None, batch_size: int | None = None,
                 partial: str = "pad", block_size: int = 256, shuffle_window: int = 4096,
                 on_error: str = "raise", rank: int | None = None, world_size: int | None = None,
                 batched: bool = False, storage_options: dict | None = None,
                 cache_dir=None, cache_limit="50GB", prefetch: int = 2,
                 trust_storage: bool = False, shard_affinity: bool = True,
                 slot_pool: SlotPool | None = None, weights: Sequence[float] | None = None,
                 epoch_size: int | None = None, check: str | None = None):
        super().__init__()
        if partial not in partition.PARTIAL_POLICIES:
            raise ValueError(f"partial must be one of {partition.PARTIAL_POLICIES}, got "
                             f"{partial!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        # a shuffle window is read at once, from up to window / block_size places: the access
        # mode keeps that much (cached shards open, chunks in memory; docs/remote.md)
        burst = Burst(shuffle_window, -(-shuffle_window // max(1, block_size))) if shuffle \
            else Burst()
        mixture = isinstance(path, (list, tuple, Source))
        if not mixture and (weights is not None or epoch_size is not None):
            raise ValueError("weights and epoch_size are for a mixture: pass a list of datasets")
        self._mix: tuple | None = None  # (sizes of each source's shards, samples per epoch)
        if mixture:  # several datasets read as one (shardpack/read/mix.py, docs/mixing.md)
            sources = sources_of([path] if isinstance(path, Source) else path, weights)
            self.reader = MixReader(sources, storage_options=storage_options,
                                    cache_dir=cache_dir, cache_limit=cache_limit,
                                    prefetch=prefetch, trust_storage=trust_storage, burst=burst,
                                    check=check)
            sizes = self.reader.source_sizes()
            totals = [sum(x) for x in sizes]
            counts = partition.allot(totals, [src.weight for src in sources],
                                     [src.fixed(n) for src, n in zip(sources, totals,
                                                                     strict=True)], epoch_size)
            self._mix = (tuple(tuple(x) for x in sizes), tuple(counts))
            shard_affinity = False  # every rank reads every source (docs/mixing.md)
        else:
            self.reader = DatasetReader(path, storage_options, cache_dir=cache_dir,
                                        cache_limit=cache_limit, prefetch=prefetch,
                                        trust_storage=trust_storage, burst=burst, check=check)
        unknown = sorted(set(fields or ()) - set(self.reader.fields))
        if unknown:
            raise ValueError(f"unknown fields {unknown}: the dataset has {self.reader.fields}")
        if mixture:
            _check_sources(self.reader, decode, fields)
        self.path = str(path) if not mixture else ", ".join(str(src.path) for src in sources)
        self.shuffle, self.seed, self.fields = shuffle, seed, tuple(fields) if fields else None
        self.decode, self.transform = decode, transform
        self.batch_size = batch_size or 1
        self.partial, self.block_size, self.shuffle_window = partial, block_size, shuffle_window
        # each rank shuffles within its own span of shuffled shards: a job fetches the dataset
        # about once an epoch, not once per rank (partition.epoch_order, docs/scale.md)
        self.shard_affinity = shard_affinity
        self.on_error = on_error
        self.batched = batched
        if batched and not batch_size:
            raise ValueError("batched=True needs a batch_size")
        self.rank, self.world_size = rank, world_size
        self._dist: tuple[int, int] | None = None  # (rank, world) seen in the training process
        self._capture_dist()
        # set_epoch() writes here; workers (persistent ones included) read it at each __iter__
        # (NOTE [fork-shared pages] in shardpack/loader/shared.py)
        self._epoch = SharedInt(-1)
        # batch buffers the workers reuse (shardpack.loader.buffers): made here (or given), before
        # the
        # DataLoader forks them; anonymous, so it lives exactly as long as the processes holding it
        if slot_pool is not None and not batched:
            raise ValueError("slot_pool is for batched=True (batches travel through its slots)")
        self._pool = (slot_pool or SlotPool.create()) if batched else None
        if self._pool is not None:  # keys travel from workers as sample ids, looked up here
            self._pool.serve_keys(self.reader)
        self._local_epoch = 0   # epochs started in this process, used until set_epoch is called
        self._resume: dict | None = None
        self._running: Position | None = None  # the iteration running in this process, if any
        self.stats = {"yielded": 0, "skipped": 0, "repeats": 0, "dropped": 0,
                      "fast_start_requests": 0}

    # -- where am I -----------------------------------------------------------------------------
    def _capture_dist(self) -> None:
        """Remember rank and world while in the training process: DataLoader workers have no
        process group, so they use what was seen here (at construction, set_epoch, len, or when
        the dataset is sent to a worker)."""
        if dist.is_available() and dist.is_initialized():
            self._dist = dist.get_rank(), dist.get_world_size()

    def _placement(self):
        rank, world = self.rank, self.world_size
        if self._dist is not None:
            rank = self._dist[0] if rank is None else rank
            world = self._dist[1] if world is None else world
        return placement(rank, world)

    # -- pickling into workers ----------------------------------------------------------------
    def __getstate__(self):
        self._capture_dist()
        return {**self.__dict__, "_epoch": self._epoch.carried()}

    # -- epochs and sizes ---------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order from the next iteration on, in this process and in every
        DataLoader worker, persistent workers included."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._capture_dist()
        self._epoch.value = epoch

    @property
    def epoch(self) -> int:
        value = int(self._epoch.value)
        return value if value >= 0 else self._local_epoch

    def _shard_sizes(self) -> list[int]:
        return [s.samples for s in self.reader.shards]

    def _epoch_samples(self) -> int:
        """Samples in an epoch: the dataset's, or a mixture's ``epoch_size``."""
        return sum(self._mix[1]) if self._mix is not None else len(self.reader)

    def __len__(self) -> int:
        """Samples this rank yields in a full epoch (the same on every rank)."""
        self._capture_dist()
        where = self._placement()
        n = self._epoch_samples()
        return n // where.world if self.partial == "drop" else -(-n // where.world)

    # -- state --------------------------------------------------------------------------------
    def state_dict(self, samples_seen: int | None = None) -> dict:
        """Where the epoch stands.

        * ``samples_seen=k`` (any DataLoader, called in the training process): this rank has
          consumed its first ``k`` samples of the current epoch.  Loadable with any world size
          and worker count; with the same world size the rest comes in the same order.
        * no argument, inside the iterating process (what ``StatefulDataLoader`` does in each
          worker): this worker's own position."""
        base = {"version": STATE_VERSION, "num_samples": self._epoch_samples(), "seed": self.seed,
                "shuffle": self.shuffle, "partial": self.partial, "block_size": self.block_size,
                "shuffle_window": self.shuffle_window, "shard_affinity": self.shard_affinity}
        if self._mix is not None:  # sources' sizes and shares: the order depends on them
            base["mix"] = [[sum(sizes), count] for sizes, count in zip(*self._mix, strict=True)]
            base["mix_order"] = partition.MIX_ORDER_VERSION
        epoch, history = self._current()
        if samples_seen is not None:
            self._capture_dist()
            where = self._placement()
            return {**base, "epoch": epoch,
                    "history": history + [[where.world, self._seen(samples_seen)]],
                    "worker": None}
        running = self._running
        if running is None or running.epoch != epoch:  # not iterating: what would run next
            worker = self._resume.get("worker") if self._resume else None
            return {**base, "epoch": epoch, "history": history, "worker": worker}
        return {**base, "epoch": epoch, "history": history,
                "worker": {"world": running.world, "rank": running.rank,
                           "num_workers": running.num_workers, "worker": running.worker,
                           "batch_size": self.batch_size, "yielded": running.yielded.value}}

    def _seen(self, samples_seen) -> int:
        """``samples_seen`` as an int, refused where no rank could have seen that many (a
        state saved from it could not be loaded)."""
        try:
            if isinstance(samples_seen, bool):
                raise TypeError
            seen = operator.index(samples_seen)
        except TypeError:
            raise ValueError(f"samples_seen must be an integer, found "
                             f"{_short(samples_seen)}") from None
        if not 0 <= seen <= len(self):
            raise ValueError(f"samples_seen={seen:,}: this rank's share of an epoch holds 0 to "
                             f"{len(self):,} samples")
        return seen

    def _current(self) -> tuple[int, list]:
        """(epoch, resume history) of the epoch running or about to run in this process."""
        epoch = self.epoch
        if self._running is not None and self._running.epoch == epoch:
            return epoch, [list(h) for h in self._running.history]
        if self._resume is not None and self._resume["epoch"] == epoch:
            return epoch, [list(h) for h in self._resume["history"]]
        return epoch, []

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration yields exactly what the saved epoch had left.  A state
        that cannot belong to this dataset (wrong types, negative or impossible counts, a
        history longer than any run makes) is refused in one line before anything is computed
        from it."""
        if not isinstance(state, dict):
            raise ValueError(f"a ShardDataset state is a dict, found {type(state).__name__}")
        # versions 1 and 2 shuffled blocks and windows from other random draws (3: one key
        # per span and window, so a process computes its own share alone); unshuffled orders
        # are the same in all of them
        shuffle = state.get("shuffle")  # (a value of another type: refused below)
        unshuffled = isinstance(shuffle, (bool, int, np.integer, type(None))) and not shuffle
        version = state.get("version")
        if not _same(version, STATE_VERSION) and not (_is_int(version) and version in (1, 2)
                                                      and unshuffled):
            why = ("states of order versions 1 and 2 resume only unshuffled epochs: do not load "
                   "this one; start the epoch from its beginning, or finish it with the shardpack "
                   "that saved it") if _is_int(version) and version in (1, 2) else \
                "saved by another shardpack (or not a ShardDataset state)"
            raise ValueError(f"unsupported state version: expected {STATE_VERSION}, found "
                             f"{_short(version)}: {why}")
        _check_state(state, self._epoch_samples())
        mix = None if self._mix is None else \
            [[sum(sizes), count] for sizes, count in zip(*self._mix, strict=True)]
        if not _same(state.get("mix"), mix):
            raise ValueError(f"state was saved with mixture {_short(state.get('mix'))} "
                             f"([samples, per epoch] of each source), this dataset has "
                             f"{_short(mix)}: resume needs the same sources and shares")
        # mixed epochs have their own order version (single datasets' orders did not change);
        # a state from before it (no "mix_order": version 1) loads where its epochs are the same
        mix_version = state.get("mix_order", 1)
        if mix is not None and (not _is_int(mix_version) or
                                partition.mix_order_changed(mix, not unshuffled, mix_version)):
            raise ValueError(f"unsupported mixture order version: expected "
                             f"{partition.MIX_ORDER_VERSION}, found {_short(mix_version)}: its "
                             "epochs read a downsampled source in another order; do not load this "
                             "state: start the epoch from its beginning, or finish it with the "
                             "shardpack that saved it")
        for key in ("num_samples", "seed", "shuffle", "partial", "block_size", "shuffle_window",
                    "shard_affinity"):
            mine = self._epoch_samples() if key == "num_samples" else getattr(self, key)
            saved = state.get(key, False)  # (states from before shard_affinity: False)
            if not _same(saved, mine):
                raise ValueError(f"state was saved with {key}={_short(saved)}, this dataset has "
                                 f"{mine!r}: resume needs the same dataset and order settings"
                                 + (f" (pass shard_affinity={_short(saved)})"
                                    if key == "shard_affinity" else ""))
        self._resume = {"epoch": state["epoch"], "history": [list(h) for h in state["history"]],
                        "worker": state.get("worker")}
        self._epoch.value = state["epoch"]

    # -- iteration ----------------------------------------------------------------------------
    def _share(self, where, epoch: int, history) -> partition.Share:
        if self._mix is not None:
            # a mixture is split by position in its epoch (a sample of an upsampled source
            # comes several times), then positions become the samples there
            ids = partition.mix_order(self._mix[0], self._mix[1], seed=self.seed, epoch=epoch,
                                      shuffle=self.shuffle, block_size=self.block_size,
                                      window=self.shuffle_window)
            order = np.arange(len(ids), dtype=np.int64)
            share = partition.resume_sequences(order, history, where.world,
                                               self.partial)[where.rank]
            share = partition.worker_split(share, where.num_workers, where.worker,
                                           self.batch_size)
            return partition.Share(ids[share.ids], share.repeat, share.dropped)
        # this worker's share only: its cost follows the share, not the epoch (docs/scale.md);
        # with shard affinity the order is cut for the world size the epoch started with
        spans = (history[0][0] if history else where.world) if self.shard_affinity else 1
        return partition.share(self._shard_sizes(), seed=self.seed, epoch=epoch,
                               world=where.world, rank=where.rank,
                               num_workers=where.num_workers, worker=where.worker,
                               batch_size=self.batch_size, partial=self.partial,
                               shuffle=self.shuffle, block_size=self.block_size,
                               window=self.shuffle_window, spans=spans,
                               history=[tuple(h) for h in history])

    def __iter__(self) -> Iterator[dict]:
        """One pass, as stages: order (this process's share of the epoch, and where it
        resumes), prefetch (fetching ahead, for remote data), gather (batches or samples),
        decode and transform (applied where the items are made: :meth:`_finish`)."""
        settle_worker()
        self.reader.revalidate()  # shards changed since the last epoch are mapped again
        position, share = self._begin()
        skip = position.yielded.value
        fetcher = NOTHING
        try:
            if self.reader.prefetch > 0:  # cold cache: the rank's first batch by ranged reads
                self._fast_start_batch(position, share.ids[skip:skip + self.batch_size])
            fetcher = self._prefetcher(share, skip, position.num_workers)
            gather = self._batches if self.batched else self._samples
            yield from gather(share, skip, position, fetcher=fetcher)
        finally:
            fetcher.close()
            self.reader.drop_pieces()

    @property
    def slot_pool(self) -> SlotPool | None:
        """The batch buffers the DataLoader workers reuse (batched only; None where none
        could be mapped)."""
        return self._pool

    def _begin(self) -> tuple["Position", partition.Share]:
        """The order stage: this process's place (epoch, resume, rank, worker) and its share of
        the epoch; stateful decode and transform stages are told the epoch."""
        where = self._placement()
        if int(self._epoch.value) < 0 and self._running is not None:
            self._local_epoch += 1  # no set_epoch(): each new pass in this process moves on
        epoch = self.epoch
        resume, self._resume = self._resume, None
        if resume is not None and resume["epoch"] != epoch:
            resume = None  # saved for another epoch: set_epoch() moved past it
        history = resume["history"] if resume else []
        skip = 0
        saved = resume.get("worker") if resume else None
        if saved is not None:
            same = (saved["world"], saved["rank"], saved["num_workers"], saved["worker"],
                    saved["batch_size"]) == (where.world, where.rank, where.num_workers,
                                             where.worker, self.batch_size)
            if not same:
                raise ShardpackError(
                    f"a worker-level state (world {saved['world']}, {saved['num_workers']} "
                    f"workers) can only resume the same layout, not world {where.world} with "
                    f"{where.num_workers} workers",
                    hint="for elastic resume save ds.state_dict(samples_seen=k) instead")
            skip = saved["yielded"]
        share = self._share(where, epoch, history)
        self._running = Position(epoch, tuple(tuple(h) for h in history), where.world,
                                 where.rank, where.num_workers, where.worker, Counter(skip))
        self.stats["dropped"] = share.dropped
        for stage in (self.decode, self.transform):
            if hasattr(stage, "begin"):  # stateful stages (random crops) follow the epoch
                stage.begin(epoch)
            elif hasattr(stage, "epoch"):
                stage.epoch = epoch
        return self._running, share

    def _finish(self, item):
        """The decode and transform stages, on a batch or a sample."""
        if self.decode is not None:
            item = self.decode(item)
        if self.transform is not None:
            item = self.transform(item)
        return item

    def _fast_start_batch(self, where, ids) -> None:
        """Remote data with a cache, cold: fetch the samples ``ids`` of this pass's first batch
        with ranged reads, before this process's whole-shard downloads start.  With DataLoader
        workers only worker 0 does (its batch is the loader's first); the others read whole
        shards from their first batch on (docs/remote.md, "Fast start")."""
        if where.num_workers > 1 and where.worker != 0:
            return
        try:
            self.stats["fast_start_requests"] += self.reader.fetch_pieces(ids)
        except ShardpackError:  # only a shortcut: the usual path reports the error
            self.reader.drop_pieces()

    def _prefetcher(self, share: partition.Share, skip: int, num_workers: int):
        """For remote data: a background fetcher over the shards (or chunks) this share reads
        from position ``skip`` on, each once, in order of first need.  It keeps on hand or on
        the way what the current batch needs and, when shuffling, what this worker's part of
        the next shuffle window needs (a window is read in a burst, from many shards), then
        ``prefetch`` units more.  Samples the fast start fetched as pieces (the first batch)
        need nothing more.  A do-nothing one for local data."""
        reader, access = self.reader, self.reader.access
        if not access.prefetches or reader.prefetch <= 0:
            return NOTHING
        served = self.batch_size if reader.has_pieces else 0
        shards, rows = reader.locate_many(share.ids[skip + served:])
        if not len(shards):
            return NOTHING
        keys = access.unit_keys(shards, rows)
        distinct, needs = np.unique(keys, return_index=True)
        order = np.argsort(needs, kind="stable")
        distinct, needs = distinct[order], needs[order] + served
        if access.all_cached(distinct.tolist()):
            return NOTHING  # a warm epoch starts no thread (a cached shard's turn just
            #                      marks it recently used, which keeps it from eviction)
        units = [access.unit(k) for k in distinct.tolist()]
        # what the mode fetches ahead of the current batch: with a cache, this worker's part
        # of the next shuffle window (read in a burst); chunks in memory stay one window
        ahead = access.ahead(self.shuffle_window // max(1, num_workers)) if self.shuffle else 0
        return reader.prefetcher(units, needs, ahead)

    def _batches(self, share: partition.Share, skip: int, running: "Position",
                 fetcher=NOTHING) -> Iterator[dict]:
        """Whole batches, gathered straight into (shared-memory) tensors: the fast path."""
        from shardpack.loader.batches import collate
        from shardpack.loader.gather import Gatherer
        from shardpack.loader.torchenv import get_worker_info

        shared = get_worker_info() is not None
        size = self.batch_size
        gatherer = Gatherer(self.reader, share.ids, size, self.fields, shared, self._pool)
        for start in range(skip, len(share), size):
            part = share[start:start + size]
            if not self.reader.has_pieces:  # (pieces: the fast start's batch goes out first)
                fetcher.reading(start + len(part) - skip)
            batch = None
            try:
                if not self.reader.has_pieces:  # else: the fast start's pieces, sample by sample
                    batch = gatherer.batch(start, start + len(part), part.repeat)
            except ShardpackError:
                if self.on_error == "raise":
                    raise
            if batch is None:  # remote, compressed, or a bad sample to skip: sample by sample
                inner = dataclasses.replace(running, yielded=Counter(0))
                samples = list(self._samples(part, 0, inner, raw=True))
                self.reader.drop_pieces()  # the fast start serves one batch only
                if not samples:
                    running.yielded.value = start + len(part)
                    continue
                batch = collate(samples, self._pool if shared else None)
            else:
                self.stats["yielded"] += len(part)
                self.stats["repeats"] += int(part.repeat.sum())
            running.yielded.value = start + len(part)
            # the epoch travels with the batch: GPU crops in the training process follow it
            batch["__epoch__"] = torch.full((len(batch["__index__"]),), running.epoch,
                                            dtype=torch.int64)
            if self._mix is not None:
                batch["__source__"] = torch.from_numpy(
                    self.reader.source_of(batch["__index__"].numpy()))
            batch = self._finish(batch)
            if not fetcher.started:  # the fast start's batch is made:
                fetcher.reading(min(len(share), start + len(part) + size) - skip)  # downloads
            yield batch                                  # start before it goes out

    def _samples(self, share: partition.Share, skip: int, running: "Position",
                 raw: bool = False, fetcher=NOTHING) -> Iterator[dict]:
        reader = self.reader
        ids = share.ids[skip:]
        repeats = share.repeat[skip:]
        shards, rows = reader.locate_many(ids)
        fields = self.fields
        for pos, (gid, shard, row, rep) in enumerate(zip(ids.tolist(), shards.tolist(),
                                                         rows.tolist(), repeats.tolist(),
                                                         strict=True)):
            running.yielded.value += 1
            if pos == self.batch_size:
                reader.drop_pieces()  # the fast start serves the first batch only
            if (pos % 64 == 0 or not fetcher.started) and not reader.has_pieces:
                fetcher.reading(pos + 64)
            try:
                sample = reader.read(shard, row, views=raw)  # (raw: copied into a batch)
                if raw:  # collate parses labels: a bad one is this sample's error, skippable
                    _check_labels(sample, reader, shard, row)
            except ShardpackError as exc:
                if self.on_error == "raise":
                    raise
                self.stats["skipped"] += 1
                warnings.warn(f"shardpack: skipped a bad sample ({exc}); "
                              f"{self.stats['skipped']} skipped so far", stacklevel=2)
                continue
            if fields is not None:
                sample = {k: v for k, v in sample.items() if k == "__key__" or k in fields}
            sample["__index__"] = gid
            sample["__repeat__"] = rep
            if self._mix is not None:
                sample["__source__"] = int(self.reader.source_of([gid])[0])
            self.stats["repeats"] += rep
            if not raw:
                sample = self._finish(sample)
            self.stats["yielded"] += 1
            yield sample


def _check_sources(reader: "MixReader", decode, fields) -> None:
    """Each source of a mixture has what the decode stage and ``fields`` need: one line naming
    the source otherwise."""
    from shardpack.images.content import is_image_field

    from shardpack.loader.batches import LABEL_FIELDS

    wanted = getattr(decode, "field", False)  # False: the stage reads no image field
    for i, (source, own) in enumerate(zip(reader.sources, reader.readers, strict=True)):
        have = [f for f in own.fields if fields is None or f in fields]
        if wanted is None and not any(is_image_field(f) for f in have):
            raise ValueError(f"source {i} ({source.path}) has no image field (fields: "
                             f"{', '.join(have)}), which decode needs")
        if wanted and wanted not in have:
            raise ValueError(f"source {i} ({source.path}) has no field {wanted!r} (fields: "
                             f"{', '.join(have)}), which decode needs")
        for label in LABEL_FIELDS:  # a label is a number in every sample or in none
            used = fields is None or label in fields
            if used and label in reader.fields and label not in own.fields:
                raise ValueError(f"source {i} ({source.path}) has no label field {label!r}, "
                                 f"which other sources have: pass fields=[...] without "
                                 f"{label!r}, or mix sources that all have it")


class Counter:
    """A count that a frozen :class:`Position` carries and the reading loop moves on."""

    __slots__ = ("value",)

    def __init__(self, value: int = 0):
        self.value = value


@dataclasses.dataclass(frozen=True)
class Position:
    """Where this process's iteration is: the epoch, its resume history, the placement (rank
    and DataLoader worker), and how many of its share's samples it has yielded (the one part
    that moves, a :class:`Counter`).  ``state_dict()`` reads it."""

    epoch: int
    history: tuple
    world: int
    rank: int
    num_workers: int
    worker: int
    yielded: Counter


MAX_RESUMES = 10_000  # steps a resume history may hold: one per resume within one epoch
MAX_WORLD = 1 << 18   # ranks a saved step or worker position may name (262,144 processes)
# A step after which the world size changes re-cuts what is left of the epoch for every rank,
# at a cost that follows the ranks and the ranges cut so far (partition._resumed, about 1-3 us
# each): a history may cost this many such units, a few seconds at most, where real elastic runs
# (a 100,000-rank job resized five times: 1.5 million) stay under it
MAX_RESUME_WORK = 1 << 21


def _check_state(state: dict, samples: int) -> None:
    """Refuse a state that cannot belong to a dataset of ``samples`` samples an epoch: wrong
    types, a negative epoch or count, more samples seen than a rank's share holds, a history
    longer than any run makes.  O(len(history)), at most MAX_RESUMES steps, and checked before
    anything loops over it, so a crafted state (a history of 10^9 steps) fails at once."""
    def bad(what: str) -> ValueError:
        return ValueError(f"not a state of this dataset ({samples:,} samples an epoch): {what}")

    for key in ("epoch", "history"):
        if key not in state:
            raise bad(f"it has no {key!r}")
    epoch, history = state["epoch"], state["history"]
    if not _is_int(epoch) or not 0 <= epoch < 1 << 63:
        raise bad(f"epoch must be an integer >= 0, found {_short(epoch)}")
    if not isinstance(history, (list, tuple)):
        raise bad(f"history must be a list of [world, samples_seen] steps, found "
                  f"{type(history).__name__}")
    if len(history) > MAX_RESUMES:
        raise bad(f"its history has {len(history):,} resume steps, more than the "
                  f"{MAX_RESUMES:,} one epoch may record")
    _check_history(history, samples, bad)
    _check_worker(state.get("worker"), samples, bad)


def _check_history(history: list, samples: int, bad) -> None:
    """Each step ``[world, samples_seen]``: integers, a world of 1 to MAX_WORLD ranks, and no
    more samples seen since the world size last changed than a rank's share holds; the work of
    resuming it bounded by MAX_RESUME_WORK."""
    run_world, run_seen, ranges, work = None, 0, 1, 0

    def recut(world: int) -> None:  # the steps of ``world`` ranks end: the rest is cut anew
        nonlocal ranges, work
        work += ranges + world
        ranges = min(ranges + world, samples + world)  # consumed samples cut the ranges
        if work > MAX_RESUME_WORK:
            raise bad(f"its history changes the world size so often, on so many ranks, that "
                      f"resuming it would cut the epoch {work:,} times over (at most "
                      f"{MAX_RESUME_WORK:,})")

    for i, step in enumerate(history):
        if not isinstance(step, (list, tuple)) or len(step) != 2 or \
                not all(_is_int(v) for v in step):
            raise bad(f"history step {i} must be [world, samples_seen] integers, found "
                      f"{_short(step)}")
        world, seen = int(step[0]), int(step[1])
        if not 1 <= world <= MAX_WORLD:
            raise bad(f"history step {i} has world size {world:,} (1 to {MAX_WORLD:,})")
        if world != run_world:
            if run_world is not None:
                recut(run_world)
            run_world, run_seen = world, 0
        run_seen += seen
        share = -(-samples // world)  # the most samples one rank's share of an epoch holds
        if seen < 0 or run_seen > share:
            raise bad(f"history step {i} says each of {world:,} ranks saw {seen:,} samples"
                      + (f" ({run_seen:,} since the world size last changed)"
                         if run_seen != seen else "")
                      + f"; a rank's share holds 0 to {share:,}")
    if run_world is not None:
        recut(run_world)  # the world it resumes on may differ too


def _check_worker(saved, samples: int, bad) -> None:
    """A worker-level position (``state_dict()`` inside a DataLoader worker), or None."""
    if saved is None:
        return
    names = ("world", "rank", "num_workers", "worker", "batch_size", "yielded")
    if not isinstance(saved, dict) or any(not _is_int(saved.get(n)) for n in names):
        raise bad(f"worker must be null or {{{', '.join(names)}: integers}}, found "
                  f"{_short(saved)}")
    world, rank, workers, worker, batch, yielded = (int(saved[n]) for n in names)
    if not (1 <= world <= MAX_WORLD and 0 <= rank < world and 1 <= workers <= MAX_WORLD
            and 0 <= worker < workers and batch >= 1 and 0 <= yielded <= samples):
        raise bad(f"worker position {_short(saved)} is not a place in an epoch of this "
                  f"dataset")


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _same(saved, mine) -> bool:
    """``saved == mine``, False where the comparison is not a plain truth value (an array)."""
    try:
        return bool(saved == mine)
    except (TypeError, ValueError):
        return False


def _short(value) -> str:
    """``repr(value)``, cut short: a state's values can be anything."""
    import reprlib

    shown = reprlib.Repr()
    shown.maxstring = shown.maxother = 80
    shown.maxlist = shown.maxtuple = shown.maxdict = 6
    return shown.repr(value)


def _check_labels(sample: dict, reader: DatasetReader, shard: int, row: int) -> None:
    from shardpack.loader.batches import LABEL_FIELDS, label_value
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


class MapDataset:
    """Map-style access to a packed dataset: ``ds[i]`` and ``ds.get(key)``, one ranged read (or
    memory-map slice) per sample.  Works as a map-style dataset for ``DataLoader``."""

    def __init__(self, path, *, decode: Callable | None = None,
                 storage_options: dict | None = None, trust_storage: bool = False,
                 check: str | None = None):
        """``check``: as :class:`ShardDataset`'s (every read by default)."""
        self.reader = DatasetReader(path, storage_options, trust_storage=trust_storage,
                                    check=check)
        self.decode = decode
        self._keys: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, i: int) -> dict:
        if i < 0:
            i += len(self)
        sample = self.reader.read_sample(i)
        sample["__index__"] = i
        return self.decode(sample) if self.decode else sample

    def index_of(self, key: str) -> int:
        if self._keys is None:  # built on first use: one dict over all keys
            keys: dict[str, int] = {}
            for shard in range(len(self.reader.shards)):
                base = int(self.reader.offsets[shard])
                for row, k in enumerate(self.reader.index(shard).keys()):
                    keys[k] = base + row
            self._keys = keys
        try:
            return self._keys[key]
        except KeyError:
            raise KeyError(f"no sample with key {key!r} in {self.reader.storage.url}") from None

    def get(self, key: str) -> dict:
        return self[self.index_of(key)]


def open_dataset(path, **kwargs) -> MapDataset:
    return MapDataset(path, **kwargs)
