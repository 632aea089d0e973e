"""The faults suite's second and third parts: the corruption campaign (bit flips, truncations
and swaps of a small packed dataset, read by shardpack's readers and WebDataset's tar reader in
this process under a SIGALRM timer) and the sweep of systematic manifest edits through
``shardpack verify`` (testbed/faults.py holds both: tests/robustness/test_integrity.py runs them
too)."""

from __future__ import annotations

import faulthandler
import functools
import os
import random
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import shardpack

from benchmarks import testbed
from benchmarks.testbed import fake_jpeg, make_tree


def make_dataset(root: Path, shard_format: str) -> tuple[Path, dict]:

    src = make_tree(root / "src", {f"c{i % 2}/{i:03d}.jpg": fake_jpeg(300 + 37 * i, seed=i)
                                   for i in range(40)})
    out = root / f"clean-{shard_format}"
    shardpack.pack(src, out, shard_format=shard_format, workers=1, max_samples=10)
    truth = {s["__key__"]: bytes(s["jpg"]) for s in shardpack.open_reader(out)}
    return out, truth


def read_webdataset(out: Path, how: str):
    import webdataset as wds

    from shardpack import format as fmt

    tars = sorted(str(p) for p in out.glob("*.tar"))
    for s in wds.WebDataset(tars, shardshuffle=False, empty_check=False):
        key = s["__key__"]
        # our member names escape dots in keys; these keys have none, so they compare as-is
        yield key, s.get("jpg")
    del fmt


def campaign(work: Path, clean: Path, truth: dict, mutations, readers, timeout: float) -> dict:
    counts = {name: Counter() for name in readers}
    for mutate in mutations:
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(clean, work)
        mutate(work)
        for name, (reader, how) in readers.items():
            # backstop for a hang SIGALRM cannot break (C code that never returns): end the run
            faulthandler.dump_traceback_later(2 * timeout + 10, exit=True)
            try:
                read = functools.partial(reader, work, how)
                counts[name][testbed.faults().outcome(read, truth, timeout).kind] += 1
            finally:
                faulthandler.cancel_dump_traceback_later()
    return counts


def flips(clean: Path, n: int, seed: int, only_shards: bool):
    rng = random.Random(seed)
    files = sorted(p.name for p in clean.iterdir()
                   if not only_shards or p.suffix in (".tar", ".spk"))
    sizes = [(clean / f).stat().st_size for f in files]
    for _ in range(n):
        name = rng.choices(files, weights=sizes)[0]
        pos, bit = rng.randrange(sizes[files.index(name)]), rng.randrange(8)

        def mutate(work, name=name, pos=pos, bit=bit):
            with open(work / name, "r+b") as f:
                f.seek(pos)
                byte = f.read(1)[0]
                f.seek(pos)
                f.write(bytes([byte ^ (1 << bit)]))
        yield mutate


def truncations(clean: Path):
    for shard in sorted(p.name for p in clean.iterdir() if p.suffix in (".tar", ".spk")):
        for cut in range(0, (clean / shard).stat().st_size, 512):
            yield lambda work, shard=shard, cut=cut: os.truncate(work / shard, cut)


def swaps(clean: Path):
    shards = sorted(p.name for p in clean.iterdir() if p.suffix in (".tar", ".spk"))
    for a, b in zip(shards, shards[1:], strict=False):
        def mutate(work, a=a, b=b):
            (work / a).rename(work / "swap")
            (work / b).rename(work / a)
            (work / "swap").rename(work / b)
        yield mutate


def make_files_dataset(root: Path) -> Path:
    """A `files`-layout dataset (classes null) with .cls sidecars, msgpack + zstd: the sweep's
    third manifest, beside the two ImageFolder ones of the campaign."""
    files = {}
    for i in range(40):
        files[f"{i:03d}.bin"] = bytes([i]) * (5 + i)
        files[f"{i:03d}.cls"] = str(i % 3).encode()
    out = root / "clean-files"
    shardpack.pack(make_tree(root / "src-files", files), out, shard_format="msgpack",
                   compression="zstd", workers=1, max_samples=10)
    return out


def manifest_sweep(datasets: dict, work: Path):
    """Every edit of manifest_edits() on each dataset (name -> clean folder), verified."""
    done, f = [], testbed.faults()
    for name, clean in datasets.items():
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(clean, work)
        for swept in f.sweep(work, f.manifest_edits((work / "shardpack.json").read_bytes())):
            done.append((name, swept))
    return done



def corruption(args) -> tuple:
    """Both formats through every damage and reader, then the manifest sweep: (rows, swept,
    the sweep's dataset names)."""
    f = testbed.faults()
    rows, sweep_sets = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for shard_format in ("tar", "msgpack"):
            clean, truth = make_dataset(tmp / shard_format, shard_format)
            sweep_sets[f"imagefolder/{shard_format}"] = clean
            readers = {"shardpack, per sample": (f.read_shardpack, "samples"),
                       "shardpack, batched": (functools.partial(f.read_shardpack, batch_size=8),
                                              "batched")}
            if shard_format == "tar":
                readers["webdataset.WebDataset"] = (read_webdataset, None)
            cases = [
                (f"bit flip in shard data ({shard_format})",
                 functools.partial(flips, clean, args.flips, args.seed, True)),
                (f"bit flip anywhere: shards, indexes, manifest ({shard_format})",
                 functools.partial(flips, clean, args.flips, args.seed + 1, False)),
                (f"truncation at every 512-byte boundary ({shard_format})",
                 functools.partial(truncations, clean)),
                (f"two neighbouring shards swapped ({shard_format})",
                 functools.partial(swaps, clean)),
            ]
            for case, make in cases:
                counts = campaign(tmp / "work", clean, truth, list(make()), readers,
                                  args.timeout)
                for name, k in counts.items():
                    rows.append((case, name, sum(k.values()), *(k[kind] for kind in f.KINDS)))
                    print(case, name, dict(k), file=sys.stderr)
        sweep_sets["files/msgpack+zstd"] = make_files_dataset(tmp / "files")
        swept = manifest_sweep(sweep_sets, tmp / "edit")
        print("manifest sweep", dict(Counter(s.result for _, s in swept)), file=sys.stderr)
    return rows, swept, list(sweep_sets)
