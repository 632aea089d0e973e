"""Fault benchmark: damage datasets, servers, caches and runs in scripted ways, count outcomes.

First the fault campaign: families of scripted tries (shards changed in place between epochs,
damaged cached copies and odd cache folders, a misbehaving HTTP server on 127.0.0.1, crafted
datasets, image bombs, kill -9 mid-command, other cases), each try in a process of its own under
a time limit (tools/faults_run.py; the families are in tools/faults_local.py,
tools/faults_remote.py and tools/faults_crafted.py), what it read compared sample by sample with
the packed truth: ok, a clear error, silent, another exception (a traceback), a hang or a crash
(a signal).  Then the older corruption campaign: bit flips, truncations and swaps of a small
packed dataset, read by shardpack's readers and WebDataset's tar reader in this process under a
SIGALRM timer.  Then a sweep of systematic edits to valid manifests, each checked with
``shardpack verify``: refused, accepted, or a traceback.  Writes docs/reliability.md
(``--out``).  Not a test (tests/test_integrity.py and the fault tests are; they share
tests/faults.py's logic).

    python tools/bench_faults.py --flips 1000 --out docs/reliability.md
    python tools/bench_faults.py --only "ROW" --pick N     # one try of the campaign, shown
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import os
import random
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

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


# ---------------------------------------------------------------------------------------------
# The fault campaign: scripted tries, each in a process of its own
# ---------------------------------------------------------------------------------------------

FAMILIES = ("in-place local damage", "cache dir", "remote (HTTP)", "crafted datasets",
            "process faults", "other")


def preload() -> None:
    """Everything a try uses, imported before the first fork (a try then starts in
    milliseconds); nothing that starts a thread: a try forks from a process without any."""
    import aiohttp  # noqa: F401
    import click.testing  # noqa: F401
    import fsspec.implementations.http  # noqa: F401
    import PIL.Image  # noqa: F401
    import torch.utils.data  # noqa: F401

    import shardpack.cli.main  # noqa: F401
    import shardpack.loader.dataset  # noqa: F401
    import shardpack.transforms.decode  # noqa: F401
    import shardpack.interop.export  # noqa: F401
    import shardpack.inspect.preview  # noqa: F401
    import shardpack.interop.unpack  # noqa: F401
    import tests.servers  # noqa: F401
    import tests.test_crafted  # noqa: F401


def build_tries(tmp: Path, args, nginx_url: str, sets: dict, big, kill_set) -> list:
    import faults_crafted as C
    import faults_local as L
    import faults_remote as R

    t = args.try_timeout
    served = {f: (f"{nginx_url}/{clean.name}", clean, truth) for f, (clean, truth) in
              sets.items()}
    tries = L.inplace_tries(sets, args.inplace_flips, args.seed, t)
    tries += R.cache_damage_tries(served, args.cache_flips, args.seed + 1, t)
    tries += R.file_as_cache_tries(served["tar"][0], sets["tar"][1], t)
    if R.read_only_possible(tmp / "probe"):
        tries += R.read_only_tries(served, t)
    else:
        print("read-only cache tries skipped: cannot bind-mount read-only here", file=sys.stderr)
    tries += R.shared_corrupt_tries(served, args.shared, args.seed + 2, t)
    tries += R.remote_tries(sets["tar"], big, t)
    for shard_format, (clean, truth) in sets.items():
        tries += C.not_file_tries(clean, truth, t, shard_format)
    tries += C.key_tries(t) + C.field_tries(t) + C.label_tries(t)
    tries += C.state_tries(sets["tar"][0], t) + C.bomb_tries(t)
    tries += L.process_tries(*kill_set, args.kill_points, t)
    tries += L.colon_tries(*kill_set, t) + L.ls_tries(t) + L.collate_tries(t)
    order = {f: i for i, f in enumerate(FAMILIES)}
    return sorted(tries, key=lambda x: order[x.family])  # (stable: rows keep their order)


def select(tries: list, only: str, pick: int | None) -> list:
    """The tries of the row named ``only`` (its full "family: row" text, or a part of it),
    or the ``pick``-th of them (from 0)."""
    def name(x):
        return f"{x.family}: {x.row}"
    chosen = [x for x in tries if name(x) == only] or [x for x in tries if only in name(x)]
    return chosen if pick is None else chosen[pick:pick + 1]


def run_campaign(args, only: str | None = None, pick: int | None = None):
    """Build the datasets, serve them, run every try (or the ones chosen); (tries, seconds)."""
    import faults_local as L
    import faults_remote as R
    from faults_run import BAD, run_try

    from tests.servers import NginxServer, find_nginx

    preload()
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        serve = tmp / "serve"
        sets = {f: L.shard_dataset(serve, f) for f in ("tar", "msgpack")}
        big = R.big_dataset(tmp)
        kill_set = L.process_dataset(tmp)
        if find_nginx() is None:
            raise SystemExit("nginx is needed for the cache family (tools/setup.sh installs it)")
        with NginxServer(serve, tmp / "nginx") as nginx:
            tries = build_tries(tmp, args, nginx.url, sets, big, kill_set)
            if only is not None:
                tries = select(tries, only, pick)
            last = None
            for n, x in enumerate(tries):
                run_try(x, tmp / "scratch")
                if only is not None:
                    print(f"[{n + (pick or 0)}] {x.family}: {x.row} {x.params}\n    -> {x.kind}: "
                          f"{x.detail} ({x.seconds:.2f} s)")
                elif x.kind in BAD:
                    print(f"  {x.kind}: {x.row} {x.params}: {x.detail}", file=sys.stderr)
                if (x.family, x.row) != last and only is None:
                    last = (x.family, x.row)
                    print(f"{time.time() - started:6.0f} s  {x.family}: {x.row}", file=sys.stderr)
    return tries, time.time() - started


# Why a row has silent, traceback, hang or crash outcomes, where the cause is known and is a
# documented property rather than a fault (matched against "family: row"; shown only for rows
# that have such outcomes).
NOTES = {
    'check="once"': 'check="once" keeps a memo of the samples it hashed, so it does not hash '
                    "them again: by design it misses a change that the shard's stat does not "
                    "show when it is looked at (docs/reading.md, \"Integrity\"). The stat is taken "
                    "at each epoch's start and when a shard is mapped, so a change during an "
                    "epoch is missed until the next epoch; a cached copy changed in place with "
                    "its mtime kept still carries the cache's stamp and is trusted.",
    "trust_storage=True": "trust_storage=True (check=\"none\") hashes nothing by design: a flipped "
                          "byte that leaves the record structure intact comes back as it is (the "
                          "msgpack per-sample path still checks its CRC32C). The shard identity "
                          "probe (three samples hashed when a shard is mapped) catches a local "
                          "shard copied over between epochs, not a change during an epoch; a "
                          "cached copy is not probed (the cache hashed it whole).",
}


def campaign_lines(tries: list, seconds: float, args) -> list[str]:
    from faults_run import BAD, KINDS as RUN_KINDS
    from faults_run import summary

    rows = summary(tries)
    lines = ["## The fault campaign: in place, cache, HTTP, crafted datasets, kills", "",
             f"First part of the same command ({seconds:.0f} s, {len(tries):,} tries). Each try "
             "is a script run in a process of its own, forked from the benchmark (shardpack, "
             "torch and the HTTP client already imported), in an empty folder, under a "
             f"wall-clock limit of {args.try_timeout:g} s (tools/faults_run.py); what it read is "
             "compared sample by sample with the packed truth. Its outcome: **ok** (every "
             "sample right, or the command did what a clean run does), **clear error** (a "
             "one-line `ShardpackError`, or for a command exit 2 with one `shardpack: error:` "
             "line, or verify's exit 1 with `BAD` lines; every sample returned before it right), "
             "**silent** (a wrong or missing sample, a refused input accepted, a file left "
             "behind or written elsewhere, with or without a later error), **traceback** "
             "(another exception), **hang** (no outcome within the limit: the try's process "
             "group is killed) or **crash** (the process died of a signal, SIGBUS or an "
             "out-of-memory kill, before reporting). Where the right answer is more than \"no "
             "wrong sample\", the row says it in brackets.", "",
             "| family | tries | ok | clear error | silent | other exception (traceback) | hang "
             "| crash (signal) |",
             "|---|---|---|---|---|---|---|---|"]
    families: dict[str, Counter] = {}
    for family, _, c in rows:
        families.setdefault(family, Counter()).update(c)
    for family, c in list(families.items()) + [("**all**", sum(families.values(), Counter()))]:
        lines.append(f"| {family} | {sum(c.values()):,} | {c['ok']:,} | {c['clear error']:,} | "
                     f"**{c['silent']:,}** | **{c['other exception']:,}** | **{c['hang']:,}** | "
                     f"**{c['crash']:,}** |")
    outside = Counter(x.kind for x in tries
                      if not any(key in f"{x.family}: {x.row}" for key in NOTES))
    lines += ["", "Outside the rows of `check=\"once\"` and `trust_storage=True` (which by "
              "design do not hash every read: below): silent "
              f"{outside['silent']:,}, traceback {outside['other exception']:,}, hang "
              f"{outside['hang']:,}, crash {outside['crash']:,}."]
    lines += ["", "By case:", "",
              "| family | case | tries | ok | clear error | silent | other exception (traceback) "
              "| hang | crash (signal) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for family, row, c in rows:
        lines.append(f"| {family} | {row} | {sum(c.values()):,} | " + " | ".join(
            f"**{c[k]:,}**" if k in BAD else f"{c[k]:,}" for k in RUN_KINDS) + " |")
    lines += ["", *family_notes(args), ""]
    by_row: dict[str, list] = {}
    for x in tries:
        by_row.setdefault(f"{x.family}: {x.row}", []).append(x)
    designed = {name: [note for key, note in NOTES.items() if key in name] for name in by_row}
    bad_rows = {name: [(n, x) for n, x in enumerate(row) if x.kind in BAD]
                for name, row in by_row.items()}
    bad_rows = {name: shown for name, shown in bad_rows.items() if shown}
    by_design = {name: shown for name, shown in bad_rows.items() if designed[name]
                 and all(x.kind == "silent" for _, x in shown)}
    rest = {name: shown for name, shown in bad_rows.items() if name not in by_design}
    how = ("Each try runs alone with `python tools/bench_faults.py --only \"FAMILY: CASE\" "
           "--pick N` (N: its place in the row, from 0, shown in brackets; same options as "
           "above), which prints what it returned.")
    if by_design:
        lines += ["**Silent by design: `check=\"once\"` and `trust_storage=True`.** " +
                  " ".join(NOTES.values()) + " So those rows count wrong samples that the "
                  "default, `check=\"every\"`, turns into one-line errors (its rows above). "
                  "One try each, for the record:", ""]
        for name, shown in by_design.items():
            n, x = shown[0]
            params = ", ".join(f"{k}={v!r}" for k, v in x.params.items())
            lines.append(f"- {name}: {len(shown)} silent; e.g. [{n}] {params}: {x.detail}")
        lines.append("")
    if not rest:
        lines += ["**Other silent, traceback, hang or crash outcomes:** none.", ""]
        return lines
    lines += [f"**{'Other s' if by_design else 'S'}ilent, traceback, hang or crash outcomes, "
              "try by try** (what varies inside the row, and what the try reported). " + how, ""]
    for name, shown in rest.items():
        lines.append(f"- {name}:")
        for n, x in shown[:args.show]:
            params = ", ".join(f"{k}={v!r}" for k, v in x.params.items())
            lines.append(f"  - [{n}] {x.kind}: {params}: {x.detail}")
        if len(shown) > args.show:
            lines.append(f"  - ... and {len(shown) - args.show} more of the same row")
    lines.append("")
    return lines


def family_notes(args) -> list[str]:
    """What each family does, with its try counts' knobs."""
    return [
        "What each family does:", "",
        "- **in-place local damage**: a dataset of 24 samples of ~3 KB in two shards of 12 (the "
        "same size, each spanning several pages), tar and msgpack. One `ShardDataset` (per "
        "sample, and batched with batch_size 4, `prefetch=0`) reads an epoch; then shard 0 is "
        "damaged and the same object reads a second epoch (\"between epochs\"), or it is "
        "damaged after the first item of the second epoch (\"during an epoch\"). Damage: `cp "
        "shard-00001 shard-00000` (same size, same inode; also with the mtime put back, as `cp "
        f"-p`), {args.inplace_flips} single bytes flipped at random offsets with the mtime put "
        "back (`--inplace-flips`), truncation to 0 bytes, one page, the page boundary nearest "
        "half, 100 bytes short (inside the last page) and one byte short. Each under `check="
        "\"every\"` (the default, passed as nothing), `check=\"once\"` and `trust_storage=True`.",
        "- **cache dir**: the same two datasets served by nginx on 127.0.0.1 and read with "
        "`cache_dir`; the same damage, to the cached copy of shard 0 (offsets of "
        f"`--cache-flips` = {args.cache_flips} flips). A regular file as `cache_dir` (and a "
        "folder under it) through both readers and `shardpack cache info|prune|clear`. A cache "
        "filled ahead, then bind-mounted read-only (`mount --bind -o ro`; as root chmod stops "
        "nothing) and read through: warm, cold, with shard 1 missing, with shard 1 corrupt. One "
        "cached shard flipped (its mtime moves), then 2 to 4 processes read the dataset through "
        f"that cache at once ({args.shared} tries per format, `--shared`).",
        "- **remote (HTTP)**: tests/servers.py's FaultServer, started inside each try, serving "
        "the tar dataset (and, for the 206 rows, one of two ~9.6 MB shards, so that ranged reads "
        "of about 8 MiB start inside a shard). Each fault applies to one target: the manifest, "
        "the indexes (read whole, or downloaded into a cache), the shards (read in ranges "
        "without a cache, or downloaded whole into one); with and without `trust_storage`, per "
        "sample and batched. Retries keep the default 5 attempts and 30 s read timeout with "
        "10-50 ms between attempts instead of 0.2 s doubling (only the waits differ). The "
        "manifest's size is recorded nowhere, so a short manifest body whose Content-Length "
        "agrees cannot be told from a short manifest: it does not parse, one line (the clear "
        "errors of \"short twice, then whole\"). An endless body to a ranged read of a shard is "
        "read up to the end of the range, which holds the right bytes: served.",
        "- **crafted datasets**: a FIFO, a folder or a link to /dev/zero in place of the "
        "manifest, an index or a shard, used by every reader and by cat, verify, ls, info, "
        "unpack and export (info reads only the manifest and ls only the indexes: served is "
        "right for them when a shard or index is replaced). Datasets written directly with "
        "every hash consistent (tests/test_crafted.py's `craft`): keys that unpack and export "
        "must refuse, and keys every command must take, through verify, unpack and export "
        "(`--to webdataset`, `--to files`; a file written outside OUT is silent); field names "
        "no pack writes. Labels outside int64 (and at its bounds) through the batched path (with "
        "`on_error=\"skip\"` too), per-sample + `collate`, and a DataLoader with `collate`. "
        "Resume states that cannot belong to the dataset (refused in one line within a second, "
        "or it is a traceback). tests/hostile/images/ (headers claiming 8,000 to 13,000 pixels "
        "a side) through `pack --check full`, `verify --decode`, `CpuDecode` and `preview`, in a "
        "process whose address space may grow by 1 GiB only.",
        "- **process faults**: unpack, export --to files (onto a new OUT, and with --overwrite "
        "onto an old one) and pack (1 and 2 workers) of a 40-sample dataset are killed with "
        "SIGKILL (their whole process group) at one file-system event of their run: an audit "
        "hook counts the opens, renames, removals, mkdirs, links and utimes of the command's "
        "process, and kills at the N-th, for every N of a clean run (at most `--kill-points` = "
        f"{args.kill_points}, spread). Then the same command runs again (pack with `--resume`): "
        "right is OUT as a clean run makes it, byte for byte, and no hidden work folder "
        "`.OUT.tmp-*` left beside it (a leftover is silent). With 2 workers only the main "
        "process's events are counted, so where the workers are at a kill varies from run to run.",
        "- **other**: a local path holding `::` (as a plain path and as `file://`), packed into "
        "and read by every reader and command; `ls` and `ls --long` of keys holding control "
        "characters (each key on one line); `collate` errors naming the sample.",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flips", type=int, default=1000, help="bit flips per format and target")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds one reader's read of a damaged dataset may take: past it, a hang")
    p.add_argument("--out", default="", help="markdown file to write (docs/reliability.md)")
    p.add_argument("--try-timeout", type=float, default=30.0,
                   help="seconds one try of the fault campaign may take: past it, a hang")
    p.add_argument("--inplace-flips", type=int, default=10,
                   help="bytes flipped in place per format (in-place family)")
    p.add_argument("--cache-flips", type=int, default=6,
                   help="bytes flipped per format in a cached copy (cache family)")
    p.add_argument("--shared", type=int, default=8,
                   help="tries per format of one corrupt cached file read by several processes")
    p.add_argument("--kill-points", type=int, default=200,
                   help="most kill points per command (process faults)")
    p.add_argument("--show", type=int, default=6,
                   help="bad tries listed per row in the page")
    p.add_argument("--only", default=None,
                   help="run only this row of the fault campaign (\"FAMILY: CASE\", or part of "
                        "it), print each try, write nothing")
    p.add_argument("--pick", type=int, default=None, help="with --only: only its N-th try")
    args = p.parse_args()
    if args.only is not None:
        tries, _ = run_campaign(args, args.only, args.pick)
        if not tries:
            raise SystemExit(f"no try matches {args.only!r}")
        return
    if args.out:
        Path(args.out).resolve().parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    tries, campaign_s = run_campaign(args)
    legacy_started = time.time()
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
    command = shlex.join(["python", "tools/bench_faults.py", *sys.argv[1:]])
    lines = ["# Reliability: what readers return from damaged datasets", "",
             f"Made by `{command}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, in "
             f"{time.time() - started:.0f} s on {os.cpu_count()} CPUs: the fault campaign "
             f"{campaign_s:.0f} s, the corruption campaign and the manifest sweep "
             f"{time.time() - legacy_started:.0f} s. Three parts: the fault campaign (scripted "
             "tries, each in a process of its own), a corruption campaign (bit flips, "
             "truncations and swaps, read in this process) and a sweep of manifest edits "
             "through `shardpack verify`.", ""]
    lines += campaign_lines(tries, campaign_s, args)
    lines += ["## Bit flips, truncations and swaps", "",
             "Second part of the same command. Dataset: 40 samples (fake JPEGs of "
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
              "Third part of the same command. Each value of three valid manifests (the two "
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
