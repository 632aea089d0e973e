"""Mixtures (docs/mixing.md): how many samples each source gives an epoch, and the order of a
mixed epoch, as pure functions.

* ``allot``: samples per source and epoch, from weights, fixed counts and ``epoch_size``.
* ``mix_order``: one mixed epoch, each source read as an endless stream of passes (so a
  downsampled source shows new samples each epoch), interleaved in proportion.
* ``mix_order_changed``, ``check_saved_mix``: whether a saved state's mixed epochs are this
  version's, and whether its mixture is this one.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .epoch import epoch_order, keyed_rng
from .state import is_int, same, short


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
    (tests/integration/test_mix.py)."""
    offsets = np.concatenate([[0], np.cumsum([int(np.sum(s)) for s in source_sizes])])
    ids, keys = [], []
    for s, (sizes, c) in enumerate(zip(source_sizes, counts, strict=True)):
        if c == 0:
            continue
        passes = _Passes(sizes, c, seed=source_seed(seed, s), shuffle=shuffle,
                         block_size=block_size, window=window)
        ids.append(passes.epoch(int(epoch)) + offsets[s])
        u = keyed_rng(seed, epoch, s, 0x4D49).random(c) if shuffle else np.full(c, 0.5)
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


def mix_state(source_sizes: Sequence[Sequence[int]], counts: Sequence[int]) -> dict:
    """A mixture's part of a saved state: ``mix`` ([samples, per epoch] of each source; the
    order depends on them) and ``mix_order`` (:data:`MIX_ORDER_VERSION`).

    Args:
        source_sizes: each source's shard sizes.
        counts: samples each source gives an epoch.
    """
    return {"mix": mix_summary(source_sizes, counts), "mix_order": MIX_ORDER_VERSION}


def mix_summary(source_sizes: Sequence[Sequence[int]], counts: Sequence[int]) -> list:
    """``[[samples, per epoch], ...]`` of each source, as states hold it.

    Args:
        source_sizes: each source's shard sizes.
        counts: samples each source gives an epoch.
    """
    return [[sum(sizes), count] for sizes, count in zip(source_sizes, counts, strict=True)]


def check_saved_mix(state: dict, mix: list | None, shuffled: bool) -> None:
    """Refuse, in one line, a saved state of another mixture (or of a single dataset when this
    is a mixture, and the other way round), or one whose mixed epochs were ordered otherwise (a
    state from before ``mix_order`` is version 1: it loads where its epochs are the same).

    Args:
        state: a saved state (any values).
        mix: this dataset's :func:`mix_summary`, None for a single dataset.
        shuffled: whether the saved epochs were shuffled.
    """
    if not same(state.get("mix"), mix):
        raise ValueError(f"state was saved with mixture {short(state.get('mix'))} ([samples, "
                         f"per epoch] of each source), this dataset has {short(mix)}: resume "
                         "needs the same sources and shares")
    version = state.get("mix_order", 1)
    if mix is not None and (not is_int(version) or mix_order_changed(mix, shuffled, version)):
        raise ValueError(f"unsupported mixture order version: expected {MIX_ORDER_VERSION}, "
                         f"found {short(version)}: its epochs read a downsampled source in "
                         "another order; do not load this state: start the epoch from its "
                         "beginning, or finish it with the shardpack that saved it")


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


def source_seed(seed: int, source: int) -> int:
    """The seed of source ``source``'s own orders in a mixture seeded ``seed``: each source
    shuffles its passes on its own key.

    Args:
        seed: the mixture's seed.
        source: the source's position in the mixture.
    """
    return int(keyed_rng(seed, source, 0x5352).integers(1 << 62))
