"""A complete, short training script on a packed dataset: the example users copy.

    # one process (CPU or one GPU)
    python tools/train_example.py DATASET --out runs/a
    # DDP: any number of processes, CPU (gloo) or GPUs (nccl)
    torchrun --nproc_per_node 2 tools/train_example.py DATASET --out runs/a

It resumes by itself: run the same command again after a crash or kill, and it continues from the
last checkpoint, mid-epoch, with every sample of the epoch seen exactly once across the
interruption (the loader's state is part of the checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader

import shardpack


def small_cnn(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


def build_model(name: str, classes: int) -> nn.Module:
    if name == "resnet50":
        import torchvision  # only where torchvision is installed (GPU machines)

        return torchvision.models.resnet50(num_classes=classes)
    return small_cnn(classes)


def main() -> None:  # noqa: C901  (the example users copy: one readable loop, top to bottom)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset")
    p.add_argument("--out", required=True, help="checkpoint folder (resumes from it)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--decode", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--model", choices=["small", "resnet50"], default="small")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--checkpoint-every", type=int, default=20, help="steps")
    p.add_argument("--log-seen", action="store_true",
                   help="record each step's sample ids in OUT/seen-rankR.jsonl (used by tests)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds (tests: slow down)")
    args = p.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    cuda = torch.cuda.is_available()
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)

    decode = shardpack.CpuDecode(args.size) if args.decode == "cpu" else None
    ds = shardpack.ShardDataset(args.dataset, batch_size=args.batch_size, batched=True,
                                decode=decode)
    classes = len(ds.reader.manifest.classes or ()) or 1000
    loader = shardpack.DeviceLoader(
        DataLoader(ds, batch_size=None, num_workers=args.workers,
                   persistent_workers=args.workers > 0, pin_memory=cuda),
        device=device, decode=args.decode, size=args.size)
    model = build_model(args.model, classes).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    os.makedirs(args.out, exist_ok=True)
    ckpt = os.path.join(args.out, "checkpoint.pt")
    epoch, step, resumed = 0, 0, False
    if os.path.exists(ckpt):
        state = torch.load(ckpt, map_location=device, weights_only=True)
        (model.module if distributed else model).load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        epoch, step = state["epoch"], state["step"]
        if state["loader"] is not None:  # saved mid-epoch: continue exactly where it stopped
            loader.load_state_dict(state["loader"])
            resumed = True
        if rank == 0:
            print(f"resumed at epoch {epoch}, step {step}", flush=True)
    seen_log = _seen_log(args, rank, step) if args.log_seen else None

    loss_fn = nn.CrossEntropyLoss(reduction="none")
    while epoch < args.epochs:
        if not resumed:
            loader.set_epoch(epoch)
        resumed = False
        start, samples = time.perf_counter(), 0
        for batch in loader:
            images, labels = batch["image"], batch["cls"].to(device)
            weight = (~batch["__repeat__"]).to(device).float()  # padding repeats don't count
            loss = (loss_fn(model(images), labels) * weight).sum() / weight.sum().clamp(min=1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            samples += len(labels)
            if seen_log is not None:
                ids = batch["__index__"][~batch["__repeat__"].cpu()].tolist()
                seen_log.write(json.dumps({"step": step, "epoch": epoch, "ids": ids}) + "\n")
                seen_log.flush()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if step % args.checkpoint_every == 0:
                _checkpoint(ckpt, model, opt, epoch, step, loader.state_dict(), rank, distributed)
            if rank == 0 and step % 10 == 0:
                rate = samples * world / (time.perf_counter() - start)
                print(f"epoch {epoch} step {step} loss {loss.item():.3f} {rate:,.0f} samples/s "
                      f"waiting {100 * loader.wait_fraction:.1f}%", flush=True)
        epoch += 1
        _checkpoint(ckpt, model, opt, epoch, step, None, rank, distributed)
    if rank == 0:
        print(f"done: {step} steps, data wait {100 * loader.wait_fraction:.1f}% of loop time",
              flush=True)
    if distributed:
        dist.destroy_process_group()


def _checkpoint(path, model, opt, epoch, step, loader_state, rank, distributed) -> None:
    """Rank 0 writes model, optimizer and loader state in one file, atomically (temp + rename).
    Every rank consumed the same number of samples, so one loader state serves the whole job;
    ``loader_state=None`` means the epoch ``epoch`` starts fresh."""
    if rank == 0:
        raw = model.module if distributed else model
        tmp = f"{path}.{os.getpid()}.tmp"
        torch.save({"model": raw.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch,
                    "step": step, "loader": loader_state}, tmp)
        os.replace(tmp, path)
    if distributed:
        dist.barrier()


def _seen_log(args, rank, step):
    """Append-only log of sample ids per step; on resume, drop steps after the checkpoint."""
    path = os.path.join(args.out, f"seen-rank{rank}.jsonl")
    kept = []
    if os.path.exists(path):
        with open(path) as f:
            kept = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
    with open(path, "w") as f:
        f.writelines(kept)
    return open(path, "a")


if __name__ == "__main__":
    main()
