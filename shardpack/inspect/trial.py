"""One configuration of the loading pipeline, measured: the unit of ``shardpack bench --sweep``.

A :class:`Config` names every lever (raw files or packed, workers, threads or processes, prefetch
depth, pinned memory, where images decode, remote prefetch and cache); :func:`measure` builds that
pipeline exactly as a training script would (``ShardDataset`` -> ``DataLoader`` ->
``DeviceLoader``, or torchvision-style ImageFolder + Pillow over the raw files), runs it against a
simulated step (``step_ms``: the host sleeps, as it does while a GPU runs the step) or a real model
step on CUDA, and returns what it measured over the steady part.  The sweep runs each trial in a
process of its own (``python -m shardpack.inspect.trial``: a JSON config on stdin, a JSON result
on stdout), so that one trial's memory, workers and page cache warm-up do not leak into the next.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass

WINDOWS = 5  # the measured part is cut in this many windows: their rates give the spread


@dataclass(frozen=True)
class Config:
    """One pipeline to measure.

    Args:
        name: what it is, in the sweep's table (``"workers 4"``).
        lever: the lever it changes against the starting point (``"start"`` for that).
        path: the packed dataset (folder or URL), or the raw tree with ``files``.
        files: read the raw tree as torchvision's ImageFolder + Pillow would.
        workers: DataLoader worker processes, or threads with ``execution="threads"``.
        execution: ``"processes"`` or ``"threads"`` (docs/reading.md, "Threads or processes").
        prefetch_batches: ``DeviceLoader``'s batches ahead of the step.
        pin: pin host batches before the copy to CUDA (no effect on the CPU).
        decode: ``"cpu"`` (region decode where built), ``"cpu-whole"`` (whole images), ``"gpu"``
            (nvJPEG) or ``"none"`` (bytes only).
        prefetch_shards: remote data: shards fetched ahead per reading process.
        cache_dir: remote data: where shards are cached (None: ranged reads, no cache).
        batch_size: samples per batch.
        size: the training image side.
        step_ms: the simulated step (ignored with ``model``).
        model: a torchvision model name whose train step runs on CUDA, instead of ``step_ms``.
        transform: ``"module:function"``, the user's per-batch CPU transform, run in the workers.
        device: where batches go.
    """

    name: str
    lever: str
    path: str
    files: bool = False
    workers: int = 2
    execution: str = "processes"
    prefetch_batches: int = 2
    pin: bool = True
    decode: str = "cpu"
    prefetch_shards: int = 2
    cache_dir: str | None = None
    batch_size: int = 256
    size: int = 224
    step_ms: float = 0.0
    model: str | None = None
    transform: str | None = None
    device: str = "cpu"

    def but(self, **changes) -> "Config":
        """This config with ``changes``."""
        return dataclasses.replace(self, **changes)


def load_callable(spec: str):
    """``"package.module:function"`` -> the function (the user's transform)."""
    import importlib

    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"transform {spec!r}: give it as module:function")
    return getattr(importlib.import_module(module), name)


def build(config: Config):
    """The pipeline ``config`` names, as a ``DeviceLoader`` (plus what to close after)."""
    from shardpack.inspect.pillowfolder import CollateThen, PillowFolder
    from shardpack.loader.torchenv import DataLoader
    from shardpack.transforms.device import DeviceLoader
    from shardpack.transforms.spec import TransformSpec

    spec = TransformSpec(size=config.size)
    transform = load_callable(config.transform) if config.transform else None
    workers = dict(num_workers=config.workers, persistent_workers=config.workers > 0)
    if config.files:
        loader = DataLoader(PillowFolder(config.path, spec), batch_size=config.batch_size,
                            shuffle=True, collate_fn=CollateThen(transform), **workers)
        return DeviceLoader(loader, device=config.device, decode_on="cpu", spec=spec,
                            prefetch_batches=config.prefetch_batches, pin_memory=config.pin)
    from shardpack.loader.dataset import ShardDataset
    from shardpack.transforms.operation import Decode

    place = {"cpu": "cpu", "cpu-whole": "cpu", "gpu": "gpu"}.get(config.decode)
    decode = Decode(spec, place=place, on_error="skip") if place else None
    threads = config.execution == "threads"
    ds = ShardDataset(config.path, batch_size=config.batch_size, batched=True, decode=decode,
                      transform=transform, prefetch_shards=config.prefetch_shards,
                      cache_dir=config.cache_dir, execution=config.execution,
                      workers=config.workers if threads else None)
    loader = ds if threads else DataLoader(ds, batch_size=None, **workers)
    return DeviceLoader(loader, device=config.device, prefetch_batches=config.prefetch_batches,
                        pin_memory=config.pin)


def model_step(config: Config):
    """The step each batch gets: a sleep of ``step_ms`` (a GPU step leaves the host free), or a
    real train step of a torchvision model on CUDA."""
    if not config.model:
        seconds = config.step_ms / 1000.0
        return lambda batch: time.sleep(seconds)
    import torchvision  # the GPU path alone imports it (the CPU wheel has none beside it)

    from shardpack.loader.torchenv import torch

    net = getattr(torchvision.models, config.model)(num_classes=1000).to(config.device)
    net = net.to(memory_format=torch.channels_last)
    optim = torch.optim.SGD(net.parameters(), lr=0.01)

    def step(batch):
        images = batch["image"]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(net(images), labels(batch, images))
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
    return step


def labels(batch: dict, images):
    """The batch's classes as the loss's targets, on the images' device; zeros where the data
    has no class field (the step costs the same: the sweep times it, it does not train)."""
    from shardpack.loader.torchenv import torch

    cls = batch.get("cls")
    if not isinstance(cls, torch.Tensor) or cls.shape != images.shape[:1] \
            or cls.is_floating_point():
        return torch.zeros(images.shape[0], dtype=torch.long, device=images.device)
    return cls.to(images.device, dtype=torch.long, non_blocking=True) % 1000


def settle(config: Config) -> None:
    """Wait for the steps queued on CUDA: the host runs ahead of the device (no step reads its
    loss), so the measured part ends when its last step has run, not when it was queued."""
    if config.model:
        from shardpack.loader.torchenv import torch

        torch.cuda.synchronize()


def measure(config: Config, seconds: float, warmup: int = 2) -> dict:
    """Run ``config`` for about ``seconds`` after ``warmup`` batches (which also start the
    workers) and return the figures of the measured part: ``samples_per_s``, ``wait_fraction``
    (the device's idle share between steps, ``DeviceLoader.idle()``, and its ``timing``),
    ``host_wait_fraction``, ``batches`` and ``samples``, ``window_rates`` (the spread),
    ``stages`` (busy seconds and share per stage), ``cores`` and ``peak_bytes`` (this process and
    its workers), ``first_batch_s``."""
    from shardpack.inspect.usage import TreeUsage

    started = time.perf_counter()
    loader = build(config)
    step = model_step(config)
    usage = TreeUsage()
    arrivals, sizes = [], []
    first_batch = None
    measuring = False
    epoch = seen = 0
    deadline = None
    while deadline is None or time.perf_counter() < deadline:
        loader.set_epoch(epoch)
        count = 0
        for batch in loader:
            count += 1
            seen += 1
            now = time.perf_counter()
            if first_batch is None:
                first_batch = now - started
            if measuring:
                arrivals.append(now)
                sizes.append(len(batch["__index__"]) if "__index__" in batch
                             else len(batch["cls"]))
            elif seen > warmup:  # warm: count from here on
                measuring = True
                loader.reset_stats()
                usage.start(now)
                arrivals.append(now)
                sizes.append(0)
                deadline = now + seconds
            step(batch)
            if deadline is not None and time.perf_counter() >= deadline:
                break
        epoch += 1
        if count == 0:
            raise RuntimeError(f"{config.path}: the pipeline gave no batch")
    settle(config)
    end = time.perf_counter()
    idle = loader.idle()
    usage.stop(end)
    table = loader.stats()
    wall = loader.stats["wall_s"]
    host_wait = loader.wait_fraction
    del loader  # its workers leave now, before the caller builds another (docs/reading.md)
    return dict(
        samples=int(sum(sizes)), batches=len(arrivals) - 1, seconds=end - arrivals[0],
        samples_per_s=sum(sizes) / (end - arrivals[0]), window_rates=window_rates(arrivals, sizes),
        wait_fraction=idle["idle_fraction"], timing=idle["timing"],
        host_wait_fraction=host_wait, stages=stage_shares(table, wall, config),
        cores=usage.cores, peak_bytes=usage.peak_bytes, first_batch_s=first_batch)


def window_rates(arrivals: list, sizes: list) -> list:
    """samples/s in each of :data:`WINDOWS` equal runs of batches (fewer with fewer batches)."""
    n = len(arrivals) - 1
    if n < 1:
        return []
    cuts = sorted({round(k * n / WINDOWS) for k in range(WINDOWS + 1)})
    out = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        span = arrivals[b] - arrivals[a]
        if span > 0:
            out.append(sum(sizes[a + 1:b + 1]) / span)
    return out


def stage_shares(table: dict, wall: float, config: Config) -> dict:
    """Per stage: busy seconds, and the share of its workers' time it was busy (the dataset's
    stages run in ``workers`` processes or threads; pin and device in one thread)."""
    parallel = max(1, config.workers)
    out = {}
    for name, counts in table.items():
        if not isinstance(counts, dict) or "busy_s" not in counts or not counts.get("items"):
            continue
        lanes = 1 if name in ("pin", "device") else parallel
        out[name] = dict(busy_s=counts["busy_s"],
                         share=counts["busy_s"] / (wall * lanes) if wall > 0 else 0.0)
    return out


def main() -> int:
    """Child process: a JSON ``{"config": {...}, "seconds": s}`` on stdin, the result (or
    ``{"error": "..."}``) as one JSON line on stdout."""
    request = json.loads(sys.stdin.read())
    config = Config(**request["config"])
    if config.decode == "cpu-whole":  # before anything asks whether the region decoder is on
        from shardpack.images.jpegcrop import ENV

        os.environ[ENV] = "0"
    try:
        result = measure(config, float(request["seconds"]), int(request.get("warmup", 2)))
    except Exception as exc:  # one line for the sweep's table, never a traceback
        result = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
