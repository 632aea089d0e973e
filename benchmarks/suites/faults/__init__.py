"""Faults: damage datasets, servers, caches and runs in scripted ways, and count what the
readers and commands return.

First the fault campaign: families of scripted tries (shards changed in place between epochs,
damaged cached copies and odd cache folders, a misbehaving HTTP server on 127.0.0.1, crafted
datasets, image bombs, resume states of another packing, converter inputs as GNU tar writes them,
decompression bombs and odd source files, kill -9 mid-command, two exports into one OUT, other
cases), each try in a process of its own under a time limit (run.py; the families in local.py,
remote.py, crafted.py, guards.py and converters.py), what it read compared sample by sample with
the packed truth. Then the corruption campaign and the manifest sweep
(corruption.py). ``--out docs/reliability.md`` writes every row (page.py); the result JSON keeps
the totals.

    python -m benchmarks faults --flips 1000 --seed 16 --out docs/reliability.md
    python -m benchmarks faults --only "ROW" --pick N     # one try of the campaign, shown
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks import testbed
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure

from . import converters as V
from . import crafted as C
from . import guards as G
from . import local as L
from . import remote as R
from .corruption import corruption
from .page import NOTES, page
from .run import BAD, run_try


FAMILIES = ("in-place local damage", "cache dir", G.CACHE, "remote (HTTP)", "crafted datasets",
            G.RESUME, V.TARS, V.SOURCES, "process faults", G.EXPORT, "other")


def preload() -> None:
    """Everything a try uses, imported before the first fork (a try then starts in
    milliseconds); nothing that starts a thread: a try forks from a process without any."""
    import aiohttp  # noqa: F401
    import click.testing  # noqa: F401
    import fsspec.implementations.http  # noqa: F401
    import PIL.Image  # noqa: F401
    import torch.utils.data  # noqa: F401

    import shardpack
    from shardpack.cli import main  # noqa: F401
    # the public names, however lazily the package loads them; preview and unpack by module (the
    # tries use those modules)
    _ = shardpack.ShardDataset, shardpack.CpuDecode, shardpack.export
    import shardpack.inspect.preview  # noqa: F401
    import shardpack.interop.unpack  # noqa: F401

    testbed.preload()


def build_tries(tmp: Path, args, nginx_url: str, sets: dict, big, kill_set) -> list:
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
    tries += G.cache_link_tries(served, t) + G.resume_tries(t) + G.export_tries(t)
    tries += V.tar_format_tries(t) + V.misnamed_tries(t) + V.bomb_tries(t)
    tries += V.source_file_tries(t)
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


def run_campaign(args, only: str | None = None, pick: int | None = None) -> tuple:
    """Build the datasets, serve them, run every try (or the ones chosen); (tries, seconds)."""
    servers = testbed.servers()
    preload()
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        serve = tmp / "serve"
        sets = {f: L.shard_dataset(serve, f) for f in ("tar", "msgpack")}
        big = R.big_dataset(tmp)
        kill_set = L.process_dataset(tmp)
        if servers.find_nginx() is None:
            raise SystemExit("nginx is needed for the cache family (scripts/setup.sh installs it)")
        with servers.NginxServer(serve, tmp / "nginx") as nginx:
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


def options(p) -> None:
    """The faults suite's options."""
    p.add_argument("--flips", type=int, default=1000, help="bit flips per format and target")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds one reader's read of a damaged dataset may take: past it, a hang")
    p.add_argument("--out", default="", help="also write the page of every row here "
                   "(docs/reliability.md)")
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
    p.add_argument("--show", type=int, default=6, help="bad tries listed per row in the page")
    p.add_argument("--only", default=None,
                   help="run only this row of the fault campaign (\"FAMILY: CASE\", or part of "
                        "it), print each try, write nothing")
    p.add_argument("--pick", type=int, default=None, help="with --only: only its N-th try")


def figures(tries: list, rows: list, swept: list) -> list:
    """Per family its tries and outcomes; the bad outcomes outside the rows that by design do
    not hash every read (target 0); the corruption campaign's silent reads, WebDataset's as the
    peer; the manifest edits verify accepted."""
    out, families = [], {}
    for x in tries:
        families.setdefault(x.family, Counter())[x.kind] += 1
    for family, k in families.items():
        out.append(figure(f"fault campaign, {family}", sum(k.values()), "tries", {}, {},
                          ", ".join(f"{kind} {n:,}" for kind, n in k.items())))
    outside = Counter(x.kind for x in tries
                      if not any(key in f"{x.family}: {x.row}" for key in NOTES))
    bad = sum(outside[k] for k in BAD)
    out.append(figure("fault campaign: silent, traceback, hang or crash outside check=\"once\" "
                      "and trust_storage=True", bad, "tries", {}, {"target": 0},
                      f"of {sum(outside.values()):,} tries; " + ", ".join(
                          f"{k} {outside[k]:,}" for k in sorted(BAD))))
    readers = {}
    for _case, reader, total, _ok, clear, silent, other, hang in rows:
        who = "webdataset.WebDataset" if reader.startswith("webdataset") else "shardpack"
        r = readers.setdefault(who, Counter())
        r.update(tries=total, clear=clear, silent=silent + hang, other=other)
    if "shardpack" in readers:
        sp = readers["shardpack"]
        out.append(figure("corruption campaign: wrong, missing or hung reads", sp["silent"],
                          "tries", {k: v["silent"] for k, v in readers.items() if k != "shardpack"},
                          {"target": 0}, f"shardpack's readers, {sp['tries']:,} tries; clear "
                          f"errors {sp['clear']:,}, other exceptions {sp['other']:,}"))
    got = Counter(s.result for _, s in swept)
    out.append(figure("manifest edits verify accepted", got["accepted"], "edits", {}, {},
                      f"of {len(swept):,}; refused {got['refused']:,}, no effect "
                      f"{got['no effect']:,}, traceback {got['traceback']:,}"))
    return out


@suite("faults", title="Faults: what readers return from damaged data", options=options,
       quick=dict(flips=5, inplace_flips=1, cache_flips=1, shared=1, kill_points=3,
                  try_timeout=20, timeout=20),
       measures="""Outcomes, not speed: scripted faults (shards changed in place between and
       during epochs, damaged cached copies and odd cache folders, links planted in the cache,
       a misbehaving HTTP server, crafted datasets, image bombs, resume states of another
       packing, converter inputs as GNU tar writes them, decompression bombs and odd source
       files, kill -9 at every file-system event of a command, two exports into one OUT), each
       try in a process of its own under a time limit, what it returned compared sample by
       sample with the packed truth: ok, a clear one-line error, silent (a wrong or missing
       sample), another exception, a hang or a crash. Then bit flips, truncations and swaps of a
       small dataset read by shardpack and by WebDataset, and every edit of three manifests
       through `shardpack verify`. docs/reliability.md has every row.""",
       bounds="""By design, `check="once"` (a memo of what was hashed) and `trust_storage=True`
       (no hashing) miss changes a shard's stat does not show; every other row must have no
       silent, traceback, hang or crash outcome, which is the target.""")
def run_faults(run) -> Outcome:
    """The faults suite: the campaign, then the corruption campaign and the sweep."""
    a = run.args
    if a.only is not None:
        tries, _ = run_campaign(a, a.only, a.pick)
        raise SystemExit(0 if tries else f"no try matches {a.only!r}")
    started = time.time()
    tries, campaign_s = run_campaign(a)
    legacy_started = time.time()
    rows, swept, names = corruption(a)
    if a.out:
        seconds = {"all": time.time() - started, "campaign": campaign_s,
                   "legacy": time.time() - legacy_started}
        Path(a.out).write_text(page(run.command, time.strftime("%Y-%m-%d %H:%M UTC",
                                                               time.gmtime()), seconds, tries,
                                    rows, swept, names, a))
    setup = (f"{len(tries):,} tries in {campaign_s:.0f} s; {a.flips} flips per format and "
             f"target; seed {a.seed}; limits {a.try_timeout:g} s a try, {a.timeout:g} s a read.")
    return Outcome(figures(tries, rows, swept), setup)
