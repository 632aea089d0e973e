"""Decode on the GPU: nvJPEG (through torchvision) in bounded chunks, then crop, resize and flip on
the device with the CPU path's crop rule and randomness (the same
:class:`~shardpack.transforms.spec.TransformSpec` and
:func:`~shardpack.transforms.spec.plan_crop`: a sample crops and flips alike on either path).

Used by :class:`~shardpack.transforms.device.DeviceLoader` (``decode_on="gpu"``).  torchvision is
imported only
here, when a :class:`GpuDecoder` is made.  The planning (which device, which images go to nvJPEG,
the chunks, the retry of a failed chunk image by image) is made of pure functions, tested without
CUDA (docs/device.md, "GPU decode").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from shardpack.core.errors import DecodeError, DeviceError
from shardpack.loader.torchenv import torch
from shardpack.images.content import check_size
from shardpack.images.registry import claimed_codec
from shardpack.transforms.decode import decode_image
from shardpack.transforms.spec import SampleRandom, TransformSpec, plan_crop

MIN_TORCHVISION = (0, 20)  # decode_jpeg(list, device="cuda") decodes a batch in one call from 0.20
CHUNK_BYTES = 512 << 20    # decoded full-size pixels per nvJPEG call (256 x 12 MP would be ~9 GB)
CHUNK_IMAGES = 256
GPU_COLORSPACES = ("Gray", "RGB", "YCbCr")  # CMYK / YCCK: torchvision's nvJPEG path refuses them


# -- pure planning ---------------------------------------------------------------------------------

def resolve_device(device, *, cuda_available: bool, device_count: int, current: int
                   ) -> "torch.device":
    """``device`` with an explicit index: ``"cuda"`` is the current device (the one
    ``torch.cuda.set_device`` chose, as DDP scripts do per rank), so ``cuda`` and ``cuda:N`` compare
    equal to the tensors made there.  A CUDA device on a machine without one is a one-line
    :class:`DeviceError`."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev
    if not cuda_available:
        raise DeviceError(f"device {str(device)!r} asked for, but this machine has no CUDA device "
                          f"(torch {torch.__version__})",
                          hint="use device='cpu' and decode_on='cpu'")
    index = current if dev.index is None else dev.index
    if not 0 <= index < device_count:
        raise DeviceError(f"device {str(device)!r} asked for, but this machine has "
                          f"{device_count} CUDA device(s)")
    return torch.device("cuda", index)


def check_torchvision(version: str) -> None:
    """torchvision new enough for batched CUDA decode, else a one-line :class:`DeviceError`."""
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    if tuple(parts) < MIN_TORCHVISION:
        need = ".".join(map(str, MIN_TORCHVISION))
        raise DeviceError(f"decode_on='gpu' needs torchvision >= {need} (batched CUDA JPEG "
                          f"decode); found {version}", hint="pip install 'shardpack[gpu]' with the "
                          "torchvision that matches your torch")


@dataclass(frozen=True)
class Route:
    """Where one image decodes: ``gpu`` (a JPEG nvJPEG takes, or stored pixels copied up as they
    are: ``pixels_at`` their offset) or ``cpu`` with the reason."""
    gpu: bool
    height: int = 0
    width: int = 0
    reason: str = ""
    pixels_at: int | None = None


def route(raw) -> Route:
    """Read the header only.  JPEGs in Gray/RGB/YCbCr go to the GPU; CMYK and YCCK JPEGs, other
    formats and unreadable headers go to the CPU, which decodes or names what is wrong."""
    codec = claimed_codec(raw)
    if codec is not None and codec.stored_pixels:  # no decode: copied to the device as they are
        try:
            height, width, offset = codec.layout(raw)
            check_size(width, height)
        except (ValueError, DecodeError) as exc:
            return Route(False, reason=getattr(exc, "message", str(exc)))
        return Route(True, height, width, pixels_at=offset)
    if codec is None or not codec.nvjpeg:
        return Route(False, reason=f"{codec.name if codec else 'not an image'}: nvJPEG does "
                                   "not decode it")
    import simplejpeg

    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(raw)
    except ValueError as exc:
        return Route(False, reason=f"JPEG header: {exc}")
    try:
        check_size(width, height)  # a decompression bomb: the CPU path says so, skippably
    except DecodeError as exc:
        return Route(False, height, width, reason=exc.message)
    if colorspace not in GPU_COLORSPACES:
        return Route(False, height, width, reason=f"{colorspace} JPEG")
    return Route(True, height, width)


def plan_chunks(sizes: Sequence[tuple[int, int]], budget: int = CHUNK_BYTES,
                most: int = CHUNK_IMAGES) -> list[list[int]]:
    """Consecutive groups of image positions whose decoded RGB pixels (h x w x 3 bytes) stay
    within ``budget`` and ``most`` images; an image larger than the budget goes alone."""
    chunks: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, (h, w) in enumerate(sizes):
        size = h * w * 3
        if current and (used + size > budget or len(current) >= most):
            chunks.append(current)
            current, used = [], 0
        current.append(i)
        used += size
    if current:
        chunks.append(current)
    return chunks


# nvJPEG's statuses (nvjpeg.h, nvjpegStatus_t).  Those of the device or the library, not of an
# image: not initialised, allocator failure (nvJPEG allocates outside torch's caching allocator, so
# a full GPU shows up here), execution failed, architecture mismatch, internal error.  An image's
# own are 2-4, 9 and 10: it goes to the CPU path.
NVJPEG_STATUS = {0: "SUCCESS", 1: "NOT_INITIALIZED", 2: "INVALID_PARAMETER", 3: "BAD_JPEG",
                 4: "JPEG_NOT_SUPPORTED", 5: "ALLOCATOR_FAILURE", 6: "EXECUTION_FAILED",
                 7: "ARCH_MISMATCH", 8: "INTERNAL_ERROR", 9: "IMPLEMENTATION_NOT_SUPPORTED",
                 10: "INCOMPLETE_BITSTREAM"}
_NVJPEG_FATAL = frozenset({1, 5, 6, 7, 8})

# torchvision checks every nvJPEG call as TORCH_CHECK(status == SUCCESS, "<what failed>: ",
# status): "Failed to get image info: 3", "Failed to decode batch: 5", "Failed to decode jpeg
# stream: 6", ...  That is a c10::Error, whose what() appends the C++ backtrace ("\nException
# raised from decode_images at ...decode_jpegs_cuda.cpp:NNN (most recent call first):\nframe #0:
# ..."), and torchvision 0.26 rethrows it as "Error while decoding JPEG images: " + what(): the
# status is wherever the message puts it, not at the end.  So every "<what failed>: N" in the text
# is read.  CUDA errors ("Failed to synchronize CUDA stream: N") and a decoder that cannot be made
# ("Failed to initialize nvjpeg with ... backend", "Failed to create ...", "nvjpegGetProperty
# failed") are the device's whatever the number.
_STATUS = re.compile(r"(Failed to [A-Za-z][A-Za-z ]*?|nvjpeg[A-Za-z]* failed): (-?\d+)(?!\d)")
_DEVICE_CALLS = ("Failed to synchronize CUDA stream", "Failed to initialize nvjpeg",
                 "Failed to create", "nvjpegGetProperty failed")
_BACKTRACE = "Exception raised from "


def nvjpeg_statuses(text: str) -> list[tuple[str, int]]:
    """Every ``(what failed, status)`` torchvision's nvJPEG checks wrote into an error message,
    in order, wherever they are (before a C++ backtrace, inside a wrapper's prefix)."""
    return [(m.group(1), int(m.group(2))) for m in _STATUS.finditer(text)]


def is_fatal(exc: BaseException) -> bool:
    """Errors that are the device's, not an image's: out of memory, CUDA errors (torch's text, or
    torchvision's "Failed to synchronize CUDA stream: N"), a decoder that cannot be made, and
    nvJPEG's not-initialised, allocator, execution, architecture and internal failures (statuses
    1, 5, 6, 7, 8) are raised, never turned into a CPU decode or an image-by-image retry."""
    accel = getattr(torch, "AcceleratorError", None)
    if isinstance(exc, torch.cuda.OutOfMemoryError) or (accel and isinstance(exc, accel)):
        return True
    text = str(exc)
    if any(s in text for s in ("out of memory", "CUDA error", "cudaError", "CUDA_ERROR",
                               "device-side assert")):
        return True
    for what, status in nvjpeg_statuses(text):
        if what.startswith(_DEVICE_CALLS) or status in _NVJPEG_FATAL:
            return True
    return False


SYSTEMIC = 4  # a chunk of this many images or more failing image by image is the device's fault


def decode_chunks(encoded: Sequence, chunks: list[list[int]], decode: Callable[[list], list],
                  before: Callable[[], None] = lambda: None) -> Iterator[tuple]:
    """Decode ``encoded`` chunk by chunk with ``decode`` (a list in, a list out), yielding
    ``(chunk, decoded, failed)`` per chunk: the positions, each one's image or None, and
    {position: why it failed}.  A chunk that fails is retried image by image, so one bad image
    costs only itself; fatal errors (:func:`is_fatal`) are raised.  ``before`` runs before each
    call (the side stream's synchronisation).  One chunk's images at a time: memory stays
    bounded by the chunk plan."""
    for chunk in chunks:
        failed: dict[int, str] = {}
        before()
        try:
            images = list(decode([encoded[i] for i in chunk]))
            if len(images) != len(chunk):
                raise RuntimeError(f"{len(images)} images back for {len(chunk)}")
        except Exception as exc:  # noqa: BLE001 - sorted just below
            if is_fatal(exc):
                raise
            images = [None] * len(chunk)
            if len(chunk) == 1:
                failed[chunk[0]] = _why(exc)
            else:
                for k, i in enumerate(chunk):
                    before()
                    try:
                        images[k] = decode([encoded[i]])[0]
                    except Exception as exc:  # noqa: BLE001
                        if is_fatal(exc):
                            raise
                        failed[i] = _why(exc)
                if len(chunk) >= SYSTEMIC and len(failed) == len(chunk):
                    raise DeviceError(f"GPU JPEG decode failed for all {len(chunk)} images of a "
                                      f"chunk, one by one too: {failed[chunk[0]]}",
                                      hint="the device, not the images; use "
                                      "decode_on='cpu'") from None
        yield chunk, images, failed


def _why(exc: BaseException) -> str:
    """One line: the message without a C++ backtrace (c10::Error's what() appends one)."""
    return " ".join(str(exc).split(_BACKTRACE)[0].split())[:200] or type(exc).__name__


def batch_epoch(batch: dict, fallback: int) -> int:
    """The epoch a batch was made in: ShardDataset's batches carry ``__epoch__`` (so GPU crops
    follow the dataset's epoch as CPU crops do, set_epoch called or not); else ``fallback``."""
    value = batch.get("__epoch__")
    if value is None or len(value) == 0:
        return fallback
    return int(value[0])


# -- the decoder -----------------------------------------------------------------------------------

class GpuDecoder:
    """nvJPEG decode + crop/resize/flip on ``device`` for one DeviceLoader.  Made once: imports
    torchvision, checks its version and decodes a tiny JPEG on the device, so that a missing
    piece is one line at construction, not a silent CPU fallback at every batch.

    Args:
        device: the CUDA device (any device with ``backend``).
        spec: the transform spec: its crop part decides each sample's crop and flip, as on the
            CPU path (normalisation, dtype and layout are DeviceLoader's).
        on_error: ``"raise"`` or ``"skip"`` (a zero image, flagged) an image nothing decodes.
        stats: the counters to update (``cpu_fallbacks``, ``gpu_failed``, ``bad``).
        backend: replaces nvJPEG (a list of encoded uint8 tensors -> a list of uint8 CHW
            tensors on ``device``): the tests run the whole plan on the CPU with it.
    """

    def __init__(self, device: "torch.device", spec: TransformSpec, *, on_error: str = "raise",
                 stats: dict | None = None, backend: Callable[[list], list] | None = None):
        self.device, self.spec, self.on_error = device, spec, on_error
        self.stats = stats if stats is not None else {}
        for name in ("cpu_fallbacks", "gpu_failed", "bad"):
            self.stats.setdefault(name, 0)
        self._decode = backend if backend is not None else _nvjpeg(device)

    def __call__(self, data: "torch.Tensor", offsets: Sequence[int], ids: Sequence[int],
                 keys: Sequence[str], epoch: int, stream) -> tuple["torch.Tensor", list[int]]:
        """Raw bytes of a batch (host uint8 ``data`` cut at ``offsets``) -> uint8 NHWC on the
        device, and the positions of bad images (zeros) when ``on_error="skip"``.  Runs with
        ``stream`` current.

        Args:
            data: the batch's encoded images, end to end (host uint8).
            offsets: image i is ``data[offsets[i]:offsets[i + 1]]``.
            ids: the samples' global indices (their crops' randomness).
            keys: the samples' keys (errors name them).
            epoch: the epoch the batch was read in.
            stream: the CUDA stream the work is queued on (None off CUDA).
        """
        n, size = len(ids), self.spec.size
        raws = [data[offsets[i]:offsets[i + 1]] for i in range(n)]
        routes = [route(r.numpy()) for r in raws]
        on_gpu = [i for i in range(n) if routes[i].gpu and routes[i].pixels_at is None]
        stored = [i for i in range(n) if routes[i].pixels_at is not None]
        cpu = {i: routes[i].reason for i in range(n) if not routes[i].gpu}

        def rnd(i: int) -> SampleRandom | None:  # fresh each time: it counts its draws
            return self.spec.random(epoch, ids[i])

        canvas = torch.empty((n, 3, size, size), dtype=torch.float32, device=self.device)
        flips = [False] * n
        for i in stored:  # raw pixels: one copy up (from pinned memory), the same crop and resize
            r = routes[i]
            host = raws[i][r.pixels_at:r.pixels_at + r.height * r.width * 3]
            if self.device.type == "cuda":
                host = host.pin_memory()  # a pageable non_blocking copy would block
            image = host.view(r.height, r.width, 3).to(self.device, non_blocking=True)
            flips[i] = self._crop_into(canvas, i, image.permute(2, 0, 1), rnd(i))
        if on_gpu:
            sizes = [(routes[i].height, routes[i].width) for i in on_gpu]
            encoded = [raws[i] for i in on_gpu]
            # nvJPEG writes on torchvision's own stream into outputs allocated on ours; a block
            # freed by our crop kernels still queued could be handed to it.  So our stream is
            # idle before each call (torchvision makes ours wait for its stream afterwards).
            for chunk, images, failed in decode_chunks(encoded, plan_chunks(sizes),
                                                       self._decode, before=_synchronizer(stream)):
                self.stats["gpu_failed"] += len(failed)
                cpu.update({on_gpu[k]: why for k, why in failed.items()})
                for k, image in zip(chunk, images, strict=True):
                    if image is not None:
                        i = on_gpu[k]
                        flips[i] = self._crop_into(canvas, i, image, rnd(i))
        if any(flips):
            index = _positions([i for i in range(n) if flips[i]], self.device)
            canvas[index] = canvas[index].flip(-1)
        out = canvas.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        bad = self._cpu_decode(out, raws, cpu, rnd, keys) if cpu else []
        return out, bad

    def _crop_into(self, canvas, i: int, image, rnd: SampleRandom | None) -> bool:
        """Crop and resize a decoded CHW image into ``canvas[i]`` as :func:`plan_crop` says;
        returns whether it is to be flipped (all flips of a batch go in one kernel)."""
        plan = plan_crop(image.shape[1], image.shape[2], self.spec, rnd)
        part = image[None, :, plan.top:plan.top + plan.height, plan.left:plan.left + plan.width]
        canvas[i] = torch.nn.functional.interpolate(
            part.float(), size=(self.spec.size, self.spec.size), mode="bilinear",
            antialias=True, align_corners=False)[0]
        return plan.flip

    def _cpu_decode(self, out, raws, cpu: dict[int, str], rnd, keys) -> list[int]:
        """The images the GPU does not take, decoded by the CPU path and copied up in one
        pinned, non-blocking transfer."""
        order = sorted(cpu)
        host = torch.zeros((len(order), self.spec.size, self.spec.size, 3), dtype=torch.uint8,
                           pin_memory=self.device.type == "cuda")
        bad = []
        for k, i in enumerate(order):
            self.stats["cpu_fallbacks"] += 1
            try:
                host[k] = torch.from_numpy(np.ascontiguousarray(
                    decode_image(raws[i].numpy().tobytes(), self.spec, rnd(i))))
            except DecodeError as exc:
                if self.on_error != "skip":
                    raise DecodeError(f"{exc.message} (GPU: {cpu[i]})", key=keys[i]) from None
                bad.append(i)
        self.stats["bad"] += len(bad)
        out.index_copy_(0, _positions(order, self.device), host.to(self.device, non_blocking=True))
        return bad


def _positions(values: list[int], device: "torch.device") -> "torch.Tensor":
    """An index tensor on ``device`` without a hidden sync: ``torch.tensor(list, device=cuda)``
    is a blocking copy from pageable memory; this one is built on the host, pinned, and copied
    without blocking (the caching host allocator keeps the pinned block until the copy is
    done)."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def standin_backend() -> Callable[[list], list]:
    """A CPU stand-in for nvJPEG with its contract (a list of encoded uint8 tensors in, a list of
    full-size RGB uint8 CHW tensors out; one bad item fails the whole call with torchvision's
    message shape): ``DeviceLoader(..., decode_on="gpu", decode_backend=standin_backend())`` runs
    the whole GPU plan on a machine without CUDA (tests, ``scripts/gpu_check.py --cpu-smoke``)."""
    import simplejpeg

    def decode(items: list) -> list:
        out = []
        for t in items:
            try:
                pixels = simplejpeg.decode_jpeg(t.numpy().tobytes(), colorspace="RGB")
            except ValueError as exc:
                raise RuntimeError("Error while decoding JPEG images: Failed to get image info: 3"
                                   f"\n{_BACKTRACE}decode_images (stand-in: {exc})") from None
            out.append(torch.from_numpy(pixels).permute(2, 0, 1))
        return out

    return decode


def probe(decode: Callable[[list], list], drain: Callable[[], None]) -> "torch.Tensor":
    """Decode an 8x8 JPEG with ``decode``, the caller's stream drained before and after: nvJPEG
    fills its output on torchvision's own stream, in memory allocated on the caller's, so a
    block freed just before (``model.to(...)`` leaves temporaries whose kernels may still be
    queued) must not be handed to it while those kernels run."""
    drain()
    image = decode([_tiny_jpeg()])[0]
    drain()
    return image


def _nvjpeg(device: "torch.device") -> Callable[[list], list]:
    """torchvision's batched CUDA decode, checked: importable, new enough, and able to decode an
    8x8 JPEG on ``device``; else a one-line :class:`DeviceError` naming the cause."""
    try:
        import torchvision
        import torchvision.io as tvio
    except Exception as exc:  # noqa: BLE001 - ImportError, or a torch it was not built for
        raise DeviceError(f"decode_on='gpu' needs a torchvision that imports beside torch "
                          f"{torch.__version__}: {_why(exc)}",
                          hint="pip install 'shardpack[gpu]' with the torchvision that matches "
                          "your torch") from None
    check_torchvision(torchvision.__version__)

    def decode(items: list) -> list:
        return tvio.decode_jpeg(items, device=device, mode=tvio.ImageReadMode.RGB)

    try:
        with torch.cuda.device(device):
            image = probe(decode, torch.cuda.current_stream(device).synchronize)
    except Exception as exc:  # noqa: BLE001 - every cause becomes the one line below
        raise DeviceError(f"GPU JPEG decode does not work on {device} (torchvision "
                          f"{torchvision.__version__}, torch {torch.__version__}): {_why(exc)}",
                          hint="use decode_on='cpu'") from None
    if tuple(image.shape) != (3, 8, 8):
        raise DeviceError(f"GPU JPEG decode on {device} returned shape {tuple(image.shape)} for "
                          "an 8x8 probe", hint="use decode_on='cpu'")
    return decode


def _synchronizer(stream) -> Callable[[], None]:
    return stream.synchronize if stream is not None else (lambda: None)


def _tiny_jpeg() -> "torch.Tensor":
    import simplejpeg

    pixels = np.full((8, 8, 3), 128, dtype=np.uint8)
    return torch.frombuffer(bytearray(simplejpeg.encode_jpeg(pixels, quality=90)),
                            dtype=torch.uint8)
