"""Batch buffers reused between DataLoader workers and the trainer (loader/buffers.py), and Keys."""

import copy
import functools
import gc
import os
import pickle
import threading
import time
import weakref

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_convert

import shardpack
from shardpack import ShardDataset
from shardpack.loader.batches import SLOT_MIN, Batch, BytesBatch, Keys
from shardpack.loader.buffers import SlotPool, receive
from shardpack.core.errors import ShardpackError

from testbed.helpers import make_tree


def _payload(i: int, size: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8).tobytes()


@pytest.fixture(scope="module", params=[(48, 20_000, 8), (384, 700, 128)], ids=["big", "tiny"])
def packed(request, tmp_path_factory):
    """(dataset, {key: bytes}, batch size): every batch's bin field is >= SLOT_MIN bytes."""
    count, size, batch = request.param
    root = tmp_path_factory.mktemp("bufs")
    files = {f"c{i % 2}/{i:04d}.bin": _payload(i, size + i % 7) for i in range(count)}
    src = make_tree(root / "src", files)
    shardpack.pack(src, root / "out", shard_format="tar", max_samples=count // 3, workers=1)
    assert size * batch >= SLOT_MIN
    return root / "out", {k[:-4]: v for k, v in files.items()}, batch


def _as_sender(fn):
    """Run fn on a thread named like multiprocessing.Queue's feeder: the DataLoader's hand-off,
    the only place a worker's batch travels as slot numbers."""
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()), name="QueueFeederThread")
    thread.start()
    thread.join()
    return out[0]


def _check(batch, expected):
    keys = batch["__key__"]
    assert isinstance(keys, shardpack.Keys) and len(keys) == len(batch["bin"])
    for key, value, label in zip(keys, batch["bin"].items(), batch["cls"].tolist(), strict=True):
        assert expected[key] == value, key
        assert label == int(key[1]), key  # ImageFolder class of c0/ or c1/: labels parsed, memo


def test_workers_reuse_slots_and_the_trainer_frees_them(packed):
    path, expected, B = packed
    ds = ShardDataset(path, batch_size=B, batched=True, seed=3)
    pool = ds.slot_pool
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    seen = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        for batch in loader:
            _check(batch, expected)
            seen += batch["__index__"].tolist()
        # the last batch is still held here: its slot is busy, every other one came back
        assert pool.free_slots() == pool.slots - 1
        del batch
        gc.collect()
        assert pool.free_slots() == pool.slots
    assert sorted(seen) == sorted(list(range(len(expected))) * 3)


def test_trainer_holding_every_batch_falls_back_without_waiting(packed):
    path, expected, B = packed
    ds = ShardDataset(path, batch_size=B, batched=True, slot_pool=SlotPool(slots=2))
    held = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert len(held) == -(-len(expected) // B) > 2
    for batch in held:  # slot contents were never overwritten while held
        _check(batch, expected)
    assert ds.slot_pool.free_slots() == 0
    del held, batch
    gc.collect()
    assert ds.slot_pool.free_slots() == 2


def test_a_field_replaced_in_the_worker_gives_its_slot_back(packed):
    path, expected, B = packed

    def drop_bytes(batch):
        batch["size"] = torch.tensor([len(x) for x in batch.pop("bin").items()])
        return batch

    ds = ShardDataset(path, batch_size=B, batched=True, transform=drop_bytes)
    sizes = {}
    for batch in DataLoader(ds, batch_size=None, num_workers=1):
        sizes.update(zip(batch["__key__"], batch["size"].tolist(), strict=True))
    assert sizes == {k: len(v) for k, v in expected.items()}
    assert ds.slot_pool.free_slots() == ds.slot_pool.slots  # the worker released what it never sent


def test_field_larger_than_a_slot_goes_the_old_way(packed):
    path, expected, B = packed
    ds = ShardDataset(path, batch_size=B, batched=True,
                      slot_pool=SlotPool(slots=4, slot_bytes=1 << 12))
    for batch in DataLoader(ds, batch_size=None, num_workers=1):
        _check(batch, expected)
    assert ds.slot_pool.free_slots() == 4


def test_spawned_workers_do_not_carry_the_pool(packed):
    path, expected, B = packed
    ds = ShardDataset(path, batch_size=B, batched=True)
    assert pickle.loads(pickle.dumps(ds)).slot_pool is None
    loader = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="spawn")
    total = 0
    for batch in loader:
        _check(batch, expected)
        total += len(batch["__key__"])
    assert total == len(expected) and ds.slot_pool.free_slots() == ds.slot_pool.slots


def test_lease_is_refused_in_the_owner_and_unknown_pools_are_named():
    pool = SlotPool(slots=2, slot_bytes=1 << 16)
    assert pool.lease(100) is None  # the owning process has nobody to send to
    pool.owner = -1                 # pretend to be a worker
    assert pool.lease(0) is None and pool.lease((1 << 16) + 1) is None
    lease = pool.lease(100)
    assert lease is not None and pool.free_slots() == 1
    del lease
    gc.collect()
    assert pool.free_slots() == 2   # never sent: freed with its last view
    with pytest.raises(ShardpackError, match="pool nope"):
        receive("nope", 0, 10, 1)


def test_sent_batch_rebuilds_as_a_view_and_frees_on_death():
    pool = SlotPool(slots=2, slot_bytes=1 << 20)
    pool.owner = -1
    batch = Batch({"x": torch.zeros(1)})
    batch.pool = pool
    data = batch.buffer(SLOT_MIN)
    data.numpy()[:] = 7
    batch["bin"] = BytesBatch(data, torch.tensor([0, SLOT_MIN]))
    assert len(pickle.dumps(batch)) > SLOT_MIN  # pickled by user code: by value, not sent
    blob = _as_sender(functools.partial(pickle.dumps, batch))
    assert len(blob) < 1000  # the bytes stayed in the slot
    del batch, data
    gc.collect()
    assert pool.free_slots() == 1  # sent: only the receiver frees it
    pool.owner = os.getpid()  # now the receiving (owning) process
    back = pickle.loads(blob)
    view = back["bin"].data[10:20]
    assert int(back["bin"].data.sum()) == 7 * SLOT_MIN
    del back
    gc.collect()
    assert pool.free_slots() == 1  # a view of the slot is still alive
    del view
    gc.collect()
    assert pool.free_slots() == 2


def test_keys_behave_like_a_read_only_list():
    names = ["a/1", "b/ü", "c/" + "\udcff"]  # a surrogate-escaped byte survives
    keys = Keys.of(names)
    assert len(keys) == 3 and list(keys) == names and keys == names and keys[1] == "b/ü"
    assert keys[1:] == names[1:] and "a/1" in keys and keys.tolist() == names
    assert [] + keys == names and keys + ["z"] == names + ["z"]
    assert sum([keys, keys], []) == names * 2
    assert pickle.loads(pickle.dumps(keys)) == keys
    assert default_convert(keys) is keys  # the DataLoader does not walk it
    assert repr(Keys.of(["x"])) == "Keys(['x'])"
    with pytest.raises(TypeError):
        hash(keys)


def test_keys_cross_from_a_worker_as_sample_ids(packed):
    path, expected, B = packed
    ds = ShardDataset(path, batch_size=B, batched=True, shuffle=False)
    ids = np.arange(B, dtype=np.int64)[::-1].copy()
    keys = Keys.of_samples(ds.reader, ids)
    assert pickle.loads(pickle.dumps(keys)) == keys  # in the owning process: resolved, by value
    ds.slot_pool.owner = -1  # as if in a forked worker
    fresh = Keys.of_samples(ds.reader, ids)
    blob = _as_sender(lambda: pickle.dumps(fresh))
    assert b"_keys_of_ids" in blob and fresh._blob is None  # ids only, nothing looked up
    ds.slot_pool.owner = os.getpid()
    back = pickle.loads(blob)
    names = sorted(expected)
    assert back.tolist() == [names[i] for i in ids.tolist()] and len(back) == B


def test_copies_made_in_a_worker_never_free_the_slot(packed):
    """A transform that deep-copies the batch (or pickles it) in the worker: the copy goes by
    value, so dropping it frees nothing the trainer will read."""
    path, expected, B = packed

    def copy_and_wait(batch):
        dup = copy.deepcopy(batch)
        assert torch.equal(dup["bin"].data, batch["bin"].data)
        del dup
        gc.collect()
        time.sleep(0.02)  # let the other worker claim whatever was freed
        return batch

    ds = ShardDataset(path, batch_size=B, batched=True, transform=copy_and_wait)
    for batch in DataLoader(ds, batch_size=None, num_workers=2):
        _check(batch, expected)


def test_forked_children_free_nothing_and_dead_workers_slots_come_back():
    pool = SlotPool(slots=3, slot_bytes=1 << 16)
    pool.owner = -1  # this process plays a worker
    lease = pool.lease(100)
    handle = _as_sender(lease.handle)
    pool.owner = os.getpid()
    held = receive(*handle)  # the owner holds slot 0
    held[:] = 5
    ctx = __import__("multiprocessing").get_context("fork")

    def child():
        gc.collect()
        weakref.finalize._exitfunc()  # what interpreter exit would run: nothing of ours
        pool.owner = -1
        kept = pool.lease(100)  # a worker takes slot 1 and dies before sending it
        os._exit(0 if kept is not None and kept.slot == 1 else 3)

    proc = ctx.Process(target=child)
    proc.start()
    proc.join()
    assert proc.exitcode == 0 and int(held.sum()) == 5 * 100
    assert pool._state[0] == 2 and pool._state[1] == 1  # held; taken by a dead worker
    pool.owner = -1
    again = [pool.lease(100) for _ in range(2)]
    assert sorted(x.slot for x in again) == [1, 2]  # the dead worker's slot was taken back
    pool.owner = os.getpid()
    stale = (handle[0], 1, 100, int(pool._gen[1]) - 1)
    with pytest.raises(ShardpackError, match="taken back"):
        receive(*stale)  # an old handle for a reused slot is refused, never read


def test_a_pool_serves_one_dataset(packed):
    """Two datasets on one pool would look batch keys up in the wrong reader: refused."""
    path, _, B = packed
    pool = SlotPool(slots=2)
    ShardDataset(path, batch_size=B, batched=True, slot_pool=pool)
    with pytest.raises(ValueError, match="already serves another dataset"):
        ShardDataset(path, batch_size=B, batched=True, slot_pool=pool)
    with pytest.raises(ValueError, match="slot_pool is for batched=True"):
        ShardDataset(path, batch_size=B, slot_pool=SlotPool(slots=2))


def _thp_off() -> str | None:
    """Why this process gets no transparent huge pages, or None."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                return "THP is off in the kernel"
        with open("/proc/self/status") as f:
            if any(line.split() == ["THP_enabled:", "0"] for line in f):
                return "THP is off for this process (prctl)"
    except OSError:
        return "no THP settings to read"
    if not np._core.multiarray._get_madvise_hugepage():
        return "numpy's huge-page madvise is off (NUMPY_MADVISE_HUGEPAGE=0)"
    return None


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds ``address``."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(_thp_off() is not None, reason=str(_thp_off()))
def test_a_batch_buffer_outside_workers_asks_for_huge_pages():
    """A large batch made without DataLoader workers lands in fresh memory every time; with 4 KB
    pages filling 32 MB took 8,192 page faults (most of a no-worker epoch's time,
    docs/reading.md).  Its memory must be marked for huge pages (``hg``: madvise(MADV_HUGEPAGE);
    torch's own allocator does not mark it)."""
    from shardpack.loader.batches import new_buffer

    data = new_buffer(32 << 20, shared=False)
    data.fill_(1)
    # (+1 page: the allocator's header page before the array is not marked)
    assert "hg" in _vm_flags(data.data_ptr() + 4096 + (-data.data_ptr()) % 4096)
    assert data.numel() == 32 << 20 and int(data[-1]) == 1


def test_a_worker_takes_a_slot_it_wrote_before_the_lowest_free():
    """Each process that writes a slot first maps its pages (a fault every 4 KB): a worker takes
    a free slot it has written before over a lower one it has not."""
    pool = SlotPool(slots=4, slot_bytes=1 << 16)
    pool.owner = -1  # this process plays a worker
    pool._state[0], pool._pid[0] = 1, os.getppid()  # slot 0: another worker's, for now
    first = pool.lease(5000)
    assert first.slot == 1
    first.array[:] = 7
    del first
    gc.collect()
    pool._state[0] = 0  # the other worker's batch came back: slots 0 and 1 are free
    again = pool.lease(5000)
    assert again.slot == 1 and int(again.array.sum()) == 7 * 5000
    ctx = __import__("multiprocessing").get_context("fork")

    def child():  # a process that has written no slot takes the lowest free one
        lease = pool.lease(100)
        os._exit(0 if lease is not None and lease.slot == 0 else 3)

    proc = ctx.Process(target=child)
    proc.start()
    proc.join()
    assert proc.exitcode == 0
