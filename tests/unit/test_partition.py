"""Order and partition as pure functions: exact-once, equal counts, determinism, resume."""

import itertools

import numpy as np
import pytest

from shardpack.order import partition as P

PRIMES = [1, 2, 7, 13, 101, 997]


def all_shares(sizes, world, workers, batch_size=1, partial="pad", seed=0, epoch=0,
               history=(), affinity=False):
    spans = (history[0][0] if history else world) if affinity else 1
    order = P.epoch_order(sizes, seed=seed, epoch=epoch, block_size=4, window=16, spans=spans,
                          partial=partial)
    ranks = P.resume_sequences(order, list(history), world, partial)
    return order, [[P.worker_split(r, max(workers, 1), w, batch_size)
                    for w in range(max(workers, 1))] for r in ranks]


@pytest.mark.parametrize("n", PRIMES)
@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("workers", range(0, 5))
@pytest.mark.parametrize("affinity", [False, True])
def test_exact_once_and_equal_counts(n, world, workers, affinity):
    sizes = [n] if n < 50 else [n // 3, n // 3, n - 2 * (n // 3)]  # fewer shards than workers
    order, ranks = all_shares(sizes, world, workers, batch_size=3, affinity=affinity)
    assert sorted(order.tolist()) == list(range(n))
    per_rank = [sum(len(w) for w in r) for r in ranks]
    assert len(set(per_rank)) == 1 and per_rank[0] == -(-n // world)  # pad: ceil
    fresh = np.concatenate([w.ids[~w.repeat] for r in ranks for w in r])
    assert sorted(fresh.tolist()) == list(range(n))  # every sample exactly once, repeats flagged
    repeats = sum(int(w.repeat.sum()) for r in ranks for w in r)
    assert repeats == per_rank[0] * world - n


@pytest.mark.parametrize("n,world", [(13, 4), (997, 8), (5, 8)])
@pytest.mark.parametrize("affinity", [False, True])
def test_drop_policy_counts_what_it_drops(n, world, affinity):
    _, ranks = all_shares([n], world, 2, partial="drop", affinity=affinity)
    got = np.concatenate([w.ids for r in ranks for w in r])
    assert len(got) == (n // world) * world and len(set(got.tolist())) == len(got)
    assert ranks[0][0].dropped == n - len(got)
    assert not any(w.repeat.any() for r in ranks for w in r)


def test_deterministic_and_epochs_differ():
    sizes = [300, 200, 500]
    a = P.epoch_order(sizes, seed=1, epoch=0)
    assert np.array_equal(a, P.epoch_order(sizes, seed=1, epoch=0))
    assert not np.array_equal(a, P.epoch_order(sizes, seed=1, epoch=1))
    assert not np.array_equal(a, P.epoch_order(sizes, seed=2, epoch=0))
    assert np.array_equal(P.epoch_order(sizes, shuffle=False), np.arange(1000))


def test_shuffle_keeps_blocks_local_but_mixes_batches():
    sizes = [10_240] * 10  # whole blocks of 256
    order = P.epoch_order(sizes, seed=0, block_size=256, window=4096)
    # within a window of 4096 samples, at most ~4096/256 + 1 blocks are touched
    blocks = order // 256
    for start in range(0, len(order), 4096):
        assert len(np.unique(blocks[start:start + 4096])) <= 4096 // 256 + 1
    # a batch of 256 draws from many shards, not one
    shard_of = order // 10_240
    mixes = [len(np.unique(shard_of[i:i + 256])) for i in range(0, len(order), 256)]
    assert np.mean(mixes) > 5


def test_worker_split_makes_the_loader_order_the_rank_order():
    """Round-robin over workers, batch by batch, re-creates the rank's sequence."""
    _, ranks = all_shares([101], 1, 3, batch_size=4)
    workers = ranks[0]
    streams = [list(w.ids) for w in workers]
    merged = []
    active = list(range(3))
    while active:
        for w in list(active):
            batch, streams[w] = streams[w][:4], streams[w][4:]
            if not batch:
                active.remove(w)
                continue
            merged += batch
    rank_seq = P.resume_sequences(P.epoch_order([101], block_size=4, window=16), [], 1)[0]
    assert merged == list(rank_seq.ids)


@pytest.mark.parametrize("old_world,new_world", list(itertools.product([1, 2, 3], [1, 2, 5])))
@pytest.mark.parametrize("k", [0, 1, 17])
def test_resume_yields_each_remaining_sample_once(old_world, new_world, k):
    n = 211
    order = P.epoch_order([100, 111], seed=3, block_size=8, window=32)
    before = P.resume_sequences(order, [], old_world)
    consumed = set(np.concatenate([s.ids[:k] for s in before]).tolist())
    after = P.resume_sequences(order, [(old_world, k)], new_world)
    fresh = np.concatenate([s.ids[~s.repeat] for s in after]).tolist()
    assert len(fresh) == len(set(fresh))
    assert set(fresh) == set(range(n)) - consumed
    assert len({len(s) for s in after}) == 1  # still equal counts per rank
    if new_world == old_world:  # same layout: the same order, continued
        for b, a in zip(before, after, strict=True):
            assert list(a.ids) == list(b.ids[k:])


def test_chained_elastic_resumes():
    order = P.epoch_order([500], seed=0, block_size=8, window=32)
    seen = []
    history = []
    for world, k in [(2, 30), (3, 20), (1, 50)]:
        shares = P.resume_sequences(order, history, world)
        seen += [i for s in shares
                 for i, rep in zip(s.ids[:k], s.repeat[:k], strict=True) if not rep]
        history.append((world, k))
    shares = P.resume_sequences(order, history, 4)
    seen += [i for s in shares for i, rep in zip(s.ids, s.repeat, strict=True) if not rep]
    assert sorted(seen) == list(range(500))


@pytest.mark.parametrize("partial", ["pad", "drop"])
def test_shard_affinity_each_rank_reads_its_own_span_of_shards(partial):
    """With spans = world, rank r's samples come from about shards / world shards (its span,
    plus the two it may share with its neighbours), not from nearly all of them; still every
    sample once, and the shards move between ranks from one epoch to the next."""
    sizes = [100] * 61 + [37]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    n, world = sum(sizes), 8
    mine = {}
    for epoch in (0, 1):
        order = P.epoch_order(sizes, seed=5, epoch=epoch, block_size=16, window=64,
                              spans=world, partial=partial)
        assert sorted(order.tolist()) == list(range(n))
        for r in range(world):
            share = P.rank_split(order, world, r, partial)
            fresh = share.ids[~share.repeat]
            shards = set((np.searchsorted(starts, fresh, side="right") - 1).tolist())
            assert len(shards) <= -(-len(sizes) // world) + 2
            mine[epoch, r] = shards
        spread = P.rank_split(P.epoch_order(sizes, seed=5, epoch=epoch, block_size=16,
                                            window=64), world, 0, partial)
        assert len(set((np.searchsorted(starts, spread.ids, side="right") - 1).tolist())) > 30
    assert mine[0, 0] != mine[1, 0]


@pytest.mark.parametrize("old_world,new_world", [(4, 4), (4, 3), (2, 5)])
def test_shard_affinity_resume_across_world_sizes(old_world, new_world):
    sizes = [50] * 9 + [13]
    order = P.epoch_order(sizes, seed=2, epoch=3, block_size=8, window=32, spans=old_world)
    before = P.resume_sequences(order, [], old_world)
    consumed = set(np.concatenate([s.ids[:40] for s in before]).tolist())
    after = P.resume_sequences(order, [(old_world, 40)], new_world)
    fresh = np.concatenate([s.ids[~s.repeat] for s in after]).tolist()
    assert len(fresh) == len(set(fresh)) and set(fresh) == set(range(sum(sizes))) - consumed


def test_bad_arguments():
    with pytest.raises(ValueError, match="partial"):
        P.rank_split(np.arange(3), 2, 0, "wrap")
    with pytest.raises(ValueError, match="rank 2"):
        P.rank_split(np.arange(3), 2, 2)


@pytest.mark.parametrize("seed", range(300))
def test_share_equals_the_full_computation(seed):
    """share() (ranges of positions, only this worker's ids) against epoch_order +
    resume_sequences + worker_split on small N: the same ids, repeats and drops, for random
    shard sizes, worlds, workers, batch sizes, partial policies, block and window sizes, shard
    affinity, and resume histories of one or two steps at other world sizes."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 30, size=rng.integers(1, 6)).tolist()
    n = sum(sizes)
    world, workers, batch = (int(x) for x in rng.integers(1, [7, 5, 6]))
    partial = ["pad", "drop"][seed % 2]
    history = []
    if rng.random() < 0.6:
        w0 = world if rng.random() < 0.4 else int(rng.integers(1, 6))
        history.append((w0, int(rng.integers(0, max(1, n // w0) + 1))))
        if rng.random() < 0.5:
            w1 = int(rng.integers(1, 6))
            history.append((w1, int(rng.integers(0, max(1, n // w1 // 2) + 1))))
    spans = (history[0][0] if history else world) if seed % 3 else 1
    kw = dict(seed=seed, epoch=seed % 4, block_size=int(rng.integers(1, 7)),
              window=int(rng.integers(1, 10)), shuffle=seed % 11 != 0)
    order = P.epoch_order(sizes, spans=spans, partial=partial, **kw)
    settings = P.Order(seed=seed, shuffle=kw["shuffle"], block_size=kw["block_size"],
                       window=kw["window"], affinity=seed % 3 != 0, partial=partial)
    try:
        ranks = P.resume_sequences(order, history, world, partial)
    except ValueError:  # a history that could not have happened (k past the share)
        return
    seen = []
    for r in range(world):
        for w in range(workers):
            want = P.worker_split(ranks[r], workers, w, batch)
            got = P.share(sizes, settings, kw["epoch"], world=world, rank=r,
                          num_workers=workers, worker=w, batch_size=batch, history=history)
            assert got.ids.tolist() == want.ids.tolist()
            assert got.repeat.tolist() == want.repeat.tolist() and got.dropped == want.dropped
            seen += got.ids[~got.repeat].tolist()
        assert len({len(P.share(sizes, settings, kw["epoch"], world=world, rank=q,
                                history=history)) for q in range(world)}) == 1
    if not history:  # the union over all (rank, worker) shares: each sample once (+ padding)
        want = n if partial == "pad" else n // world * world
        assert len(seen) == len(set(seen)) == want


def test_each_window_and_span_draws_on_its_own_key():
    """The order at a position needs only its window's permutation and its span's blocks: the
    same positions computed alone or with the rest of the epoch agree."""
    sizes = [300, 257, 1000, 3]
    for spans in (1, 3):
        whole = P.epoch_order(sizes, seed=5, epoch=2, block_size=16, window=64, spans=spans)
        order = P.EpochOrder(sizes, seed=5, epoch=2, block_size=16, window=64, spans=spans)
        picks = np.array([1559, 0, 700, 701, 64, 1558, 63])
        assert order.at(picks).tolist() == whole[picks].tolist()


@pytest.mark.parametrize("seed", range(200))
def test_share_after_long_resume_histories_serves_every_sample_once(seed):
    """Up to four resume steps at random world sizes, consumed counts beyond a share included,
    world sizes above the sample count: share() equals the reference, and over the history plus
    the final shares every sample comes (none lost)."""
    rng = np.random.default_rng(1000 + seed)
    sizes = rng.integers(0, 15, size=rng.integers(1, 5)).tolist()
    n = sum(sizes)
    world = int(rng.integers(1, n + 3))
    history = [(int(w), int(rng.integers(0, n // w + 3)))
               for w in rng.integers(1, n + 3, size=rng.integers(1, 5))]
    kw = dict(seed=seed, block_size=2, window=5, spans=history[0][0])
    order = P.epoch_order(sizes, **kw)
    seen = []
    for i, (w, k) in enumerate(history):  # what each step consumed (a sample consumed as
        for s in P.resume_sequences(order, history[:i], w):  # another rank's padding counts)
            seen += s.ids[:k].tolist()
    ranks = P.resume_sequences(order, history, world)
    for r in range(world):
        got = P.share(sizes, P.Order(seed=seed, block_size=2, window=5), world=world, rank=r,
                      history=history)
        assert got.ids.tolist() == ranks[r].ids.tolist()
        assert got.repeat.tolist() == ranks[r].repeat.tolist()
        seen += got.ids[~got.repeat].tolist()
    assert sorted(set(seen)) == list(range(n))
