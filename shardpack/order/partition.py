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

import bisect
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
    """The global sample order of one epoch (int64 ids, a permutation of range(N)): the whole
    of :class:`EpochOrder`.  The loader never builds it (each process computes its own
    :func:`share`); it is the reference the tests hold ``share`` to.

    ``spans`` > 1 (shard affinity: ``spans`` = the world size): the shards are shuffled and laid
    end to end, that sequence is cut where :func:`rank_split` will cut the order (``partial``
    decides where), and blocks and windows are shuffled inside each span only.  Rank r then
    reads the shards of its own span (and at most the two it shares with its neighbours, plus
    the few padding repeats), so a job of W ranks fetches the dataset about once an epoch, not
    W times.  ``spans == 1`` shuffles blocks across the whole dataset."""
    order = EpochOrder(shard_sizes, seed=seed, epoch=epoch, shuffle=shuffle,
                       block_size=block_size, window=window, spans=spans, partial=partial)
    return order.at(np.arange(order.n, dtype=np.int64))


class EpochOrder:
    """An epoch's order, computed at the positions asked for, not as a whole.

    Shards are cut into blocks of ``block_size`` consecutive samples (never across shards); with
    ``spans`` > 1 the shards are first shuffled and laid end to end and the sequence cut into
    spans (see :func:`epoch_order`).  In each span the blocks are permuted, and the span is cut
    into windows of ``window`` positions, each shuffled on its own.  Every random draw has its own
    key (seed, epoch, span, window): the order at a position needs that position's window's
    permutation and the span's block permutation, nothing else.  So a process pays for the
    windows it reads (O(window) each) and for one block table of its spans (N / block_size
    entries at most), not for N."""

    def __init__(self, shard_sizes: Sequence[int], *, seed: int = 0, epoch: int = 0,
                 shuffle: bool = True, block_size: int = 256, window: int = 4096,
                 spans: int = 1, partial: str = "pad"):
        sizes = np.asarray(shard_sizes, dtype=np.int64)
        self.n = int(sizes.sum())
        self.seed, self.epoch, self.window, self.block_size = seed, epoch, window, block_size
        self.shuffled = bool(shuffle) and self.n > 0
        if not self.shuffled:
            return
        if block_size < 1 or window < 1 or spans < 1:
            raise ValueError(f"block_size, window and spans must be >= 1, got {block_size}, "
                             f"{window}, {spans}")
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        if spans == 1:
            self.cuts = np.array([0, self.n], dtype=np.int64)
            self.runs = [(starts, sizes)]
        else:  # shards in a random order, then runs of consecutive ids cut at the span ends
            perm = _rng(seed, epoch, 0x5348).permutation(len(sizes))
            per = -(-self.n // spans) if partial == "pad" else self.n // spans
            self.cuts = np.array([0] + [min(self.n, per * k) for k in range(1, spans)]
                                 + [self.n], dtype=np.int64)
            self.runs = _cut_runs(starts[perm], sizes[perm], self.cuts)
        self._blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _span_blocks(self, span: int) -> tuple[np.ndarray, np.ndarray]:
        """(first id of each block, cumulative lengths) in the span's permuted block order."""
        cached = self._blocks.get(span)
        if cached is None:
            starts, sizes = self.runs[span]
            keep = sizes > 0
            starts, sizes = starts[keep], sizes[keep]
            bs = self.block_size
            counts = -(-sizes // bs)
            first = np.repeat(starts, counts) + bs * (np.arange(int(counts.sum()))
                                                      - np.repeat(np.cumsum(counts) - counts,
                                                                  counts))
            lengths = np.minimum(bs, np.repeat(starts + sizes, counts) - first)
            perm = _rng(self.seed, self.epoch, 0x424C, span).permutation(len(first))
            cached = self._blocks[span] = (first[perm], np.cumsum(lengths[perm]))
        return cached

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The sample ids at ``positions`` of the order (int64, any order, repeats allowed)."""
        positions = np.asarray(positions, dtype=np.int64)
        if not self.shuffled:
            return positions.copy()
        out = np.empty(len(positions), dtype=np.int64)
        span = np.searchsorted(self.cuts, positions, side="right") - 1
        for k, sel in _groups(span):
            rel = positions[sel] - self.cuts[k]
            size = int(self.cuts[k + 1] - self.cuts[k])
            pre = self._unshuffle_windows(k, rel, size)
            first, cum = self._span_blocks(k)
            block = np.searchsorted(cum, pre, side="right")
            out[sel] = first[block] + pre - np.where(block > 0, cum[block - 1], 0)
        return out

    def _unshuffle_windows(self, span: int, rel: np.ndarray, size: int) -> np.ndarray:
        """Where each position of the span was before its window was shuffled."""
        w = self.window
        if w <= 1:
            return rel
        pre = np.empty_like(rel)
        for win, idx in _groups(rel // w):
            length = min(w, size - win * w)
            perm = _rng(self.seed, self.epoch, 0x5749, span, win).permutation(length)
            pre[idx] = win * w + perm[rel[idx] - win * w]
        return pre


def _groups(values: np.ndarray):
    """(value, the indices holding it) for each distinct value, in one sort."""
    if not len(values):
        return
    if values[0] == values[-1] and (values == values[0]).all():
        yield int(values[0]), np.arange(len(values))
        return
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    heads = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    for lo, hi in zip(heads.tolist(), heads[1:].tolist() + [len(order)], strict=True):
        yield int(ordered[lo]), order[lo:hi]


def _cut_runs(run_starts: np.ndarray, run_sizes: np.ndarray,
              cuts: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """The runs (pieces of shards, in order) between each pair of sequence positions ``cuts``."""
    ends = np.cumsum(run_sizes)
    out = []
    for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        if hi <= lo:
            out.append((np.zeros(0, np.int64), np.zeros(0, np.int64)))
            continue
        first = int(np.searchsorted(ends, lo, side="right"))
        last = int(np.searchsorted(ends, hi, side="left"))
        piece_starts = run_starts[first:last + 1].copy()
        piece_sizes = run_sizes[first:last + 1].copy()
        head = lo - (int(ends[first - 1]) if first else 0)  # samples of the first run before
        piece_starts[0] += head                             # this span
        piece_sizes[0] -= head
        piece_sizes[-1] -= int(ends[last]) - hi if last < len(ends) else 0
        out.append((piece_starts, piece_sizes))
    return out


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


# -- one process's share, without the whole epoch --------------------------------------------------

def share(shard_sizes: Sequence[int], *, seed: int = 0, epoch: int = 0, world: int = 1,
          rank: int = 0, num_workers: int = 1, worker: int = 0, batch_size: int = 1,
          partial: str = "pad", shuffle: bool = True, block_size: int = 256,
          window: int = 4096, spans: int = 1,
          history: Sequence[tuple[int, int]] = ()) -> Share:
    """This DataLoader worker's samples of the epoch: what
    ``worker_split(resume_sequences(epoch_order(...), history, world, partial)[rank], ...)``
    gives, at a cost that follows the share, not the epoch.

    The rank, resume and worker steps work on ranges of order positions (a rank's share is a
    range; a resume at another world size concatenates what each rank had left and cuts it
    again; a worker takes every ``num_workers``-th batch): O(world x resume steps) ranges, then
    O(this worker's samples) positions.  Only those positions become sample ids
    (:meth:`EpochOrder.at`): their windows' permutations and the block table of the spans they
    fall in.  ``spans`` as for :func:`epoch_order` (shard affinity: the world size the epoch
    started with)."""
    if partial not in PARTIAL_POLICIES:
        raise ValueError(f"partial must be one of {PARTIAL_POLICIES}, got {partial!r}")
    n = int(np.sum(np.asarray(shard_sizes, dtype=np.int64)))
    mine, dropped = _resumed(n, history, world, partial, rank)
    if num_workers > 1:
        if not 0 <= worker < num_workers:
            raise ValueError(f"worker {worker} out of range for {num_workers} workers")
        mine = _every_nth_batch(mine, num_workers, worker, max(1, batch_size))
    positions, repeat = _expand(mine)
    order = EpochOrder(shard_sizes, seed=seed, epoch=epoch, shuffle=shuffle,
                       block_size=block_size, window=window, spans=spans, partial=partial)
    return Share(order.at(positions), repeat, dropped)


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


# -- mixtures (docs/mixing.md) ---------------------------------------------------------------------

def allot(sizes: Sequence[int], weights: Sequence[float | None], fixed: Sequence[int | None],
          epoch_size: int | None = None) -> list[int]:
    """Samples each source gives to one epoch of a mixture.

    Sources with a ``fixed`` count (``Source(repeat=...)`` / ``Source(samples=...)``) take it;
    the rest of ``epoch_size`` (default: the fixed counts plus the other sources' sizes) is shared
    by ``weights`` (none given: by the sources' sizes), rounded by largest remainder (ties to
    the lower source), so the counts add up to ``epoch_size`` exactly and each is within 1 of
    its share."""
    n = len(sizes)
    if not (len(weights) == len(fixed) == n):
        raise ValueError("sizes, weights and fixed must have one entry per source")
    counts = [int(f) if f is not None else 0 for f in fixed]
    free = [i for i in range(n) if fixed[i] is None]
    if epoch_size is not None and (not isinstance(epoch_size, (int, np.integer)) or
                                   epoch_size < 0):
        raise ValueError(f"epoch_size must be a whole number >= 0, got {epoch_size!r}")
    if epoch_size is None:
        epoch_size = sum(counts) + sum(int(sizes[i]) for i in free)
    rest = epoch_size - sum(counts)
    if rest < 0:
        raise ValueError(f"epoch_size {epoch_size} is smaller than the fixed sources' "
                         f"{sum(counts)} samples")
    given = [weights[i] is not None for i in free]
    if any(given) and not all(given):
        raise ValueError("some sources have a weight and others none: give every source "
                         "without a fixed count a weight (or none of them: each once)")
    # no weights at all: each source by its size, so an epoch takes each sample once
    w = np.array([float(sizes[i]) if weights[i] is None else float(weights[i]) for i in free])
    if not np.all(np.isfinite(w)):
        raise ValueError(f"weights must be finite, got {[weights[i] for i in free]}")
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

    Each source is read as an endless stream of passes, each pass a permutation of the source
    (:class:`_Passes`); epoch ``e`` takes positions ``e * c .. (e + 1) * c`` of it
    (``c = counts[s]``).  So a downsampled source shows distinct samples in each epoch and new
    ones each epoch until every one was seen once, and an upsampled one repeats whole passes,
    each in a new order.  The sources are interleaved in proportion: the k-th sample of a source
    goes at fraction ``(k + u) / c`` of the epoch (``u`` uniform in [0, 1) with shuffle, 0.5
    without), so any stretch of the order holds each source within 3 of its share
    (tests/test_mix.py)."""
    offsets = np.concatenate([[0], np.cumsum([int(np.sum(s)) for s in source_sizes])])
    ids, keys = [], []
    for s, (sizes, c) in enumerate(zip(source_sizes, counts, strict=True)):
        if c == 0:
            continue
        passes = _Passes(sizes, c, seed=_source_seed(seed, s), shuffle=shuffle,
                         block_size=block_size, window=window)
        ids.append(passes.epoch(int(epoch)) + offsets[s])
        u = _rng(seed, epoch, s, 0x4D49).random(c) if shuffle else np.full(c, 0.5)
        keys.append((np.arange(c) + u) / c)
    if not ids:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(ids)[np.argsort(np.concatenate(keys), kind="stable")]


# Mixed epochs before the passes of a downsampled source were rearranged read pass p as the
# source's own epoch_order for p: version 1.  States record the version their epochs came from.
MIX_ORDER_VERSION = 2


def mix_order_changed(mix: Sequence[Sequence[int]], shuffle: bool, version: int) -> bool:
    """Whether a mixture's epochs (``mix``: [samples, per epoch] of each source) differ between
    mix order ``version`` and this one: version 1 differs only for a shuffled source that an
    epoch reads across a pass boundary without whole passes (0 < count < size, not a divisor);
    an unknown version, always."""
    if version == MIX_ORDER_VERSION:
        return False
    if version != 1:
        return True
    return bool(shuffle) and any(0 < c < n and n % c for n, c in mix)


class _Passes:
    """One source of a mixture as an endless stream of passes: epoch ``e`` takes stream
    positions ``e * c .. (e + 1) * c``, and pass ``p`` (positions ``p * n .. (p + 1) * n``) is a
    permutation of the source (docs/mixing.md, "Where an epoch spans two passes").

    Pass p starts from the source's own order for p (:func:`epoch_order`, its *base* order).
    Where an epoch holds the end of pass p - 1 (``r = p * n % c`` samples, its *tail*) and the
    start of pass p (``c - r``, its *head*), the two must not share a sample, so a shuffled
    downsampled source's pass is rearranged:

    * pass p holds a whole epoch after its head (``r + n - c >= c``, always when c <= n / 2):
      the previous tail's members are moved, in base order, to just before pass p's own tail.
      Its own tail stays base order, so the next pass needs one pass of look-back.
    * it does not (only when c > n / 2): the pass is a head and a tail only, so its head must
      lie inside the previous pass's head and the heads of such a run of passes nest.  The
      run starts after a pass b of the first kind (or one that starts with an epoch); the heads
      are the first ``c - r`` members of pass b + 1's base order not in b's tail, each pass
      ordering its head and then its tail by its own base order.  The run's start is
      arithmetic, so a pass costs O(n) whatever the run's length.

    Unshuffled (every base order the same) and with ``c >= n`` the base orders are kept."""

    def __init__(self, sizes: Sequence[int], count: int, *, seed: int, shuffle: bool,
                 block_size: int, window: int):
        self.sizes, self.n, self.c = sizes, int(np.sum(sizes)), int(count)
        self.d = self.n - self.c  # what each pass holds beyond one epoch
        self._kw = dict(seed=seed, shuffle=shuffle, block_size=block_size, window=window)
        self._rearrange = bool(shuffle) and 0 < self.c < self.n
        self._base: dict[int, np.ndarray] = {}

    def epoch(self, e: int) -> np.ndarray:
        n, start, stop = self.n, e * self.c, (e + 1) * self.c
        parts = []
        for p in range(start // n, (stop - 1) // n + 1):
            lo, hi = max(start, p * n) - p * n, min(stop, (p + 1) * n) - p * n
            parts.append(self.order(p)[lo:hi])
        return np.concatenate(parts)

    def base(self, p: int) -> np.ndarray:
        cached = self._base.get(p)
        if cached is None:
            cached = self._base[p] = epoch_order(self.sizes, epoch=p, **self._kw)
        return cached

    def _opens(self, p: int) -> int:
        """``r``: samples of the epoch that pass p continues, read at the end of pass p - 1."""
        return p * self.n % self.c

    def _free(self, p: int) -> bool:
        """Whether pass p's own tail is its base order's: it starts with an epoch, or holds a
        whole epoch after its head."""
        r = self._opens(p)
        return r == 0 or r + self.d >= self.c

    def order(self, p: int) -> np.ndarray:
        base = self.base(p)
        if not self._rearrange or self._opens(p) == 0:
            return base
        if self._free(p):
            own = self._opens(p + 1)  # pass p's own tail, read by the epoch after it
            body = base[:self.n - own]
            late = self._tail(p - 1)[body]
            return np.concatenate([body[~late], body[late], base[self.n - own:]])
        first = self._head(p)[base]
        return np.concatenate([base[first], base[~first]])

    def _tail(self, p: int) -> np.ndarray:
        """Mask of the members of pass p's tail."""
        if not self._free(p):
            return ~self._head(p)
        mask = np.zeros(self.n, dtype=bool)
        mask[self.base(p)[self.n - self._opens(p + 1):]] = True
        return mask

    def _head(self, p: int) -> np.ndarray:
        """Mask of the members of the head of pass p, one of a run of passes that are a head
        and a tail only: ``r`` grows by ``d`` a pass along the run, from (0, d] at its first."""
        r = self._opens(p)
        b = p - -(-r // self.d)  # the pass before the run, whose tail is its base order's
        rank = self.base(b + 1)
        rank = rank[~self._tail(b)[rank]]
        mask = np.zeros(self.n, dtype=bool)
        mask[rank[:self.c - r]] = True
        return mask


def _source_seed(seed: int, source: int) -> int:
    return int(_rng(seed, source, 0x5352).integers(1 << 62))
