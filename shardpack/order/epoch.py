"""One epoch's order as a pure function: no I/O, no torch, no global state.

Shards are cut into blocks of ``block_size`` consecutive samples; blocks are shuffled; then samples
are shuffled inside consecutive windows of ``window`` samples.  Reads stay within a few blocks at a
time (bounded memory, mostly sequential), while a batch still mixes samples from
``window / block_size`` different places of the dataset.  With shard affinity (``spans`` > 1) the
shuffled shards are cut into one span per rank first (:func:`epoch_order`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def keyed_rng(*key: int) -> np.random.Generator:
    """A generator seeded by ``key`` (integers, each taken modulo 2**64): every random draw of an
    order has its own key, so any part of it can be computed alone.

    Args:
        *key: the integers that name the draw (seed, epoch, a tag, span, window, ...).
    """
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
            perm = keyed_rng(seed, epoch, 0x5348).permutation(len(sizes))
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
            perm = keyed_rng(self.seed, self.epoch, 0x424C, span).permutation(len(first))
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
            perm = keyed_rng(self.seed, self.epoch, 0x5749, span, win).permutation(length)
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

