"""Decode in the loader against its own ceiling: is the loader the bottleneck of a CPU decode?"""

from __future__ import annotations

import time

from benchmarks import common as c
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure

BATCH, WORKERS, SIZE = 256, 2, 224
HERE = "benchmarks.suites.decode"


def options(p) -> None:
    """The decode suite's options."""
    p.add_argument("--images", type=int, default=5000,
                   help="generated 100 KB JPEGs, packed as tar [5000]")
    p.add_argument("--dataset", default=None, help="a packed dataset to use instead")


def ceiling(path) -> dict:
    """Child: ``CpuDecode`` alone in a tight loop, in 2 forked processes, each decoding half of
    the epoch's batches, gathered beforehand (no reading, no transport), outputs in reused
    slots as in the loader's workers."""
    import multiprocessing as mp

    import shardpack
    from shardpack.loader.buffers import SlotPool  # (internal: the workers' reused slots)

    batches = list(shardpack.ShardDataset(path, batch_size=BATCH, batched=True, shuffle=True))
    decode = shardpack.CpuDecode(SIZE)
    # outputs go into reused slots, as in the loader's workers: the ceiling does not pay for
    # fresh output pages either (a fresh 38.5 MB buffer per batch costs ~10% here)
    pool = SlotPool.create()
    ctx = mp.get_context("fork")
    ready, go, out = ctx.Barrier(WORKERS + 1), ctx.Event(), ctx.Queue()

    def work(worker):
        import torch

        torch.set_num_threads(1)  # as DataLoader's workers do: no intra-op pool beside them
        mine = batches[worker::WORKERS]
        ready.wait()
        go.wait()
        t, n = time.perf_counter(), 0
        for batch in mine:
            batch.pool = pool
            n += len(decode(batch)["image"])
        out.put((n, time.perf_counter() - t))

    procs = [ctx.Process(target=work, args=(w,)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    ready.wait()
    go.set()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return dict(rate=sum(n for n, _ in results) / max(s for _, s in results))


def loader(path) -> dict:
    """Child: ShardDataset(decode=CpuDecode) + DataLoader(2 persistent workers), 2 epochs: the
    2nd epoch's rate, the 1st epoch's after its first batch, and the time to the first batch."""
    import shardpack
    from torch.utils.data import DataLoader

    t0 = time.perf_counter()
    ds = shardpack.ShardDataset(path, batch_size=BATCH, batched=True, shuffle=True,
                                decode=shardpack.CpuDecode(SIZE))
    dl = DataLoader(ds, batch_size=None, num_workers=WORKERS, persistent_workers=True)
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        start = t0 if epoch == 0 else time.perf_counter()
        first, n, n_first = None, 0, 0
        for b in dl:
            n += len(b["image"])
            if first is None:
                first, n_first = time.perf_counter(), n
        end = time.perf_counter()
        epochs.append(dict(seconds=end - start, first=first - start, n=n,
                           after_first=(n - n_first) / (end - first)))
    return dict(rate=epochs[1]["n"] / epochs[1]["seconds"], ttfb=epochs[0]["first"],
                after_first=epochs[0]["after_first"],
                first_epoch=epochs[0]["n"] / epochs[0]["seconds"])


@suite("decode", title="Decode: the loader against its own ceiling", options=options,
       quick=dict(images=300),
       measures="""Images per second of `CpuDecode(224)` (training crops) through the loader:
       `ShardDataset(batched=True, decode=CpuDecode(224))` in a DataLoader with 2 persistent
       workers, batch 256, warm page cache, its 2nd epoch, and the 1st epoch's rate after its
       first batch; the time from the dataset's construction to the first decoded batch. The
       limit is the decode function alone in a tight loop in 2 processes over batches gathered
       beforehand, writing into reused output slots as the loader does. Each measurement in a
       fresh process, the two alternated.""",
       bounds="""The decode itself: the loader runs at its ceiling within the noise. On ~500x375
       JPEGs random-resized crops of at most 375 px never reach the 2x-target size that DCT
       scaling needs, so each is decoded at full scale, only its region (the region decoder,
       docs/device.md), then resized: about 1.3 ms an image in one process, most of it Huffman
       decoding, which must run over every row down to the crop's last.""")
def run_decode(run) -> Outcome:
    """The decode suite: ceiling and loader, alternated."""
    if run.args.dataset:
        data = run.args.dataset
    else:
        src, _ = c.ensure_images(run.data_dir, run.args.images)
        data = str(c.ensure_pack(src, run.data_dir / "decode" / f"img{run.args.images}-tar",
                                 "--format", "tar", "--shard-size", "64MB"))
    c.warm(c.files_under(data))
    runs = {"ceiling": [], "loader": []}
    for rep in range(run.reps):
        for kind in (("ceiling", "loader") if rep % 2 == 0 else ("loader", "ceiling")):
            r = c.fresh(f"{HERE}:{kind}", data)
            runs[kind].append(r)
            run.log(f"rep {rep} {kind:8s} {r['rate']:7.0f} images/s")
    ceil = c.med(r["rate"] for r in runs["ceiling"])
    steady = c.med(r["rate"] for r in runs["loader"])
    after = c.med(r["after_first"] for r in runs["loader"])
    ttfb = c.med(r["ttfb"] for r in runs["loader"])
    limit = {"CpuDecode alone, 2 processes": ceil}
    figures = [
        figure("loader, 2nd epoch", steady, "images/s", {}, limit,
               f"{steady / ceil:.2f}x the ceiling (target >= 0.95x: "
               f"{c.verdict(steady >= 0.95 * ceil)}); target >= 1,000/s on 2 cores: "
               f"{c.verdict(steady >= 1000)}; runs "
               f"{c.spread([r['rate'] for r in runs['loader']], '{:,.0f}')}"),
        figure("loader, 1st epoch after its 1st batch", after, "images/s", {}, limit,
               f"{after / ceil:.2f}x the ceiling"),
        figure("time to the first decoded batch", ttfb, "s", {}, {"target": 1.0},
               f"from the dataset's construction; target < 1 s: {c.verdict(ttfb < 1)}"),
    ]
    what = (run.args.dataset if run.args.dataset else f"{run.args.images:,} generated JPEGs of "
            "~100 KB (scripts/make_images.py) packed as tar")
    setup = f"{what}; batch {BATCH}, {WORKERS} workers or processes, {run.reps} repetitions."
    return Outcome(figures, setup, raw=runs)
