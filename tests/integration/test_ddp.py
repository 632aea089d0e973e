"""Real DDP: 2 processes with the gloo backend on CPU, each reading its part of one dataset."""

import json
import os
import socket

import pytest
import torch.multiprocessing as mp

import shardpack

from testbed.helpers import make_tree


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_rank(rank, world, port, path, out_dir, epochs):
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        ds = shardpack.ShardDataset(path, batch_size=4)  # rank and world from torch.distributed
        loader = DataLoader(ds, batch_size=4, num_workers=1, persistent_workers=True,
                            collate_fn=shardpack.collate)
        result = {"len": len(ds), "epochs": []}
        for epoch in range(epochs):
            ds.set_epoch(epoch)
            seen, steps = [], 0
            for batch in loader:
                seen += list(zip(batch["__index__"].tolist(), batch["__repeat__"].tolist(),
                                 strict=True))
                step = torch.ones(1)
                dist.all_reduce(step)  # a collective per step, as DDP does: a rank running
                steps += 1             # dry early would hang here
            result["epochs"].append({"seen": seen, "steps": steps})
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(240)
def test_two_gloo_ranks_read_disjoint_equal_parts(tmp_path):
    n = 101
    src = make_tree(tmp_path / "src", {f"{i:03d}.bin": bytes([i]) * 10 for i in range(n)})
    path = tmp_path / "ds"
    shardpack.pack(src, path, max_samples=30, workers=1)
    ctx = mp.start_processes(_run_rank, args=(2, _free_port(), str(path), str(tmp_path), 2),
                             nprocs=2, join=False, start_method="spawn")
    import time

    deadline = time.time() + 180
    while not ctx.join(timeout=1):
        if time.time() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("DDP ranks hung")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0]["len"] == results[1]["len"] == 51
    for epoch in range(2):
        parts = [r["epochs"][epoch] for r in results]
        assert parts[0]["steps"] == parts[1]["steps"]
        assert len(parts[0]["seen"]) == len(parts[1]["seen"]) == 51
        fresh = [i for p in parts for i, rep in p["seen"] if not rep]
        assert sorted(fresh) == list(range(n))  # every sample exactly once; 1 flagged repeat
        assert sum(rep for p in parts for _, rep in p["seen"]) == 1
    assert results[0]["epochs"][0]["seen"] != results[0]["epochs"][1]["seen"]
