"""A complete, short training script on a packed dataset: the example users copy.

    # one process (CPU or one GPU)
    python examples/train_example.py DATASET --out runs/a
    # DDP: any number of processes, CPU (gloo) or GPUs (nccl)
    torchrun --nproc_per_node 2 examples/train_example.py DATASET --out runs/a

It resumes by itself: run the same command again after a crash or kill, and it continues from the
last checkpoint, mid-epoch, with every sample of the epoch seen exactly once across the
interruption (the loader's state is part of the checkpoint).

Checkpoints (docs/device.md, "Checkpoints that don't stall training"): every --save-every-steps
steps and/or --save-every-s seconds, written atomically (temp file, fsync, rename) as
OUT/checkpoint-STEP.pt, the last --keep kept.  With --async-save the state is copied to CPU memory
at a step boundary (pinned on CUDA) and written by a background thread while training goes on;
the next save first waits for the previous one.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import threading
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


def wide_mlp(classes: int) -> nn.Module:
    """The small CNN with a wide head: 50.5M parameters (~202 MB), so a checkpoint with Adam's
    state is ~600 MB, as for a real model (the checkpoint measurements use it)."""
    return nn.Sequential(*small_cnn(4096)[:-1], nn.Linear(32, 4096), nn.ReLU(),
                         nn.Linear(4096, 12288), nn.ReLU(), nn.Linear(12288, classes))


def build_model(name: str, classes: int) -> nn.Module:
    if name == "wide":
        return wide_mlp(classes)
    if name == "resnet50":
        import torchvision  # only where torchvision is installed (GPU machines)

        return torchvision.models.resnet50(num_classes=classes)
    return small_cnn(classes)


def pick_device(local_rank: int, local_world: int, device_count: int
                ) -> tuple[torch.device, str]:
    """This rank's device and the process group's backend.  One GPU per rank where there are
    enough (NCCL); with fewer GPUs than ranks on this machine, ranks share them round-robin
    (``local_rank % device_count``) over gloo, since NCCL refuses two ranks on one GPU; no GPU:
    the CPU and gloo."""
    if device_count <= 0:
        return torch.device("cpu"), "gloo"
    device = torch.device("cuda", local_rank % device_count)
    return device, "nccl" if local_world <= device_count else "gloo"


def main() -> None:  # noqa: C901  (the example users copy: one readable loop, top to bottom)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset")
    p.add_argument("--out", required=True, help="checkpoint folder (resumes from it)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--decode", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--model", choices=["small", "wide", "resnet50"], default="small")
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0, help="model initialisation")
    p.add_argument("--save-every-steps", type=int, default=20, help="0: not by steps")
    p.add_argument("--save-every-s", type=float, default=0.0,
                   help="also save when this many seconds passed since the last save (0: off)")
    p.add_argument("--keep", type=int, default=2, help="checkpoints kept (the newest)")
    p.add_argument("--async-save", action="store_true",
                   help="snapshot to CPU memory, write in a background thread")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many (0: epochs)")
    p.add_argument("--stats-json", default=None, help="write step and save timings here")
    p.add_argument("--log-seen", action="store_true",
                   help="record each step's sample ids in OUT/seen-rankR.jsonl (used by tests)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds (tests: slow down)")
    p.add_argument("--write-delay", type=float, default=0.0,
                   help="seconds a checkpoint write pauses half-way (tests: a slow disk)")
    p.add_argument("--delay-write", type=int, default=1,
                   help="the write --write-delay holds: the Nth of this run, and later ones")
    args = p.parse_args()
    torch.manual_seed(args.seed)

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device, backend = pick_device(
        local, int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        torch.cuda.device_count() if torch.cuda.is_available() else 0)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group(backend)
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    if rank == 0 and cuda and backend == "gloo":
        print(f"{os.environ.get('LOCAL_WORLD_SIZE')} ranks share {torch.cuda.device_count()} "
              "GPU(s): gloo", flush=True)

    decode = shardpack.CpuDecode(args.size) if args.decode == "cpu" else None
    ds = shardpack.ShardDataset(args.dataset, batch_size=args.batch_size, batched=True,
                                decode=decode)
    classes = len(ds.reader.manifest.classes or ()) or 1000
    loader = shardpack.DeviceLoader(
        DataLoader(ds, batch_size=None, num_workers=args.workers,
                   persistent_workers=args.workers > 0, pin_memory=cuda),
        device=device, decode_on=args.decode, size=args.size)
    model = build_model(args.model, classes).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    if distributed:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9) \
        if args.optimizer == "sgd" else torch.optim.Adam(model.parameters(), lr=args.lr)
    raw = model.module if distributed else model

    saver = Checkpointer(args.out, keep=args.keep, every_steps=args.save_every_steps,
                         every_s=args.save_every_s, async_save=args.async_save, device=device,
                         rank=rank, write_delay=(args.write_delay, args.delay_write))
    epoch, step, resumed = 0, 0, False
    state = saver.latest(device)
    if state is not None:
        raw.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        epoch, step = state["epoch"], state["step"]
        if state["loader"] is not None:  # saved mid-epoch: continue exactly where it stopped
            loader.load_state_dict(state["loader"])
            resumed = True
        if rank == 0:
            print(f"resumed at epoch {epoch}, step {step}", flush=True)
    seen_log = _seen_log(args, rank, step) if args.log_seen else None

    loss_fn = nn.CrossEntropyLoss(reduction="none")
    step_times: list[float] = []
    last = time.perf_counter()

    def snapshot(loader_state):  # what a checkpoint holds; the loader's state of this step
        return {"model": raw.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch,
                "step": step, "loader": loader_state}

    while epoch < args.epochs and not (args.max_steps and step >= args.max_steps):
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
            if saver.due(step):
                saver.save(step, lambda: snapshot(loader.state_dict()))
            now = time.perf_counter()
            step_times.append(now - last)  # the step, its save's stall included
            last = now
            if args.max_steps and step >= args.max_steps:
                break
            if rank == 0 and step % 10 == 0:
                rate = samples * world / (time.perf_counter() - start)
                print(f"epoch {epoch} step {step} loss {loss.item():.3f} {rate:,.0f} samples/s "
                      f"waiting {100 * loader.wait_fraction:.1f}%{_idle(loader)}", flush=True)
        else:  # the epoch ran to its end: the next one starts fresh (loader state None)
            epoch += 1
            if saver.saved_step != step:  # (a save at this step already holds the whole epoch)
                saver.save(step, lambda: snapshot(None))
            last = time.perf_counter()
            continue
        if args.max_steps and step >= args.max_steps:  # stopped mid-epoch: resumable there
            if saver.saved_step != step:
                saver.save(step, lambda: snapshot(loader.state_dict()))
            break
    saver.wait()  # the last write is on disk before the process ends
    if rank == 0:
        print(f"done: {step} steps on {device}, data wait {100 * loader.wait_fraction:.1f}% of "
              f"loop time{_idle(loader)}; {saver.summary()}", flush=True)
        if args.stats_json:
            with open(args.stats_json, "w") as f:
                json.dump({"steps": step_times, **saver.stats}, f)
    if distributed:
        dist.destroy_process_group()


def _idle(loader) -> str:
    """The GPU's idle share between steps (CUDA events on the training stream), where there is
    one."""
    idle = loader.gpu_idle_fraction
    return "" if idle is None else f", GPU idle {100 * idle:.1f}% between steps"


class Checkpointer:
    """Atomic checkpoints, optionally written in the background.

    NOTE [async save]: at a step boundary ``save`` first waits for the previous write, then
    copies every tensor of the state into CPU buffers of its own (pinned on CUDA, reused from
    save to save; tensors that share memory share their copy), and hands that copy to a thread,
    which writes a temp file, fsyncs it and renames it to checkpoint-STEP.pt (then fsyncs the
    folder and removes older checkpoints beyond the newest ``keep``).  Training changes the live
    weights meanwhile; the copy is what gets written, so the file holds exactly the state of its
    step.  The training loop stalls only for the wait and the copy.  Only rank 0 writes and
    decides when (nothing in a save is collective): DDP replicas are equal, and every rank
    consumed the same number of samples, so one loader state serves the whole job.  A kill at
    any moment leaves the earlier checkpoints whole: a file only gets its final name once it is
    complete on disk.  Why not torch.distributed.checkpoint.async_save: docs/device.md."""

    def __init__(self, folder, *, keep, every_steps, every_s, async_save, device, rank,
                 write_delay=(0.0, 1)):
        self.folder, self.keep = folder, max(1, keep)
        self.every_steps, self.every_s = every_steps, every_s
        self.async_save, self.device, self.rank = async_save, device, rank
        self.write_delay = write_delay  # (seconds, from the Nth write on): tests
        self.stats = {"stall_s": [], "write_s": []}
        self.saved_step = -1
        self._writes = 0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffers: dict = {}
        self._last_save = time.monotonic()
        os.makedirs(folder, exist_ok=True)
        if rank == 0:  # what a killed write left behind: never a checkpoint, only its temp file
            for stale in glob.glob(os.path.join(folder, "checkpoint-*.tmp")):
                os.unlink(stale)

    # -- when ---------------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        if self.rank != 0:
            return False
        if self.every_steps and step % self.every_steps == 0:
            return True
        # by time: not while the previous write still runs (waiting for it would stall every
        # step once writes take longer than the interval)
        return bool(self.every_s) and time.monotonic() - self._last_save >= self.every_s and \
            not (self._thread is not None and self._thread.is_alive())

    # -- saving -------------------------------------------------------------------------------
    def save(self, step: int, state_fn) -> None:
        if self.rank != 0:
            return
        start = time.perf_counter()
        self.saved_step = step
        self.wait()
        state = state_fn()
        if self.async_save:
            seen: dict = {}
            state = self._copy(state, "", seen)
            if self.device.type == "cuda":  # the copies were queued on this stream: wait for
                done = torch.cuda.Event()  # them only, not for the loader's side streams
                done.record()
                done.synchronize()
            self._thread = threading.Thread(target=self._write_logged, args=(state, step),
                                            name="checkpoint-writer", daemon=False)
            self._thread.start()
        else:
            self._write(state, step)
        self._last_save = time.monotonic()
        self.stats["stall_s"].append(time.perf_counter() - start)

    def wait(self) -> None:
        """Until the previous write is on disk; its error, if any, is raised here."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"writing a checkpoint failed: {error}") from error

    def _copy(self, value, path: str, seen: dict):
        """The state with every tensor copied into this checkpointer's own CPU buffers (views
        of one memory get one copy, as torch.save would store them once)."""
        if isinstance(value, torch.Tensor):
            ident = (value.untyped_storage().data_ptr(), value.storage_offset(),
                     tuple(value.shape), tuple(value.stride()), value.dtype)
            if ident in seen:
                return seen[ident]
            buf = self._buffers.get(path)
            if buf is None or buf.shape != value.shape or buf.dtype != value.dtype or \
                    buf.stride() != value.stride():
                buf = self._buffers[path] = torch.empty_like(
                    value, device="cpu", pin_memory=self.device.type == "cuda")
            seen[ident] = buf.copy_(value.detach(), non_blocking=self.device.type == "cuda")
            return seen[ident]
        if isinstance(value, dict):
            return {k: self._copy(v, f"{path}/{k}", seen) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [self._copy(v, f"{path}/{i}", seen) for i, v in enumerate(value)]
            if hasattr(value, "_fields"):  # a named tuple
                return type(value)(*items)
            return type(value)(items)
        return value  # ints, floats, strings: immutable

    def _write_logged(self, state, step: int) -> None:
        try:
            self._write(state, step)
        except BaseException as exc:  # reported by the next wait(), in the training loop
            self._error = exc

    def _write(self, state, step: int) -> None:
        start = time.perf_counter()
        self._writes += 1
        final = os.path.join(self.folder, f"checkpoint-{step:09d}.pt")
        tmp = f"{final}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                delay, nth = self.write_delay
                if delay and self._writes >= nth:  # tests: a slow write, part of it on disk
                    f.write(b"partial")
                    f.flush()
                    time.sleep(delay)
                    f.seek(0)
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            if os.path.exists(tmp):  # (a full disk gets its space back)
                os.unlink(tmp)
            raise
        fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        # only older ones go, and never the one just written: after a resume from an older
        # checkpoint a newer one may exist (its run was killed): it is kept until overtaken
        older = [c for c in self._checkpoints() if _step_of(c) < step]
        for old in older[self.keep - 1:]:
            os.unlink(old)
        self.stats["write_s"].append(time.perf_counter() - start)

    # -- loading ------------------------------------------------------------------------------
    def _checkpoints(self) -> list[str]:
        """Complete checkpoints, newest first (temp files of a killed write are not among them)."""
        return sorted(glob.glob(os.path.join(self.folder, "checkpoint-*.pt")), reverse=True)

    def latest(self, device):
        """The newest checkpoint that loads, or None.  One that does not is renamed to .bad
        (so it holds no place among the ``keep``); a checkpoint.pt of the example before
        numbered checkpoints is read when there is nothing newer."""
        for path in self._checkpoints() + [os.path.join(self.folder, "checkpoint.pt")]:
            if not os.path.exists(path):
                continue
            try:
                return torch.load(path, map_location=device, weights_only=True)
            except Exception as exc:  # noqa: BLE001 - say so and try the one before
                print(f"skipping {path}: {exc}", flush=True)
                if self.rank == 0:
                    os.replace(path, path + ".bad")
        return None

    def summary(self) -> str:
        stalls, writes = self.stats["stall_s"], self.stats["write_s"]
        if not stalls:
            return "no checkpoints"
        mid = sorted(stalls)[len(stalls) // 2]
        text = f"{len(stalls)} checkpoints, median stall {1000 * mid:.0f} ms"
        if writes:
            text += f", median write {sorted(writes)[len(writes) // 2]:.2f} s"
        return text + (" (async)" if self.async_save else "")


def _step_of(path: str) -> int:
    return int(os.path.basename(path).split("-")[1].split(".")[0])


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
