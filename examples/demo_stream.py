"""Stream a packed dataset through a PyTorch DataLoader and print samples/s (the demo's last step).

Usage: python examples/demo_stream.py DATASET [--epochs 3] [--workers 2] [--batch-size 256]
"""

import argparse
import time

from torch.utils.data import DataLoader

import shardpack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    ds = shardpack.ShardDataset(args.dataset, batch_size=args.batch_size, batched=True)
    loader = DataLoader(ds, batch_size=None, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    for epoch in range(args.epochs):
        ds.set_epoch(epoch)
        start = time.perf_counter()
        count = nbytes = 0
        first = None
        labels = set()
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            count += len(batch["__key__"])
            nbytes += sum(int(v.offsets[-1]) for v in batch.values()
                          if isinstance(v, shardpack.BytesBatch))
            if "cls" in batch:
                labels.update(batch["cls"].tolist())
        seconds = time.perf_counter() - start
        print(f"epoch {epoch}: streamed {count:,} samples ({nbytes / 1e6:,.1f} MB, "
              f"{len(labels)} classes) in {seconds:.2f} s: {count / seconds:,.0f} samples/s, "
              f"{nbytes / seconds / 1e6:,.0f} MB/s, first batch after {first:.2f} s "
              f"({args.workers} workers, batch {args.batch_size}, bytes only)")


if __name__ == "__main__":
    main()
