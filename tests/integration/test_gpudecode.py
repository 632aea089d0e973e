"""The GPU decode path, planned and run without CUDA: device index, torchvision check, routing,
chunks, per-image retry, the epoch hand-off, and GpuDecoder end to end with a CPU stand-in for
nvJPEG (the same plan, crops and fallbacks as on a GPU).  Plus the one-line errors on a machine
without CUDA."""

import re

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import shardpack
from shardpack import DeviceLoader, ShardDataset
from shardpack.loader.batches import BytesBatch
from shardpack.transforms.decode import CpuDecode, CropOptions, SampleRandom, decode_image
from shardpack.core.errors import DecodeError, DeviceError
from shardpack.transforms.gpudecode import (NVJPEG_STATUS, GpuDecoder, Route, batch_epoch,
                                 check_torchvision, decode_chunks, is_fatal, nvjpeg_statuses,
                                 plan_chunks, probe, resolve_device, route, standin_backend)

from testbed.helpers import make_tree, run_cli
from testbed.imagegen import ramp_photo

NO_CUDA = not torch.cuda.is_available()


# -- device index ---------------------------------------------------------------------------------

def test_cuda_without_index_is_the_current_device():
    kw = dict(cuda_available=True, device_count=4)
    assert resolve_device("cuda", current=2, **kw) == torch.device("cuda:2")
    assert resolve_device("cuda", current=0, **kw) == torch.device("cuda", 0)
    assert resolve_device(torch.device("cuda:3"), current=0, **kw) == torch.device("cuda:3")
    assert resolve_device("cpu", current=1, **kw) == torch.device("cpu")
    with pytest.raises(DeviceError, match="has 4 CUDA device"):
        resolve_device("cuda:4", current=0, **kw)
    with pytest.raises(DeviceError, match="no CUDA device"):
        resolve_device("cuda", cuda_available=False, device_count=0, current=0)


def test_torchvision_version_check():
    for ok in ("0.20.0", "0.20.1+cu121", "0.26.0+cu130", "1.0.0", "0.21.0a0+git1234"):
        check_torchvision(ok)
    for old in ("0.19.1+cu121", "0.15.2", "0.2.0"):
        with pytest.raises(DeviceError, match=r"torchvision >= 0\.20.*found " + re.escape(old)):
            check_torchvision(old)


# -- routing and planning -------------------------------------------------------------------------

def test_route_sends_cmyk_other_formats_and_bad_headers_to_cpu():
    rgb = route(np.frombuffer(ramp_photo(0, 40, 30), np.uint8))
    assert rgb == Route(True, 30, 40)
    gray = route(np.frombuffer(ramp_photo(1, 20, 10, mode="L"), np.uint8))
    assert gray.gpu and (gray.height, gray.width) == (10, 20)
    cmyk = route(np.frombuffer(ramp_photo(2, 20, 10, mode="CMYK"), np.uint8))
    assert not cmyk.gpu and "CMYK" in cmyk.reason
    png = route(np.frombuffer(ramp_photo(3, 20, 10, "PNG"), np.uint8))
    assert not png.gpu and png.reason == "PNG: nvJPEG does not decode it"
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    try:  # over the decompression-bomb limit: the CPU path refuses it, skippably
        Image.MAX_IMAGE_PIXELS = 100
        big = route(np.frombuffer(ramp_photo(4, 40, 30), np.uint8))
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    assert not big.gpu and "too large" in big.reason
    broken = route(np.frombuffer(b"\xff\xd8 not really", np.uint8))
    assert not broken.gpu and broken.reason.startswith("JPEG header")


@pytest.mark.parametrize("seed", range(20))
def test_chunks_cover_every_image_once_in_order_within_the_budget(seed):
    rng = np.random.default_rng(seed)
    sizes = [(int(h), int(w)) for h, w in rng.integers(1, 4000, size=(rng.integers(0, 300), 2))]
    budget, most = int(rng.integers(1, 50)) << 20, int(rng.integers(1, 64))
    chunks = plan_chunks(sizes, budget, most)
    assert [i for c in chunks for i in c] == list(range(len(sizes)))
    for chunk in chunks:
        assert 1 <= len(chunk) <= most
        pixels = sum(sizes[i][0] * sizes[i][1] * 3 for i in chunk)
        assert pixels <= budget or len(chunk) == 1
    # 256 images of 12 MP would be ~9 GB decoded at once: the default plan splits them
    big = plan_chunks([(3000, 4000)] * 256)
    assert max(sum(3000 * 4000 * 3 for _ in c) for c in big) <= 512 << 20 and len(big) > 1


class _FakeNvjpeg:
    """Stands in for nvJPEG: a call with any bad item fails as a whole, as the batched call
    does; records the calls."""

    def __init__(self, fatal=None):
        self.calls, self.fatal = [], fatal

    def __call__(self, items):
        self.calls.append(list(items))
        if self.fatal is not None and self.fatal in items:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        bad = [x for x in items if x.startswith("bad")]
        if bad:
            raise RuntimeError(f"Error while decoding JPEG images: Failed to get image info: 3 "
                               f"({bad[0]})")
        return [f"img:{x}" for x in items]


def test_a_failed_chunk_is_retried_image_by_image():
    items = ["a", "b", "bad1", "c", "d", "bad2", "e"]
    fake, syncs = _FakeNvjpeg(), []
    out = list(decode_chunks(items, [[0, 1, 2, 3], [4, 5, 6]], fake,
                             before=lambda: syncs.append(1)))
    decoded = [img for _, images, _ in out for img in images]
    assert decoded == ["img:a", "img:b", None, "img:c", "img:d", None, "img:e"]
    failed = {i: why for _, _, f in out for i, why in f.items()}
    assert set(failed) == {2, 5} and "Failed to get image info: 3 (bad1)" in failed[2]
    # two batched calls, then one call per image of each failed chunk; synchronised before each
    assert len(fake.calls) == 2 + 7 and len(syncs) == len(fake.calls)
    # a clean chunk is one call
    fake = _FakeNvjpeg()
    found = [imgs for _, imgs, _ in decode_chunks(["x", "y"], [[0, 1]], fake)]
    assert found == [["img:x", "img:y"]]
    assert len(fake.calls) == 1


def test_out_of_memory_and_cuda_errors_are_raised_not_sent_to_cpu():
    with pytest.raises(torch.cuda.OutOfMemoryError):
        list(decode_chunks(["a", "huge"], [[0, 1]], _FakeNvjpeg(fatal="huge")))
    assert is_fatal(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert is_fatal(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert not is_fatal(RuntimeError("Error while decoding JPEG images: Failed to get image info"))
    # torch's caching allocator failing inside torchvision's output allocation, rethrown
    assert is_fatal(_tv026("CUDA out of memory. Tried to allocate 36.00 MiB. GPU 0 has a total "
                           "capacity of 139.80 GiB of which 4.19 MiB is free."))


# -- torchvision 0.26's real message shape ---------------------------------------------------------
#
# torchvision/csrc/io/image/cuda/decode_jpegs_cuda.cpp checks every nvJPEG call with
#   TORCH_CHECK(status == NVJPEG_STATUS_SUCCESS, "Failed to get image info: ", status);
# (the enum prints as its number), and decode_jpegs_cuda catches what decode_images throws:
#   catch (const std::exception& e) {
#     if (typeid(e) != typeid(std::runtime_error)) {
#       TORCH_CHECK(false, "Error while decoding JPEG images: ", e.what());
# A TORCH_CHECK failure is a c10::Error, whose what() is the message, "\n", then the C++
# backtrace; Python shows the outer error without its own backtrace, so the inner one stays.
# The check texts below are the strings in PyPI's torchvision 0.26.0 cp312 manylinux wheel
# (torchvision/image.so, read with `strings`; it calls c10::detail::torchCheckFail and compares
# with typeid(std::runtime_error)).  "Failed to decode image" is not among them.
# nvJPEG's statuses (nvjpeg.h, nvjpegStatus_t): 0 SUCCESS, 1 NOT_INITIALIZED, 2 INVALID_PARAMETER,
# 3 BAD_JPEG, 4 JPEG_NOT_SUPPORTED, 5 ALLOCATOR_FAILURE, 6 EXECUTION_FAILED, 7 ARCH_MISMATCH,
# 8 INTERNAL_ERROR, 9 IMPLEMENTATION_NOT_SUPPORTED, 10 INCOMPLETE_BITSTREAM.

_CPP = "/__w/vision/vision/pytorch/vision/torchvision/csrc/io/image/cuda/decode_jpegs_cuda.cpp"
_SO = "/usr/local/lib/python3.12/dist-packages/torchvision/_C.so"


def _tv026(what: str, function: str = "decode_images", line: int = 475) -> RuntimeError:
    """The RuntimeError torchvision 0.26 raises for a failed nvJPEG call: the prefix, the check's
    text, and the inner c10::Error's backtrace after it."""
    return RuntimeError(
        f"Error while decoding JPEG images: {what}\n"
        f"Exception raised from {function} at {_CPP}:{line} (most recent call first):\n"
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f3c2d5e3446 in "
        "/usr/local/lib/python3.12/dist-packages/torch/lib/libc10.so)\n"
        "frame #1: c10::detail::torchCheckFail(char const*, char const*, unsigned int, "
        "std::string const&) + 0x6a (0x7f3c2d58d6ea in /usr/local/lib/python3.12/dist-packages/"
        "torch/lib/libc10.so)\n"
        f"frame #2: vision::image::CUDAJpegDecoder::{function}(std::vector<at::Tensor, "
        "std::allocator<at::Tensor> > const&, nvjpegOutputFormat_t const&) + 0x1b2f "
        f"(0x7f3b11c2a0ff in {_SO})\n"
        "frame #3: vision::image::decode_jpegs_cuda(std::vector<at::Tensor, std::allocator<"
        "at::Tensor> > const&, vision::image::ImageReadMode, c10::Device) + 0x4c1 (0x7f3b11c2c4a1 "
        f"in {_SO})\n"
        f"frame #4: <unknown function> + 0x9e3c7 (0x7f3b11c3d3c7 in {_SO})\n")


# (the check's text as torchvision writes it, the status, the device's fault?)
_REAL = [
    ("Failed to get image info", 3, False),            # a broken header
    ("Failed to get image info", 4, False),            # a JPEG nvJPEG does not support
    ("Failed to decode batch", 3, False),
    ("Failed to decode jpeg stream", 10, False),       # a truncated image (0.26's words; no
    ("Failed to parse jpeg stream", 2, False),         # "Failed to decode image" any more)
    ("Failed to decode batch", 5, True),               # allocator failure: the GPU is full
    ("Failed to decode jpeg stream", 6, True),         # execution failed
    ("Failed to transfer jpeg to device", 8, True),    # internal error
    ("Failed to initialize batch decoding", 5, True),
    ("Failed to attach pinned buffer", 5, True),
    ("Failed to get image info", 1, True),             # not initialised
    ("Failed to synchronize CUDA stream", 700, True),  # cudaErrorIllegalAddress
    ("Failed to initialize nvjpeg with hardware backend", 2, True),  # no decoder at all
    ("Failed to create pinned buffer", 5, True),
]


@pytest.mark.parametrize(("what", "status", "fatal"), _REAL)
def test_classifier_reads_torchvision_026_messages(what, status, fatal):
    exc = _tv026(f"{what}: {status}")
    assert not str(exc).rstrip().endswith(str(status))  # the number is not at the end
    assert nvjpeg_statuses(str(exc)) == [(what, status)]
    assert is_fatal(exc) is fatal, (what, status)
    # the same text without the backtrace, and in an older wrapper's place (at the end)
    assert is_fatal(RuntimeError(f"Error while decoding JPEG images: {what}: {status}")) is fatal
    assert is_fatal(RuntimeError(f"decode_images, {_CPP}:475, {what}: {status}")) is fatal


# every nvJPEG decode check in torchvision 0.26.0's image.so
_CHECKS_026 = (
    "Failed to attach device buffer", "Failed to attach pinned buffer",
    "Failed to create decode params", "Failed to create device buffer",
    "Failed to create jpeg stream", "Failed to create nvjpeg decoder state",
    "Failed to create nvjpeg decoder", "Failed to create nvjpeg state",
    "Failed to create pinned buffer", "Failed to decode batch", "Failed to decode jpeg stream",
    "Failed to get image info", "Failed to initialize batch decoding",
    "Failed to initialize nvjpeg with default backend",
    "Failed to initialize nvjpeg with hardware backend", "Failed to parse jpeg stream",
    "Failed to set output format", "Failed to synchronize CUDA stream",
    "Failed to transfer jpeg to device", "nvjpegGetProperty failed")
_ALWAYS_DEVICE = ("Failed to create", "Failed to initialize nvjpeg",
                  "Failed to synchronize CUDA stream", "nvjpegGetProperty failed")


@pytest.mark.parametrize("what", _CHECKS_026)
def test_every_026_check_text_is_read(what):
    for status in range(11):
        exc = _tv026(f"{what}: {status}")
        assert nvjpeg_statuses(str(exc)) == [(what, status)]
        device = what.startswith(_ALWAYS_DEVICE) or status in (1, 5, 6, 7, 8)
        assert is_fatal(exc) is device, (what, status)
    assert not is_fatal(_tv026("Unknown chroma subsampling"))  # an image's


def test_statuses_5_6_8_are_never_retried_image_by_image():
    """An allocator, execution or internal failure raises at once: no per-image retry (which
    ended in a misleading DeviceError) and, for a chunk under 4 images, no silent CPU decode."""
    assert {5: "ALLOCATOR_FAILURE", 6: "EXECUTION_FAILED",
            8: "INTERNAL_ERROR"}.items() <= NVJPEG_STATUS.items()
    for status in (5, 6, 8):
        for chunk in (["a", "b"], ["a", "b", "c", "d", "e"]):
            calls = []

            def decode(items, status=status, calls=calls):
                calls.append(list(items))
                raise _tv026(f"Failed to decode batch: {status}")

            with pytest.raises(RuntimeError, match=f"Failed to decode batch: {status}"):
                list(decode_chunks(chunk, [list(range(len(chunk)))], decode))
            assert len(calls) == 1, (status, calls)  # the batched call only


def test_an_images_status_is_retried_and_named_without_the_backtrace():
    def decode(items):
        if "bad" in items:
            raise _tv026("Failed to get image info: 3", function="prepare_buffers", line=298)
        return [f"img:{x}" for x in items]

    out = list(decode_chunks(["a", "bad", "c"], [[0, 1, 2]], decode))
    assert out[0][1] == ["img:a", None, "img:c"]
    assert out[0][2] == {1: "Error while decoding JPEG images: Failed to get image info: 3"}


def test_the_probe_drains_the_callers_stream_before_decoding():
    order = []

    def decode(items):
        order.append("decode")
        return [torch.zeros(3, 8, 8, dtype=torch.uint8)]

    image = probe(decode, lambda: order.append("drain"))
    assert order == ["drain", "decode", "drain"] and tuple(image.shape) == (3, 8, 8)


def test_the_standin_backend_keeps_nvjpegs_contract():
    decode = standin_backend()
    blob = torch.frombuffer(bytearray(ramp_photo(0, 40, 30)), dtype=torch.uint8)
    (image,) = decode([blob])
    assert image.shape == (3, 30, 40) and image.dtype == torch.uint8
    broken = torch.frombuffer(bytearray(b"\xff\xd8 broken"), dtype=torch.uint8)
    with pytest.raises(RuntimeError) as info:
        decode([blob, broken])
    assert str(info.value).startswith("Error while decoding JPEG images: ")
    assert not is_fatal(info.value) and nvjpeg_statuses(str(info.value))[0][1] == 3


def test_a_chunk_that_fails_image_by_image_too_is_the_devices_fault():
    with pytest.raises(DeviceError, match="all 4 images of a chunk"):
        list(decode_chunks(["bad1", "bad2", "bad3", "bad4"], [[0, 1, 2, 3]], _FakeNvjpeg()))
    # three bad images in a small chunk are just bad images
    out = list(decode_chunks(["bad1", "bad2", "bad3"], [[0, 1, 2]], _FakeNvjpeg()))
    assert set(out[0][2]) == {0, 1, 2}


# -- GpuDecoder, whole plan, with a CPU stand-in for nvJPEG ---------------------------------------

def _cpu_backend(calls):
    """Decodes like nvJPEG would (full size, RGB, CHW uint8); a call fails as a whole when one
    item carries the marker (an image nvJPEG refuses but libjpeg-turbo takes)."""
    import simplejpeg

    def decode(items):
        calls.append(len(items))
        if any(t.numpy().tobytes().endswith(REFUSED) for t in items):
            raise RuntimeError("Error while decoding JPEG images: Failed to decode batch: 3")
        return [torch.from_numpy(simplejpeg.decode_jpeg(t.numpy().tobytes(), colorspace="RGB"))
                .permute(2, 0, 1) for t in items]

    return decode


REFUSED = b"nvjpeg-refuses-this"


def _bytes_batch(blobs):
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blobs], out=offsets[1:])
    return torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8), offsets.tolist()


def test_gpu_plan_matches_cpu_decode_and_routes_per_image():
    blobs = [ramp_photo(i, 300 + 40 * i, 240 + 30 * i) for i in range(6)]
    blobs[2] = ramp_photo(9, 200, 160, mode="CMYK")       # to the CPU by its header
    blobs[4] = blobs[4] + REFUSED                     # the batched call fails on it
    blobs += [ramp_photo(10, 120, 90, "PNG"), b"\xff\xd8 broken"]
    data, offsets = _bytes_batch(blobs)
    opts, calls, stats = CropOptions(size=48, seed=3), [], {}
    dec = GpuDecoder(torch.device("cpu"), opts, on_error="skip", stats=stats,
                     backend=_cpu_backend(calls))
    ids = [100 + i for i in range(len(blobs))]
    keys = [f"k{i}" for i in range(len(blobs))]
    out, bad = dec(data, offsets, ids, keys, epoch=2, stream=None)
    assert out.shape == (8, 48, 48, 3) and out.dtype == torch.uint8
    # one batched call for the 5 JPEGs the GPU takes; it fails, so each goes alone once
    assert calls == [5, 1, 1, 1, 1, 1]
    # to the CPU: CMYK and PNG (routed), the refused one (failed), the broken one (no header)
    assert stats["gpu_failed"] == 1 and stats["cpu_fallbacks"] == 4
    assert bad == [7] and stats["bad"] == 1 and int(out[7].sum()) == 0
    # the CPU path's crop and flip: 1-8 apart (DCT-scaled decode, another resize kernel); the
    # crop of another epoch is 65-85 apart on these images
    for i in (0, 1, 3, 4, 5, 2, 6):
        ref = decode_image(blobs[i], opts, SampleRandom(3, 2, ids[i]))
        diff = np.abs(out[i].numpy().astype(int) - ref.astype(int)).mean()
        assert diff < 12, (i, diff)
    other = dec(data, offsets, ids, keys, epoch=3, stream=None)[0]  # another epoch, other crops
    assert (other[0].float() - out[0].float()).abs().mean() > 5


def test_gpu_plan_names_the_bad_sample_by_default():
    blobs = [ramp_photo(0, 64, 48), b"\xff\xd8 broken"]
    data, offsets = _bytes_batch(blobs)
    dec = GpuDecoder(torch.device("cpu"), CropOptions(size=16), backend=_cpu_backend([]))
    with pytest.raises(DecodeError, match=r"sample 'cls0/broken'.*GPU: JPEG header"):
        dec(data, offsets, [0, 1], ["cls0/ok", "cls0/broken"], epoch=0, stream=None)


def test_device_loader_runs_the_gpu_plan_with_a_standin_on_the_cpu(small_ds):
    ds = ShardDataset(small_ds, batch_size=4, batched=True, shuffle=False)
    dl = DeviceLoader(DataLoader(ds, batch_size=None), device="cpu", decode_on="gpu", size=16,
                      normalize=False, on_error="skip", decode_backend=standin_backend())
    ref = DeviceLoader(DataLoader(ShardDataset(small_ds, batch_size=4, batched=True,
                                               shuffle=False, decode=CpuDecode(16)),
                                  batch_size=None), device="cpu", decode_on="cpu", size=16,
                       normalize=False)
    for g, c in zip(dl, ref, strict=True):
        assert g["image"].shape == c["image"].shape == (4, 3, 16, 16)
        assert (g["image"] - c["image"]).abs().mean() < 12
    assert dl.stats["samples"] == 12 and dl.stats["cpu_fallbacks"] == 0
    assert dl.gpu_idle_fraction is None  # no CUDA: no stream to time


# -- the consumer stream's idle time (CUDA events; stand-ins here) ---------------------------------

class _FakeEvent:
    now = 0.0  # the stand-in clock (ms): what the stream has reached when an event is recorded

    def record(self, stream=None):
        self.t = _FakeEvent.now

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return end.t - self.t


class _FakeStream:
    def wait_event(self, event):
        pass


def test_gpu_clock_counts_idle_between_steps_and_epoch_starts_apart():
    from shardpack.transforms.device import STATS
    from shardpack.transforms.gpuclock import GpuClock

    stats = {name: 0.0 if name.endswith("_s") else 0 for name in STATS}
    clock, stream = GpuClock(stats, events=_FakeEvent), _FakeStream()

    def at(ms, fn, *args):
        _FakeEvent.now = ms
        fn(*args)

    at(0, clock.asked, stream)                   # an epoch starts: 50 ms until the first batch
    at(50, clock.handed, stream, None, True)
    at(150, clock.asked, stream)                 # a 100 ms step, then 20 ms idle
    at(170, clock.handed, stream, None, False)
    at(270, clock.asked, stream)                 # another 100 ms step, no wait
    at(270, clock.handed, stream, None, False)
    at(370, clock.asked, stream)                 # the end of the epoch
    clock.settle(wait=True)
    assert stats["gpu_start_idle_s"] == pytest.approx(0.050) and stats["epoch_starts"] == 1
    assert stats["gpu_idle_s"] == pytest.approx(0.020)
    assert stats["gpu_busy_s"] == pytest.approx(0.300)
    clock.forget()  # reset_stats: nothing begun before counts after
    assert not clock.pending


@pytest.mark.skipif(NO_CUDA, reason="needs CUDA")
def test_gpu_decoder_has_no_hidden_sync_per_batch():
    """Flips and CPU fallbacks put index tensors on the device: built pinned and copied without
    blocking (torch.tensor(list, device="cuda") is a blocking copy from pageable memory).  With
    torch's sync debug mode set to "error", any synchronising call raises."""
    device = torch.device("cuda", torch.cuda.current_device())
    host = standin_backend()

    def on_device(items):  # nvJPEG's place, without its stream synchronisation
        return [img.to(device, non_blocking=True) for img in host(items)]

    from shardpack.images.formats.raw import pixels_npy

    raw = pixels_npy(np.zeros((24, 20, 3), np.uint8))  # stored pixels: copied up, not decoded
    blobs = [ramp_photo(i, 64 + 8 * i, 48) for i in range(6)] + [ramp_photo(9, 20, 16, "PNG"),
                                                                  raw]
    data, offsets = _bytes_batch(blobs)
    dec = GpuDecoder(device, CropOptions(size=32, seed=1), on_error="skip", backend=on_device)
    dec(data, offsets, list(range(8)), [f"k{i}" for i in range(8)], epoch=0, stream=None)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out, bad = dec(data, offsets, list(range(8)), [f"k{i}" for i in range(8)], epoch=1,
                       stream=None)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.device == device and out.shape == (8, 32, 32, 3) and bad == []
    assert dec.stats["cpu_fallbacks"] == 2  # the PNG, twice; the raw pixels never


@pytest.mark.skipif(NO_CUDA, reason="needs CUDA")
def test_real_nvjpeg_error_on_a_broken_jpeg_is_the_images():
    """The message the installed torchvision gives for a broken JPEG: read by the classifier as
    the image's fault, with its status found wherever it is."""
    tvio = pytest.importorskip("torchvision.io")
    broken = torch.frombuffer(bytearray(b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4),
                              dtype=torch.uint8)
    with pytest.raises(RuntimeError) as info:
        tvio.decode_jpeg([broken], device="cuda")
    text = str(info.value)
    print(repr(text[:600]))
    assert "Error while decoding JPEG images" in text or nvjpeg_statuses(text), text[:600]
    assert not is_fatal(info.value), text[:600]


# -- the epoch hand-off ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpuds")
    src = make_tree(root / "src", {f"c{i % 2}/{i:02d}.jpg": ramp_photo(i, 64, 48)
                                   for i in range(12)})
    shardpack.pack(src, root / "ds", workers=1, max_samples=4)
    return root / "ds"


def test_batches_carry_the_epoch_the_workers_used(small_ds):
    ds = ShardDataset(small_ds, batch_size=4, batched=True, decode=CpuDecode(16))
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    seen = []
    for _ in range(2):  # no set_epoch: persistent workers move on by themselves
        seen.append({int(e) for b in loader for e in b["__epoch__"]})
    ds.set_epoch(7)
    seen.append({int(e) for b in loader for e in b["__epoch__"]})
    assert seen == [{0}, {1}, {7}]
    assert batch_epoch({"__epoch__": torch.tensor([5, 5])}, 0) == 5
    assert batch_epoch({}, 4) == 4


# -- moving every kind of batch -------------------------------------------------------------------

def test_lists_tuples_and_nested_batches_move_to_the_device():
    from shardpack.transforms.device import _move  # noqa: PLC2701 - the module's own helper, under test

    meta = torch.device("meta")
    batch = ([torch.ones(2)], (torch.zeros(3), {"x": torch.ones(1)}),
             BytesBatch(torch.ones(4, dtype=torch.uint8), torch.tensor([0, 4])), "text")
    moved = _move(batch, meta)
    assert moved[0][0].device == meta and moved[1][0].device == meta
    assert moved[1][1]["x"].device == meta and moved[3] == "text"
    assert isinstance(moved[2], BytesBatch) and moved[2].data.device == meta


# -- one-line errors without CUDA -----------------------------------------------------------------

@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device exists")
def test_cuda_asked_for_on_a_machine_without_it_is_one_line(small_ds):
    for kwargs in (dict(device="cuda"), dict(device="cuda:0", decode_on="cpu"),
                   dict(device="cuda", decode_on="gpu"), dict(device="cpu", decode_on="gpu")):
        with pytest.raises(DeviceError, match="no(ne| CUDA device)") as info:
            DeviceLoader([], **kwargs)
        assert "\n" not in str(info.value)
    for args in (["--decode", "gpu"], ["--decode", "gpu", "--device", "cuda"],
                 ["--device", "cuda:1"]):
        result = run_cli("bench", small_ds, *args, "-q", ok=None)
        assert result.exit_code != 0 and "Traceback" not in result.output, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and "CUDA" in lines[0], result.output
