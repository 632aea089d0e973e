"""Reader -> partition -> samples: the PyTorch datasets.

``ShardDataset`` is an ``IterableDataset`` with exact-once epochs under DDP, a deterministic block +
window shuffle, and resumable state; ``open_dataset`` gives map-style random access (``ds[i]``,
``ds.get(key)``).  Which sample comes where is :class:`~shardpack.order.spec.Order`'s (pure
functions in :mod:`shardpack.order`); this module only reads what it says, lazily, in whichever
process iterates.  What is read (one dataset or a mixture) is opened by
:mod:`shardpack.loader.sources`; remote data is fetched ahead by :mod:`shardpack.loader.fetching`.
"""

from __future__ import annotations

import operator
from typing import Callable, Iterator, NamedTuple, Sequence

from shardpack.core.deprecation import renamed
from shardpack.core.errors import ShardpackError
from shardpack.loader.buffers import SlotPool
from shardpack.loader.counters import StageTable
from shardpack.loader.execution import RANK_WIDE, execution_of
from shardpack.loader.mapdataset import MapDataset, open_dataset
from shardpack.loader.pipeline import DATASET_STAGES, MapStage, Outlet, Stats
from shardpack.loader.position import Counter, Position
from shardpack.loader.readstages import OrderStage, ReadStage
from shardpack.loader.runtime import current, placement, settle_worker
from shardpack.loader.shared import SharedInt
from shardpack.loader.sources import (
    check_fields, describe, identity, is_mixture, open_reader, read_burst,
)
from shardpack.loader.stages import tell_epoch
from shardpack.loader.torchenv import IterableDataset, dist
from shardpack.order import partition
from shardpack.order.mixing import check_saved_mix, mix_state, mix_summary
from shardpack.order.spec import STATE_VERSION, Order, check_version, saved_unshuffled
from shardpack.order.state import check_dataset, check_position, same, short

__all__ = ["STATE_VERSION", "Counter", "MapDataset", "Pass", "Position", "ShardDataset",
           "open_dataset"]


class Pass(NamedTuple):
    """A pass as opened (:meth:`ShardDataset.open_pass`): its epoch, its resume history, and
    the worker-level state it resumes (None: none)."""

    epoch: int
    history: tuple
    worker: dict | None


class _OrderField:
    """A read-only ShardDataset attribute that is a field of its :class:`Order`."""

    def __init__(self, field: str):
        self.field = field

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj.order, self.field)

    def __set__(self, obj, value) -> None:
        raise AttributeError(f"{self.name} is part of the dataset's order: pass "
                             f"ShardDataset({self.name}=...)")


class ShardDataset(IterableDataset):
    """Stream a packed dataset into a DataLoader.

    Each rank yields ``len(ds)`` samples per epoch, the same for every rank.  Samples are dicts:
    ``__key__`` (str), ``__index__`` (int, global sample id), ``__repeat__`` (bool, True for a
    padding repeat) and one entry per field: ``bytes``, or whatever ``decode`` makes of them.
    Batches (``batched=True``) also carry ``__epoch__``, the epoch they were read in.

    Pass ``batch_size`` equal to the DataLoader's: workers then take whole batches round-robin, the
    loader's output is this rank's sequence in order, and ``state_dict(samples_seen=k)`` can resume
    from any plain DataLoader.  With ``torchdata``'s ``StatefulDataLoader`` the loader's own
    ``state_dict()`` carries each worker's position.  The order's settings are one frozen
    :class:`~shardpack.order.spec.Order`, ``ds.order``; ``seed``, ``shuffle``, ``partial``,
    ``block_size``, ``shuffle_window`` and ``shard_affinity`` read it.

    Mapped shards are stat-ed at each epoch's start and their size before each use, whatever
    ``check`` says: a shard changed in place is mapped again, or refused in one line.

    Args:
        path: a packed dataset (a folder or a URL), or a list of them (or of
            :class:`~shardpack.Source`) read as one mixture (docs/mixing.md).
        shuffle: shuffle each epoch (blocks of a shard, then windows); False: stored order.
        seed: the order's seed: a (seed, epoch) gives the same order in any process.
        fields: the fields to read (None: all of them).
        decode: the decode stage: a callable applied to each sample (each batch with
            ``batched=True``) where it is read, e.g. :class:`~shardpack.CpuDecode`.  A stage
            with ``begin(epoch)`` (:class:`~shardpack.loader.stages.EpochAware`) is told the
            epoch at each iteration start.
        transform: a callable applied after ``decode``, the same way.
        batch_size: the DataLoader's batch size (workers take whole batches); needed with
            ``batched=True``.
        partial: ``"pad"`` (repeat the first samples so every rank yields as many) or ``"drop"``
            (drop the remainder) when an epoch does not split evenly over the ranks.
        block_size: consecutive samples of a shard the shuffle keeps together.
        shuffle_window: positions shuffled together after the blocks are.
        on_error: ``"raise"`` or ``"skip"`` a sample that cannot be read (counted in
            ``stats["skipped"]``, with a warning).
        rank: the DDP rank (None: ``torch.distributed``, else ``RANK``, else 0).
        world_size: the DDP world size (None: ``torch.distributed``, else ``WORLD_SIZE``, else 1).
        batched: yield whole batches gathered straight into tensors (with
            ``DataLoader(batch_size=None)``).
        storage_options: fsspec options for remote data.
        cache_dir: where remote shards are cached (None: ranged reads of chunks into memory).
        cache_limit: the cache's size limit (``"50GB"``).
        prefetch_shards: for remote data, the shards (chunks without a cache) each reading
            process fetches ahead of the current batch; 0: none.  ``prefetch=`` is its old,
            deprecated name.
        trust_storage: the same as ``check="none"``.
        shard_affinity: each rank shuffles within its own span of shuffled shards, so a job
            fetches the dataset about once an epoch, not once per rank (docs/scale.md); always
            off for a mixture.
        slot_pool: the batch buffers ``batched=True`` workers reuse (default: one made here).
        weights: a mixture's shares (None: each source by its size).
        epoch_size: a mixture's samples an epoch (None: the sum of its sources' shares).
        check: how often a sample is checked against its index hash (docs/reading.md,
            "Integrity"): ``"every"`` read (the default); ``"once"`` the first time a process
            reads it from a copy of its shard (then missed: bytes changed with no trace in the
            file's stat, and a cached copy changed in place); ``"none"`` for storage you trust.
        execution: who runs the pipeline (docs/reading.md, "Threads or processes"):
            ``"processes"`` (the default), the process that iterates, a DataLoader worker
            process usually; ``"threads"``, ``workers`` threads of the training process,
            iterated directly or through ``DataLoader(ds, batch_size=None, num_workers=0)``:
            the same samples, order and crops as as many DataLoader workers.
        workers: worker threads for ``execution="threads"`` (None: one per CPU).

    ``ds.stats["skipped"]`` and the other named counts are as ever; ``ds.stats()`` is the
    per-stage table (stage -> ``items``, ``busy_s``, ``wait_in_s``, ``wait_out_s``), summed over
    every worker, threads or processes.
    """

    seed = _OrderField("seed")
    shuffle = _OrderField("shuffle")
    partial = _OrderField("partial")
    block_size = _OrderField("block_size")
    shuffle_window = _OrderField("window")
    shard_affinity = _OrderField("affinity")

    @renamed(prefetch="prefetch_shards")
    def __init__(self, path, *, shuffle: bool = True, seed: int = 0,
                 fields: Sequence[str] | None = None, decode: Callable | None = None,
                 transform: Callable | None = None, batch_size: int | None = None,
                 partial: str = "pad", block_size: int = 256, shuffle_window: int = 4096,
                 on_error: str = "raise", rank: int | None = None, world_size: int | None = None,
                 batched: bool = False, storage_options: dict | None = None,
                 cache_dir=None, cache_limit="50GB", prefetch_shards: int = 2,
                 trust_storage: bool = False, shard_affinity: bool = True,
                 slot_pool: SlotPool | None = None, weights: Sequence[float] | None = None,
                 epoch_size: int | None = None, check: str | None = None,
                 execution: str = "processes", workers: int | None = None):
        super().__init__()
        self._execution = execution_of(execution, workers)
        # every rank reads every source of a mixture (docs/mixing.md): no shard affinity
        self.order = Order(seed=seed, shuffle=shuffle, block_size=block_size,
                           window=shuffle_window, partial=partial,
                           affinity=shard_affinity and not is_mixture(path))
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.reader, self._mix = open_reader(
            path, weights=weights, epoch_size=epoch_size, storage_options=storage_options,
            cache_dir=cache_dir, cache_limit=cache_limit, prefetch=prefetch_shards,
            trust_storage=trust_storage, burst=read_burst(self.order), check=check)
        check_fields(self.reader, fields, decode)
        self.path = describe(path, self.reader)
        self.fields = tuple(fields) if fields else None
        self.decode, self.transform = decode, transform
        self.batch_size = batch_size or 1
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
        # batch buffers the workers reuse (shardpack.loader.buffers): made here (or given),
        # before the DataLoader forks them; anonymous, so it lives exactly as long as the
        # processes holding it
        if slot_pool is not None and not batched:
            raise ValueError("slot_pool is for batched=True (batches travel through its slots)")
        if slot_pool is not None and self._execution.threads:
            raise ValueError("slot_pool is for execution='processes': worker threads hand "
                             "batches over in memory")
        # (worker threads hand batches over in this process's memory: no pool)
        self._pool = (slot_pool or SlotPool.create()) if batched and \
            not self._execution.threads else None
        if self._pool is not None:  # keys travel from workers as sample ids, looked up here
            self._pool.serve_keys(self.reader)
        self._local_epoch = 0   # epochs started in this process, used until set_epoch is called
        self._resume: dict | None = None
        self._running: Position | None = None  # the iteration running in this process, if any
        # every worker's per-stage counters, in a page the workers share (counters.py)
        self._table = StageTable(DATASET_STAGES)
        self.stats = Stats(self._table, {"yielded": 0, "skipped": 0, "repeats": 0,
                                         "dropped": 0, "fast_start_requests": 0})

    @property
    def execution(self) -> str:
        """Who runs the pipeline: ``"processes"`` or ``"threads"``."""
        return self._execution.name

    @property
    def workers(self) -> int | None:
        """Worker threads of ``execution="threads"`` (None with processes)."""
        return self._execution.threads or None

    @property
    def is_mixture(self) -> bool:
        """Whether the dataset reads a mixture of sources."""
        return self._mix is not None

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

    def placement_now(self):
        """Where this process reads from (rank, world; worker as the caller runs)."""
        self._capture_dist()
        return self._placement()

    def mark_running(self, position: Position) -> None:
        """The pass that runs in this process now (its state is :meth:`state_dict`'s).

        Args:
            position: the pass's position: one worker's, or a thread execution's whole
                rank's (worker RANK_WIDE, counting what its consumer received).
        """
        self._running = position

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
        """The epoch the next (or the running) iteration reads: set_epoch's, else the passes
        this process has started."""
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
        """Where the epoch stands: the order's state form (:meth:`Order.state`), the samples an
        epoch holds (and a mixture's sources and shares), the dataset's identity (a mixture's:
        each source's; :attr:`Manifest.identity <shardpack.format.manifest.Manifest.identity>`),
        the epoch, its resume history and, inside a DataLoader worker, that worker's position.

        Args:
            samples_seen: ``k`` (any DataLoader, called in the training process): this rank has
                consumed its first ``k`` samples of the current epoch; loadable with any world
                size and worker count, and with the same world size the rest comes in the same
                order.  None, inside the iterating process (what ``StatefulDataLoader`` does in
                each worker): this worker's own position.
        """
        order = self.order.state()
        base = {"version": order.pop("version"), "num_samples": self._epoch_samples(),
                "dataset": identity(self.reader, self.path)[0], **order}
        if self._mix is not None:  # sources' sizes and shares: the order depends on them
            base.update(mix_state(*self._mix))
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
        if running.worker == RANK_WIDE:  # a thread execution's pass: what the consumer got
            return self.state_dict(samples_seen=running.yielded.value)
        return self.position_state(running)


    def _seen(self, samples_seen) -> int:
        """``samples_seen`` as an int, refused where no rank could have seen that many (a
        state saved from it could not be loaded)."""
        try:
            if isinstance(samples_seen, bool):
                raise TypeError
            seen = operator.index(samples_seen)
        except TypeError:
            raise ValueError(f"samples_seen must be an integer, found "
                             f"{short(samples_seen)}") from None
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
        that cannot belong to this dataset (another order version or settings, another dataset
        identity, the same samples packed otherwise included, wrong types, negative or
        impossible counts, a history longer than any run makes) is refused in one line before
        anything is computed from it; one saved without an identity loads, with a warning.

        Args:
            state: what :meth:`state_dict` returned (also through JSON), of this or an earlier
                shardpack: order versions 1 and 2 load for unshuffled epochs only.
        """
        if not isinstance(state, dict):
            raise ValueError(f"a ShardDataset state is a dict, found {type(state).__name__}")
        check_version(state)
        samples = self._epoch_samples()
        check_position(state, samples)
        mix = None if self._mix is None else mix_summary(*self._mix)
        check_saved_mix(state, mix, shuffled=not saved_unshuffled(state))
        saved = state.get("num_samples", False)
        if not same(saved, samples):
            raise ValueError(f"state was saved with num_samples={short(saved)}, this dataset "
                             f"has {samples!r}: resume needs the same dataset and order settings")
        check_dataset(state, *identity(self.reader, self.path))
        self.order.check_saved(state)
        self._resume = {"epoch": state["epoch"], "history": [list(h) for h in state["history"]],
                        "worker": state.get("worker")}
        self._epoch.value = state["epoch"]

    # -- iteration ----------------------------------------------------------------------------
    def _share(self, where, epoch: int, history) -> partition.Share:
        """This worker's share of the epoch only: its cost follows the share, not the epoch
        (docs/scale.md); with shard affinity the order is cut for the world size the epoch
        started with (:meth:`Order.spans`)."""
        where_kw = dict(world=where.world, rank=where.rank, num_workers=where.num_workers,
                        worker=where.worker, batch_size=self.batch_size,
                        history=[tuple(h) for h in history])
        if self._mix is not None:
            return partition.mix_share(*self._mix, self.order, epoch, **where_kw)
        return partition.share(self._shard_sizes(), self.order, epoch, **where_kw)

    def __iter__(self) -> Iterator[dict]:
        """One pass of this rank's share (of this worker's, in a DataLoader worker), run by the
        dataset's execution: in the iterating process, or on its worker threads."""
        return self._execution.run(self)

    def pipeline(self, opened: "Pass | None" = None):
        """The pass's chain of stages (docs/reading.md, "The pipeline"), its last stage:
        order -> read -> decode -> transform (those the dataset has).

        Args:
            opened: the pass, where an execution opened it for several workers (None: the
                chain opens it when reset).
        """
        order = OrderStage(self)
        order.opened = opened
        last = ReadStage(self, order)
        for name, fn in (("decode", self.decode), ("transform", self.transform)):
            if fn is not None:  # (a stage with nothing to do is left out: not even counted)
                last = MapStage(name, fn, last)
        return last

    def run_pipeline(self, opened: "Pass | None" = None, parts: bool = False) -> Iterator:
        """One pass of the chain in the calling thread (where it runs is
        :func:`~shardpack.loader.runtime.current`'s).

        Args:
            opened: the pass, opened by the execution for all its workers (None: here).
            parts: yield ``(item, positions it moved)``, a part's samples as one
                (:meth:`Outlet.parts`).
        """
        settle_worker()
        if opened is None:
            self.reader.revalidate()  # shards changed since the last epoch are mapped again
        last = self.pipeline(opened)
        outlet = None
        try:
            last.reset()
            outlet = Outlet(last, self._table, current().worker)
            yield from outlet.parts() if parts else outlet
        finally:
            if outlet is not None:
                outlet.flush()
            last.close()

    @property
    def slot_pool(self) -> SlotPool | None:
        """The batch buffers the DataLoader workers reuse (batched only; None where none
        could be mapped)."""
        return self._pool

    def open_pass(self) -> "Pass":
        """Open a pass, once per pass in the process that iterates (for all its worker threads
        at once): its epoch (moved on when no ``set_epoch`` says otherwise) and what
        ``load_state_dict`` left to resume."""
        if int(self._epoch.value) < 0 and self._running is not None:
            self._local_epoch += 1  # no set_epoch(): each new pass in this process moves on
        epoch = self.epoch
        resume, self._resume = self._resume, None
        if resume is not None and resume["epoch"] != epoch:
            resume = None  # saved for another epoch: set_epoch() moved past it
        history = tuple(tuple(h) for h in resume["history"]) if resume else ()
        return Pass(epoch, history, resume.get("worker") if resume else None)

    def begin_pass(self, opened: "Pass") -> tuple[Position, partition.Share]:
        """The order stage's start, in the worker that runs it: its place (rank, worker, where
        a saved worker-level state resumes) and its share of the pass; stateful decode and
        transform stages are told the epoch.

        Args:
            opened: the pass (:meth:`open_pass`).
        """
        where = self._placement()
        skip = 0
        saved = opened.worker
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
        share = self._share(where, opened.epoch, opened.history)
        position = Position(opened.epoch, opened.history, where.world, where.rank,
                            where.num_workers, where.worker, Counter(skip))
        if not current().thread:
            self._running = position
        self.stats["dropped"] = share.dropped
        for stage in (self.decode, self.transform):  # stages with random crops follow it
            tell_epoch(stage, opened.epoch)
        return position, share

    def position_state(self, position: Position) -> dict:
        """The worker-level state of a worker at ``position`` (what a DataLoader worker's
        ``state_dict()`` returns).

        Args:
            position: the worker's position.
        """
        order = self.order.state()
        return {"version": order.pop("version"), "num_samples": self._epoch_samples(),
                "dataset": identity(self.reader, self.path)[0], **order,
                **(mix_state(*self._mix) if self._mix is not None else {}),
                "epoch": position.epoch, "history": [list(h) for h in position.history],
                "worker": {"world": position.world, "rank": position.rank,
                           "num_workers": position.num_workers, "worker": position.worker,
                           "batch_size": self.batch_size, "yielded": position.yielded.value}}
