"""ShardDataset and open_dataset in real DataLoaders: exact-once, epochs, resume, errors."""

import json
import os
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import shardpack
from shardpack import ShardDataset, collate, open_dataset
from shardpack.order import partition as P
from shardpack.core.errors import DatasetNotFoundError, FormatError, IntegrityError, VersionError

from testbed.helpers import make_tree
from testbed.stateful import assert_resumes

N = 97  # prime: nothing divides evenly


@pytest.fixture(scope="module", params=["tar", "msgpack"])
def packed(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"ds-{request.param}")
    files = {f"c{i % 3}/{i:03d}.bin": bytes([i % 256]) * (i + 1) for i in range(N)}
    src = make_tree(root / "src", files)
    shardpack.pack(src, root / "out", shard_format=request.param, max_samples=40, workers=1)
    return root / "out"


def ids_of(loader_or_ds):
    out = []
    for item in loader_or_ds:
        if isinstance(item, dict) and isinstance(item["__index__"], torch.Tensor):
            out += item["__index__"].tolist()
        else:
            out.append(item["__index__"])
    return out


def expected_ids(ds, epoch, world=1, rank=0):
    order = P.epoch_order([s.samples for s in ds.reader.shards], seed=ds.seed, epoch=epoch,
                          shuffle=ds.shuffle, block_size=ds.block_size, window=ds.shuffle_window,
                          spans=world if ds.shard_affinity else 1, partial=ds.partial)
    return P.resume_sequences(order, [], world, ds.partial)[rank].ids.tolist()


@pytest.mark.parametrize("workers", [0, 1, 3])
@pytest.mark.parametrize("batch_size", [1, 8])
def test_dataloader_exact_once_in_rank_order(packed, workers, batch_size):
    ds = ShardDataset(packed, batch_size=batch_size, block_size=8, shuffle_window=32)
    loader = DataLoader(ds, batch_size=batch_size, num_workers=workers, collate_fn=collate)
    got = ids_of(loader)
    assert sorted(got) == list(range(N)) and len(ds) == N
    assert got == expected_ids(ds, 0)  # the loader's output is the rank's sequence, in order


def test_samples_are_bytes_and_picklable(packed):
    import pickle

    sample = next(iter(ShardDataset(packed, shuffle=False)))
    assert sample["__key__"] == "c0/000" and sample["bin"] == b"\x00"
    assert sample["cls"] == b"0" and sample["__repeat__"] is False
    assert all(type(v) in (str, bytes, int, bool) for v in sample.values())
    pickle.dumps(sample)


def test_shard_affinity_ranks_read_their_own_shards(tmp_path):
    """By default each rank's epoch comes from its own span of (shuffled) shards: 40 shards, 4
    ranks -> at most 10 + 2 shards a rank, each sample once; shard_affinity=False spreads every
    rank over most shards.  A state saved with one setting refuses the other."""
    src = make_tree(tmp_path / "src", {f"{i:03d}.bin": bytes([i % 256]) * 9 for i in range(400)})
    shardpack.pack(src, tmp_path / "out", max_samples=10, workers=1)
    for affinity, most in ((True, 12), (False, 40)):
        seen = []
        for rank in range(4):
            ds = ShardDataset(tmp_path / "out", rank=rank, world_size=4, seed=3, block_size=5,
                              shuffle_window=50, shard_affinity=affinity)
            ids = ids_of(ds)
            assert ids == expected_ids(ds, 0, 4, rank)
            shards = set(ds.reader.locate_many(ids)[0].tolist())
            assert len(shards) <= most and (affinity or len(shards) > 15)
            seen += ids
        assert sorted(seen) == list(range(400))
    state = ShardDataset(tmp_path / "out", world_size=4, rank=0).state_dict(samples_seen=3)
    with pytest.raises(ValueError, match="shard_affinity=True"):
        ShardDataset(tmp_path / "out", world_size=4, rank=0,
                     shard_affinity=False).load_state_dict(state)
    older = {k: v for k, v in state.items() if k != "shard_affinity"}  # saved before it existed
    with pytest.raises(ValueError, match=r"saved with shard_affinity=False.*pass "
                                         r"shard_affinity=False"):
        ShardDataset(tmp_path / "out", world_size=4, rank=0).load_state_dict(older)
    ShardDataset(tmp_path / "out", world_size=4, rank=0,
                 shard_affinity=False).load_state_dict(older)


@pytest.mark.parametrize("world", [2, 3, 8])
def test_ranks_get_equal_disjoint_shares(packed, world):
    per_rank = [ids_of(ShardDataset(packed, rank=r, world_size=world, seed=5))
                for r in range(world)]
    assert len({len(p) for p in per_rank}) == 1
    assert len(per_rank[0]) == len(ShardDataset(packed, rank=0, world_size=world))
    flat = [i for p in per_rank for i in p]
    assert set(flat) == set(range(N)) and len(flat) == -(-N // world) * world
    drop = [ids_of(ShardDataset(packed, rank=r, world_size=world, partial="drop"))
            for r in range(world)]
    assert len({len(p) for p in drop}) == 1 and len(set(sum(drop, []))) == (N // world) * world


def test_fields_selection_and_transform(packed):
    ds = ShardDataset(packed, fields=["cls"], transform=lambda s: {**s, "label": int(s["cls"])})
    sample = next(iter(ds))
    assert "bin" not in sample and sample["label"] == int(sample["cls"])
    with pytest.raises(ValueError, match="unknown fields"):
        ShardDataset(packed, fields=["jpg"])


@pytest.mark.parametrize("persistent", [True, False])
def test_set_epoch_reaches_persistent_workers(packed, persistent):
    ds = ShardDataset(packed, batch_size=4, block_size=8, shuffle_window=32)
    loader = DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=persistent,
                        collate_fn=collate)
    orders = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        orders.append(ids_of(loader))
        assert orders[-1] == expected_ids(ds, epoch)
    assert orders[0] != orders[1] != orders[2]


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_same_layout(packed, workers):
    B = 5
    ds = ShardDataset(packed, batch_size=B, seed=9)
    ds.set_epoch(3)
    loader = DataLoader(ds, batch_size=B, num_workers=workers, collate_fn=collate)
    full = ids_of(loader)
    seen = []
    for i, batch in enumerate(loader):
        seen += batch["__index__"].tolist()
        if i == 6:
            break
    state = json.loads(json.dumps(ds.state_dict(samples_seen=len(seen))))  # JSON-safe
    fresh = ShardDataset(packed, batch_size=B, seed=9)
    fresh.load_state_dict(state)
    rest = ids_of(DataLoader(fresh, batch_size=B, num_workers=workers, collate_fn=collate))
    assert seen + rest == full
    fresh.set_epoch(4)  # the next epoch is whole again
    assert sorted(ids_of(fresh)) == list(range(N))


@pytest.mark.parametrize("new_world,new_workers", [(1, 3), (3, 0), (2, 2)])
def test_elastic_resume(packed, new_world, new_workers):
    B, old_world, k = 4, 2, 12
    seen = []
    states = []
    for r in range(old_world):
        ds = ShardDataset(packed, batch_size=B, rank=r, world_size=old_world)
        seen += ids_of(ds)[:k]
        states.append(ds.state_dict(samples_seen=k))
    assert states[0] == states[1]  # one state for the whole job
    rest = []
    for r in range(new_world):
        ds = ShardDataset(packed, batch_size=B, rank=r, world_size=new_world)
        ds.load_state_dict(states[0])
        rest += [(i, rep) for b in DataLoader(ds, batch_size=B, num_workers=new_workers,
                                              collate_fn=collate)
                 for i, rep in zip(b["__index__"].tolist(), b["__repeat__"].tolist(), strict=True)]
    fresh = [i for i, rep in rest if not rep]
    assert sorted(seen + fresh) == list(range(N))


def _loader_ids(batch):
    return batch["__index__"].tolist()


@pytest.mark.parametrize("batched", [False, True])
def test_stateful_dataloader_resume(packed, batched):
    tdl = pytest.importorskip("torchdata.stateful_dataloader")
    B = 4

    def make():
        ds = ShardDataset(packed, batch_size=B, seed=2, batched=batched)
        return tdl.StatefulDataLoader(ds, batch_size=None if batched else B, num_workers=2,
                                      collate_fn=None if batched else collate)

    def save(loader, consumed, samples):
        return _plain(loader.state_dict())

    assert_resumes(make, save, lambda loader, state: loader.load_state_dict(state),
                   _loader_ids, points=(0, 2, 5))


def _plain(obj):
    """StatefulDataLoader states are plain data already; make tuples JSON-comparable."""
    return json.loads(json.dumps(obj))


@pytest.mark.parametrize("workers", [0, 2])
def test_generic_state_roundtrip_plain_dataloader(packed, workers):
    B = 6
    holder = {}

    def make():
        ds = ShardDataset(packed, batch_size=B, seed=7, batched=True)
        holder["ds"] = ds
        return DataLoader(ds, batch_size=None, num_workers=workers)

    def save(loader, consumed, samples):
        return loader.dataset.state_dict(samples_seen=samples)

    assert_resumes(make, save, lambda loader, state: loader.dataset.load_state_dict(state),
                   _loader_ids, points=(0, 1, 4))


def test_map_style_access(packed):
    ds = open_dataset(packed)
    assert len(ds) == N
    assert ds[5]["__key__"] == "c0/015" and ds[5]["bin"] == bytes([15]) * 16  # stored order
    assert ds.get("c1/010")["bin"] == bytes([10]) * 11 and ds[-1]["__index__"] == N - 1
    with pytest.raises(KeyError, match="no sample with key 'nope'"):
        ds.get("nope")
    batch = next(iter(DataLoader(ds, batch_size=7, collate_fn=collate, num_workers=1)))
    assert batch["bin"].item(3) == bytes([9]) * 10 and batch["__key__"][3] == "c0/009"


def test_collate_bytes_batch():
    samples = [{"__key__": "a", "jpg": b"xy", "cls": b"3", "__index__": 0, "__repeat__": False},
               {"__key__": "b", "jpg": b"", "cls": b"11", "__index__": 1, "__repeat__": True}]
    batch = collate(samples)
    assert batch["__key__"] == ["a", "b"] and batch["cls"].tolist() == [3, 11]
    assert batch["jpg"].data.dtype == torch.uint8 and batch["jpg"].offsets.tolist() == [0, 2, 2]
    assert batch["jpg"].items() == [b"xy", b""] and batch["__repeat__"].tolist() == [False, True]
    batch = collate([{"jpg": b"a", "json": b"{}"}, {"jpg": b"b"}])
    assert batch["json"].items() == [b"{}", b""]


def test_collate_memoryviews_into_a_slot_pool():
    """The fast start's batch: fields as memoryviews (labels too), large ones copied straight
    into a leased slot of the pool, small ones joined."""
    from shardpack.loader.batches import INLINE_LIMIT
    from shardpack.loader.buffers import SlotPool

    big = [os.urandom(INLINE_LIMIT // 2 + 1), os.urandom(INLINE_LIMIT // 2 + 1)]
    samples = [{"__key__": k, "jpg": memoryview(b), "cls": memoryview(c), "txt": memoryview(t)}
               for k, b, c, t in zip("ab", big, (b"4", b"12"), (b"x", b""), strict=True)]
    pool = SlotPool.create()
    if pool is None:
        pytest.skip("this system cannot map a slot pool")

    def check(out):
        batch = collate(samples, pool)
        out.put((batch["cls"].tolist(), batch["txt"].items(), batch["jpg"].items() == big,
                 len(batch.__dict__.get("_leases", {}))))

    import multiprocessing
    import queue

    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=check, args=(out,))  # a worker: it leases slots
    child.start()
    got = out.get(timeout=60)
    child.join(60)
    assert got == ([4, 12], [b"x", b""], True, 1)  # the big field sits in a slot
    mine = queue.Queue()
    check(mine)  # the pool's own process has nobody to send to: no slot, same bytes
    assert mine.get() == ([4, 12], [b"x", b""], True, 0)


def _copy(packed, tmp_path):
    import shutil

    shutil.copytree(packed, tmp_path / "copy")
    return tmp_path / "copy"


def test_missing_shard_names_it(packed, tmp_path):
    ds_path = _copy(packed, tmp_path)
    victim = sorted(p for p in ds_path.iterdir() if p.suffix in (".tar", ".spk"))[1]
    victim.unlink()
    with pytest.raises(DatasetNotFoundError, match=victim.name):
        ids_of(ShardDataset(ds_path, shuffle=False))


def test_truncated_shard_names_it(packed, tmp_path):
    ds_path = _copy(packed, tmp_path)
    victim = sorted(p for p in ds_path.iterdir() if p.suffix in (".tar", ".spk"))[0]
    victim.write_bytes(victim.read_bytes()[:100])
    with pytest.raises(FormatError, match=f"{victim.name}.*truncated"):
        ids_of(ShardDataset(ds_path))


def test_bad_crc_is_caught_or_skipped(tmp_path):
    src = make_tree(tmp_path / "src", {f"{i}.bin": bytes([i]) * 50 for i in range(10)})
    out = tmp_path / "out"
    shardpack.pack(src, out, shard_format="msgpack", workers=1)
    shard = out / "shard-00000.spk"
    data = bytearray(shard.read_bytes())
    data[16 + 24 + 20] ^= 0xFF  # inside the first record's payload
    shard.write_bytes(bytes(data))
    with pytest.raises(IntegrityError,
                       match=r"shard-00000.spk, sample '0', offset 16: .*index hash"):
        ids_of(ShardDataset(out, shuffle=False))
    ds = ShardDataset(out, shuffle=False, on_error="skip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = ids_of(ds)
    assert got == list(range(1, 10)) and ds.stats["skipped"] == 1
    assert any("skipped a bad sample" in str(w.message) for w in caught)


def test_version_mismatch_is_named(packed, tmp_path):
    ds_path = _copy(packed, tmp_path)
    manifest = json.loads((ds_path / "shardpack.json").read_text())
    manifest["version"] = 3
    (ds_path / "shardpack.json").write_text(json.dumps(manifest))
    with pytest.raises(VersionError, match=r"expected one of \(1, 2\), found 3"):
        ShardDataset(ds_path)


def test_state_version_and_settings_are_checked(packed):
    ds = ShardDataset(packed)
    state = ds.state_dict(samples_seen=3)
    with pytest.raises(ValueError, match="seed"):
        ShardDataset(packed, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="state version"):
        ds.load_state_dict({**state, "version": 99})


@pytest.mark.parametrize("workers", [0, 2])
def test_batched_mode_matches_sample_mode(packed, workers):
    B = 8
    plain = ShardDataset(packed, batch_size=B, seed=4)
    fast = ShardDataset(packed, batch_size=B, seed=4, batched=True)
    a = list(DataLoader(plain, batch_size=B, num_workers=workers, collate_fn=collate))
    b = list(DataLoader(fast, batch_size=None, num_workers=workers))
    assert len(a) == len(b) == -(-N // B)
    for x, y in zip(a, b, strict=True):
        assert x["__key__"] == y["__key__"] and torch.equal(x["__index__"], y["__index__"])
        assert torch.equal(x["cls"], y["cls"]) and x["bin"].items() == y["bin"].items()
        assert torch.equal(x["bin"].offsets, y["bin"].offsets)


def test_batch_pickles_small_tensors_inline():
    import pickle

    from shardpack.loader.batches import INLINE_LIMIT, Batch, BytesBatch

    small = torch.arange(10)
    big = torch.zeros(INLINE_LIMIT, dtype=torch.uint8)
    batch = Batch({"a": small, "b": BytesBatch(big, torch.tensor([0, INLINE_LIMIT])), "k": ["x"]})
    back = pickle.loads(pickle.dumps(batch))
    assert isinstance(back, Batch) and torch.equal(back["a"], small)
    assert torch.equal(back["b"].data, big) and back["b"].offsets.tolist() == [0, INLINE_LIMIT]
    back["a"][0] = 5  # rebuilt tensors are writable


def test_vectorised_label_parsing():
    from shardpack.loader.gather import _parse_decimal

    raw = b"3" + b"12" + b"0" + b"907"
    src = np.frombuffer(raw, dtype=np.uint8)
    starts, sizes = np.array([0, 1, 3, 4]), np.array([1, 2, 1, 3])
    assert _parse_decimal(src, starts, sizes).tolist() == [3, 12, 0, 907]
    assert _parse_decimal(np.frombuffer(b"-1", dtype=np.uint8), np.array([0]),
                          np.array([2])) is None  # not plain digits: the caller falls back


def test_a_bad_label_fails_its_own_batch_only(tmp_path):
    """Labels are parsed for a planned stretch of batches at once; a label further on that is not
    an integer must not fail the batches before its own."""
    files = {}
    for i in range(N):
        files[f"{i:03d}.bin"] = bytes([i]) * 5
        files[f"{i:03d}.cls"] = b"x1" if i == 90 else str(i % 7).encode()
    shardpack.pack(make_tree(tmp_path / "src", files), tmp_path / "out", shard_format="tar",
                   workers=1)
    ds = ShardDataset(tmp_path / "out", shuffle=False, batch_size=8, batched=True)
    got = []
    with pytest.raises(ValueError, match=r"shard-00000.tar, sample '090', offset \d+: field "
                                         r"'cls' holds b'x1', not an integer"):
        for batch in DataLoader(ds, batch_size=None):
            got.append(batch)
    assert len(got) == 90 // 8  # every batch before the one holding sample 90
    labels = torch.cat([b["cls"] for b in got]).tolist()
    assert labels == [i % 7 for i in range(len(got) * 8)]


def test_workers_put_inherited_objects_out_of_the_collectors_reach(packed):
    import gc

    def freeze_count(batch):
        batch["frozen"] = torch.tensor([gc.get_freeze_count()])
        return batch

    before = gc.get_freeze_count()
    ds = ShardDataset(packed, batch_size=8, batched=True, transform=freeze_count)
    in_workers = [b["frozen"].item() for b in DataLoader(ds, batch_size=None, num_workers=2)]
    assert min(in_workers) > 1000  # the objects inherited from this process
    in_process = [b["frozen"].item() for b in DataLoader(ds, batch_size=None)]
    assert set(in_process) == {before} and gc.get_freeze_count() == before  # trainer untouched


@pytest.mark.parametrize("where", ["payload", "flags"])
def test_batched_reads_check_each_record(tmp_path, where):
    src = make_tree(tmp_path / "src", {f"{i}.bin": bytes([i]) * 50 for i in range(10)})
    out = tmp_path / "out"
    shardpack.pack(src, out, shard_format="msgpack", workers=1)
    reader = shardpack.read.reader.DatasetReader(out)
    index = reader.index(0)
    row = index.keys().index("7")
    start = int(index.starts[row])
    shard = out / "shard-00000.spk"
    data = bytearray(shard.read_bytes())
    data[start + (30 if where == "payload" else 20)] ^= 0x01  # payload byte, or the flags
    shard.write_bytes(bytes(data))
    ds = ShardDataset(out, shuffle=False, batch_size=4, batched=True)
    got = []
    message = "index hash" if where == "payload" else "header mismatch"
    with pytest.raises(IntegrityError, match=rf"sample '7', offset {start}: .*{message}"):
        for batch in DataLoader(ds, batch_size=None):
            got.append(batch["__key__"].tolist())
    assert got == [["0", "1", "2", "3"]]


@pytest.mark.parametrize("version", [1, 2])
def test_state_of_a_previous_order_version(packed, version):
    ds = ShardDataset(packed, batch_size=8)
    state = {**ds.state_dict(samples_seen=16), "version": version}
    with pytest.raises(ValueError, match=f"expected 3, found {version}: .*unshuffled"):
        ShardDataset(packed, batch_size=8).load_state_dict(state)  # shuffled: orders differ
    plain = ShardDataset(packed, batch_size=8, shuffle=False)
    old = {**plain.state_dict(samples_seen=16), "version": version}
    fresh = ShardDataset(packed, batch_size=8, shuffle=False)
    fresh.load_state_dict(old)  # unshuffled: the same order in every version
    assert ids_of(fresh) == list(range(16, N))
    with pytest.raises(ValueError, match="found 99: saved by another shardpack"):
        ShardDataset(packed, batch_size=8).load_state_dict({**state, "version": 99})


def test_labels_that_int_accepts_are_parsed_once_per_stretch(tmp_path, monkeypatch):
    from shardpack.loader import gather

    calls = []
    parse = gather._parse_ints
    monkeypatch.setattr(gather, "_parse_ints", lambda *a: calls.append(1) or parse(*a))
    files = {}
    for i in range(N):
        files[f"{i:03d}.bin"] = bytes([i]) * 5
        files[f"{i:03d}.cls"] = b"%d\n" % (i % 7) if i % 2 else b"-%d" % (i % 5)
    shardpack.pack(make_tree(tmp_path / "src", files), tmp_path / "out", shard_format="tar",
                   workers=1)
    ds = ShardDataset(tmp_path / "out", shuffle=False, batch_size=8, batched=True)
    got = torch.cat([b["cls"] for b in DataLoader(ds, batch_size=None)]).tolist()
    assert got == [i % 7 if i % 2 else -(i % 5) for i in range(N)]
    assert len(calls) == 3  # stretches of 1, 4 and 16 batches (13 batches in all)


def test_copies_have_their_own_epoch_and_a_pickled_reader_one_shard_list(packed):
    import copy
    import pickle

    ds = ShardDataset(packed)
    twin = copy.copy(ds)
    twin.set_epoch(7)
    assert ds.epoch == 0 and twin.epoch == 7  # a copy's set_epoch is its own
    reader = pickle.loads(pickle.dumps(ds.reader))
    assert reader.shards is reader.manifest.shards  # one list of entries, not two
    assert reader.manifest == ds.reader.manifest


def test_a_process_keeps_a_bounded_number_of_indexes(packed, monkeypatch):
    from shardpack.read import reader as reader_module

    monkeypatch.setattr(reader_module, "MAX_INDEXES", 2)
    ds = ShardDataset(packed, shuffle=True, seed=3, batch_size=4, batched=True)
    assert len(ds.reader.shards) > 2
    seen = []
    for batch in ds:
        seen += batch["__index__"].tolist()
        # at most MAX_INDEXES, beyond the shards mapped right now (a batch uses them)
        assert len(ds.reader._indexes) <= 2 + len(ds.reader._buffers)
    assert sorted(seen) == list(range(N))
