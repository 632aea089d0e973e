"""Pinned -> device: ``DeviceLoader`` wraps a DataLoader, prefetches batches to the device on a side
stream, decodes JPEGs on the GPU if asked, and measures how long the consumer waited.

Same API on CPU (``device="cpu"``), so training code runs unchanged on a laptop.

* ``decode_on=None``: batches pass through; tensors (in dicts, lists and tuples) move to the
  device.
* ``decode_on="cpu"``: workers decoded already (``ShardDataset(...,
  decode=shardpack.CpuDecode())``); the uint8 NHWC ``image`` moves to the device and becomes the
  spec's dtype and layout (float NCHW in channels-last memory by default), normalised there.
* ``decode_on="gpu"``: workers ship raw JPEG bytes (one uint8 tensor + offsets per batch);
  :class:`~shardpack.transforms.gpudecode.GpuDecoder` decodes them with nvJPEG in bounded chunks
  and crops, resizes and flips on the GPU, with the CPU path's crop rule and (seed, epoch, index)
  randomness (the same :class:`~shardpack.transforms.spec.TransformSpec`), then normalises as
  above.  Images nvJPEG does not take (other formats, CMYK) or fails on decode on the CPU,
  counted in ``stats["cpu_fallbacks"]``; an image nothing decodes raises ``DecodeError`` naming
  the sample, or with ``on_error="skip"`` is zeros flagged in ``batch["__bad__"]``.

Two measures of waiting, updated at every batch: ``wait_fraction``, the share of the loop's wall
time the consumer's host thread waited for a batch; and ``idle()``, how long the step's device sat
without a batch between steps (on CUDA from CUDA events on the consumer's stream,
``gpu_idle_fraction``; on the CPU from the host's clock, labelled so), epoch starts counted apart.
``stats()`` (the counts are a dict that can be called) is the per-stage table: the dataset's
stages (order, read, decode, transform, summed over its workers, threads or processes), this
loader's own, pin and device, and ``idle`` (docs/reading.md, "The pipeline").
"""

from __future__ import annotations

import queue
import threading
import time

from shardpack.core.deprecation import renamed
from shardpack.core.errors import DeviceError
from shardpack.loader.batches import BytesBatch
from shardpack.loader.counters import Counts
from shardpack.loader.pipeline import Stats
from shardpack.loader.stages import EpochSettable
from shardpack.loader.torchenv import torch
from shardpack.transforms.decode import image_batch
from shardpack.transforms.gpuclock import GpuClock, HostClock
from shardpack.transforms.gpudecode import GpuDecoder, batch_epoch, resolve_device
from shardpack.transforms.spec import TransformSpec, spec_of

DECODE_PLACES = (None, "cpu", "gpu")
STATS = ("batches", "samples", "wait_s", "device_wait_s", "wall_s", "cpu_fallbacks", "gpu_failed",
         "bad", "gpu_idle_s", "gpu_busy_s", "gpu_start_idle_s", "host_idle_s", "host_busy_s",
         "host_start_idle_s", "epoch_starts")


class DeviceLoader:
    """Batches of a DataLoader on ``device``, fetched (and decoded) ahead on a side stream.

    Args:
        loader: the DataLoader (or any iterable of batches: a ``ShardDataset`` with
            ``execution="threads"`` directly).
        device: where batches go (``"cuda"`` is the current CUDA device).
        decode_on: where images are decoded: None (no images: batches pass through; or, when
            the loader's dataset decodes with :class:`~shardpack.Decode`, its ``place``), ``"cpu"``
            (the workers did, with :class:`~shardpack.CpuDecode`) or ``"gpu"`` (nvJPEG, here).
            ``decode=`` is its old, deprecated name.
        prefetch_batches: batches moved (and decoded) ahead of the consumer (at least 1).
            ``prefetch=`` is its old, deprecated name.
        size: the spec's output side (GPU decode).
        train: random crops and flips (GPU decode); False: resize and centre crop.
        field: the image field (None: found by name).
        seed: the crops' seed (GPU decode).
        flip: flip half the training images (GPU decode).
        normalize: subtract ImageNet's mean and divide by its std (default); False: none.
        dtype: the image tensor's dtype (default float32).
        spec: the whole :class:`~shardpack.transforms.spec.TransformSpec` instead of ``size``,
            ``train``, ``seed``, ``flip``, ``normalize`` and ``dtype`` (pass the CpuDecode's own
            for ``decode_on="cpu"``: its crop part is the workers', the rest is read here).
        on_error: ``"raise"`` or ``"skip"`` (a zero image, flagged) an image nothing decodes
            (None: the dataset's :class:`~shardpack.Decode`'s, else ``"raise"``).
        decode_backend: stands in for nvJPEG (a list of encoded uint8 tensors -> a list of
            uint8 CHW tensors, e.g. :func:`shardpack.transforms.gpudecode.standin_backend`);
            with it ``decode_on="gpu"`` runs its whole plan on any device, CUDA or not (tests,
            gpu_check's CPU smoke run).
        pin_memory: pin pageable host batches before a CUDA copy (default), so the copy runs
            beside compute; False copies from pageable memory (what ``bench --sweep`` compares).
    """

    @renamed(decode="decode_on", prefetch="prefetch_batches")
    def __init__(self, loader, device="cpu", decode_on: str | None = None,
                 prefetch_batches: int = 2, *, size: int | None = None,
                 train: bool | None = None, field: str | None = None, seed: int | None = None,
                 flip: bool | None = None, normalize: bool | None = None, dtype=None,
                 spec: TransformSpec | None = None, on_error: str | None = None,
                 decode_backend=None, pin_memory: bool = True):
        placed = _placed_decode(loader)
        if placed is not None and decode_on is None:  # the spec and place given once
            decode_on, field = placed.place, field if field is not None else placed.field
            on_error = on_error or placed.on_error
            if spec is None and all(v is None for v in (size, train, seed, flip)):
                spec = placed.spec
        on_error = on_error or "raise"
        if decode_on not in DECODE_PLACES:
            raise ValueError(f"decode_on must be None, 'cpu' or 'gpu', got {decode_on!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.spec = spec_of(spec, size=size, train=train, seed=seed, flip=flip,
                            normalize=normalize, dtype=dtype)
        self.device = _device_for(device, decode_on, standin=decode_backend is not None)
        self.loader = loader
        self.decode_on = decode_on
        self.prefetch_batches = max(1, prefetch_batches)
        self.field = field
        self.dtype = getattr(torch, self.spec.dtype)
        self.epoch = 0
        # the producer's stages: pin (pageable -> pinned host memory, CUDA only) and device
        # (copy, GPU decode, normalisation); stats() adds them to the dataset's stages
        self._stages = {"pin": Counts(), "device": Counts()}
        self._pins = self._stages["pin"] if pin_memory else None  # None: pageable copies
        self.stats = Stats(self._stage_table, {})
        self._clock: GpuClock | None = None  # the running iteration's idle timer
        self._last = 0.0                     # ... and when its wall time was last counted
        self.reset_stats()
        self._consumed = 0  # samples handed to the consumer this epoch (for state_dict)
        self._mean, self._std = _normalisation(self.spec, self.device)
        self._gpu = GpuDecoder(self.device, self.spec, on_error=on_error, stats=self.stats,
                               backend=decode_backend) if decode_on == "gpu" else None

    def __len__(self) -> int:
        return len(self.loader)

    def reset_stats(self) -> None:
        """Zero the counters (e.g. after a warm-up); they are updated at every batch.  Time and
        device stalls from before the reset are not counted after it."""
        self.stats.update({name: 0.0 if name.endswith("_s") else 0 for name in STATS})
        for counts in self._stages.values():
            counts.take()
        dataset = _dataset_of(self.loader)
        reset = getattr(getattr(dataset, "stats", None), "reset_stages", None)
        if reset is not None:  # the dataset's stages start again with this loader's
            reset()
        self._last = time.perf_counter()
        if self._clock is not None:
            self._clock.forget()

    def _stage_table(self) -> dict:
        """The loader's dataset's stages (where it has them: a ShardDataset) and this
        loader's own, pin and device."""
        dataset = _dataset_of(self.loader)
        table = getattr(dataset, "stats", None)
        out = dict(table()) if callable(table) else {}
        out.update({name: counts.as_dict() for name, counts in self._stages.items()})
        out["idle"] = self.idle()
        return out

    def idle(self) -> dict:
        """How long the step's device sat without a batch between steps, so far (since the last
        :meth:`reset_stats`): ``timing`` (``"cuda-events"``: CUDA events on the consumer's
        stream; ``"host"``: the host's clock, where batches stay on the CPU), ``idle_s`` and
        ``busy_s`` between steps, ``idle_fraction`` (None before a second batch), the epoch
        starts apart (``start_idle_s`` over ``epoch_starts``) and the host thread's own wait
        (``host_wait_s``).  On CUDA it waits for the events recorded so far: call it between
        steps (an epoch end, a log line), not in the hot loop."""
        if self._clock is not None:
            self._clock.settle(wait=True)
        clock = GpuClock if self.device.type == "cuda" else HostClock
        idle = self.stats[f"{clock.prefix}_idle_s"]
        busy = self.stats[f"{clock.prefix}_busy_s"]
        return {"timing": clock.timing, "idle_s": idle, "busy_s": busy,
                "idle_fraction": idle / (idle + busy) if idle + busy > 0 else None,
                "start_idle_s": self.stats[f"{clock.prefix}_start_idle_s"],
                "epoch_starts": self.stats["epoch_starts"], "host_wait_s": self.stats["wait_s"]}

    @property
    def wait_fraction(self) -> float:
        """Share of the loop's wall time the consumer's host thread waited for a batch to be
        ready.  Not the GPU's idle share (:attr:`gpu_idle_fraction`): the GPU may still be busy
        with steps already queued while the host waits, and it idles while the host is late for
        other reasons (the GIL, a slow step on the host).  Up to date after every batch."""
        wall = self.stats["wall_s"]
        return min(1.0, self.stats["wait_s"] / wall) if wall else 0.0

    @property
    def gpu_idle_fraction(self) -> float | None:
        """Share of the consumer stream's time with nothing to do between steps: from the end of
        the work queued before the consumer asked for a batch until the batch was on the device
        and handed over, timed with CUDA events on that stream, against that idle time plus the
        time from each hand-over to the next ask.  Each iteration's first batch (an epoch start)
        is left out: ``stats["gpu_start_idle_s"]`` over ``stats["epoch_starts"]``.  None off
        CUDA; events are read once complete, so the last step or two show a little later."""
        idle, busy = self.stats["gpu_idle_s"], self.stats["gpu_busy_s"]
        return idle / (idle + busy) if idle + busy > 0 else None

    # -- state: counts what the consumer received, delegates to the dataset ---------------------
    def set_epoch(self, epoch: int) -> None:
        """Start counting ``epoch``'s batches, and pass the epoch on to the loader's dataset
        where it takes one (:class:`~shardpack.loader.stages.EpochSettable`: a ShardDataset).

        Args:
            epoch: the epoch.
        """
        self.epoch = epoch
        self._consumed = 0
        dataset = _dataset_of(self.loader)
        if isinstance(dataset, EpochSettable):
            dataset.set_epoch(epoch)

    def state_dict(self) -> dict:
        """The epoch and the dataset's state at the samples handed to the consumer so far
        (``dataset.state_dict(samples_seen=...)``): batches still in flight are not counted."""
        dataset = _dataset_of(self.loader)
        return {"dataset": dataset.state_dict(samples_seen=self._consumed), "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        """Resume from :meth:`state_dict`'s output: the dataset continues where the consumer
        stopped.

        Args:
            state: what :meth:`state_dict` returned.
        """
        self.epoch = state["epoch"]
        self._consumed = 0
        _dataset_of(self.loader).load_state_dict(state["dataset"])

    # -- iteration ------------------------------------------------------------------------------
    def __iter__(self):
        """A producer thread pulls batches from the DataLoader and starts their transfer (and GPU
        decode) on a side stream, up to ``prefetch_batches`` batches ahead; the consumer only
        waits when none is ready.  That wait is what ``wait_fraction`` reports; the consumer
        stream's idle time, timed with CUDA events, is what ``gpu_idle_fraction`` reports."""
        cuda = self.device.type == "cuda"
        stream = torch.cuda.Stream(self.device) if cuda else None
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch_batches)
        stop = threading.Event()

        thread = threading.Thread(target=self._produce, args=(stream, ready, stop),
                                  name="shardpack-prefetch", daemon=True)
        clock = self._clock = GpuClock(self.stats) if cuda else HostClock(self.stats)
        self._last = time.perf_counter()
        thread.start()
        first = True
        try:
            while True:
                t0 = time.perf_counter()
                current = torch.cuda.current_stream(self.device) if cuda else None
                clock.asked(current)
                batch, event, error = ready.get()
                if error is None:
                    clock.handed(current, event, first)
                if event is not None:
                    _record_stream(batch, current)
                first = False
                now = time.perf_counter()
                self.stats["wait_s"] += now - max(t0, self._last)
                self.stats["wall_s"] += now - self._last
                self._last = now
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
            clock.settle(wait=True)
            self.stats["wall_s"] += time.perf_counter() - self._last
            self._clock = None

    def _produce(self, stream, ready: queue.Queue, stop: threading.Event) -> None:
        """The producer thread: batches from the loader, moved (and decoded) on ``stream``."""
        try:
            if stream is not None:  # this thread's own current device: else every rank's is 0
                torch.cuda.set_device(self.device)
            counts = self._stages["device"]
            asked = time.perf_counter()
            for batch in self.loader:
                got = time.perf_counter()
                if stream is not None:
                    with torch.cuda.stream(stream):
                        moved = self._to_device(batch, stream)
                        event = torch.cuda.Event()
                        event.record(stream)
                else:
                    moved, event = self._to_device(batch, None), None
                made = time.perf_counter()
                while not stop.is_set():
                    try:
                        ready.put((moved, event, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
                asked = _count(counts, asked, got, made)
            ready.put((None, None, StopIteration()))
        except BaseException as exc:  # hand any failure to the consumer, never hang
            ready.put((None, None, exc))

    def _to_device(self, batch, stream):
        if not isinstance(batch, dict):
            return _move(batch, self.device, self._pins)
        if self.decode_on == "gpu":
            batch = dict(batch)
            items = image_batch(batch, self.field)
            ids = batch["__index__"].tolist()
            keys = batch.get("__key__") or [f"#{i}" for i in ids]  # errors name the sample
            image, bad = self._gpu(items.data, items.offsets.tolist(), ids, keys,
                                   batch_epoch(batch, self.epoch), stream)
            batch["image"] = image
            if bad or "__bad__" not in batch:
                flags = torch.zeros(len(batch["__index__"]), dtype=torch.bool)
                flags[bad] = True
                batch["__bad__"] = flags
        elif self.decode_on == "cpu" and "image" not in batch:
            raise ValueError("decode_on='cpu' expects decoded images from the workers: pass "
                             "decode=shardpack.CpuDecode() to ShardDataset(..., batched=True)")
        out = {k: _move(v, self.device, self._pins) for k, v in batch.items()
               if k != "image"}
        if "image" in batch:
            out["image"] = self._finish(batch["image"])
        return out

    def _finish(self, image: "torch.Tensor") -> "torch.Tensor":
        """uint8 NHWC (host or device) -> the spec's dtype and layout on the device (NCHW: in
        channels-last memory), normalised with its mean and std."""
        if image.device != self.device:
            if self.device.type == "cuda":
                image = _pinned(image, self._pins) if self._pins is not None \
                    and not image.is_pinned() else image
            image = image.to(self.device, non_blocking=True)
        nchw = self.spec.layout == "NCHW"
        if (image.device.type == "cpu" and self._mean is not None and image.dim() == 4
                and image.shape[-1] == 3 and self.dtype == torch.float32):
            out = _normalise_on_cpu(image, self._mean, self._std)
            return out.permute(0, 3, 1, 2) if nchw else out  # NCHW: channels-last memory
        if nchw:
            image = image.permute(0, 3, 1, 2)  # a channels-last view: no copy
        image = image.to(self.dtype)
        if self._mean is not None:
            image = (image - self._mean.to(self.dtype)) / self._std.to(self.dtype)
        return image.contiguous(memory_format=torch.channels_last) if nchw else image.contiguous()


# Values per op of the CPU normalisation: under torch's parallel grain size (32,768), so that each
# op runs in the calling thread.  Over it, torch hands every op to its intra-op thread pool, whose
# threads spin between ops: on 2 cores beside 2 loader workers, a batch then took 3-10x the CPU
# of the same ops in one thread, taken from the workers (docs/device.md, "DeviceLoader on the CPU").
NORMALISE_CHUNK = 3 * 10_922


def _normalise_on_cpu(image: "torch.Tensor", mean: "torch.Tensor", std: "torch.Tensor"
                      ) -> "torch.Tensor":
    """uint8 NHWC -> float32 NHWC ``(image - mean) / std`` on the CPU in one fused op
    (``addcmul``) per chunk of NORMALISE_CHUNK values: one pass over each chunk while it is in
    the cache, where converting, subtracting and dividing the whole batch makes and faults in
    three 154 MB buffers."""
    scale = (1 / std).reshape(3)
    bias = (-mean / std).reshape(3)
    out = torch.empty(image.shape, dtype=torch.float32)
    pixels, values = image.reshape(-1, 3), out.view(-1, 3)
    step = NORMALISE_CHUNK // 3
    for start in range(0, pixels.shape[0], step):
        torch.addcmul(bias, pixels[start:start + step], scale, out=values[start:start + step])
    return out


def _device_for(device, decode_on: str | None, standin: bool) -> "torch.device":
    """The device batches go to, with its index; GPU decode refused in one line where no CUDA
    device is (unless a stand-in backend replaces nvJPEG).  CUDA is touched only for a CUDA
    device (a CPU loader in a forked child must not)."""
    asked = torch.device(device)
    standin = decode_on == "gpu" and standin
    cuda = (asked.type == "cuda" or (decode_on == "gpu" and not standin)) \
        and torch.cuda.is_available()
    if decode_on == "gpu" and not cuda and not standin:
        raise DeviceError("decode_on='gpu' needs a CUDA device; this machine has none "
                          f"(torch {torch.__version__})", hint="use decode_on='cpu'")
    resolved = resolve_device(
        asked, cuda_available=cuda, device_count=torch.cuda.device_count() if cuda else 0,
        current=torch.cuda.current_device() if cuda and asked.index is None else 0)
    if decode_on == "gpu" and resolved.type != "cuda" and not standin:
        raise ValueError(f"decode_on='gpu' needs a CUDA device, got device={device!r}; use "
                         "device='cuda' or decode_on='cpu'")
    return resolved


def _normalisation(spec: TransformSpec, device) -> tuple:
    """The spec's mean and std as device tensors shaped for its layout, in pixel units
    (x 255), or (None, None) without normalisation."""
    if spec.mean is None:
        return None, None
    shape = (1, 3, 1, 1) if spec.layout == "NCHW" else (1, 1, 1, 3)
    return tuple(torch.tensor([v * 255 for v in values], device=device).view(shape)
                 for values in (spec.mean, spec.std))


def _dataset_of(loader):
    """The dataset a loader reads: a DataLoader's, or the loader itself (a ShardDataset with
    worker threads is iterated directly)."""
    return getattr(loader, "dataset", loader)


def _placed_decode(loader):
    """The loader's dataset's :class:`~shardpack.Decode` stage (one that says its ``place``),
    or None."""
    from shardpack.transforms.operation import Decode

    stage = getattr(_dataset_of(loader), "decode", None)
    return stage if isinstance(stage, Decode) else None


def _count(counts: Counts, asked: float, got: float, made: float) -> float:
    """Count one batch of the device stage: asked for at ``asked``, received at ``got``, moved
    at ``made``, handed over now; returns now (when the next is asked for)."""
    now = time.perf_counter()
    counts.items += 1
    counts.wait_in += got - asked
    counts.busy += made - got
    counts.wait_out += now - made
    return now


def _pinned(value: "torch.Tensor", counts: Counts | None) -> "torch.Tensor":
    """``value`` in pinned memory, the time counted in the pin stage's ``counts``."""
    start = time.perf_counter()
    value = value.pin_memory()
    if counts is not None:
        counts.items += 1
        counts.busy += time.perf_counter() - start
    return value


_PLAIN = {str, bytes, int, float, bool, type(None)}  # values no device holds


def _move(value, device, pins: Counts | None = None):
    """Tensors (also inside BytesBatch, dicts, lists and tuples) to ``device``: from pinned memory
    without blocking; pageable tensors are pinned first on CUDA (counted in ``pins``; None: not
    pinned, copied from pageable memory)."""
    if isinstance(value, BytesBatch):
        return BytesBatch(_move(value.data, device, pins), _move(value.offsets, device, pins))
    if isinstance(value, torch.Tensor):
        if value.device == device:
            return value
        if pins is not None and device.type == "cuda" and value.device.type == "cpu" \
                and not value.is_pinned():
            value = _pinned(value, pins)
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {k: _move(v, device, pins) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and set(map(type, value)) <= _PLAIN:
        return value  # a batch's keys: nothing to move, and 256 calls a batch cost ~50 us
    if isinstance(value, list):
        return [_move(v, device, pins) for v in value]
    if isinstance(value, tuple):  # a named tuple keeps its type
        moved = [_move(v, device, pins) for v in value]
        return type(value)(*moved) if hasattr(value, "_fields") else tuple(moved)
    return value


def _record_stream(value, stream) -> None:
    """Tell the caching allocator these tensors are used on the consumer's stream too."""
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            value.record_stream(stream)
    elif isinstance(value, dict):
        for v in value.values():
            _record_stream(v, stream)
    elif isinstance(value, (list, tuple)) and not set(map(type, value)) <= _PLAIN:
        for v in value:  # BytesBatch too; a batch's keys are skipped at once
            _record_stream(v, stream)


def _batch_len(batch) -> int:
    if isinstance(batch, dict):
        if "__index__" in batch:
            return len(batch["__index__"])
        for v in batch.values():
            return len(v)
    return len(batch)
