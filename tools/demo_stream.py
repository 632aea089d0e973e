"""Stream a packed dataset back and print samples/s and MB/s (the demo's last step).

Usage: python tools/demo_stream.py DATASET [--epochs N]
"""

import argparse
import time

from shardpack import open_reader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    reader = open_reader(args.dataset)
    labels = {}
    for epoch in range(args.epochs):
        start = time.perf_counter()
        count = nbytes = 0
        for sample in reader:
            count += 1
            nbytes += sum(len(v) for k, v in sample.items() if k != "__key__")
            if "cls" in sample and epoch == 0:
                labels[int(sample["cls"])] = labels.get(int(sample["cls"]), 0) + 1
        seconds = time.perf_counter() - start
        print(f"epoch {epoch}: streamed {count:,} samples ({nbytes / 1e6:,.1f} MB) in "
              f"{seconds:.2f} s: {count / seconds:,.0f} samples/s, {nbytes / seconds / 1e6:,.0f} "
              f"MB/s (one process, page cache {'cold-ish' if epoch == 0 else 'warm'})")
    if labels:
        print("samples per class:", dict(sorted(labels.items())))


if __name__ == "__main__":
    main()
