#!/usr/bin/env python3
"""Loading benchmark: shardpack (tar, msgpack) vs raw files, webdataset, MosaicML streaming (MDS),
LitData, FFCV and DALI (CPU only), one epoch into PyTorch, bytes-only and decode (JPEG decode +
random-resized-crop 224 + flip), with the data evicted from the page cache (cold) and warm.

    python tools/bench_peers.py [--images 5000] [--reps 3] [--skip ffcv,dali] \
        [--out docs/benchmarks.md]

Every run is its own subprocess (2 DataLoader workers or 2 threads, batch 256) under the venv the
loader needs: .venv (shardpack, files, webdataset), .bench-venv (mds, litdata:
tools/bench_setup_peers.sh), .bench-loaders-venv (ffcv, dali: tools/bench_setup_loaders.sh).
Contenders alternate within each repetition, in rotated order. Inputs are converted once with
each peer's own writer into DATA_DIR/peers/. Internally `--run NAME PATH MODE` is one loader's epoch
and `--convert NAME SRC OUT` one conversion. Logs and runs.jsonl go to DATA_DIR/logs/peers.
"""
import argparse
import datetime
import io
import json
import math
import os
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, ".venv", "bin", "python")
PEER_PY = os.path.join(ROOT, ".bench-venv", "bin", "python")
LOADERS_PY = os.path.join(ROOT, ".bench-loaders-venv", "bin", "python")
SHARDPACK = os.path.join(ROOT, ".venv", "bin", "shardpack")
BATCH, WORKERS, SIZE, SHARD = 256, 2, 224, "64MB"
# name -> (python, dataset folder under DATA_DIR/peers/<tree>, or None for the source tree itself)
CONTENDERS = {
    "shardpack-tar": (VENV_PY, "shardpack-tar"),
    "shardpack-msgpack": (VENV_PY, "shardpack-msgpack"),
    "files": (VENV_PY, None), "webdataset": (VENV_PY, "webdataset"), "mds": (PEER_PY, "mds"),
    "litdata": (PEER_PY, "litdata"), "ffcv": (LOADERS_PY, "ffcv"), "dali": (LOADERS_PY, None),
}


# ---------------------------------------------------------------- loader side (subprocesses)
def peer_decode(data, rng):
    """The decode of the peers without their own: Pillow, decoding at the smallest JPEG DCT scale
    (draft) that keeps the crop >= SIZE, random-resized-crop (scale 0.08-1, ratio 3/4-4/3),
    bilinear resize of the crop, random horizontal flip. uint8 HWC."""
    import numpy as np
    from PIL import Image
    im = Image.open(io.BytesIO(data))
    w, h = im.size
    for _ in range(10):
        area = w * h * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            left, top = rng.randint(0, w - cw), rng.randint(0, h - ch)
            break
    else:
        cw = ch = min(w, h)
        left, top = (w - cw) // 2, (h - ch) // 2
    scale = 1
    while scale < 8 and min(cw, ch) >= 2 * scale * SIZE:
        scale *= 2
    if scale > 1:
        im.draft("RGB", (-(-w // scale), -(-h // scale)))
    sx, sy = im.size[0] / w, im.size[1] / h
    out = np.asarray(im.convert("RGB").resize(
        (SIZE, SIZE), Image.Resampling.BILINEAR,
        box=(left * sx, top * sy, (left + cw) * sx, (top + ch) * sy)))
    return out[:, ::-1] if rng.random() < 0.5 else out


def _sample(data, cls, index, decode):
    data = bytes(data)  # LitData hands out memoryviews, which do not pickle (the loader hangs)
    return (peer_decode(data, random.Random(int(index))) if decode else data), int(cls)


def collate(samples):
    import numpy as np
    import torch
    xs, ys = zip(*samples, strict=True)
    x = torch.from_numpy(np.stack(xs)) if not isinstance(xs[0], bytes) else list(xs)
    return x, torch.tensor(ys)


class FilesDataset:
    """Map-style dataset over the ImageFolder tree (torchvision's ImageFolder minus torchvision)."""
    def __init__(self, root, decode):
        self.items = [(os.path.join(root, rel), ci) for rel, ci in bc.list_tree(root)]
        self.decode = decode

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, ci = self.items[i]
        with open(path, "rb") as f:
            return _sample(f.read(), ci, i, self.decode)


def _torch_loader(ds, **kw):
    from torch.utils.data import DataLoader
    return DataLoader(ds, num_workers=WORKERS, **kw)


def load_shardpack(path, decode):
    from shardpack import CpuDecode, ShardDataset
    ds = ShardDataset(path, batch_size=BATCH, batched=True,
                      decode=CpuDecode(SIZE) if decode else None)
    return _torch_loader(ds, batch_size=None), lambda b: int((~b["__repeat__"]).sum())


def load_files(path, decode):
    return _torch_loader(FilesDataset(path, decode), batch_size=BATCH, shuffle=True,
                         collate_fn=collate), lambda b: len(b[1])


def load_webdataset(path, decode):
    import webdataset as wds
    urls = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".tar"))
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), workersplitter=wds.split_by_worker,
                         empty_check=False)
          .shuffle(1000).map(lambda s: _sample(s["jpg"], s["cls"], hash(s["__key__"]), decode))
          .batched(BATCH, collation_fn=collate, partial=True))
    return wds.WebLoader(ds, batch_size=None, num_workers=WORKERS), lambda b: len(b[1])


def load_mds(path, decode):
    if "streaming" not in sys.modules:
        import bench_pack
        bench_pack._mds_writer_class()  # registers a bare `streaming` package (no torchvision)
    from streaming.base import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    clean_stale_shared_memory()

    class DS(StreamingDataset):
        def get_item(self, idx):
            s = super().get_item(idx)
            return _sample(s["jpg"], s["cls"], idx, decode)
    ds = DS(local=path, remote=None, shuffle=True, batch_size=BATCH)
    return _torch_loader(ds, batch_size=BATCH, collate_fn=collate), lambda b: len(b[1])


def load_litdata(path, decode):
    from litdata import StreamingDataLoader, StreamingDataset

    class DS(StreamingDataset):
        def __getitem__(self, index):
            s = super().__getitem__(index)
            return _sample(s["jpg"], s["cls"], getattr(index, "index", 0), decode)
    ds = DS(input_dir=path, shuffle=True)
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS,
                               collate_fn=collate), lambda b: len(b[1])


def load_ffcv(path, decode):
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.bytes import BytesDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder, RGBImageField
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, ToTensor
    image = [RandomResizedCropRGBImageDecoder((SIZE, SIZE)), RandomHorizontalFlip(), ToTensor()] \
        if decode else [BytesDecoder()]
    loader = Loader(os.path.join(path, "jpg.beton" if decode else "bytes.beton"), batch_size=BATCH,
                    num_workers=WORKERS, order=OrderOption.RANDOM, os_cache=True,
                    drop_last=False,
                    pipelines={"image": image, "label": [IntDecoder(), ToTensor()]},
                    custom_fields={"image": RGBImageField} if decode else {})
    return loader, lambda b: len(b[1])


def load_dali(path, decode):
    import numpy as np
    import torch
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=BATCH, num_threads=WORKERS, device_id=None)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=path, random_shuffle=True, name="reader")
        if not decode:
            return jpegs, labels
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE)
        return fn.flip(images, horizontal=fn.random.coin_flip()), labels

    def batches():
        p = pipe()
        p.build()
        left = p.epoch_size("reader")
        while left > 0:
            images, labels = p.run()
            n = min(left, len(labels))
            left -= n
            x = torch.from_numpy(np.array(images.as_tensor())) if decode else \
                [images.at(i).tobytes() for i in range(n)]
            yield x, n
    return batches(), lambda b: b[1]


_SHARDPACK = ["shardpack.loader.dataset", "shardpack.transforms.decode"]
IMPORTS = {"shardpack-tar": _SHARDPACK, "files": ["PIL.Image"], "shardpack-msgpack": _SHARDPACK,
           "webdataset":
           ["webdataset", "PIL.Image"], "mds": ["streaming.base", "PIL.Image"],
           "litdata": ["litdata", "PIL.Image"], "ffcv": ["ffcv.loader", "ffcv.transforms"],
           "dali": ["nvidia.dali", "nvidia.dali.fn"]}


def run_main(name, path, mode):
    loader_fn = {"shardpack-tar": load_shardpack, "shardpack-msgpack": load_shardpack,
                 "files": load_files, "webdataset": load_webdataset, "mds": load_mds,
                 "litdata": load_litdata, "ffcv": load_ffcv, "dali": load_dali}[name]
    import importlib
    import torch  # noqa: F401  imports are not timed: t0 starts at the loader's construction
    if name == "mds":
        import bench_pack
        bench_pack._mds_writer_class()
    for module in IMPORTS.get(name, ()):
        importlib.import_module(module)
    t0 = time.perf_counter()
    loader, count = loader_fn(path, mode == "decode")
    samples, first, n_first = 0, None, 0
    for batch in loader:
        samples += count(batch)
        if first is None:
            first, n_first = time.perf_counter() - t0, samples
    epoch = time.perf_counter() - t0
    steady = (samples - n_first) / (epoch - first) if epoch > first else None
    print("RESULT " + json.dumps(dict(samples=samples, epoch_s=epoch, first_batch_s=first,
                                      steady=steady)), flush=True)


# ---------------------------------------------------------------- conversions (subprocesses)
def convert_main(name, src, out):
    import bench_pack
    items = bc.list_tree(src)
    bench_pack.SHARD_BYTES = 64 * 10**6
    if name == "webdataset":
        bench_pack.peer_webdataset(src, out, items)
    elif name == "mds":
        bench_pack.peer_mds(src, out, items)
    elif name == "litdata":
        from litdata import optimize
        import functools
        optimize(fn=functools.partial(bench_pack._litdata_sample, src), inputs=items,
                 output_dir=out, chunk_bytes=SHARD, num_workers=2)
    elif name == "ffcv":
        convert_ffcv(src, out, items)


def convert_ffcv(src, out, items):
    """Two .beton files: jpg.beton, an RGBImageField holding the ORIGINAL JPEG bytes (the stock
    writer re-encodes every image), and bytes.beton, a BytesField, for the bytes-only mode."""
    import numpy as np
    from PIL import Image
    from ffcv.fields import BytesField, IntField, RGBImageField
    from ffcv.fields.rgb_image import IMAGE_MODES
    from ffcv.writer import DatasetWriter

    class OriginalJPEG(RGBImageField):
        def encode(self, destination, data, malloc):
            w, h = Image.open(io.BytesIO(data)).size
            destination["mode"], destination["width"], destination["height"] = \
                IMAGE_MODES["jpg"], w, h
            destination["data_ptr"], buf = malloc(len(data))
            buf[:] = np.frombuffer(data, np.uint8)

    class Items:
        def __init__(self, as_array):
            self.as_array = as_array

        def __len__(self):
            return len(items)

        def __getitem__(self, i):
            with open(os.path.join(src, items[i][0]), "rb") as f:
                data = f.read()
            return (np.frombuffer(data, np.uint8) if self.as_array else data), items[i][1]
    for fname, field, as_array in (("jpg.beton", OriginalJPEG(write_mode="jpg"), False),
                                   ("bytes.beton", BytesField(), True)):
        DatasetWriter(os.path.join(out, fname), {"image": field, "label": IntField()},
                      num_workers=2).from_indexed_dataset(Items(as_array))


# ---------------------------------------------------------------- harness
def prepare(src, peers_dir, names, log_dir):
    """Convert the source once per dataset folder; returns {name: path}."""
    paths = {}
    for name in names:
        folder = CONTENDERS[name][1]
        if folder is None:
            paths[name] = src
            continue
        out = os.path.join(peers_dir, folder)
        if not os.path.exists(out + ".done"):
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            if name.startswith("shardpack"):
                cmd = [SHARDPACK, "pack", src, out, "--format", name.split("-")[1], "--shard-size",
                       SHARD, "--workers", "2", "--overwrite", "-q"]
            else:
                cmd = [CONTENDERS[name][0], os.path.abspath(__file__), "--convert", name, src, out]
            print("converting:", shlex.join(cmd), flush=True)
            t = time.perf_counter()
            with open(os.path.join(log_dir, f"convert-{name}.log"), "w") as log:
                subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
            with open(out + ".done", "w") as f:
                f.write(f"{time.perf_counter() - t:.1f} s\n")
        paths[name] = out
    return paths


def run_one(name, path, mode, cache, log, expected):
    files = bc.files_under(path)
    (bc.evict if cache == "cold" else bc.warm)(files)
    resident = bc.resident_fraction(files)
    cmd = [CONTENDERS[name][0], os.path.abspath(__file__), "--run", name, path, mode]
    r = bc.run_measured(cmd, log, timeout=600)
    text = open(log, errors="replace").read()
    res = [json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT ")]
    r.update(name=name, mode=mode, cache=cache, resident=resident, load1=os.getloadavg()[0])
    if r["rc"] or not res:
        r["error"] = " | ".join(text.strip().splitlines()[-3:])
    elif res[0]["samples"] != expected:
        r["error"] = f"{res[0]['samples']} samples in the epoch, expected {expected}"
    else:
        r.update(res[0], rate=res[0]["samples"] / res[0]["epoch_s"])
    return r


def wait_sweep(dataset, src, steps):
    """shardpack bench --decode cpu --step-ms S on the packed dataset and on the raw tree (warm)."""
    out = {}
    for label, target in (("shardpack-tar", [dataset]), ("files", ["--files", src])):
        bc.warm(bc.files_under(target[-1]))
        for s in steps:
            cmd = [SHARDPACK, "bench", *target, "--decode", "cpu", "--device", "cpu", "-q",
                   "--step-ms", str(s)]
            text = subprocess.run(cmd, capture_output=True, text=True).stdout
            wait = re.search(r"waiting\s+([\d.]+)%", text)
            rate = re.search(r"samples/s\s+([\d,]+)", text)
            out.setdefault(label, []).append(dict(
                step_ms=s, wait=float(wait.group(1)) / 100 if wait else (1.0 if s == 0 else None),
                rate=float(rate.group(1).replace(",", "")) if rate else None))
            print(f"  wait sweep {label:14} step {s:4} ms: {out[label][-1]}", flush=True)
    return out


def versions():
    meta = "import importlib.metadata as m, sys; print(*[m.version(p) for p in sys.argv[1:]])"
    def v(py, *pkgs):
        try:
            got = subprocess.run([py, "-c", meta, *pkgs], capture_output=True, text=True,
                                 timeout=120).stdout.split()
        except OSError:
            got = []
        return ", ".join(f"{p} {x}" for p, x in zip(pkgs, got, strict=False)) or "missing"
    return {".venv": v(VENV_PY, "shardpack", "torch", "webdataset", "pillow", "simplejpeg"),
            ".bench-venv": v(PEER_PY, "mosaicml-streaming", "litdata", "torch", "pillow"),
            ".bench-loaders-venv": v(LOADERS_PY, "ffcv", "nvidia-dali-cuda120", "torch")}


def summarize(runs, names):
    stats = {}
    for r in runs:
        if "rate" in r:
            stats.setdefault((r["name"], r["cache"], r["mode"]), []).append(r)
    out = {}
    for key, rs in stats.items():
        rates = [r["rate"] for r in rs]
        out[key] = dict(med=statistics.median(rates), lo=min(rates), hi=max(rates), n=len(rs),
                        first=statistics.median(r["first_batch_s"] for r in rs),
                        steady=statistics.median(r["steady"] or 0 for r in rs),
                        samples=rs[0]["samples"])
    return out


def table(stats, names, caches):
    lines = ["| contender | cache | bytes samples/s median (min-max, n) | first batch s | "
             "vs shardpack-tar | decode samples/s median (min-max, n) | first batch s | "
             "vs shardpack-tar |", "|---|---|---|---|---|---|---|---|"]
    for name in names:
        for cache in caches:
            cells = []
            for mode in ("bytes", "decode"):
                s, ref = stats.get((name, cache, mode)), stats.get(("shardpack-tar", cache, mode))
                if s is None:
                    cells += ["failed / not run", "-", "-"]
                    continue
                cells += [f"{s['med']:,.0f} ({s['lo']:,.0f}-{s['hi']:,.0f}, {s['n']})",
                          f"{s['first']:.2f}", f"{s['med'] / ref['med']:.2f}x" if ref else "-"]
            lines.append(f"| {name} | {cache} | " + " | ".join(cells) + " |")
    return lines


def plot_main(json_path, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    d = json.load(open(json_path))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw=dict(width_ratios=[2.2, 1]))
    combos = [(c, m) for m in ("bytes", "decode") for c in d["caches"]]
    width = 0.8 / len(combos)
    for k, (cache, mode) in enumerate(combos):
        meds = [d["stats"].get(f"{n}|{cache}|{mode}", {}).get("med", 0) for n in d["names"]]
        a1.bar([i + k * width for i in range(len(d["names"]))], meds, width,
               label=f"{mode}, {cache}")
    a1.set_xticks([i + 0.4 - width / 2 for i in range(len(d["names"]))], d["names"],
                  rotation=25)
    a1.set_yscale("log")
    a1.set_ylabel("samples/s (median, one epoch, log scale)")
    a1.set_title(f"Loading {d['files']:,} JPEGs: 2 workers, batch {BATCH}")
    a1.legend()
    for label, pts in d["sweep"].items():
        pts = [p for p in pts if p["wait"] is not None]
        a2.plot([p["step_ms"] for p in pts], [p["wait"] for p in pts], "o-", label=label)
    a2.set_xlabel("simulated step time, ms per batch")
    a2.set_ylabel("wait fraction of wall time")
    a2.set_title("shardpack bench --decode cpu (warm)")
    a2.set_ylim(0, 1.05)
    a2.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():  # noqa: C901  (a benchmark driver: options, then the runs, in order)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=5000, help="ImageNet-like tree size")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--caches", default="cold,warm")
    ap.add_argument("--modes", default="bytes,decode")
    ap.add_argument("--skip", default="", help="comma separated: " + ",".join(CONTENDERS))
    ap.add_argument("--steps", default="0,50,100,200", help="wait sweep step times, ms")
    ap.add_argument("--data-dir", default=os.path.join(ROOT, "bench-data"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    ap.add_argument("--png", default=os.path.join(ROOT, "docs", "bench_peers.png"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--run", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--convert", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--plot", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run or args.convert or args.plot:
        fn = run_main if args.run else convert_main if args.convert else plot_main
        return fn(*(args.run or args.convert or args.plot))

    started = datetime.datetime.now(datetime.timezone.utc)
    skip = set(filter(None, args.skip.split(",")))
    names = [n for n in CONTENDERS if n not in skip and os.access(CONTENDERS[n][0], os.X_OK)]
    missing = [n for n in CONTENDERS if n not in skip and n not in names]
    import bench_pack
    src, gen = bench_pack.ensure_tree(args.data_dir, "imagenet", args.images)
    tree = os.path.basename(src)
    log_dir = os.path.join(args.data_dir, "logs", "peers")
    os.makedirs(log_dir, exist_ok=True)
    paths = prepare(src, os.path.join(args.data_dir, "peers", tree), names, log_dir)
    caches, modes = args.caches.split(","), args.modes.split(",")
    n_files = len(bc.list_tree(src))
    fincore = ""
    if shutil.which("fincore"):
        bc.evict(bc.files_under(paths[names[0]]))
        fincore = bench_pack.fincore_check(bc.files_under(paths[names[0]])[:50])
    runs = []
    for rep in range(args.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for cache in caches:
            for mode in modes:
                for name in order:
                    log = os.path.join(log_dir, f"{name}-{cache}-{mode}-{rep}.log")
                    r = run_one(name, paths[name], mode, cache, log, n_files)
                    runs.append(dict(r, rep=rep))
                    with open(os.path.join(log_dir, "runs.jsonl"), "a") as f:
                        f.write(json.dumps(runs[-1]) + "\n")
                    print(f"rep {rep} {cache:4} {mode:6} {name:17} "
                          f"{r.get('rate', 0):8,.0f} samples/s  "
                          f"first {r.get('first_batch_s') or 0:6.2f} s"
                          f"  resident {r['resident']:.0%}  {r.get('error', '')}", flush=True)
    sweep = wait_sweep(paths.get("shardpack-tar"), src, [int(s) for s in args.steps.split(",")]) \
        if "shardpack-tar" in names else {}
    stats = summarize(runs, names)
    failed = {}
    for r in runs:
        if "error" in r:
            failed.setdefault(r["name"], f"{r['cache']}/{r['mode']}: {r['error']}")
    resid = {c: [r["resident"] for r in runs if r["cache"] == c] for c in caches}
    m = bc.machine_info(args.data_dir)
    command = "python tools/bench_peers.py " + shlex.join(sys.argv[1:])
    doc = [f"Made by `{command}` on {started:%Y-%m-%d %H:%M} UTC; data: `{gen}` "
           f"({n_files:,} JPEGs, {bc.tree_bytes(src) / 1e6:,.0f} MB).", "",
           f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']:.1f} GiB RAM, Linux "
           f"{m['kernel']}, Python {m['python']}, data on {m['fs']}. Shared and noisy.", "",
           "Versions: " + "; ".join(f"{k}: {v}" for k, v in versions().items()), "",
           f"One epoch per run, {args.reps} repetitions, contenders in rotated order each "
           f"repetition; samples/s = samples / (loader construction to last batch); first batch "
           f"= loader construction to first batch (imports and interpreter start excluded). "
           f"Resident fraction at start: " + ", ".join(
               f"{c} {min(v):.1%}-{max(v):.1%}" for c, v in resid.items() if v) + ".", ""]
    doc += table(stats, names, caches) + [""]
    combos = [(c, m) for c in caches for m in modes]
    doc += ["Samples/s after the first batch (median; leaves out worker start-up, first reads "
            "and FFCV's JIT compilation):", "",
            "| contender | " + " | ".join(f"{c} {m}" for c, m in combos) + " |",
            "|---|" + "---|" * len(combos)]
    doc += [f"| {n} | " + " | ".join(f"{stats[(n, c, m)]['steady']:,.0f}" if (n, c, m) in stats
                                      else "-" for c, m in combos) + " |" for n in names]
    doc.append("")
    if fincore:
        doc.append(f"- Eviction cross-check ({names[0]}), {fincore}.")
    for name, why in failed.items():
        doc.append(f"- **{name} failed** ({why})")
    for name in missing:
        doc.append(f"- **{name} not run**: its venv is missing ({CONTENDERS[name][0]}).")
    if sweep:
        doc += ["", "Wait fraction vs step time (`shardpack bench DATASET|--files SRC --decode cpu "
                "--device cpu --step-ms S`, warm, one run each; with S = 0 the consumer does "
                "nothing, so it waits 100% by definition):", "",
                "| source | " + " | ".join(f"{p['step_ms']} ms" for p in sweep["files"]) + " |",
                "|---|" + "---|" * len(sweep["files"])]
        for label, pts in sweep.items():
            doc.append(f"| {label} | " + " | ".join(
                (f"{p['wait']:.0%}" if p["wait"] is not None else "?") +
                (f" ({p['rate']:,.0f}/s)" if p["rate"] else "") for p in pts) + " |")
    took = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    doc += ["", f"![samples/s per contender; wait fraction vs step time]"
            f"({os.path.relpath(args.png, os.path.dirname(args.out))})", "",
            f"Run took {took / 60:.0f} min.",
            "", METHOD]
    text = "\n".join(doc)
    print("\n" + text)
    data = dict(names=names, caches=caches, files=n_files, sweep=sweep,
                stats={"|".join(k): v for k, v in stats.items()})
    with open(os.path.join(log_dir, "summary.json"), "w") as f:
        json.dump(data, f)
    if not args.no_write:
        plot_py = next((p for p in (LOADERS_PY, PEER_PY, VENV_PY) if subprocess.run(
            [p, "-c", "import matplotlib"], capture_output=True).returncode == 0), None)
        if plot_py:
            subprocess.run([plot_py, os.path.abspath(__file__), "--plot",
                            os.path.join(log_dir, "summary.json"), args.png], check=True)
        bc.update_section(args.out, "## Loading: shardpack vs peers", text)
        print(f"\nwrote the '## Loading: shardpack vs peers' section of {args.out} and {args.png}")


METHOD = """#### Method

- Each run is one subprocess; 2 loader workers (DALI: 2 threads), batch 256, shuffled, one
  epoch. Cold: `os.sync()` then `posix_fadvise(DONTNEED)` on every file the contender reads,
  checked with mincore (300-file sample) and once with util-linux `fincore`; dentries and inodes
  stay cached. Warm: every file read once before the run.
- Inputs, converted once into `bench-data/peers/` with each peer's own writer, 64 MB shards or
  chunks, no compression: `shardpack pack --format tar|msgpack --shard-size 64MB`; webdataset
  `ShardWriter`; MDS `MDSWriter` (`jpg` as a `bytes` column); LitData `optimize`; FFCV
  `DatasetWriter` (an `RGBImageField` subclass that stores the original JPEG bytes, the stock one
  re-encodes; a `BytesField` file for bytes-only). raw files and DALI read the ImageFolder tree.
- Loaders: shardpack `ShardDataset(batched=True, batch_size=256, decode=CpuDecode(224))` in a
  `DataLoader(batch_size=None)`; raw files a map-style dataset over the tree in a shuffled
  `DataLoader`; webdataset `WebDataset(shardshuffle) .shuffle(1000) .batched(256)` in a
  `WebLoader`; MDS `StreamingDataset(shuffle=True)` and LitData `StreamingDataset(shuffle=True)`
  (memoryview -> bytes in the adapter) in their DataLoaders; FFCV `Loader(order=RANDOM,
  os_cache=True)`; DALI `fn.readers.file(random_shuffle=True)` in a CPU pipeline
  (`device_id=None`).
- Decode: shardpack its `CpuDecode` (simplejpeg at a reduced DCT scale, torch resize); FFCV
  `RandomResizedCropRGBImageDecoder` + `RandomHorizontalFlip`; DALI
  `decoders.image_random_crop` + `resize` + `flip`; the others one shared Pillow function
  (`peer_decode`: draft decode at the smallest DCT scale keeping the crop >= 224,
  random-resized-crop scale 0.08-1 ratio 3/4-4/3, bilinear resize, random flip)."""


if __name__ == "__main__":
    main()
