"""Mixtures: the pure functions (allot, mix_order) over many shapes, and ShardDataset over several
datasets: counts, exact-once per source across epochs, interleaving within batches, resume (mid
epoch, across an epoch boundary, at another world size, StatefulDataLoader), mixed formats and
fields, a remote source beside a local one, and the one-line errors."""

import json
import os
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import shardpack
from shardpack import ShardDataset
from shardpack.order import partition as P
from shardpack.loader.batches import collate
from shardpack.read.mix import Source

from testbed.helpers import make_tree
from testbed.stateful import assert_resumes


def _shapes(seed):
    """Random mixtures: shard sizes per source, weights or fixed counts, an epoch size."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 5))
    sizes = [[int(x) for x in rng.integers(1, 40, size=rng.integers(1, 5))] for _ in range(k)]
    weights, fixed = [], []
    for s in sizes:
        if rng.random() < 0.3:
            weights.append(None)
            fixed.append(int(rng.integers(0, 3 * sum(s))))
        else:
            weights.append(float(rng.integers(1, 6)))
            fixed.append(None)
    free = any(f is None for f in fixed)
    epoch_size = int(rng.integers(sum(f or 0 for f in fixed), 400)) if free and \
        rng.random() < 0.5 else None
    return sizes, weights, fixed, epoch_size


@pytest.mark.parametrize("seed", range(60))
def test_counts_are_exact_shares(seed):
    sizes, weights, fixed, epoch_size = _shapes(seed)
    totals = [sum(s) for s in sizes]
    counts = P.allot(totals, weights, fixed, epoch_size)
    expected_total = epoch_size if epoch_size is not None else \
        sum(f if f is not None else n for f, n in zip(fixed, totals, strict=True))
    assert sum(counts) == expected_total
    rest = expected_total - sum(f or 0 for f in fixed)
    wsum = sum(w for w in weights if w is not None)
    for c, w, f in zip(counts, weights, fixed, strict=True):
        if f is not None:
            assert c == f
        else:
            assert abs(c - rest * w / wsum) < 1  # within 1 of its share


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_epoch_has_its_counts_and_each_source_is_read_pass_after_pass(seed, shuffle):
    sizes, weights, fixed, epoch_size = _shapes(seed)
    totals = [sum(s) for s in sizes]
    counts = P.allot(totals, weights, fixed, epoch_size)
    offsets = np.concatenate([[0], np.cumsum(totals)])
    streams = [[] for _ in sizes]
    for epoch in range(4):
        order = P.mix_order(sizes, counts, seed=seed, epoch=epoch, shuffle=shuffle,
                            block_size=3, window=7)
        assert len(order) == sum(counts)
        src = np.searchsorted(offsets, order, side="right") - 1
        assert np.bincount(src, minlength=len(sizes)).tolist() == counts
        for s in range(len(sizes)):
            streams[s] += (order[src == s] - offsets[s]).tolist()
        # interleaved in proportion: any stretch holds each source within 2 of its share
        for lo in range(0, len(order), 16):
            part = src[lo:lo + 16]
            for s, c in enumerate(counts):
                assert abs(np.count_nonzero(part == s) - len(part) * c / len(order)) <= 3
    for s, n in enumerate(totals):  # exact-once within each pass, across epochs
        stream = streams[s]
        for p in range(len(stream) // n):
            assert sorted(stream[p * n:(p + 1) * n]) == list(range(n))
        assert len(set(stream[len(stream) // n * n:])) == len(stream) % n


@pytest.mark.parametrize("seed", range(20))
def test_ranks_and_workers_split_a_mixed_epoch_exactly_once(seed):
    rng = np.random.default_rng(seed)
    sizes, weights, fixed, epoch_size = _shapes(seed)
    counts = P.allot([sum(s) for s in sizes], weights, fixed, epoch_size)
    n = sum(counts)
    world, workers, batch = int(rng.integers(1, 6)), int(rng.integers(1, 4)), int(
        rng.integers(1, 9))
    positions = np.arange(n)
    for partial in ("pad", "drop"):
        shares = [P.rank_split(positions, world, r, partial) for r in range(world)]
        assert len({len(s) for s in shares}) == 1  # equal counts per rank
        got = [i for s in shares for w in range(workers)
               for i in P.worker_split(s, workers, w, batch).ids[
                   ~P.worker_split(s, workers, w, batch).repeat].tolist()]
        if partial == "pad":
            assert sorted(got) == list(range(n))
        else:
            assert len(got) == len(set(got)) == n // world * world


def test_downsampled_source_shows_new_samples_until_all_were_seen():
    counts = P.allot([100, 30], [None, None], [20, None])
    assert counts == [20, 30]
    firsts = []
    for epoch in range(5):
        order = P.mix_order([[100], [30]], counts, seed=4, epoch=epoch)
        firsts.append(set(order[order < 100].tolist()))
    assert set().union(*firsts) == set(range(100))  # 5 epochs of 20: one whole pass
    assert all(not (a & b) for i, a in enumerate(firsts) for b in firsts[i + 1:])


def _source_stream(sizes, c, seed, epochs, shuffle=True, block_size=3, window=7):
    """The epochs of a one-source mixture, each checked to hold distinct samples while
    downsampled, concatenated."""
    stream = []
    for e in epochs:
        ids = P.mix_order([sizes], [c], seed=seed, epoch=e, shuffle=shuffle,
                          block_size=block_size, window=window).tolist()
        assert len(ids) == c
        if c <= sum(sizes):
            assert len(set(ids)) == c, f"epoch {e} repeats samples"
        stream += ids
    return stream


def _passes_are_permutations(stream, n, start=0):
    """``stream`` begins at stream position ``start``: each whole pass in it (positions
    p * n .. (p + 1) * n) holds every sample once, so none repeats before all were seen."""
    first = -(-start // n) * n - start
    for lo in range(first, len(stream) - n + 1, n):
        assert sorted(stream[lo:lo + n]) == list(range(n)), f"pass at {start + lo}"


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(1, 12), min_size=1, max_size=4),
       frac=st.floats(0, 1), seed=st.integers(0, 2**32), first=st.integers(0, 10**6),
       block_size=st.integers(1, 5), window=st.integers(1, 9))
def test_a_downsampled_source_is_distinct_in_each_epoch_and_pass_after_pass(
        sizes, frac, seed, first, block_size, window):
    n = sum(sizes)
    c = max(1, min(n, round(frac * n)))
    # enough epochs for whole runs of passes that are a head and a tail only (c > n / 2)
    k = 2 * n // max(1, n - c) + 2 * n // c + 3 if c < n else 4
    for start in (0, first):
        stream = _source_stream(sizes, c, seed, range(start, start + k), block_size=block_size,
                                window=window)
        _passes_are_permutations(stream, n, start * c)


@pytest.mark.parametrize("n, c", [(300, 200), (300, 250), (300, 299), (300, 150), (300, 7)])
def test_the_epochs_of_a_downsampled_source_hold_distinct_samples(n, c):
    sizes = [64] * (n // 64) + [n % 64]
    epochs = range(2 * n // (n - c) + 4)
    stream = _source_stream(sizes, c, 11, epochs, block_size=16, window=32)
    _passes_are_permutations(stream, n)
    if (n, c) == (300, 200):  # epoch 1 reads the tail of pass 0 and the head of pass 1
        assert len(set(stream[200:400])) == 200
        assert set(stream[:300]) == set(range(300))


@pytest.mark.parametrize("n", [2, 3, 5, 9, 17])
def test_one_short_of_a_pass_each_epoch(n):
    stream = _source_stream([n], n - 1, 3, range(2 * n + 3), block_size=1, window=n)
    _passes_are_permutations(stream, n)


@pytest.mark.parametrize("shuffle", [True, False])
def test_upsampled_and_unshuffled_sources_keep_their_passes(shuffle):
    sizes, seed = [7, 5], 9
    own = P.source_seed(seed, 0)
    base = [P.epoch_order(sizes, seed=own, epoch=p, shuffle=shuffle, block_size=3,
                          window=7).tolist() for p in range(10)]
    for c in (12, 25, 36):  # upsampled: whole passes, each its own order
        stream = _source_stream(sizes, c, seed, range(3), shuffle=shuffle)
        assert stream == sum(base, [])[:len(stream)]
    if not shuffle:  # unshuffled: in order, for any count
        for c in (5, 11):
            assert _source_stream(sizes, c, seed, range(4), shuffle=False) == \
                [i % 12 for i in range(4 * c)]


@pytest.mark.parametrize("seed", range(20))
def test_orders_kept_from_mix_order_version_1(seed):
    """Where mix_order_changed says version 1's epochs are this version's, they are: version 1
    read pass p of each source as its own epoch_order for p."""
    sizes, weights, fixed, epoch_size = _shapes(seed)
    totals = [sum(s) for s in sizes]
    counts = P.allot(totals, weights, fixed, epoch_size)
    for shuffle in (True, False):
        if P.mix_order_changed([[n, c] for n, c in zip(totals, counts, strict=True)],
                               shuffle, 1):
            continue
        for epoch in range(3):
            want = []
            for s, (src, c) in enumerate(zip(sizes, counts, strict=True)):
                n = sum(src)
                passes = [P.epoch_order(src, seed=P.source_seed(seed, s), epoch=p,
                                        shuffle=shuffle, block_size=3, window=7)
                          for p in range(epoch * c // n, ((epoch + 1) * c - 1) // n + 1)]
                stream = np.concatenate(passes) if passes else np.zeros(0, np.int64)
                lo = epoch * c - epoch * c // n * n if c else 0
                want.append(stream[lo:lo + c] + sum(totals[:s]))
            got = P.mix_order(sizes, counts, seed=seed, epoch=epoch, shuffle=shuffle,
                              block_size=3, window=7)
            src_of = np.searchsorted(np.cumsum(totals), got, side="right")
            for s in range(len(sizes)):
                assert got[src_of == s].tolist() == want[s].tolist()


# -- the dataset ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """A tar dataset of 30 JPEG-named samples and a msgpack one of 10 PNG-named samples."""
    root = tmp_path_factory.mktemp("mix")
    a = make_tree(root / "a", {f"c{i % 2}/{i:03d}.jpg": os.urandom(100 + i) for i in range(30)})
    b = make_tree(root / "b", {f"c{i % 2}/{i:03d}.png": os.urandom(50 + i) for i in range(10)})
    shardpack.pack(a, root / "A", workers=1, max_samples=8, check="none")
    shardpack.pack(b, root / "B", workers=1, max_samples=4, check="none", shard_format="msgpack")
    return root / "A", root / "B"


def _ids(items):
    return [(int(i), int(s)) for b in items
            for i, s in zip(np.atleast_1d(b["__index__"]).tolist(),
                            np.atleast_1d(b["__source__"]).tolist(), strict=True)]


@pytest.mark.parametrize("batched", [False, True])
def test_mixture_epoch_counts_sources_and_fields(two, batched):
    ds = ShardDataset(list(two), weights=[1, 3], epoch_size=40, batch_size=8, batched=batched,
                      seed=2)
    assert len(ds) == 40
    loader = DataLoader(ds, batch_size=None if batched else 8, num_workers=2,
                        collate_fn=None if batched else collate)
    epochs = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        batches = list(loader)
        got = _ids(batches)
        assert Counter(s for _, s in got) == {0: 10, 1: 30}
        for b in batches:  # every batch of 8 holds 2 of source 0, give or take 2
            assert abs(int(np.sum(np.asarray(b["__source__"]) == 0)) - 2) <= 2
            assert "jpg" in b and "png" in b and "cls" in b  # the union of the fields
            for i, s in zip(np.asarray(b["__source__"]).tolist(),
                            range(len(b["__key__"])), strict=True):
                own, other = ("jpg", "png") if i == 0 else ("png", "jpg")
                assert len(b[own].items()[s]) > 0
                assert len(b[other].items()[s]) == 0
        epochs.append(got)
    # source 1 (10 samples) is upsampled 3x: whole passes, each a new order
    stream = [i for e in epochs for i, s in e if s == 1]
    assert all(sorted(stream[p * 10:(p + 1) * 10]) == list(range(30, 40)) for p in range(9))
    assert stream[:10] != stream[10:20]


def test_sources_with_their_own_counts_and_options(two):
    a, b = two
    ds = ShardDataset([Source(a, samples=12), Source(b, repeat=2)], seed=1)
    got = Counter(s["__source__"] for s in ds)
    assert got == {0: 12, 1: 20} and len(ds) == 32
    with pytest.raises(ValueError, match="give one of weight, repeat, samples"):
        Source(a, weight=1, repeat=2)
    with pytest.raises(ValueError, match="weights= and Source"):
        ShardDataset([Source(a, samples=3), b], weights=[1, 1])
    with pytest.raises(ValueError, match="weights and epoch_size are for a mixture"):
        ShardDataset(a, weights=[1])
    with pytest.raises(ValueError, match=r"source 1 \(.*B\) has no field 'jpg'"):
        ShardDataset([a, b], decode=shardpack.CpuDecode(32, field="jpg"), batch_size=4,
                      batched=True)


def _resumable(two, **kw):
    return ShardDataset(list(two), weights=[2, 1], epoch_size=36, seed=5, **kw)


@pytest.mark.parametrize("batched", [False, True])
def test_mixture_resumes_mid_epoch_and_across_an_epoch_boundary(two, batched):
    B = 4
    holder = {}

    def make():
        ds = holder["ds"] = _resumable(two, batch_size=B, batched=batched)
        ds.set_epoch(1)
        return DataLoader(ds, batch_size=None if batched else B, num_workers=2,
                          collate_fn=None if batched else collate)

    def save(loader, consumed, samples):
        return loader.dataset.state_dict(samples_seen=samples)

    assert_resumes(make, save, lambda loader, state: loader.dataset.load_state_dict(state),
                   _ids_of_batch, points=(0, 2, 5, 9))
    # across the boundary: a state saved at the end of epoch 1 resumes into nothing, and the
    # next epoch is epoch 2's own order
    ds = _resumable(two, batch_size=B, batched=batched)
    ds.set_epoch(1)
    state = ds.state_dict(samples_seen=len(ds))
    fresh = _resumable(two, batch_size=B, batched=batched)
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert list(fresh) == []
    fresh.set_epoch(2)
    again = _resumable(two, batch_size=B, batched=batched)
    again.set_epoch(2)
    assert _ids(_as_batches(fresh, batched)) == _ids(_as_batches(again, batched))


def _ids_of_batch(batch):
    return _ids([batch])


def _as_batches(ds, batched):
    return list(ds) if batched else [collate([s]) for s in ds]


@pytest.mark.parametrize("new_world", [1, 3])
def test_mixture_elastic_resume_every_planned_sample_once(two, new_world):
    B, old_world, k = 4, 2, 8
    seen, states = [], []
    for r in range(old_world):
        ds = _resumable(two, batch_size=B, rank=r, world_size=old_world)
        seen += _ids([collate([s]) for s in ds])[:k]
        states.append(ds.state_dict(samples_seen=k))
    assert states[0] == states[1]
    rest = []
    for r in range(new_world):
        ds = _resumable(two, batch_size=B, rank=r, world_size=new_world)
        ds.load_state_dict(states[0])
        rest += [(i, s) for b in DataLoader(ds, batch_size=B, num_workers=2, collate_fn=collate)
                 for i, s, rep in zip(b["__index__"].tolist(), b["__source__"].tolist(),
                                      b["__repeat__"].tolist(), strict=True) if not rep]
    planned = P.mix_order(*_resumable(two)._mix, seed=5, epoch=0)
    offsets = np.array([0, 30])
    want = Counter((int(i), int(np.searchsorted(offsets, i, side="right") - 1)) for i in planned)
    assert Counter(seen + rest) == want


def test_mixture_with_stateful_dataloader(two):
    tdl = pytest.importorskip("torchdata.stateful_dataloader")

    def make():
        return tdl.StatefulDataLoader(_resumable(two, batch_size=4, batched=True),
                                      batch_size=None, num_workers=2)

    assert_resumes(make, lambda loader, c, s: json.loads(json.dumps(loader.state_dict())),
                   lambda loader, state: loader.load_state_dict(state), _ids_of_batch,
                   points=(0, 3))


def test_a_downsampled_source_through_the_dataset(two, tmp_path):
    """300 samples, 200 an epoch: epoch 1 reads the tail of pass 0 and the head of pass 1, 200
    distinct keys; epochs 0 and 1 see every sample."""
    big = make_tree(tmp_path / "big", {f"{i:03d}.jpg": os.urandom(20) for i in range(300)})
    shardpack.pack(big, tmp_path / "BIG", workers=1, max_samples=64, check="none")
    keys = []
    for epoch in (0, 1):
        ds = ShardDataset([Source(tmp_path / "BIG", samples=200), two[0]], fields=["jpg"],
                          batch_size=16, batched=True, seed=7)
        ds.set_epoch(epoch)
        got = [k for b in DataLoader(ds, batch_size=None, num_workers=2)
               for k, s in zip(b["__key__"], np.asarray(b["__source__"]).tolist(), strict=True)
               if s == 0]
        assert len(got) == len(set(got)) == 200
        keys.append(set(got))
    assert len(keys[0] | keys[1]) == 300


def test_a_mixture_state_of_mix_order_version_1(two):
    """States saved before mixed epochs had their own order version: refused where a shuffled
    source is read across pass boundaries (this mixture's source 0: 24 of 30 an epoch), loaded
    where the epochs are the same."""
    state = _resumable(two, batch_size=4).state_dict(samples_seen=4)
    assert state["mix_order"] == P.MIX_ORDER_VERSION
    old = {k: v for k, v in state.items() if k != "mix_order"}
    with pytest.raises(ValueError, match="mixture order version: expected 2, found 1"):
        _resumable(two, batch_size=4).load_state_dict(old)
    with pytest.raises(ValueError, match="found 99"):
        _resumable(two, batch_size=4).load_state_dict({**state, "mix_order": 99})
    plain = _resumable(two, batch_size=4, shuffle=False)
    fresh = _resumable(two, batch_size=4, shuffle=False)
    fresh.load_state_dict({k: v for k, v in plain.state_dict(samples_seen=4).items()
                           if k != "mix_order"})
    assert len(_ids([collate([s]) for s in fresh])) == 32
    whole = ShardDataset(list(two), seed=5, batch_size=4)  # each source once an epoch
    ShardDataset(list(two), seed=5, batch_size=4).load_state_dict(
        {k: v for k, v in whole.state_dict(samples_seen=4).items() if k != "mix_order"})


def test_state_of_another_mixture_is_refused(two):
    state = _resumable(two, batch_size=4).state_dict(samples_seen=4)
    other = ShardDataset(list(two), weights=[1, 1], epoch_size=36, seed=5, batch_size=4)
    with pytest.raises(ValueError, match="saved with mixture"):
        other.load_state_dict(state)


def test_remote_source_beside_a_local_one(two, http_server, tmp_path):  # noqa: F811
    a, b = two
    server = http_server(b)
    ds = ShardDataset([a, Source(server.url, cache_dir=tmp_path / "cache")], weights=[1, 1],
                      batch_size=5, batched=True, seed=3)
    got = _ids(DataLoader(ds, batch_size=None, num_workers=2))
    assert Counter(s for _, s in got) == {0: 20, 1: 20}
    local = ShardDataset([a, b], weights=[1, 1], batch_size=5, batched=True, seed=3)
    assert got == _ids(DataLoader(local, batch_size=None, num_workers=2))  # same order


def test_decode_and_device_loader_on_a_mixture(tmp_path):
    from testbed.imagegen import ramp_photo as _photo

    a = make_tree(tmp_path / "a", {f"c{i % 2}/{i:02d}.jpg": _photo(i, 80, 60) for i in range(12)})
    b = make_tree(tmp_path / "b", {f"c{i % 2}/{i:02d}.PNG": _photo(i, 64, 48, "PNG")
                                   for i in range(6)})
    shardpack.pack(a, tmp_path / "A", workers=1)
    shardpack.pack(b, tmp_path / "B", workers=1, shard_format="msgpack")
    ds = ShardDataset([tmp_path / "A", tmp_path / "B"], batch_size=6, batched=True,
                      decode=shardpack.CpuDecode(32))
    loader = shardpack.DeviceLoader(DataLoader(ds, batch_size=None, num_workers=1),
                                    device="cpu", decode_on="cpu")
    batches = list(loader)
    assert sum(len(b["__index__"]) for b in batches) == 18
    assert all(b["image"].shape[1:] == (3, 32, 32) and float(b["image"].std()) > 0.1
               for b in batches)


def test_bench_command_takes_a_mixture(two):
    from testbed.helpers import run_cli

    a, b = two
    out = run_cli("bench", a, b, "--weights", "1,3", "--epoch-size", "40", "--batch-size", "8",
                  "--workers", "1", "-q").output
    assert "(40 samples, 5 batches" in out and " + " in out
    bad = run_cli("bench", a, "--weights", "1", "-q", ok=None)
    assert bad.exit_code == 2 and "for a mixture" in bad.output
    bad = run_cli("bench", a, b, "--weights", "1,x", "-q", ok=None)
    assert bad.exit_code == 2 and "give numbers" in bad.output


def test_default_shares_take_each_sample_once_and_bad_shares_are_one_line(two):
    a, b = two
    ds = ShardDataset([a, b], seed=1)  # no weights: each source by its size
    assert len(ds) == 40 and Counter(s["__source__"] for s in ds) == {0: 30, 1: 10}
    assert P.allot([30, 10], [None, None], [None, None]) == [30, 10]
    for kwargs, message in ((dict(weights=[float("inf"), 1]), "finite"),
                            (dict(epoch_size=10.5), "whole number"),
                            (dict(epoch_size=-5), "whole number")):
        with pytest.raises(ValueError, match=message):
            ShardDataset([a, b], **kwargs)
    with pytest.raises(ValueError, match="some sources have a weight and others none"):
        ShardDataset([Source(a, weight=2), b])
    with pytest.raises(ValueError, match="samples must be a whole number"):
        Source(a, samples=2.7)


def test_a_label_field_in_some_sources_only_is_refused_at_construction(two, tmp_path):
    a, _ = two
    flat = make_tree(tmp_path / "flat", {f"{i:03d}.jpg": os.urandom(60) for i in range(10)})
    shardpack.pack(flat, tmp_path / "C", workers=1, check="none")
    with pytest.raises(ValueError, match=r"source 1 \(.*C\) has no label field 'cls'"):
        ShardDataset([a, tmp_path / "C"], batch_size=4, batched=True)
    ds = ShardDataset([a, tmp_path / "C"], fields=["jpg"], batch_size=4, batched=True)
    assert sum(len(b["__index__"]) for b in ds) == 40  # without the label: every sample


def test_the_decode_check_looks_at_the_fields_kept(two):
    a, b = two
    with pytest.raises(ValueError, match=r"source 1 \(.*B\) has no image field"):
        ShardDataset([a, b], fields=["jpg", "cls"], batch_size=4, batched=True,
                     decode=shardpack.CpuDecode(16))
