"""Fetching ahead of a pass, for remote data: the fast start (the first batch by ranged reads) and
the background prefetcher over the shards (or chunks) a share reads (docs/remote.md).
"""

from __future__ import annotations

import numpy as np

from shardpack.core.errors import ShardpackError
from shardpack.read.prefetch import NOTHING


def fast_start(reader, stats: dict, where, ids) -> None:
    """Remote data with a cache, cold: fetch the samples ``ids`` of this pass's first batch
    with ranged reads, before this process's whole-shard downloads start.  With DataLoader
    workers only worker 0 does (its batch is the loader's first); the others read whole
    shards from their first batch on (docs/remote.md, "Fast start").

    Args:
        reader: the dataset's reader.
        stats: the dataset's counters (``fast_start_requests`` is counted there).
        where: this process's position (``num_workers``, ``worker``).
        ids: the first batch's sample ids.
    """
    if where.num_workers > 1 and where.worker != 0:
        return
    try:
        stats["fast_start_requests"] += reader.fetch_pieces(ids)
    except ShardpackError:  # only a shortcut: the usual path reports the error
        reader.drop_pieces()


def prefetcher(reader, ids: np.ndarray, *, batch_size: int, num_workers: int, window: int):
    """For remote data: a background fetcher over the shards (or chunks) that ``ids`` read, each
    once, in order of first need.  It keeps on hand or on the way what the current batch needs
    and, when shuffling, what this worker's part of the next shuffle window needs (a window is
    read in a burst, from many shards), then ``prefetch`` units more.  Samples the fast start
    fetched as pieces (the first batch) need nothing more.  A do-nothing one for local data.

    Args:
        reader: the dataset's reader.
        ids: the sample ids still to read, in order.
        batch_size: samples per batch.
        num_workers: DataLoader workers of this rank.
        window: the shuffle window (0: not shuffling).
    """
    access = reader.access
    if not access.prefetches or reader.prefetch <= 0:
        return NOTHING
    served = batch_size if reader.has_pieces else 0
    shards, rows = reader.locate_many(ids[served:])
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
    ahead = access.ahead(window // max(1, num_workers)) if window else 0
    return reader.prefetcher(units, needs, ahead)
