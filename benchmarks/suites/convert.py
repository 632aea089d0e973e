"""Conversion: `shardpack convert` from WebDataset tars, MDS and Parquet beside `shardpack pack`
of the same files, warm and cold."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from benchmarks import common as c
from benchmarks.registry import suite
from benchmarks.results import Outcome, figure

TARGET = 0.8
WRITERS = "benchmarks.suites.writers:peer_main"


def options(p) -> None:
    """The convert suite's options."""
    p.add_argument("--images", type=int, default=20000, help="100 KB JPEGs [20000]")
    p.add_argument("--modes", default="warm,cold", help="page-cache modes [warm,cold]")
    p.add_argument("--timeout", type=float, default=1800, help="per run, seconds")


def make_parquet(src, out) -> None:
    """key (string), jpg (binary), cls (int64) columns; row groups of 1,000 rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    items = c.list_tree(src)
    schema = pa.schema([("__key__", pa.string()), ("jpg", pa.binary()), ("cls", pa.int64())])
    os.makedirs(out, exist_ok=True)
    with pq.ParquetWriter(os.path.join(out, "train-00000.parquet"), schema) as writer:
        for start in range(0, len(items), 1000):
            keys, data, classes = [], [], []
            for rel, ci in items[start:start + 1000]:
                keys.append(c.split_key(rel)[0])
                with open(os.path.join(src, rel), "rb") as f:
                    data.append(f.read())
                classes.append(ci)
            writer.write_table(pa.table([keys, data, classes], schema=schema))


def ensure_inputs(run, src) -> dict:
    """The three inputs, each made once by its own writer: {format: folder}."""
    def writer(python, name):
        return lambda out: c.parse_child(subprocess.run(
            c.child_cmd(WRITERS, name, str(src), str(out), python=python), capture_output=True,
            text=True, env=c.child_env()), name)
    makers = {"webdataset": writer(sys.executable, "webdataset"), "mds": writer(c.PEER_PY, "mds"),
              "parquet": lambda out: make_parquet(src, out)}
    if not os.access(c.PEER_PY, os.X_OK):
        run.log(f"{c.PEER_PY} missing (benchmarks/suites/setup_peers.sh): no MDS input")
        del makers["mds"]
    made = {}
    for name, make in makers.items():
        out = run.data_dir / "convert" / f"{name}-{src.name}"
        if not os.path.exists(f"{out}.done"):
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            run.log(f"making the {name} input in {out}")
            make(out)
            open(f"{out}.done", "w").close()
        made[name] = out
    return made


def one_run(run, name, cmd, files, mode, rep, out) -> dict:
    """One contender's run into ``out``, its input cold or warm."""
    shutil.rmtree(out.parent, ignore_errors=True)
    out.parent.mkdir(parents=True)
    (c.evict if mode == "cold" else c.warm)(files)
    resident = c.resident_fraction(files)
    log = run.data_dir / "logs" / f"convert-{name}-{mode}-{rep}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    r = c.run_measured(c.shardpack_cmd(*cmd, out, "--workers", 2, "-q"), log,
                       timeout=run.args.timeout)
    text = open(log, errors="replace").read().strip().splitlines()
    if r["rc"] != 0:
        raise SystemExit(f"{name} failed: {' | '.join(text[-3:])}")
    shutil.rmtree(out.parent, ignore_errors=True)
    run.log(f"  rep {rep} {mode:4} {name:20} {r['wall_s']:7.2f} s  rss {r['maxrss_mb']:6.0f} MB"
            f"  resident {resident:.0%}")
    return dict(r, name=name, mode=mode, resident=resident, said=text[-1] if text else "")


@suite("convert", title="Converting", options=options, quick=dict(images=200),
       measures="""Wall time of `shardpack convert --workers 2` (tar output, 256 MB shards) from
       WebDataset tars (written by webdataset's ShardWriter), an MDS dataset (MDSWriter, no
       compression) and one Parquet file (pyarrow, 1,000-row groups), next to `shardpack pack`
       of the same generated 100 KB JPEGs; each run a subprocess, contenders rotated, input
       evicted from the page cache (cold) or read once (warm). The figure is samples/s; the
       limit column is pack's.""",
       bounds="""Pack's own cost per file is the reference: tar members and uncompressed MDS
       fields are byte ranges the shard writers read in 16 MB windows; Parquet cells cost the
       writers a decode (snappy, in pyarrow, ~2 MB record batches) that pack does not have. Cold,
       pack waits on 20,000 small reads and a conversion does not, so conversions win there.""")
def run_convert(run) -> Outcome:
    """The convert suite: pack and each conversion, rotated, per mode."""
    src, gen = c.ensure_images(run.data_dir, run.args.images)
    inputs = ensure_inputs(run, src)
    cmds = {"pack": (["pack", src], c.files_under(src))}
    for name, path in inputs.items():
        cmds[f"convert-{name}"] = (["convert", path, "--from", name], c.files_under(path))
    names, n = list(cmds), len(c.list_tree(src))
    modes = [m for m in run.args.modes.split(",") if m]
    runs = []
    for rep in range(run.reps):
        for mode in modes:
            for name in c.rotated(names, rep):
                cmd, files = cmds[name]
                runs.append(one_run(run, name, cmd, files, mode, rep,
                                    run.data_dir / "convert-scratch" / "out"))
    figures = []
    for mode in modes:
        walls = {k: [r["wall_s"] for r in runs if r["name"] == k and r["mode"] == mode]
                 for k in names}
        rate = {k: n / c.med(v) for k, v in walls.items()}
        for name in names[1:]:
            ratio = rate[name] / rate["pack"]
            rss = max(r["maxrss_mb"] for r in runs if r["name"] == name and r["mode"] == mode)
            figures.append(figure(
                f"{mode}: {name}", rate[name], "samples/s", {}, {"pack": rate["pack"]},
                f"{ratio:.2f}x pack (target >= {TARGET:.0%}: {c.verdict(ratio >= TARGET)}); "
                f"wall s: {c.spread(walls[name])}; max RSS {rss:,.0f} MB"))
    said = {r["name"]: r["said"] for r in runs}
    setup = f"{n:,} JPEGs (`{gen}`), 10 classes; inputs made once by each writer; {run.reps} " \
        "repetitions."
    return Outcome(figures, setup, raw={"runs": runs, "said": said})
