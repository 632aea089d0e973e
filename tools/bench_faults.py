"""Fault campaign (issue 16): corrupt a small packed dataset in many ways and count, per reader,
what came back: all right, a clear error, silent wrong or missing samples, another exception, or
nothing within ``--timeout`` (a hang).  shardpack's readers and WebDataset's tar reader run over
the very same corrupted tar files.  Then a sweep of systematic edits to valid manifests, each
checked with ``shardpack verify``: refused, accepted, or a traceback.  Writes
docs/reliability.md's tables (``--out``).  Not a test (tests/test_integrity.py is; both use the
logic in tests/faults.py).

    python tools/bench_faults.py --flips 1000 --out docs/reliability.md
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import shardpack  # noqa: E402
from tests.faults import KINDS, manifest_edits, outcome, read_shardpack, sweep  # noqa: E402


def make_dataset(root: Path, shard_format: str) -> tuple[Path, dict]:
    from tests.conftest import fake_jpeg, make_tree

    src = make_tree(root / "src", {f"c{i % 2}/{i:03d}.jpg": fake_jpeg(300 + 37 * i, seed=i)
                                   for i in range(40)})
    out = root / f"clean-{shard_format}"
    shardpack.pack(src, out, format=shard_format, workers=1, max_samples=10)
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
                counts[name][outcome(read, truth, timeout).kind] += 1
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
    from tests.conftest import make_tree

    files = {}
    for i in range(40):
        files[f"{i:03d}.bin"] = bytes([i]) * (5 + i)
        files[f"{i:03d}.cls"] = str(i % 3).encode()
    out = root / "clean-files"
    shardpack.pack(make_tree(root / "src-files", files), out, format="msgpack",
                   compression="zstd", workers=1, max_samples=10)
    return out


def manifest_sweep(datasets: dict, work: Path):
    """Every edit of manifest_edits() on each dataset (name -> clean folder), verified."""
    done = []
    for name, clean in datasets.items():
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(clean, work)
        for swept in sweep(work, manifest_edits((work / "shardpack.json").read_bytes())):
            done.append((name, swept))
    return done


KIND_ORDER = ("text", "number", "string", "null", "list", "key", "unknown", "object", "type",
              "shard")


def sweep_lines(done: list, names: list[str]) -> list[str]:
    """The sweep's table (per edit kind) and the list of every edit verify did not refuse."""
    kinds: dict[str, Counter] = {}
    for _, s in done:
        kinds.setdefault(s.edit.kind, Counter())[s.result] += 1
    order = sorted(kinds, key=lambda k: next(
        (i for i, p in enumerate(KIND_ORDER) if k.startswith(p)), len(KIND_ORDER)))
    lines = ["| edit | tries | refused | accepted | no effect | traceback |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {k} | {sum(c.values()):,} | {c['refused']:,} | **{c['accepted']:,}** | "
              f"{c['no effect']:,} | **{c['traceback']:,}** |"
              for k, c in ((k, kinds[k]) for k in order)]
    total = Counter(s.result for _, s in done)
    lines.append(f"| **all** | **{len(done):,}** | **{total['refused']:,}** | "
                 f"**{total['accepted']:,}** | **{total['no effect']:,}** | "
                 f"**{total['traceback']:,}** |")
    for result, title in (("accepted", "Accepted by verify (it said OK), by field"),
                          ("traceback", "Tracebacks"),
                          ("no effect", "No effect (accepted, nothing to refuse), by reason")):
        groups: dict[str, dict[str, dict]] = {}  # field or reason -> edit -> datasets
        for name, s in done:
            if s.result != result:
                continue
            if result == "no effect":
                what, edit = s.edit.no_effect, f"`{s.edit.where}` {s.edit.kind}"
            else:
                what = f"`{s.edit.where}`"
                edit = s.edit.kind + (f" ({s.edit.change})" if s.edit.change else "")
                edit += f": {s.said}" if result == "traceback" else ""
            groups.setdefault(what, {}).setdefault(edit, {})[name] = None  # ordered set
        if not groups:
            lines += ["", f"**{title}:** none."]
            continue
        lines += ["", f"**{title}** (on every dataset unless one is named):", ""]
        for what, edits in groups.items():
            lines.append(f"- {what}: " + "; ".join(
                edit + ("" if len(on) == len(names) else f" [{', '.join(on)} only]")
                for edit, on in edits.items()))
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flips", type=int, default=1000, help="bit flips per format and target")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds one reader's read of a damaged dataset may take: past it, a hang")
    p.add_argument("--out", default="", help="markdown file to write (docs/reliability.md)")
    args = p.parse_args()
    started = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sweep_sets = {}
        for shard_format in ("tar", "msgpack"):
            clean, truth = make_dataset(tmp / shard_format, shard_format)
            sweep_sets[f"imagefolder/{shard_format}"] = clean
            readers = {"shardpack, per sample": (read_shardpack, "samples"),
                       "shardpack, batched": (functools.partial(read_shardpack, batch_size=8),
                                              "batched")}
            if shard_format == "tar":
                readers["webdataset.WebDataset"] = (read_webdataset, None)
            cases = [
                (f"bit flip in shard data ({shard_format})",
                 functools.partial(flips, clean, args.flips, args.seed, True), args.flips),
                (f"bit flip anywhere: shards, indexes, manifest ({shard_format})",
                 functools.partial(flips, clean, args.flips, args.seed + 1, False), args.flips),
                (f"truncation at every 512-byte boundary ({shard_format})",
                 functools.partial(truncations, clean), None),
                (f"two neighbouring shards swapped ({shard_format})",
                 functools.partial(swaps, clean), None),
            ]
            for case, make, _ in cases:
                counts = campaign(tmp / "work", clean, truth, list(make()), readers,
                                  args.timeout)
                for name, c in counts.items():
                    rows.append((case, name, sum(c.values()), *(c[k] for k in KINDS)))
                    print(case, name, dict(c), file=sys.stderr)
        sweep_sets["files/msgpack+zstd"] = make_files_dataset(tmp / "files")
        swept = manifest_sweep(sweep_sets, tmp / "edit")
        print("manifest sweep", dict(Counter(s.result for _, s in swept)), file=sys.stderr)
    lines = ["# Reliability: what readers return from damaged datasets", "",
             f"Made by `python tools/bench_faults.py --flips {args.flips} --seed {args.seed} "
             f"--out docs/reliability.md` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
             f" ({time.time() - started:.0f} s, both tables). Dataset: 40 samples (fake JPEGs of "
             "300-1,750 bytes), 4 shards of 10, tar and msgpack. After each damage every reader "
             "reads the whole dataset from a fresh process state; its outcome is **ok** (every "
             "sample right), **clear error** (a one-line `ShardpackError`, every sample returned "
             "before it right), **silent** (a wrong or missing sample, with or without a later "
             "error), **other exception** (anything else) or **hang** (no end within "
             f"`--timeout` = {args.timeout:g} s). How a hang is caught: each read runs in the "
             "tool's main thread under a `SIGALRM` timer (`setitimer`), whose handler raises an "
             "exception no reader catches (a `BaseException`); it breaks a wait in Python code, "
             "a sleep, a lock or a blocking read. A loop inside C code that never returns to "
             "the interpreter would not be broken: for that, `faulthandler` ends the whole run "
             f"with a traceback after {2 * args.timeout + 10:g} s, so a run that finished had "
             "none. WebDataset reads the same tar files; damage to our index or manifest does "
             "not concern it, so for those rows its outcome is about the shard files alone.", "",
             "| damage | reader | tries | ok | clear error | silent | other exception | hang |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {c} | {r} | {t:,} | {a:,} | {b:,} | **{s:,}** | {o:,} | **{h:,}** |"
              for c, r, t, a, b, s, o, h in rows]
    lines += ["", "How to read it: shardpack's silent column must be 0 for every damage "
              "(tests/test_integrity.py enforces it on every reader at a smaller size). A flip "
              "that lands in the tar end-of-archive blocks or in padding no sample covers "
              "changes nothing a reader returns: those count as ok. WebDataset has no index and "
              "no checksums: a flip in a member's data comes back as wrong bytes, a truncation "
              "as missing samples without an error.", "",
              "## Manifest edits through `shardpack verify`", "",
              "Same command, second part. Each value of three valid manifests (the two "
              "ImageFolder datasets above, with classes `c0` and `c1`, and a `files`-layout "
              "msgpack + zstd dataset of 40 samples with `.cls` sidecars and no classes) is "
              "edited by its type: numbers +1, -1, 0, negative, 2**64, as a string, as a float, "
              "NaN, as bool, null or list; strings with one character changed, appended to, "
              "emptied, upper-cased, padded, set to another valid value, to a path, to a number, "
              "null or list; lists with each element dropped or duplicated, neighbours swapped "
              "(shard entries too), reversed, an element added, emptied, or as object or string; "
              "objects with each key removed, an unknown key added, emptied, or as null, list or "
              "string; a shard entry's value set to its neighbour's; and the file's text "
              "re-written (compact, other key order, BOM, trailing space, a key written twice, "
              "truncated, not UTF-8). After each edit `shardpack verify` runs in process "
              "(click's `CliRunner`) on the dataset: **refused** is exit 1 with a `BAD` line "
              "or exit 2 with one `shardpack: error` line, **accepted** is exit 0 (`OK`), "
              "**traceback** anything else. **No effect** counts an accepted edit that, by a "
              "rule fixed before the run (`_no_effect` in tests/faults.py), leaves nothing "
              "verify could or should refuse: the same JSON content written differently, an "
              "unknown key (keys are added without a version bump), an optional key removed, "
              "or another valid value of a note nothing in the dataset records (`hidden`, "
              "`ignored`, `group`, `preprocessing`, `skipped` counts). Every other accepted edit "
              "is a gap in verify: it is listed below the table. tests/test_integrity.py runs "
              "the same sweep on its two datasets (about 600 edits each, under a second): a "
              "traceback, or an accepted edit outside the gaps listed here, fails it.", ""]
    lines += sweep_lines(swept, list(sweep_sets))
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
