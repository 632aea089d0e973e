"""The read pipeline's stages: one save/restore check on every stage, threads against processes
(same samples, order and crops), the per-stage counters, and the torchdata node."""

import gc
import os
import threading
import time
import weakref

import numpy as np

import pytest
import torch
from torch.utils.data import DataLoader

import shardpack
from shardpack import CpuDecode, ShardDataset
from shardpack.core.errors import DecodeError, IntegrityError
from shardpack.loader.pipeline import DATASET_STAGES

from testbed.helpers import make_tree
from testbed.stateful import assert_resumes

N = 83  # prime: no batch size or worker count divides it
B = 8


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("stages")
    files = {f"c{i % 3}/{i:03d}.jpg": _jpeg(i) for i in range(N)}
    shardpack.pack(make_tree(root / "src", files), root / "out", max_samples=20, workers=1)
    return root / "out"


def _jpeg(i: int) -> bytes:
    import io

    from PIL import Image

    rng = np.random.default_rng(i)
    pixels = rng.integers(0, 255, (20 + i % 13, 24 + i % 7, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=85)
    return out.getvalue()


def _dataset(path, **kw):
    kw.setdefault("batched", True)
    decode = kw.pop("decode", True)
    if isinstance(decode, bool):
        decode = CpuDecode(16) if decode else None
    return ShardDataset(path, batch_size=B, seed=5, block_size=4, shuffle_window=16,
                        decode=decode, **kw)


def _ids(item):
    if isinstance(item, tuple):  # the order stage's (start, part)
        return item[1].ids.tolist()
    if isinstance(item, list):  # a part's samples
        return [sample["__index__"] for sample in item]
    index = item["__index__"]
    return index.tolist() if isinstance(index, torch.Tensor) else [index]


def _stage(ds, name):
    return next(stage for stage in ds.pipeline().chain() if stage.name == name)


def _same(item):
    return item


class _Run:
    """One stage of a fresh chain, iterated from its reset (or a loaded state)."""

    def __init__(self, path, name, batched):
        ds = _dataset(path, batched=batched, decode=True if batched else _same,
                      transform=_same)
        self.stage = _stage(ds, name)
        self.state = None

    def __iter__(self):
        self.stage.reset(self.state)
        return self.stage


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("name", DATASET_STAGES)
def test_every_stage_resumes_from_its_state(images, name, batched):
    def load(run, state):
        run.state = state

    assert_resumes(lambda: _Run(images, name, batched), lambda run, c, s: run.stage.state(),
                   load, _ids, points=(0, 1, 4))


def _processes(path, workers, **kw):
    ds = _dataset(path, **kw)
    loader = DataLoader(ds, batch_size=None if ds.batched else B, num_workers=workers,
                        collate_fn=None if ds.batched else shardpack.collate)
    return ds, list(loader)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_threads_give_the_same_batches_and_crops_as_processes(images, workers):
    _, want = _processes(images, workers)
    ds = _dataset(images, execution="threads", workers=workers)
    got = list(ds)
    assert [_ids(b) for b in got] == [_ids(b) for b in want]
    assert sorted(sum((_ids(b) for b in got), [])) == list(range(N))
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(got, want, strict=True))
    assert ds.stats["yielded"] == N


def test_threads_sample_by_sample_and_through_a_dataloader(images):
    _, want = _processes(images, 2, batched=False, decode=False)
    ds = _dataset(images, batched=False, decode=False, execution="threads", workers=2)
    got = [s["__index__"] for s in DataLoader(ds, batch_size=None, num_workers=0)]
    assert got == sum((_ids(b) for b in want), [])


def test_threads_refuse_dataloader_worker_processes(images):
    ds = _dataset(images, execution="threads", workers=2)
    with pytest.raises(ValueError, match="num_workers=0"):
        list(DataLoader(ds, batch_size=None, num_workers=1))


def test_execution_options_are_checked(images):
    with pytest.raises(ValueError, match="execution must be one of"):
        _dataset(images, execution="fibers")
    with pytest.raises(ValueError, match="workers= is for execution='threads'"):
        _dataset(images, workers=2)
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        _dataset(images, execution="threads", workers=0)
    threaded = _dataset(images, execution="threads", workers=3)
    assert threaded.workers == 3 and threaded.execution == "threads"
    assert threaded.slot_pool is None  # batches stay in this process's memory


@pytest.mark.parametrize("new_world", [1, 3])
def test_thread_state_resumes_with_another_world_size(images, new_world):
    seen, states = [], []
    for rank in range(2):
        ds = _dataset(images, execution="threads", workers=2, rank=rank, world_size=2)
        batches = iter(ds)
        for _ in range(3):
            seen += _ids(next(batches))
        states.append(ds.state_dict())
        batches.close()
    assert states[0] == states[1]  # one state for the whole job, JSON-able
    rest = []
    for rank in range(new_world):
        ds = _dataset(images, execution="threads", workers=3, rank=rank, world_size=new_world)
        ds.load_state_dict(states[0])
        rest += [i for b in ds for i, rep in zip(_ids(b), b["__repeat__"].tolist(),
                                                 strict=True) if not rep]
    assert sorted(seen + rest) == list(range(N))


def _corrupt_one_sample(path):
    shard = sorted(path.glob("*.tar"))[1]
    data = bytearray(shard.read_bytes())
    at = data.index(b"\xff\xd8\xff")  # the first JPEG's start
    data[at + 40] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_threads_check_every_read_and_raise_in_the_consumer(images, tmp_path):
    import shutil

    copy = tmp_path / "ds"
    shutil.copytree(images, copy)
    _corrupt_one_sample(copy)
    before = threading.active_count()
    with pytest.raises(IntegrityError, match="do not match the index hash"):
        list(_dataset(copy, execution="threads", workers=2))
    assert threading.active_count() == before  # the worker threads are gone, none hangs


def test_a_consumer_that_stops_early_stops_the_threads(images):
    before = threading.active_count()
    ds = _dataset(images, execution="threads", workers=3)
    batches = iter(ds)
    next(batches)
    batches.close()
    assert threading.active_count() == before


def test_a_decode_error_names_the_sample(images):
    def broken(batch):
        raise DecodeError("cannot decode", key=batch["__key__"][0])

    ds = ShardDataset(images, batch_size=B, batched=True, decode=broken, execution="threads",
                      workers=2)
    with pytest.raises(DecodeError, match="cannot decode"):
        list(ds)


@pytest.mark.parametrize("execution", ["threads", "processes"])
def test_stats_count_every_stage_over_all_workers(images, execution):
    if execution == "threads":
        ds = _dataset(images, execution="threads", workers=2)
        batches = list(ds)
    else:
        ds, batches = _processes(images, 2)
    table = ds.stats()
    assert list(table) == list(DATASET_STAGES)
    for name in DATASET_STAGES:
        assert set(table[name]) == {"items", "busy_s", "wait_in_s", "wait_out_s"}
        # a stage the dataset has counts every batch; one it lacks (no transform) counts none
        assert table[name]["items"] == (0 if name == "transform" else len(batches)), name
    assert table["decode"]["busy_s"] > 0 and table["read"]["busy_s"] > 0
    # each stage waits on its input for at least what the stages before it were busy
    assert table["decode"]["wait_in_s"] >= table["read"]["busy_s"] * 0.99
    ds.stats.reset_stages()
    assert ds.stats()["decode"]["items"] == 0


def test_device_loader_stats_add_its_own_stages(images):
    ds = _dataset(images, execution="threads", workers=2)
    loader = shardpack.DeviceLoader(DataLoader(ds, batch_size=None, num_workers=0),
                                    decode_on="cpu", spec=ds.decode.spec)
    batches = sum(1 for _ in loader)
    table = loader.stats()
    assert list(table) == list(DATASET_STAGES) + ["pin", "device", "idle"]
    assert table["device"]["items"] == table["decode"]["items"] == batches
    assert loader.stats["batches"] == batches  # the named counts are as before
    assert table["idle"]["timing"] == "host" and table["idle"]["epoch_starts"] == 1


def _children() -> set[int]:
    """This process's child processes (every thread's), from /proc."""
    import glob

    out = set()
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        try:
            with open(path) as f:
                out.update(int(pid) for pid in f.read().split())
        except FileNotFoundError:  # a thread that ended since the listing: it has no children
            continue
    return out


@pytest.mark.parametrize("execution", ["threads", "processes"])
def test_a_dropped_loader_is_freed_at_once_and_its_workers_leave(images, execution):
    """No shardpack object of a loader is in a reference cycle: ``del`` frees it, and a
    DataLoader's persistent workers leave then, not at some later garbage collection in another
    loader's thread (which cost 5 s a worker, and stalled the next loader's first batch)."""
    before = _children()
    ds = _dataset(images, execution=execution, **({"workers": 2} if execution == "threads" else {}))
    workers = 0 if execution == "threads" else 1
    loader = shardpack.DeviceLoader(
        DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0),
        decode_on="cpu", spec=ds.decode.spec)
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert sum(1 for _ in loader) > 0
    assert loader.stats()["decode"]["items"] > 0
    started = _children() - before
    assert len(started) == workers, started
    refs = [weakref.ref(obj) for obj in (loader, loader.loader, ds)]
    gc.disable()  # what is freed now is freed by reference counts alone
    try:
        del loader, ds
        assert [ref() is None for ref in refs] == [True] * 3
        deadline = time.monotonic() + 3.0
        while started & _children() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not started & _children(), "the workers outlived their loader"
    finally:
        gc.enable()


class _SlowBatches:
    """Batches that take ``delay`` seconds each to make: the loader, not the step, is slow."""

    def __init__(self, n: int, delay: float):
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for i in range(self.n):
            time.sleep(self.delay)
            yield {"__index__": torch.tensor([i])}


@pytest.mark.parametrize("make_ms,step_ms,low,high", [(40, 10, 0.55, 0.9), (0, 20, 0.0, 0.15)])
def test_the_device_idle_share_is_timed_on_the_host_without_cuda(make_ms, step_ms, low, high):
    # batches take make_ms to make and the step step_ms: the device idles about
    # (make - step) / make of the time between steps; the first batch is an epoch start, apart
    loader = shardpack.DeviceLoader(_SlowBatches(12, make_ms / 1000), prefetch_batches=1)
    for _ in loader:
        time.sleep(step_ms / 1000)
    idle = loader.idle()
    assert idle["timing"] == "host" and idle["epoch_starts"] == 1
    assert low <= idle["idle_fraction"] <= high, idle
    assert idle["busy_s"] >= 11 * step_ms / 1000 * 0.9  # every step after the first counted
    assert idle["start_idle_s"] >= make_ms / 1000 * 0.9
    assert loader.stats()["idle"]["idle_fraction"] == idle["idle_fraction"]
    assert loader.gpu_idle_fraction is None  # the CUDA-event figure is CUDA's alone
    loader.reset_stats()
    assert loader.idle()["idle_fraction"] is None and loader.idle()["epoch_starts"] == 0


def test_shard_node_resumes_through_torchdata_loader(images):
    nodes = pytest.importorskip("torchdata.nodes")

    def make():
        return nodes.Loader(shardpack.ShardNode(images, batch_size=B, batched=True, seed=5,
                                                workers=2))

    def save(loader, consumed, samples):
        return loader.state_dict()

    def load(loader, state):
        loader.load_state_dict(state)

    assert_resumes(make, save, load, _ids, points=(0, 2, 7))
    loader = make()
    first, second = [sum((_ids(b) for b in loader), []) for _ in range(2)]
    assert sorted(first) == sorted(second) == list(range(N)) and first != second  # epochs


def test_thread_state_mid_part_sample_by_sample(images):
    def make():
        return _dataset(images, batched=False, decode=False, execution="threads", workers=2)

    assert_resumes(make, lambda ds, c, s: ds.state_dict(),
                   lambda ds, state: ds.load_state_dict(state), _ids, points=(0, 3, 13))


@pytest.mark.parametrize("place", ["cpu", "gpu"])
def test_one_decode_operation_placed_by_an_argument(images, place):
    from shardpack.transforms.gpudecode import standin_backend

    spec = shardpack.TransformSpec(size=16, seed=3)
    standin = standin_backend() if place == "gpu" else None

    def run(decode, **kw):
        ds = ShardDataset(images, batch_size=B, batched=True, seed=5, decode=decode,
                          execution="threads", workers=2)
        return list(shardpack.DeviceLoader(ds, decode_backend=standin, **kw))

    once = run(shardpack.Decode(spec, place=place))  # the spec and the place given once
    twice = run(CpuDecode(spec=spec) if place == "cpu" else None, decode_on=place, spec=spec)
    assert len(once) == len(twice) > 1
    for a, b in zip(once, twice, strict=True):
        assert a["image"].dtype == torch.float32 and torch.equal(a["image"], b["image"])
    with pytest.raises(ValueError, match="place must be one of"):
        shardpack.Decode(spec, place="tpu")


def test_device_loader_over_a_thread_dataset_directly_resumes(images):
    def make():
        ds = _dataset(images, decode=shardpack.Decode(shardpack.TransformSpec(size=16),
                                                      place="cpu"),
                      execution="threads", workers=2)
        return shardpack.DeviceLoader(ds)  # no DataLoader: the threads are the workers

    def load(loader, state):
        loader.load_state_dict(state)

    assert_resumes(make, lambda loader, c, s: loader.state_dict(), load, _ids, points=(0, 3))
    batch = next(iter(make()))
    assert batch["image"].dtype == torch.float32  # the place and spec came from the dataset
