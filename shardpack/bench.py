"""``shardpack bench``: run the real pipeline (ShardDataset -> DataLoader -> DeviceLoader) and
report samples/s, MB/s, time to first batch and, with a simulated step time, the fraction of wall
time the consumer waited for data.  ``files=`` runs the same pipeline over an unpacked file tree,
so users see what packing bought them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .batches import BytesBatch, collate
from .dataset import ShardDataset
from .decode import CpuDecode
from .device import DeviceLoader
from .samples import Source
from .torchenv import DataLoader


@dataclass(frozen=True)
class BenchOptions:
    decode: str = "none"      # none | cpu | gpu
    workers: int = 2
    batch_size: int = 256
    size: int = 224
    step_ms: float = 0.0
    batches: int | None = None
    device: str = "cpu"
    epochs: int = 1


@dataclass
class BenchResult:
    source: str
    samples: int
    batches: int
    seconds: float
    first_batch_s: float
    nbytes: int
    wait_fraction: float | None
    bad: int = 0

    def lines(self) -> list[str]:
        rate = self.samples / self.seconds if self.seconds else 0.0
        out = [f"source        {self.source}",
               f"samples/s     {rate:,.0f}  ({self.samples:,} samples, {self.batches} batches, "
               f"{self.seconds:.2f} s)",
               f"MB/s          {self.nbytes / self.seconds / 1e6 if self.seconds else 0:,.1f}",
               f"first batch   {self.first_batch_s:.3f} s"]
        if self.bad:
            out.append(f"undecodable  {self.bad} images (zero images in their place)")
        if self.wait_fraction is not None:
            out.append(f"waiting       {100 * self.wait_fraction:.1f}% of wall time")
        return out


class FilesDataset:
    """Map-style dataset over an unpacked tree (ImageFolder or any files), same sample dicts."""

    def __init__(self, root):
        self.samples = list(Source(root))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict:
        sample = self.samples[i]
        out = {"__key__": sample.key}
        for f in sample.fields:
            if f.path is None:
                out[f.name] = f.value
            else:
                with open(f.path, "rb") as fh:
                    out[f.name] = fh.read()
        out["__index__"] = i
        out["__repeat__"] = False
        return out


class _CollateDecode:
    def __init__(self, decode):
        self.decode = decode

    def __call__(self, samples):
        batch = collate(samples)
        return self.decode(batch) if self.decode is not None else batch


def make_loader(dataset: str | None, files: str | None, opts: BenchOptions):
    decode = CpuDecode(opts.size, on_error="skip") if opts.decode == "cpu" else None
    kwargs = dict(num_workers=opts.workers, persistent_workers=opts.workers > 0)
    if files is not None:
        return DataLoader(FilesDataset(files), batch_size=opts.batch_size, shuffle=True,
                          collate_fn=_CollateDecode(decode), **kwargs)
    ds = ShardDataset(dataset, batch_size=opts.batch_size, batched=True, decode=decode)
    return DataLoader(ds, batch_size=None, **kwargs)


def run(dataset: str | None, opts: BenchOptions, files: str | None = None,
        progress: bool = False) -> BenchResult:
    started = time.perf_counter()
    loader = make_loader(dataset, files, opts)
    device_loader = DeviceLoader(loader, device=opts.device,
                                 decode={"none": None}.get(opts.decode, opts.decode),
                                 size=opts.size, on_error="skip")  # counted, as for CPU
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=opts.batches, unit="batch", desc="bench")
    samples = nbytes = batches = bad = 0
    first = None
    step = opts.step_ms / 1000.0
    for epoch in range(opts.epochs):
        device_loader.set_epoch(epoch)
        for batch in device_loader:
            if first is None:
                first = time.perf_counter() - started
            batches += 1
            samples += len(batch["__index__"])
            nbytes += sum(int(v.offsets[-1]) for v in batch.values() if isinstance(v, BytesBatch))
            if "image" in batch:
                nbytes += batch["image"].numel()
            if "__bad__" in batch:
                bad += int(batch["__bad__"].sum())
            if step:
                _busy(step)
            if bar is not None:
                bar.update(1)
            if opts.batches and batches >= opts.batches:
                break
        if opts.batches and batches >= opts.batches:
            break
    if bar is not None:
        bar.close()
    seconds = device_loader.stats["wall_s"]
    return BenchResult(files or dataset, samples, batches, seconds, first or 0.0, nbytes,
                       device_loader.wait_fraction if step else None, bad)


def _busy(seconds: float) -> None:
    """A stand-in training step: sleep (a GPU step leaves the CPU free for the loader)."""
    time.sleep(seconds)
