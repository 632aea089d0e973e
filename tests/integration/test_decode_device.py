"""CPU decode against the Pillow reference; DeviceLoader on CPU; GPU paths skip without CUDA."""

import io
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import shardpack
from shardpack import DeviceLoader, ShardDataset
from shardpack.transforms.decode import (CpuDecode, CropOptions, SampleRandom, decode_image,
                              reference_decode)
from shardpack.core.errors import DecodeError

from testbed.helpers import make_tree
from testbed.stateful import assert_resumes


def _photo(seed, w, h, fmt="JPEG"):
    from PIL import Image

    rng = np.random.default_rng(seed)
    # smooth content plus a little noise, like a photo (pure noise makes every resize differ)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * (seed + 1)) % 256, (y * 3) % 256, ((x + y) * 2) % 256], -1)
    arr = np.clip(base + rng.normal(0, 6, base.shape), 0, 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


@pytest.fixture(scope="module")
def photos():
    sizes = [(500, 375), (375, 500), (640, 480), (1200, 900), (300, 260), (2000, 1500)]
    return [_photo(i, w, h) for i, (w, h) in enumerate(sizes * 3)]


@pytest.mark.parametrize("train", [True, False])
def test_fast_decode_matches_pillow_reference(photos, train):
    opts = CropOptions(size=224, train=train)
    means = []
    for i, data in enumerate(photos):
        fast = decode_image(data, opts, SampleRandom(0, 0, i))
        ref = reference_decode(data, opts, SampleRandom(0, 0, i))
        assert fast.shape == ref.shape == (224, 224, 3) and fast.dtype == np.uint8
        means.append(np.abs(fast.astype(int) - ref.astype(int)).mean())
    # DCT-scaled decode (the 1200 and 2000 px images) and a different resize kernel differ a
    # little from a full-resolution Pillow decode; a wrong crop or flip differs by ~40-60
    assert np.mean(means) < 4 and max(means) < 10, means


def test_crops_are_deterministic_per_epoch_and_index(photos):
    opts = CropOptions(size=64)
    a = decode_image(photos[0], opts, SampleRandom(3, 1, 42))
    assert np.array_equal(a, decode_image(photos[0], opts, SampleRandom(3, 1, 42)))
    others = [decode_image(photos[0], opts, SampleRandom(3, e, i)) for e, i in [(2, 42), (1, 43)]]
    assert not any(np.array_equal(a, o) for o in others)


def test_png_and_corrupt_input(photos):
    png = _photo(1, 300, 200, "PNG")
    assert decode_image(png, CropOptions(size=32), None).shape == (32, 32, 3)
    with pytest.raises(DecodeError, match="cannot decode JPEG"):
        decode_image(b"\xff\xd8garbage", CropOptions(), None)
    with pytest.raises(DecodeError, match="cannot decode image"):
        decode_image(b"not an image", CropOptions(), None)


@pytest.fixture(scope="module")
def image_ds(tmp_path_factory, photos):
    root = tmp_path_factory.mktemp("imgs")
    files = {f"c{i % 2}/{i:03d}.jpg": photos[i % len(photos)] for i in range(30)}
    files["c0/bad.jpg"] = b"\xff\xd8 broken"
    src = make_tree(root / "src", files)
    # check="none": a broken image reaches training (packed unchecked, or by an older release)
    shardpack.pack(src, root / "ds", workers=1, max_samples=12, check="none")
    return root / "ds"


def test_cpu_decode_stage_in_workers(image_ds):
    ds = ShardDataset(image_ds, batch_size=8, batched=True,
                      decode=CpuDecode(64, on_error="skip"))
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    batches = list(loader)
    images = torch.cat([b["image"] for b in batches])
    assert images.shape == (31, 64, 64, 3) and images.dtype == torch.uint8
    bad = torch.cat([b["__bad__"] for b in batches])
    keys = sum((b["__key__"] for b in batches), [])
    assert bad.sum() == 1 and keys[int(bad.nonzero()[0, 0])] == "c0/bad"
    strict = ShardDataset(image_ds, batch_size=8, batched=True, decode=CpuDecode(64),
                          shuffle=False)
    with pytest.raises(DecodeError, match="sample 'c0/bad'"):
        list(strict)
    with pytest.raises(DecodeError, match=r"^in a DataLoader worker: sample 'c0/bad': cannot "):
        list(DataLoader(strict, batch_size=None, num_workers=1))


def test_device_loader_cpu_same_samples_in_order(image_ds):
    ds = ShardDataset(image_ds, batch_size=8, batched=True, decode=CpuDecode(32, on_error="skip"))
    plain = [b["__index__"].tolist() for b in DataLoader(ds, batch_size=None, num_workers=2)]
    dl = DeviceLoader(DataLoader(ds, batch_size=None, num_workers=2), device="cpu",
                      decode_on="cpu", size=32)
    got = []
    for batch in dl:
        got.append(batch["__index__"].tolist())
        img = batch["image"]
        assert img.shape[1:] == (3, 32, 32) and img.dtype == torch.float32
        assert img.is_contiguous(memory_format=torch.channels_last)
        assert -3 < float(img.mean()) < 3  # normalised
    assert got == plain and dl.stats["samples"] == 31


class _Slow(IterableDataset):
    def __init__(self, n, delay):
        self.n, self.delay = n, delay

    def __iter__(self):
        for i in range(self.n):
            time.sleep(self.delay)
            yield {"__index__": torch.tensor([i])}


def test_wait_accounting():
    # data takes 50 ms a batch, the consumer 10 ms: it waits ~80% of the time
    dl = DeviceLoader(DataLoader(_Slow(10, 0.05), batch_size=None), device="cpu")
    for _ in dl:
        time.sleep(0.01)
    assert 0.65 < dl.wait_fraction < 0.95, dl.stats
    assert dl.gpu_idle_fraction is None  # no CUDA stream to time
    # data is instant, the consumer slow: it (almost) never waits
    dl = DeviceLoader(DataLoader(_Slow(10, 0.0), batch_size=None), device="cpu", prefetch_batches=4)
    for _ in dl:
        time.sleep(0.03)
    assert dl.wait_fraction < 0.1, dl.stats


def test_reset_stats_forgets_what_came_before():
    dl = DeviceLoader(DataLoader(_Slow(8, 0.0), batch_size=None), device="cpu")
    it = iter(dl)
    next(it)
    time.sleep(0.4)  # a warm-up pause: not counted after the reset
    dl.reset_stats()
    for _ in range(5):
        next(it)
        time.sleep(0.01)
    assert dl.stats["batches"] == 5 and dl.stats["wall_s"] < 0.3, dl.stats
    assert 0 <= dl.wait_fraction <= 1


def test_device_loader_errors_reach_the_consumer():
    class Broken(IterableDataset):
        def __iter__(self):
            yield {"__index__": torch.tensor([0])}
            raise RuntimeError("boom in the pipeline")

    dl = DeviceLoader(DataLoader(Broken(), batch_size=None), device="cpu")
    with pytest.raises(RuntimeError, match="boom"):
        list(dl)


def test_device_loader_state_roundtrip(image_ds):
    def make():
        ds = ShardDataset(image_ds, batch_size=4, batched=True, seed=1)
        return DeviceLoader(DataLoader(ds, batch_size=None, num_workers=1), device="cpu")

    assert_resumes(make, lambda dl, consumed, samples: dl.state_dict(),
                   lambda dl, state: dl.load_state_dict(state),
                   lambda b: b["__index__"].tolist(), points=(0, 2, 5))


def test_gpu_decode_refused_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device exists")
    with pytest.raises(shardpack.DeviceError, match="needs a CUDA device; this machine has none"):
        DeviceLoader([], device="cpu", decode_on="gpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_decode_close_to_cpu(image_ds):
    pytest.importorskip("torchvision")
    ds = ShardDataset(image_ds, batch_size=8, batched=True, shuffle=False)
    gpu = DeviceLoader(DataLoader(ds, batch_size=None), device="cuda", decode_on="gpu", size=64,
                       normalize=False, on_error="skip")
    assert gpu.device == torch.device("cuda", torch.cuda.current_device())
    cpu_ds = ShardDataset(image_ds, batch_size=8, batched=True, shuffle=False,
                          decode=CpuDecode(64, on_error="skip"))
    cpu = DeviceLoader(DataLoader(cpu_ds, batch_size=None), device="cuda", decode_on="cpu",
                       normalize=False)
    for g, c in zip(gpu, cpu, strict=True):
        assert g["image"].device == gpu.device
        diff = (g["image"].float() - c["image"].float()).abs().mean()
        assert diff < 6
        assert g["__bad__"].tolist() == c["__bad__"].tolist()
    assert gpu.stats["cpu_fallbacks"] == 1 and gpu.stats["bad"] == 1  # the broken JPEG
    # the consumer stream's idle time, from CUDA events: the epoch start counted apart
    assert 0 <= gpu.gpu_idle_fraction <= 1 and gpu.stats["epoch_starts"] == 1, gpu.stats
    assert gpu.stats["gpu_start_idle_s"] > 0, gpu.stats
    raising = DeviceLoader(DataLoader(ds, batch_size=None), device="cuda", decode_on="gpu", size=64)
    with pytest.raises(DecodeError, match="bad"):
        list(raising)


def test_bench_command_end_to_end(image_ds, tmp_path):
    from testbed.helpers import run_cli

    out = run_cli("bench", image_ds, "--batch-size", "8", "--workers", "1", "--decode", "cpu",
                  "--size", "32", "--step-ms", "1", "-q").output
    assert "samples/s" in out and "(31 samples, 4 batches" in out and "waiting" in out
    assert "undecodable  1 images" in out
    from shardpack.interop.unpack import unpack

    unpacked = tmp_path / "files"
    unpack(image_ds, unpacked)
    for cls_file in unpacked.rglob("*.cls"):  # back to a plain ImageFolder tree
        cls_file.unlink()
    out = run_cli("bench", "--files", unpacked, "--batch-size", "8", "--workers", "0",
                  "--batches", "2", "-q").output
    assert "(16 samples, 2 batches" in out
    result = run_cli("bench", image_ds, "--decode", "gpu", "-q", ok=None)
    if not torch.cuda.is_available():
        assert result.exit_code == 2 and "needs a CUDA device" in result.output


class _Spy(CpuDecode):
    """Records, per batch, the threads of worker 0's head start (0: none) and whether worker 0's
    first batch was already done when this batch's decode began."""

    def _threads(self):
        threads, head_start = super()._threads()
        done = self._head is not None and self._head._page.value == self._head.token
        self._seen = [threads if head_start else 0, int(done)]
        return threads, head_start

    def __call__(self, batch):
        batch = super().__call__(batch)
        batch["spy"] = torch.tensor(self._seen)
        return batch


def test_a_loader_of_threads_gives_the_images_of_worker_processes(image_ds):
    def run(threads, workers):
        ds = ShardDataset(image_ds, batch_size=8, batched=True, seed=1,
                          decode=CpuDecode(48, on_error="skip", threads=threads))
        return list(DataLoader(ds, batch_size=None, num_workers=workers))

    threads, processes = run(3, 0), run(0, 2)
    assert len(threads) == len(processes) > 2
    key = lambda b: b["__index__"].tolist()  # noqa: E731 - the two loaders interleave alike
    for a, b in zip(sorted(threads, key=key), sorted(processes, key=key), strict=True):
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["__bad__"], b["__bad__"])
    assert sum(int(b["__bad__"].sum()) for b in threads) == 1  # the broken image, counted
    with pytest.raises(ValueError, match="threads must be an int"):
        CpuDecode(48, threads=-1)


def test_a_thread_pool_made_before_a_fork_is_not_reused_by_the_workers(image_ds):
    """A pool inherited through fork has no threads but counts idle ones: a worker using it
    would wait forever for its first batch."""
    ds = ShardDataset(image_ds, batch_size=8, batched=True, seed=1,
                      decode=CpuDecode(48, on_error="skip", threads=2))
    here = list(DataLoader(ds, batch_size=None, num_workers=0))  # the pool made in this process
    there = list(DataLoader(ds, batch_size=None, num_workers=1, timeout=60))
    assert len(here) == len(there) > 2


def test_head_start_worker_0_decodes_the_first_batch_on_every_cpu(image_ds):
    import os

    def run(head_start):
        ds = ShardDataset(image_ds, batch_size=8, batched=True, seed=1,
                          decode=_Spy(64, on_error="skip", head_start=head_start))
        out = list(DataLoader(ds, batch_size=None, num_workers=2))
        return ds, out

    ds, fast = run(True)
    _, plain = run(False)
    cpus = len(os.sched_getaffinity(0))
    spy = [b["spy"].tolist() for b in fast]
    assert spy[0] == [cpus, 0]  # worker 0's first batch: every CPU, nobody done yet
    assert spy[1] == [0, 1]     # worker 1's first batch began only once worker 0's was done
    assert all(s[0] == 0 for s in spy[2:])
    assert ds.decode._head._page.value == 1  # the page the workers wrote (epoch 0, 1st pass)
    assert [b["spy"].tolist()[0] for b in plain] == [0] * len(plain)
    for a, b in zip(fast, plain, strict=True):  # threads change nothing in the images
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["__bad__"], b["__bad__"])


def test_head_start_names_the_first_bad_sample_and_counts_worker_iterations(tmp_path, photos):
    files = {f"c0/{i:02d}.jpg": photos[i % len(photos)] for i in range(8)}
    files["c0/03.jpg"] = files["c0/06.jpg"] = b"\xff\xd8 broken"
    src = make_tree(tmp_path / "src", files)
    shardpack.pack(src, tmp_path / "ds", workers=1, check="none")
    ds = ShardDataset(tmp_path / "ds", batch_size=8, batched=True, shuffle=False,
                      decode=_Spy(32))
    with pytest.raises(DecodeError, match="sample 'c0/03'"):  # as one thread would say
        list(DataLoader(ds, batch_size=None, num_workers=1))
    ok = ShardDataset(tmp_path / "ds", batch_size=4, batched=True, shuffle=False,
                      decode=_Spy(32, on_error="skip"))
    list(ok)  # the training process iterates first: its count is not the workers'
    spy = [b["spy"].tolist() for b in DataLoader(ok, batch_size=None, num_workers=1)]
    assert spy[0][0] == len(__import__("os").sched_getaffinity(0)) and spy[1][0] == 0


def test_decode_gives_torch_no_read_only_array():
    """Pillow's pixels are read-only; a crop spanning whole rows used to reach torch.from_numpy
    as it was, and torch warned ("The given NumPy array is not writable") in every process.
    torch warns once per process, so the check runs in a fresh one with warnings as errors."""
    import subprocess
    import sys

    code = """if True:
        import io
        import warnings

        import numpy as np
        from PIL import Image

        from shardpack.transforms.decode import CpuDecode, CropOptions, SampleRandom, decode_image

        warnings.simplefilter("error")
        pixels = (np.arange(40 * 4 * 3) % 251).astype(np.uint8).reshape(40, 4, 3)
        for mode, fmt in [("RGB", "PNG"), ("L", "PNG"), ("RGB", "WEBP")]:
            buf = io.BytesIO()
            Image.fromarray(pixels).convert(mode).save(buf, fmt)
            # eval: the center crop of a 4 px wide image is whole rows
            assert decode_image(buf.getvalue(), CropOptions(16, train=False)).shape == (16, 16, 3)
            for i in range(20):  # training crops, some of them whole rows
                decode_image(buf.getvalue(), CropOptions(16), SampleRandom(0, 0, i))
        print("ok")
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-2000:]


def test_readme_bench_commands_run_as_written(image_ds, tmp_path, monkeypatch):
    """Every `shardpack bench` command the README shows runs, with the placeholders filled in
    and kept short; and `--files` appears only in such whole commands, since bench takes a
    DATASET or --files, never both."""
    import re
    import shlex

    from shardpack.interop.unpack import unpack

    from testbed.helpers import ROOT, run_cli

    text = (ROOT / "README.md").read_text()
    spans = re.findall(r"`([^`\n]*--files[^`\n]*)`", text.replace("\n  ", " "))
    assert spans and all(s.startswith("shardpack bench ") for s in spans), spans
    commands = re.findall(r"`(shardpack bench [^`]*)`", text.replace("\n  ", " "))
    commands += re.findall(r"^(shardpack bench .*?)(?:\s+#.*)?$", text, re.M)
    # a --sweep runs for its --budget: tests/integration/test_sweep.py runs it through the CLI
    commands = [c for c in commands if "--sweep" not in c]
    assert len(commands) >= 3, commands
    files = tmp_path / "files"
    unpack(image_ds, files)
    for cls_file in files.rglob("*.cls"):  # back to a plain ImageFolder tree
        cls_file.unlink()
    monkeypatch.chdir(tmp_path)  # where --plot writes
    fill = {"DATASET": image_ds, "/fast/train-shards": image_ds, "SRC_DIR": files}
    for command in commands:
        args = [str(fill.get(a, a)) for a in shlex.split(command)[2:]]
        run_cli("bench", *args, "--batches", "1", "--workers", "0", "--batch-size", "4",
                "--size", "16", "--device", "cpu", "-q")
