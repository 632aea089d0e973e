"""Pinned -> device: ``DeviceLoader`` wraps a DataLoader, prefetches batches to the device on a side
stream, decodes JPEGs on the GPU if asked, and measures how long the consumer waited.

Same API on CPU (``device="cpu"``), so training code runs unchanged on a laptop.

* ``decode=None``: batches pass through; tensors move to the device.
* ``decode="cpu"``: workers decoded already (``ShardDataset(..., decode=shardpack.CpuDecode())``);
  the uint8 NHWC ``image`` moves to the device and becomes float NCHW (channels-last memory),
  normalised there.
* ``decode="gpu"``: workers ship raw JPEG bytes (one uint8 tensor + offsets per batch); the bytes
  are pinned, decoded with nvJPEG (``torchvision.io.decode_jpeg(..., device="cuda")``, batched),
  cropped, resized, flipped and normalised on the GPU.  Crops follow the same rule and the same
  (seed, epoch, index) randomness as the CPU path.  Non-JPEG or undecodable images fall back to
  CPU decode for that sample, counted in ``stats["cpu_fallbacks"]``.  torchvision is imported only
  here, only on this path.
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from .batches import BytesBatch
from .decode import (CropOptions, DecodeError, SampleRandom, crop_box, decode_image, image_batch,
                     should_flip)
from .torchenv import torch

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


class DeviceLoader:
    def __init__(self, loader, device="cpu", decode: str | None = None, prefetch: int = 2, *,
                 size: int = 224, train: bool = True, field: str | None = None, seed: int = 0,
                 normalize: bool = True, dtype=torch.float32):
        if decode not in (None, "cpu", "gpu"):
            raise ValueError(f"decode must be None, 'cpu' or 'gpu', got {decode!r}")
        self.loader = loader
        self.device = torch.device(device)
        if decode == "gpu" and self.device.type != "cuda":
            raise ValueError("decode='gpu' needs a CUDA device; use decode='cpu' on this machine")
        self.decode = decode
        self.prefetch = max(1, prefetch)
        self.field = field
        self.opts = CropOptions(size=size, train=train, seed=seed)
        self.normalize, self.dtype = normalize, dtype
        self.epoch = 0
        self.stats = {"batches": 0, "samples": 0, "wait_s": 0.0, "wall_s": 0.0,
                      "cpu_fallbacks": 0}
        self._consumed = 0  # samples handed to the consumer this epoch (for state_dict)
        self._mean = torch.tensor(IMAGENET_MEAN, device=self.device).view(1, 3, 1, 1)
        self._std = torch.tensor(IMAGENET_STD, device=self.device).view(1, 3, 1, 1)

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def wait_fraction(self) -> float:
        wall = self.stats["wall_s"]
        return self.stats["wait_s"] / wall if wall else 0.0

    # -- state: counts what the consumer received, delegates to the dataset ---------------------
    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._consumed = 0
        dataset = getattr(self.loader, "dataset", None)
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)

    def state_dict(self) -> dict:
        dataset = self.loader.dataset
        return {"dataset": dataset.state_dict(samples_seen=self._consumed), "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = state["epoch"]
        self._consumed = 0
        self.loader.dataset.load_state_dict(state["dataset"])

    # -- iteration ------------------------------------------------------------------------------
    def __iter__(self):
        """A producer thread pulls batches from the DataLoader and starts their transfer (and GPU
        decode) on a side stream, up to ``prefetch`` batches ahead; the consumer only waits when
        none is ready.  That wait is what ``wait_fraction`` reports."""
        cuda = self.device.type == "cuda"
        stream = torch.cuda.Stream(self.device) if cuda else None
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def produce() -> None:
            try:
                for batch in self.loader:
                    if cuda:
                        with torch.cuda.stream(stream):
                            moved = self._to_device(batch)
                            event = torch.cuda.Event()
                            event.record(stream)
                    else:
                        moved, event = self._to_device(batch), None
                    while not stop.is_set():
                        try:
                            ready.put((moved, event, None), timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                ready.put((None, None, StopIteration()))
            except BaseException as exc:  # hand any failure to the consumer, never hang
                ready.put((None, None, exc))

        thread = threading.Thread(target=produce, name="shardpack-prefetch", daemon=True)
        start = time.perf_counter()
        waited = 0.0
        thread.start()
        try:
            while True:
                t0 = time.perf_counter()
                batch, event, error = ready.get()
                if event is not None:
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(event)
                    _record_stream(batch, current)
                waited += time.perf_counter() - t0
                if isinstance(error, StopIteration):
                    return
                if error is not None:
                    raise error
                count = _batch_len(batch)
                self.stats["batches"] += 1
                self.stats["samples"] += count
                self._consumed += count
                yield batch
        finally:
            stop.set()
            while thread.is_alive():  # unblock a producer stuck on a full queue
                try:
                    ready.get_nowait()
                except queue.Empty:
                    thread.join(0.05)
            self.stats["wait_s"] += waited
            self.stats["wall_s"] += time.perf_counter() - start

    def _to_device(self, batch):
        if not isinstance(batch, dict):
            return _move(batch, self.device)
        if self.decode == "gpu":
            batch = dict(batch)
            batch["image"] = self._gpu_decode(image_batch(batch, self.field),
                                              batch["__index__"].tolist())
        elif self.decode == "cpu" and "image" not in batch:
            raise ValueError("decode='cpu' expects decoded images from the workers: pass "
                             "decode=shardpack.CpuDecode() to ShardDataset(..., batched=True)")
        out = {k: _move(v, self.device) for k, v in batch.items() if k != "image"}
        if "image" in batch:
            out["image"] = self._finish(batch["image"])
        return out

    def _finish(self, image: "torch.Tensor") -> "torch.Tensor":
        """uint8 NHWC (host or device) -> NCHW channels-last float on the device, normalised."""
        if image.device != self.device:
            if self.device.type == "cuda":
                image = image.pin_memory() if not image.is_pinned() else image
            image = image.to(self.device, non_blocking=True)
        image = image.permute(0, 3, 1, 2).to(self.dtype)  # a channels-last view: no copy
        if self.normalize:
            image = (image - self._mean.to(self.dtype)) / self._std.to(self.dtype)
        return image.contiguous(memory_format=torch.channels_last)

    def _gpu_decode(self, items: BytesBatch, ids: list[int]) -> "torch.Tensor":
        """nvJPEG batch decode, then crop + resize + flip per image on the GPU: uint8 NHWC."""
        import torchvision.io as tvio  # only on the GPU path

        data = items.data if items.data.is_pinned() else items.data.pin_memory()
        offsets = items.offsets.tolist()
        encoded, plan, sizes = [], [], []
        out = torch.empty((len(ids), self.opts.size, self.opts.size, 3), dtype=torch.uint8,
                          device=self.device)
        fallback = []
        for i, gid in enumerate(ids):
            raw = data[offsets[i]:offsets[i + 1]]
            rnd = SampleRandom(self.opts.seed, self.epoch, gid) if self.opts.train else None
            header = _jpeg_size(raw.numpy())
            if header is None:
                fallback.append((i, raw, rnd))
                continue
            encoded.append(raw)
            plan.append((i, rnd))
            sizes.append(header)
        if encoded:
            try:
                images = tvio.decode_jpeg(encoded, device=self.device,
                                          mode=tvio.ImageReadMode.RGB)
            except RuntimeError:
                images = None
            if images is None:  # one bad image fails the batch call: fall back one by one
                fallback += [(i, raw, rnd) for (i, rnd), raw in zip(plan, encoded, strict=True)]
            else:
                for (i, rnd), img in zip(plan, images, strict=True):
                    h, w = img.shape[1:]
                    top, left, ch, cw = crop_box(h, w, self.opts, rnd)
                    crop = img[None, :, top:top + ch, left:left + cw].float()
                    res = torch.nn.functional.interpolate(
                        crop, size=(self.opts.size, self.opts.size), mode="bilinear",
                        antialias=True, align_corners=False)[0].round_().clamp_(0, 255)
                    res = res.to(torch.uint8)
                    if should_flip(rnd, self.opts):
                        res = res.flip(-1)
                    out[i] = res.permute(1, 2, 0)
        for i, raw, rnd in fallback:
            self.stats["cpu_fallbacks"] += 1
            try:
                pixels = decode_image(raw.numpy().tobytes(), self.opts, rnd)
            except DecodeError:
                pixels = np.zeros((self.opts.size, self.opts.size, 3), dtype=np.uint8)
            out[i] = torch.from_numpy(np.ascontiguousarray(pixels)).to(self.device)
        return out


def _jpeg_size(raw: np.ndarray):
    if raw[:2].tobytes() != b"\xff\xd8":
        return None
    try:
        import simplejpeg

        return simplejpeg.decode_jpeg_header(raw)[:2]
    except ValueError:
        return None


def _move(value, device):
    if isinstance(value, BytesBatch):
        return BytesBatch(_move(value.data, device), _move(value.offsets, device))
    if isinstance(value, torch.Tensor):
        if value.device == device:
            return value
        if device.type == "cuda" and not value.is_pinned():
            value = value.pin_memory()
        return value.to(device, non_blocking=True)
    return value


def _record_stream(batch, stream) -> None:
    """Tell the caching allocator these tensors are used on the consumer's stream too."""
    for value in (batch.values() if isinstance(batch, dict) else [batch]):
        tensors = value if isinstance(value, BytesBatch) else [value]
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                t.record_stream(stream)


def _batch_len(batch) -> int:
    if isinstance(batch, dict):
        if "__index__" in batch:
            return len(batch["__index__"])
        for v in batch.values():
            return len(v)
    return len(batch)
