"""GPU checks in one short run (< 5 minutes on a CUDA machine); prints a markdown table.

    python tools/gpu_check.py [--images 8000] [--workers 8] [--out FILE.md]
    python tools/gpu_check.py --cpu-smoke        # exercise the script's CPU parts, no GPU needed

Measures: GPU (nvJPEG) vs CPU decode difference on the same crops; nvJPEG batched decode
images/s; end-to-end DeviceLoader images/s with CPU decode and with GPU decode at the same worker
count; consumer wait fraction with a real ResNet-50 bf16 training step (torchvision); pinned vs
pageable host-to-device GB/s.  Data is generated (tools/make_images.py) and packed in a temp dir.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

import shardpack

ROOT = Path(__file__).resolve().parents[1]


def _make_data(tmp: Path, count: int) -> Path:
    spec = importlib.util.spec_from_file_location("make_images", ROOT / "tools" / "make_images.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.make_images(tmp / "img", count, classes=10, seed=0)
    shardpack.pack(tmp / "img", tmp / "ds", format="tar", shard_size="64MB")
    return tmp / "ds"


def _loader(ds_path, workers, decode, size=224, batch=256):
    dec = shardpack.CpuDecode(size, on_error="skip") if decode == "cpu" else None
    ds = shardpack.ShardDataset(ds_path, batch_size=batch, batched=True, decode=dec)
    return DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0,
                      pin_memory=torch.cuda.is_available(), prefetch_factor=4 if workers else None)


def decode_difference(ds_path, device) -> tuple[float, float]:
    gpu = shardpack.DeviceLoader(_loader(ds_path, 2, None, batch=64), device=device,
                                 decode="gpu", normalize=False)
    cpu = shardpack.DeviceLoader(_loader(ds_path, 2, "cpu", batch=64), device=device,
                                 decode="cpu", normalize=False)
    worst, means = 0.0, []
    for i, (g, c) in enumerate(zip(gpu, cpu, strict=False)):  # the first batches only
        diff = (g["image"].float() - c["image"].float()).abs()
        worst, _ = max(worst, float(diff.amax())), means.append(float(diff.mean()))
        if i == 3:
            break
    return sum(means) / len(means), worst


def nvjpeg_rate(ds_path, device) -> float:
    import torchvision.io as tvio

    reader = shardpack.open_reader(ds_path)
    data = [torch.frombuffer(bytearray(reader.read_sample(i)["jpg"]), dtype=torch.uint8)
            for i in range(min(512, len(reader)))]
    tvio.decode_jpeg(data[:64], device=device)  # warm-up (nvJPEG handles, allocator)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(3):
        tvio.decode_jpeg(data, device=device)
    torch.cuda.synchronize()
    return 3 * len(data) / (time.perf_counter() - start)


def end_to_end(ds_path, device, workers, decode, batches=30, batch=256) -> float:
    dl = shardpack.DeviceLoader(_loader(ds_path, workers, decode, batch=batch), device=device,
                                decode=decode)
    count, start = 0, None
    for i, batch in enumerate(dl):
        if i == 2:  # skip start-up
            if device.type == "cuda":
                torch.cuda.synchronize()
            start, count = time.perf_counter(), 0
        count += batch["image"].shape[0]
        if i == batches + 2:
            break
    if device.type == "cuda":
        torch.cuda.synchronize()
    return count / (time.perf_counter() - start)


def training_wait(ds_path, device, workers, decode, steps=40) -> tuple[float, float]:
    import torchvision

    model = torchvision.models.resnet50(num_classes=10).to(device,
                                                           memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    dl = shardpack.DeviceLoader(_loader(ds_path, workers, decode), device=device, decode=decode)
    seen, start = 0, None
    for i, batch in enumerate(dl):
        if i == 5:
            torch.cuda.synchronize()
            dl.stats.update(wait_s=0.0, wall_s=0.0)
            start, seen = time.perf_counter(), 0
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(batch["image"]),
                                                     batch["cls"].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()  # a real step: the host waits for the GPU
        seen += batch["image"].shape[0]
        if i == steps + 5:
            break
    wall = time.perf_counter() - start
    return dl.stats["wait_s"] / max(dl.stats["wall_s"], 1e-9), seen / wall


def h2d_rates(device) -> tuple[float, float]:
    size = 256 << 20
    rates = []
    for pinned in (True, False):
        host = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
        dev = torch.empty(size, dtype=torch.uint8, device=device)
        dev.copy_(host, non_blocking=pinned)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            dev.copy_(host, non_blocking=pinned)
        torch.cuda.synchronize()
        rates.append(10 * size / (time.perf_counter() - start) / 1e9)
    return rates[0], rates[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=8000)
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 2))
    p.add_argument("--out", default=None, help="also write the table to this file")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="run the CPU-side parts on a small set (no GPU): checks the script")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ds_path = _make_data(Path(tmp), 300 if args.cpu_smoke else args.images)
        if args.cpu_smoke:
            rate = end_to_end(ds_path, torch.device("cpu"), 2, "cpu", batches=4, batch=32)
            rows.append(("DeviceLoader, CPU decode, 2 workers (smoke)", f"{rate:,.0f} img/s"))
        else:
            if not torch.cuda.is_available():
                sys.exit("no CUDA device: run with --cpu-smoke to check the script on CPU")
            device = torch.device("cuda")
            mean, worst = decode_difference(ds_path, device)
            rows.append(("GPU vs CPU decode, same crops: mean / max abs diff (0-255)",
                         f"{mean:.2f} / {worst:.0f}"))
            rows.append(("nvJPEG batched decode (512 images / call)",
                         f"{nvjpeg_rate(ds_path, device):,.0f} img/s"))
            cpu_rate = end_to_end(ds_path, device, args.workers, "cpu")
            gpu_rate = end_to_end(ds_path, device, args.workers, "gpu")
            rows.append((f"DeviceLoader end to end, CPU decode, {args.workers} workers",
                         f"{cpu_rate:,.0f} img/s"))
            rows.append((f"DeviceLoader end to end, GPU decode, {args.workers} workers",
                         f"{gpu_rate:,.0f} img/s ({gpu_rate / cpu_rate:.1f}x CPU decode)"))
            for decode in ("gpu", "cpu"):
                wait, rate = training_wait(ds_path, device, args.workers, decode)
                rows.append((f"ResNet-50 bf16 training, {decode.upper()} decode: data wait",
                             f"{100 * wait:.1f}% of wall time at {rate:,.0f} img/s"))
            pinned, pageable = h2d_rates(device)
            rows.append(("host-to-device copy, pinned / pageable",
                         f"{pinned:.1f} / {pageable:.1f} GB/s"))
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor()
    lines = [f"GPU checks on {name}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
             f"{args.workers} workers, `python tools/gpu_check.py`", "",
             "| check | result |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
