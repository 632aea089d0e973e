"""Order and partition as pure functions: no I/O, no torch, no global state.

An epoch's order is a function of (shard sizes, seed, epoch); each rank's share a function of that
order and (world, rank, partial policy); each DataLoader worker's share a function of the rank's
share and (num_workers, worker, batch_size).  Tests call these directly to prove exact-once without
running a loader.

* ``epoch_order``: shards are cut into blocks of ``block_size`` consecutive samples; blocks are
  shuffled; then samples are shuffled inside consecutive windows of ``window`` samples.  Reads stay
  within a few blocks at a time (bounded memory, mostly sequential), while a batch still mixes
  samples from ``window / block_size`` different places of the dataset.
* ``rank_split``: contiguous, equal-length chunks of the order, one per rank.  ``partial="pad"``
  (default) repeats the first samples of the order to fill the last ranks, flagged as repeats;
  ``partial="drop"`` drops the remainder.  Every rank yields exactly the same number of samples,
  so no rank runs dry at epoch end and nobody hangs in a collective.
* ``worker_split``: the rank's sequence in batches of ``batch_size``; batch ``b`` goes to worker
  ``b % num_workers``.  A DataLoader polls workers round-robin, so its output is the rank's
  sequence in order, which is what makes "consumed k samples" a prefix and resume exact.
* ``resume_sequences``: the per-rank sequences left after ``history`` (a list of
  ``(world, consumed_per_rank)`` steps), for any new world size: each remaining sample exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

PARTIAL_POLICIES = ("pad", "drop")


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


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([int(k) & 0xFFFF_FFFF_FFFF_FFFF for k in key])


def epoch_order(shard_sizes: Sequence[int], *, seed: int = 0, epoch: int = 0,
                shuffle: bool = True, block_size: int = 256, window: int = 4096,
                spans: int = 1, partial: str = "pad") -> np.ndarray:
    """The global sample order of one epoch (int64 ids, a permutation of range(N)).

    ``spans`` > 1 (shard affinity: ``spans`` = the world size): the shards are shuffled and laid
    end to end, that sequence is cut where :func:`rank_split` will cut the order (``partial``
    decides where), and blocks and windows are shuffled inside each span only.  Rank r then
    reads the shards of its own span (and at most the two it shares with its neighbours, plus
    the few padding repeats), so a job of W ranks fetches the dataset about once an epoch, not
    W times.  ``spans == 1`` shuffles blocks across the whole dataset."""
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    total = int(sizes.sum())
    if not shuffle or total == 0:
        return np.arange(total, dtype=np.int64)
    if block_size < 1 or window < 1 or spans < 1:
        raise ValueError(f"block_size, window and spans must be >= 1, got {block_size}, "
                         f"{window}, {spans}")
    rng = _rng(seed, epoch, 0x5348)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    if spans == 1:
        return _shuffled(starts, sizes, rng, block_size, window)
    # shards in a random order, then runs of consecutive ids cut at the span boundaries
    perm = rng.permutation(len(sizes))
    run_starts, run_sizes = starts[perm], sizes[perm]
    per = -(-total // spans) if partial == "pad" else total // spans
    cuts = [min(total, per * k) for k in range(1, spans)] if per else []
    order = np.empty(total, dtype=np.int64)
    ends = np.cumsum(run_sizes)
    lo = 0
    for hi in cuts + [total]:
        if hi > lo:  # the runs (pieces of shards) between sequence positions lo and hi
            first = int(np.searchsorted(ends, lo, side="right"))
            last = int(np.searchsorted(ends, hi, side="left"))
            piece_starts = run_starts[first:last + 1].copy()
            piece_sizes = run_sizes[first:last + 1].copy()
            head = lo - (int(ends[first - 1]) if first else 0)  # samples of the first run
            piece_starts[0] += head                           # before this span
            piece_sizes[0] -= head
            piece_sizes[-1] -= int(ends[last]) - hi if last < len(ends) else 0
            keep = piece_sizes > 0
            order[lo:hi] = _shuffled(piece_starts[keep], piece_sizes[keep], rng, block_size,
                                     window)
        lo = hi
    return order


def _shuffled(starts: np.ndarray, sizes: np.ndarray, rng, block_size: int,
              window: int) -> np.ndarray:
    """Ids of the runs ``starts[i] .. starts[i] + sizes[i]``, cut into blocks (never across
    runs), blocks permuted, then each window of ``window`` shuffled on its own."""
    total = int(sizes.sum())
    block_starts = np.concatenate([s + np.arange(0, n, block_size)
                                   for s, n in zip(starts, sizes, strict=True) if n > 0])
    block_ends = np.minimum(block_starts + block_size,
                            np.repeat(starts + sizes, [-(-n // block_size) for n in sizes]))
    perm = rng.permutation(len(block_starts))
    lengths = (block_ends - block_starts)[perm]
    firsts = block_starts[perm]
    # expand blocks to sample ids without a Python loop
    offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    order = np.repeat(firsts, lengths) + offsets
    if window > 1:  # each window shuffled on its own (cheaper than sorting random keys)
        full = total // window * window
        order[:full] = rng.permuted(order[:full].reshape(-1, window), axis=1).ravel()
        order[full:] = rng.permutation(order[full:])
    return order


def rank_split(order: np.ndarray, world: int, rank: int, partial: str = "pad",
               repeat: np.ndarray | None = None) -> Share:
    """Rank ``rank``'s contiguous, equal-length share of ``order``."""
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
    """Batches ``worker, worker + num_workers, ...`` of the rank's share."""
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


# -- mixtures (docs/mixing.md) ---------------------------------------------------------------------

def allot(sizes: Sequence[int], weights: Sequence[float | None], fixed: Sequence[int | None],
          epoch_size: int | None = None) -> list[int]:
    """Samples each source gives to one epoch of a mixture.

    Sources with a ``fixed`` count (``Source(repeat=...)`` / ``Source(samples=...)``) take it;
    the rest of ``epoch_size`` (default: the fixed counts plus the other sources' sizes) is shared
    by ``weights``, rounded by largest remainder (ties to the lower source), so the counts add up
    to ``epoch_size`` exactly and each is within 1 of its share."""
    n = len(sizes)
    if not (len(weights) == len(fixed) == n):
        raise ValueError("sizes, weights and fixed must have one entry per source")
    counts = [int(f) if f is not None else 0 for f in fixed]
    free = [i for i in range(n) if fixed[i] is None]
    if epoch_size is None:
        epoch_size = sum(counts) + sum(int(sizes[i]) for i in free)
    rest = epoch_size - sum(counts)
    if rest < 0:
        raise ValueError(f"epoch_size {epoch_size} is smaller than the fixed sources' "
                         f"{sum(counts)} samples")
    w = np.array([1.0 if weights[i] is None else float(weights[i]) for i in free])
    if rest and (not free or w.sum() <= 0):
        raise ValueError(f"epoch_size {epoch_size} leaves {rest} samples but no source has a "
                         "weight to take them")
    if free and rest:
        share = rest * w / w.sum()
        base = np.floor(share).astype(np.int64)
        left = rest - int(base.sum())
        order = np.lexsort((np.arange(len(free)), -(share - base)))  # largest remainder first
        base[order[:left]] += 1
        for i, c in zip(free, base.tolist(), strict=True):
            counts[i] = c
    for i in range(n):
        if counts[i] and not sizes[i]:
            raise ValueError(f"source {i} is empty but the epoch wants {counts[i]} samples of it")
    return counts


def mix_order(source_sizes: Sequence[Sequence[int]], counts: Sequence[int], *, seed: int = 0,
              epoch: int = 0, shuffle: bool = True, block_size: int = 256,
              window: int = 4096) -> np.ndarray:
    """One epoch of a mixture: mixture-global sample ids (source offset + the source's own id),
    ``sum(counts)`` of them, in order.

    Each source is read as an endless stream of passes, pass ``p`` being the source's own
    :func:`epoch_order` for ``p`` (a new order each pass; unshuffled: in order); epoch ``e``
    takes positions ``e * c .. (e + 1) * c`` of it (``c = counts[s]``).  So a downsampled source
    shows new samples each epoch until every one was seen once, and an upsampled one repeats
    whole passes, each in a new order.  The sources are interleaved in proportion: the k-th
    sample of a source goes at fraction ``(k + u) / c`` of the epoch (``u`` uniform in [0, 1)
    with shuffle, 0.5 without), so any stretch of the order holds each source within 3 of its
    share (tests/test_mix.py)."""
    offsets = np.concatenate([[0], np.cumsum([int(np.sum(s)) for s in source_sizes])])
    ids, keys = [], []
    for s, (sizes, c) in enumerate(zip(source_sizes, counts, strict=True)):
        n = int(np.sum(sizes))
        if c == 0:
            continue
        start, stop = epoch * c, (epoch + 1) * c
        parts = []
        for p in range(start // n, (stop - 1) // n + 1):
            order = epoch_order(sizes, seed=_source_seed(seed, s), epoch=p, shuffle=shuffle,
                                block_size=block_size, window=window)
            lo, hi = max(start, p * n) - p * n, min(stop, (p + 1) * n) - p * n
            parts.append(order[lo:hi])
        ids.append(np.concatenate(parts) + offsets[s])
        u = _rng(seed, epoch, s, 0x4D49).random(c) if shuffle else np.full(c, 0.5)
        keys.append((np.arange(c) + u) / c)
    if not ids:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(ids)[np.argsort(np.concatenate(keys), kind="stable")]


def _source_seed(seed: int, source: int) -> int:
    return int(_rng(seed, source, 0x5352).integers(1 << 62))
