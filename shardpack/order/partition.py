"""Partition as pure functions: no I/O, no torch, no global state.

An epoch's order (:mod:`.epoch`) is a function of (shard sizes, :class:`~.spec.Order`, epoch);
each rank's share a function of that order and (world, rank, partial policy); each DataLoader
worker's share a function of the rank's share and (num_workers, worker, batch_size).  Tests call
these directly to prove exact-once without running a loader.

* ``rank_split``: contiguous, equal-length chunks of the order, one per rank.  ``partial="pad"``
  (default) repeats the first samples of the order to fill the last ranks, flagged as repeats;
  ``partial="drop"`` drops the remainder.  Every rank yields exactly the same number of samples,
  so no rank runs dry at epoch end and nobody hangs in a collective.
* ``worker_split``: the rank's sequence in batches of ``batch_size``; batch ``b`` goes to worker
  ``b % num_workers``.  A DataLoader polls workers round-robin, so its output is the rank's
  sequence in order, which is what makes "consumed k samples" a prefix and resume exact.
* ``resume_sequences``: the per-rank sequences left after ``history`` (a list of
  ``(world, consumed_per_rank)`` steps), for any new world size: each remaining sample exactly once.
* ``share`` / ``mix_share``: one process's share of a dataset's / a mixture's epoch, at a cost
  that follows the share.

The epoch order (:mod:`.epoch`), the mixtures (:mod:`.mixing`) and the :class:`~.spec.Order`
value are importable from here too: this module is the order package's one namespace.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .epoch import EpochOrder, epoch_order
from .mixing import MIX_ORDER_VERSION, allot, mix_order, mix_order_changed, source_seed
from .spec import PARTIAL_POLICIES, Order

__all__ = ["MIX_ORDER_VERSION", "PARTIAL_POLICIES", "EpochOrder", "Order", "Share", "allot",
           "epoch_order", "mix_order", "mix_order_changed", "mix_share",
           "rank_split", "resume_sequences", "share", "source_seed", "worker_split"]



@dataclass(frozen=True)
class Share:
    """One rank's (or worker's) samples: global sample ids and a flag for padding repeats."""

    ids: np.ndarray      # int64 global sample indices, in yield order
    repeat: np.ndarray   # bool, True where the sample repeats one given elsewhere (padding)
    dropped: int = 0     # samples of the epoch dropped by partial="drop" (same for every rank)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, item) -> "Share":
        return Share(self.ids[item], self.repeat[item], self.dropped)


def rank_split(order: np.ndarray, world: int, rank: int, partial: str = "pad",
               repeat: np.ndarray | None = None) -> Share:
    """Rank ``rank``'s contiguous, equal-length share of ``order``.

    Args:
        order: the epoch's sample ids (or positions), in order.
        world: ranks.
        rank: the rank whose share this is.
        partial: ``"pad"`` (repeat the first samples to fill the last ranks) or ``"drop"``.
        repeat: flags of samples that already are repeats (default: none).
    """
    if partial not in PARTIAL_POLICIES:
        raise ValueError(f"partial must be one of {PARTIAL_POLICIES}, got {partial!r}")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} out of range for world size {world}")
    n = len(order)
    if repeat is None:
        repeat = np.zeros(n, dtype=bool)
    if partial == "drop":
        per = n // world
        dropped = n - per * world
    else:
        per = -(-n // world)
        dropped = 0
        missing = per * world - n
        if missing:
            fill = np.resize(np.arange(n), missing) if n else np.zeros(0, dtype=np.int64)
            order = np.concatenate([order, order[fill]])
            repeat = np.concatenate([repeat, np.ones(missing, dtype=bool)])
    return Share(order[rank * per:(rank + 1) * per], repeat[rank * per:(rank + 1) * per], dropped)


def worker_split(share: Share, num_workers: int, worker: int, batch_size: int = 1) -> Share:
    """Batches ``worker, worker + num_workers, ...`` of the rank's share.

    Args:
        share: the rank's share.
        num_workers: DataLoader workers of the rank (1 or less: the whole share).
        worker: this worker's id.
        batch_size: samples per batch.
    """
    if num_workers <= 1:
        return share
    if not 0 <= worker < num_workers:
        raise ValueError(f"worker {worker} out of range for {num_workers} workers")
    batch_size = max(1, batch_size)
    positions = np.arange(len(share))
    mine = (positions // batch_size) % num_workers == worker
    return share[mine]


def resume_sequences(order: np.ndarray, history: Sequence[tuple[int, int]], world: int,
                     partial: str = "pad") -> list[Share]:
    """Per-rank shares for ``world`` ranks after the steps in ``history``.

    Each step ``(w, k)`` means: the epoch ran on ``w`` ranks, each of which consumed the first
    ``k`` samples of its share.  With the same world size as the last step, each rank continues
    its own share where it stopped (same order as without the interruption).  With another world
    size, the samples nobody consumed (padding repeats aside) are re-split, in order."""
    shares = [rank_split(order, world if not history else history[0][0], r, partial)
              for r in range(world if not history else history[0][0])]
    for i, (w, k) in enumerate(history):
        if len(shares) != w:
            raise ValueError(f"resume history step {i} has world {w}, but {len(shares)} shares")
        rest = [s[k:] for s in shares]
        next_world = history[i + 1][0] if i + 1 < len(history) else world
        if next_world == w:
            shares = rest
            continue
        consumed = np.concatenate([s.ids[:k] for s in shares]) if k else np.zeros(0, np.int64)
        ids = np.concatenate([s.ids[~s.repeat] for s in rest])
        ids = ids[~np.isin(ids, consumed)]
        ids = ids[np.sort(np.unique(ids, return_index=True)[1])]  # first occurrence, in order
        shares = [rank_split(ids, next_world, r, partial) for r in range(next_world)]
    return shares


# -- one process's share, without the whole epoch --------------------------------------------------

def share(shard_sizes: Sequence[int], order: Order, epoch: int = 0, *, world: int = 1,
          rank: int = 0, num_workers: int = 1, worker: int = 0, batch_size: int = 1,
          history: Sequence[tuple[int, int]] = ()) -> Share:
    """This DataLoader worker's samples of the epoch: what
    ``worker_split(resume_sequences(epoch_order(...), history, world, partial)[rank], ...)``
    gives, at a cost that follows the share, not the epoch.

    The rank, resume and worker steps work on ranges of order positions (a rank's share is a
    range; a resume at another world size concatenates what each rank had left and cuts it
    again; a worker takes every ``num_workers``-th batch): O(world x resume steps) ranges, then
    O(this worker's samples) positions.  Only those positions become sample ids
    (:meth:`EpochOrder.at`): their windows' permutations and the block table of the spans they
    fall in.

    Args:
        shard_sizes: samples in each shard, in dataset order.
        order: the order's settings (:class:`Order`); with shard affinity the order is cut into
            one span per rank of the world size the epoch started with (:meth:`Order.spans`).
        epoch: the epoch.
        world: ranks reading now.
        rank: this process's rank.
        num_workers: DataLoader workers of this rank (1: none).
        worker: this worker's id.
        batch_size: samples per batch; workers take whole batches round-robin.
        history: the epoch's resume steps so far, ``[(world, samples_seen_per_rank), ...]``.
    """
    n = int(np.sum(np.asarray(shard_sizes, dtype=np.int64)))
    mine, dropped = _resumed(n, history, world, order.partial, rank)
    if num_workers > 1:
        if not 0 <= worker < num_workers:
            raise ValueError(f"worker {worker} out of range for {num_workers} workers")
        mine = _every_nth_batch(mine, num_workers, worker, max(1, batch_size))
    positions, repeat = _expand(mine)
    whole = EpochOrder(shard_sizes, seed=order.seed, epoch=epoch, shuffle=order.shuffle,
                       block_size=order.block_size, window=order.window,
                       spans=order.spans(world, history), partial=order.partial)
    return Share(whole.at(positions), repeat, dropped)


def mix_share(source_sizes: Sequence[Sequence[int]], counts: Sequence[int], order: Order,
              epoch: int = 0, *, world: int = 1, rank: int = 0, num_workers: int = 1,
              worker: int = 0, batch_size: int = 1,
              history: Sequence[tuple[int, int]] = ()) -> Share:
    """This DataLoader worker's samples of a mixture's epoch (mixture-global ids): the epoch's
    positions are split as :func:`share` splits a dataset's (a sample of an upsampled source
    comes several times, so positions, not ids, are split), then become the samples there
    (:func:`mix_order`).

    Args:
        source_sizes: each source's shard sizes.
        counts: samples each source gives an epoch (:func:`allot`).
        order: the order's settings (shard affinity does not apply to mixtures).
        epoch: the epoch.
        world: ranks reading now.
        rank: this process's rank.
        num_workers: DataLoader workers of this rank (1: none).
        worker: this worker's id.
        batch_size: samples per batch; workers take whole batches round-robin.
        history: the epoch's resume steps so far, ``[(world, samples_seen_per_rank), ...]``.
    """
    ids = mix_order(source_sizes, counts, seed=order.seed, epoch=epoch, shuffle=order.shuffle,
                    block_size=order.block_size, window=order.window)
    positions = np.arange(len(ids), dtype=np.int64)
    mine = resume_sequences(positions, history, world, order.partial)[rank]
    mine = worker_split(mine, num_workers, worker, batch_size)
    return Share(ids[mine.ids], mine.repeat, mine.dropped)


# A sequence of order positions as ranges: a list of (start, stop, repeat) with 0 <= start < stop
# <= n; "repeat" marks padding (positions served a second time).  Slices use the cumulative
# lengths (bisect), so a rank or a batch costs O(log ranges + its own ranges).

@dataclass(frozen=True)
class _Layout:
    """A sequence cut for ``world`` ranks: the padded sequence, its cumulative lengths, the
    samples per rank, and those dropped."""

    seq: list
    cum: list
    per: int
    dropped: int

    def part(self, lo: int, hi: int) -> list:
        return _slice(self.seq, self.cum, lo, hi)


def _cumulative(seq: list) -> list:
    out, total = [0], 0
    for a, b, _ in seq:
        total += b - a
        out.append(total)
    return out


def _slice(seq: list, cum: list, lo: int, hi: int) -> list:
    out = []
    i = max(0, bisect.bisect_right(cum, lo) - 1)
    while i < len(seq) and cum[i] < hi:
        a, b, rep = seq[i]
        s, e = max(lo, cum[i]), min(hi, cum[i + 1])
        if s < e:
            out.append((a + s - cum[i], a + e - cum[i], rep))
        i += 1
    return out


def _layout(seq: list, world: int, partial: str) -> _Layout:
    """rank_split's cut of a range sequence, for every rank at once."""
    cum = _cumulative(seq)
    total = cum[-1]
    if partial == "drop":
        return _Layout(seq, cum, total // world, total - total // world * world)
    per = -(-total // world)
    missing = per * world - total
    if missing and total:  # padding: the sequence's first samples again, flagged
        fill = []
        while missing > 0:
            take = min(missing, total)
            fill += [(a, b, True) for a, b, _ in _slice(seq, cum, 0, take)]
            missing -= take
        seq = seq + fill
        cum = _cumulative(seq)
    return _Layout(seq, cum, per, 0)


def _minus(seq: list, taken: list) -> list:
    """``seq`` without the positions of the ranges ``taken`` (sorted, merged)."""
    out = []
    starts = [a for a, _ in taken]
    for a, b, rep in seq:
        cur = a
        i = max(bisect.bisect_right(starts, cur) - 1, 0)
        while cur < b and i < len(taken):
            ta, tb = taken[i]
            if tb <= cur:
                i += 1
                continue
            if ta >= b:
                break
            if ta > cur:
                out.append((cur, ta, rep))
            cur = max(cur, tb)
            i += 1
        if cur < b:
            out.append((cur, b, rep))
    return out


def _merged(ranges: list) -> list:
    out: list = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _resumed(n: int, history: Sequence[tuple[int, int]], world: int, partial: str,
             rank: int) -> tuple[list, int]:
    """``rank``'s ranges after ``history`` (resume_sequences on ranges) and the samples dropped.
    Each step costs O(world x log ranges + ranges): the ranks are slices of one layout."""
    first = history[0][0] if history else world
    layout = _layout([(0, n, False)] if n else [], first, partial)
    ranks, done = first, 0  # every rank has consumed its first `done` samples of the layout
    for i, (w, k) in enumerate(history):
        if ranks != w:
            raise ValueError(f"resume history step {i} has world {w}, but {ranks} shares")
        next_world = history[i + 1][0] if i + 1 < len(history) else world
        if next_world == w:
            done += k
            continue
        per = layout.per
        consumed = _merged([(a, b) for r in range(w)
                            for a, b, _ in layout.part(r * per + done,
                                                       min((r + 1) * per, r * per + done + k))])
        left = [piece for r in range(w)
                for piece in layout.part(r * per + min(per, done + k), (r + 1) * per)
                if not piece[2]]
        layout = _layout(_minus(left, consumed), next_world, partial)
        ranks, done = next_world, 0
    if not 0 <= rank < ranks:
        raise ValueError(f"rank {rank} out of range for world size {world}")
    per = layout.per
    return layout.part(rank * per + min(per, done), (rank + 1) * per), layout.dropped


def _every_nth_batch(seq: list, num_workers: int, worker: int, batch_size: int) -> list:
    cum = _cumulative(seq)
    out = []
    for lo in range(worker * batch_size, cum[-1], num_workers * batch_size):
        out += _slice(seq, cum, lo, lo + batch_size)
    return out


def _expand(seq: list) -> tuple[np.ndarray, np.ndarray]:
    if not seq:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    starts = np.array([a for a, _, _ in seq], dtype=np.int64)
    lengths = np.array([b - a for a, b, _ in seq], dtype=np.int64)
    reps = np.array([r for _, _, r in seq], dtype=bool)
    offsets = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(lengths) - lengths, lengths)
    return np.repeat(starts, lengths) + offsets, np.repeat(reps, lengths)

