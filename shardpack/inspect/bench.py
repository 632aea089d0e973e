"""``shardpack bench``: run the real pipeline (ShardDataset -> DataLoader -> DeviceLoader) and
report samples/s, MB/s, time to first batch and, with a simulated step time, the fraction of wall
time the consumer waited for data.  ``files=`` runs the same pipeline over an unpacked file tree,
so users see what packing bought them.

Every batch is also recorded on a timeline (:class:`Timeline`: when it arrived, its samples, how
long the consumer waited for it, as the DeviceLoader counts waits), which ``bench --plot FILE``
draws: samples/s over time and the wait per step, the first batch marked (docs/preview.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from dataclasses import field as dataclass_field

import numpy as np

from shardpack.loader.batches import BytesBatch, collate
from shardpack.loader.dataset import ShardDataset
from shardpack.transforms.decode import CpuDecode
from shardpack.transforms.device import DeviceLoader
from shardpack.write.packsource import PackSource
from shardpack.loader.torchenv import DataLoader


@dataclass(frozen=True)
class BenchOptions:
    """What ``shardpack bench`` runs (its command-line options).

    Args:
        decode: where images decode: ``"none"`` (bytes only), ``"cpu"`` (CpuDecode in the
            workers) or ``"gpu"`` (nvJPEG): ``DeviceLoader``'s ``decode_on``, spelled as the
            CLI's ``--decode``.
        workers: DataLoader workers.
        batch_size: samples per batch.
        size: decoded image side.
        step_ms: a simulated training step per batch (0: none).
        batches: stop after this many batches (None: whole epochs).
        device: where batches go.
        epochs: epochs to run.
        weights: several datasets: a mixture's shares.
        epoch_size: several datasets: a mixture's samples an epoch.
        on_error: ``--files``: ``"skip"`` skips and counts the tree's bad entries (broken
            links, special files), as ``pack --skip-bad`` does; ``"raise"`` stops at the first.
    """

    decode: str = "none"      # none | cpu | gpu
    workers: int = 2
    batch_size: int = 256
    size: int = 224
    step_ms: float = 0.0
    batches: int | None = None
    device: str = "cpu"
    epochs: int = 1
    weights: tuple | None = None    # several datasets: a mixture's shares
    epoch_size: int | None = None
    on_error: str = "raise"


@dataclass
class Timeline:
    """One entry per batch the consumer received: seconds since the bench started when it
    arrived, its samples, and the seconds the consumer waited for it (the DeviceLoader's host
    wait plus, on CUDA, the stream's stall, counted when its events are settled, which may be
    a step late; the first batch's wait includes the loader's start)."""
    arrived: list = dataclass_field(default_factory=list)
    samples: list = dataclass_field(default_factory=list)
    waits: list = dataclass_field(default_factory=list)

    def add(self, arrived: float, samples: int, wait: float) -> None:
        """Record a batch.

        Args:
            arrived: seconds since the bench started.
            samples: its samples.
            wait: seconds the consumer waited for it.
        """
        self.arrived.append(arrived)
        self.samples.append(samples)
        self.waits.append(wait)

    def rates(self, window: int | None = None) -> np.ndarray:
        """samples/s at each batch over the last ``window`` batches (default: ~1/20 of the
        run, 1 to 10), the first batch's as samples over its arrival time."""
        t = np.asarray(self.arrived, dtype=np.float64)
        n = np.asarray(self.samples, dtype=np.float64)
        if not len(t):
            return t
        k = window or max(1, min(10, len(t) // 20))
        done = np.concatenate([[0.0], np.cumsum(n)])
        since = np.concatenate([[0.0], t])
        lo = np.maximum(np.arange(len(t)) + 1 - k, 0)
        spans = t - since[lo]
        return np.divide(done[1:] - done[lo], spans, out=np.zeros(len(t)), where=spans > 0)

    def wait_line(self) -> str | None:
        """The wait per step after the first batch (p50, p90, max) as a report line; None
        with fewer than two batches."""
        if len(self.waits) < 2:
            return None
        rest = np.asarray(self.waits[1:]) * 1000
        p50, p90 = np.percentile(rest, [50, 90])
        return (f"wait/step     p50 {p50:.1f} ms, p90 {p90:.1f} ms, max {rest.max():.1f} ms "
                f"after the first batch ({1000 * self.waits[0]:.0f} ms)")

    def plot(self, path, title: str, step_ms: float) -> None:
        """samples/s over time and the wait per step as a PNG (matplotlib), the first batch
        marked."""
        from shardpack.inspect.sampling import new_figure, save_figure

        fig = new_figure((9, 6))
        top, bottom = fig.subplots(2, 1, sharex=True)
        t = np.asarray(self.arrived)
        top.plot(t, self.rates(1), ".", color="#aab7c4", markersize=3, label="per batch")
        top.plot(t, self.rates(), "-", color="#2e86c1", label="rolling")
        top.set_ylabel("samples/s")
        top.set_title(title, fontsize=10)
        bottom.bar(t, np.asarray(self.waits) * 1000, width=_bar_width(t), color="#c0392b")
        bottom.set_ylabel("consumer wait per step (ms)")
        bottom.set_xlabel("seconds since start" + (f" (step {step_ms:g} ms)" if step_ms else ""))
        bottom.set_yscale("symlog", linthresh=1.0)
        bottom.set_xlim(left=0)
        if len(t):
            for ax in (top, bottom):
                ax.axvline(t[0], color="black", linestyle="--", linewidth=1)
            top.text(t[0], 0.97, f" first batch: {t[0]:.2f} s", va="top", fontsize=8,
                     transform=top.get_xaxis_transform())
        top.legend(loc="lower right", fontsize=8)
        save_figure(fig, path)


def _bar_width(t: np.ndarray) -> float:
    return float(np.median(np.diff(t))) * 0.8 if len(t) > 1 else 0.01


@dataclass
class BenchResult:
    """One bench run's figures: the source, samples, batches, seconds, time to the first batch,
    bytes, the consumer's wait fraction (with a step time), undecodable images, and the
    per-batch :class:`Timeline`."""

    source: str
    samples: int
    batches: int
    seconds: float
    first_batch_s: float
    nbytes: int
    wait_fraction: float | None
    bad: int = 0
    timeline: Timeline = dataclass_field(default_factory=Timeline)
    skipped: dict = dataclass_field(default_factory=dict)  # --files: bad entries by reason

    def lines(self) -> list[str]:
        """The report, one line per figure."""
        rate = self.samples / self.seconds if self.seconds else 0.0
        out = [f"source        {self.source}",
               f"samples/s     {rate:,.0f}  ({self.samples:,} samples, {self.batches} batches, "
               f"{self.seconds:.2f} s)",
               f"MB/s          {self.nbytes / self.seconds / 1e6 if self.seconds else 0:,.1f}",
               f"first batch   {self.first_batch_s:.3f} s"]
        if self.bad:
            out.append(f"undecodable  {self.bad} images (zero images in their place)")
        if self.skipped:
            out.append("skipped       " + ", ".join(f"{n:,} {reason}" for reason, n
                                                     in sorted(self.skipped.items())))
        if self.wait_fraction is not None:
            out.append(f"waiting       {100 * self.wait_fraction:.1f}% of wall time")
            waits = self.timeline.wait_line()
            if waits:
                out.append(waits)
        return out


class FilesDataset:
    """Map-style dataset over an unpacked tree (ImageFolder or any files), same sample dicts."""

    def __init__(self, root, skip_bad: bool = False):
        source = PackSource(root, skip_bad=skip_bad)
        self.samples = list(source)
        self.skipped = dict(source.report.skipped)

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


def make_loader(dataset: str | list | None, files: str | None, opts: BenchOptions):
    """The DataLoader the bench reads: over the packed ``dataset`` (a list: a mixture), or over
    the unpacked tree ``files``, with CpuDecode in the workers for ``decode="cpu"``.

    Args:
        dataset: a packed dataset, or a list of them.
        files: an unpacked file tree instead.
        opts: the bench's options.
    """
    decode = CpuDecode(opts.size, on_error="skip") if opts.decode == "cpu" else None
    kwargs = dict(num_workers=opts.workers, persistent_workers=opts.workers > 0)
    if files is not None:
        return DataLoader(FilesDataset(files, opts.on_error == "skip"),
                          batch_size=opts.batch_size, shuffle=True,
                          collate_fn=_CollateDecode(decode), **kwargs)
    ds = ShardDataset(dataset, batch_size=opts.batch_size, batched=True, decode=decode,
                      **({"weights": opts.weights, "epoch_size": opts.epoch_size}
                         if isinstance(dataset, list) else {}))
    return DataLoader(ds, batch_size=None, **kwargs)


def run(dataset: str | None, opts: BenchOptions, files: str | None = None,
        progress: bool = False) -> BenchResult:
    """Run the pipeline (DataLoader -> DeviceLoader) as ``opts`` says and measure it.

    Args:
        dataset: a packed dataset (or a list of them: a mixture).
        opts: the bench's options.
        files: an unpacked file tree to read instead.
        progress: show a progress bar.
    """
    started = time.perf_counter()
    loader = make_loader(dataset, files, opts)
    device_loader = DeviceLoader(loader, device=opts.device,
                                 decode_on={"none": None}.get(opts.decode, opts.decode),
                                 size=opts.size, on_error="skip")  # counted, as for CPU
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=opts.batches, unit="batch", desc="bench")
    samples = nbytes = batches = bad = 0
    first = None
    step = opts.step_ms / 1000.0
    timeline = Timeline()
    waited = 0.0
    for epoch in range(opts.epochs):
        device_loader.set_epoch(epoch)
        for batch in device_loader:
            now = time.perf_counter() - started
            if first is None:
                first = now
            stats = device_loader.stats
            total_wait = stats["wait_s"] + stats["device_wait_s"]
            timeline.add(now, len(batch["__index__"]), total_wait - waited)
            waited = total_wait
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
    return BenchResult(files or (" + ".join(dataset) if isinstance(dataset, list) else dataset),
                       samples, batches, seconds, first or 0.0, nbytes,
                       device_loader.wait_fraction if step else None, bad, timeline,
                       getattr(loader.dataset, "skipped", {}))


def _busy(seconds: float) -> None:
    """A stand-in training step: sleep (a GPU step leaves the CPU free for the loader)."""
    time.sleep(seconds)
