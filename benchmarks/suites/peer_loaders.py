"""The peers suite's loader side: one epoch of one loader (shardpack, raw files, webdataset, MDS,
LitData, FFCV, DALI), bytes only or decoded, and the conversions into each peer's format. Runs
in the interpreter of the venv that has the loader (.venv, .bench-venv, .bench-loaders-venv):
standard library at the top, each loader imported inside its function."""

from __future__ import annotations

import functools
import importlib
import io
import math
import os
import random
import sys
import time

from benchmarks.common import list_tree
from benchmarks.suites import writers

BATCH, WORKERS, SIZE, SHARD = 256, 2, 224, "64MB"


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
    """The peers' collate: stacked images (or a list of bytes) and a label tensor."""
    import numpy as np
    import torch
    xs, ys = zip(*samples, strict=True)
    x = torch.from_numpy(np.stack(xs)) if not isinstance(xs[0], bytes) else list(xs)
    return x, torch.tensor(ys)


class FilesDataset:
    """Map-style dataset over the ImageFolder tree (torchvision's ImageFolder minus torchvision)."""

    def __init__(self, root, decode):
        self.items = [(os.path.join(root, rel), ci) for rel, ci in list_tree(root)]
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
    """shardpack: ShardDataset(batched, CpuDecode(224) when decoding) in a DataLoader."""
    from shardpack import CpuDecode, ShardDataset
    ds = ShardDataset(path, batch_size=BATCH, batched=True,
                      decode=CpuDecode(SIZE) if decode else None)
    return _torch_loader(ds, batch_size=None), lambda b: int((~b["__repeat__"]).sum())


def load_files(path, decode):
    """Raw files: a map-style dataset over the tree in a shuffled DataLoader."""
    return _torch_loader(FilesDataset(path, decode), batch_size=BATCH, shuffle=True,
                         collate_fn=collate), lambda b: len(b[1])


def load_webdataset(path, decode):
    """webdataset: WebDataset(shardshuffle) .shuffle(1000) .batched(256) in a WebLoader."""
    import webdataset as wds
    urls = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".tar"))
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), workersplitter=wds.split_by_worker,
                         empty_check=False)
          .shuffle(1000).map(lambda s: _sample(s["jpg"], s["cls"], hash(s["__key__"]), decode))
          .batched(BATCH, collation_fn=collate, partial=True))
    return wds.WebLoader(ds, batch_size=None, num_workers=WORKERS), lambda b: len(b[1])


def load_mds(path, decode):
    """MDS: StreamingDataset(shuffle=True) in a DataLoader."""
    if "streaming" not in sys.modules:
        writers.mds_writer_class()  # registers a bare `streaming` package (no torchvision)
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
    """LitData: StreamingDataset(shuffle=True) in its StreamingDataLoader."""
    from litdata import StreamingDataLoader, StreamingDataset

    class DS(StreamingDataset):
        def __getitem__(self, index):
            s = super().__getitem__(index)
            return _sample(s["jpg"], s["cls"], getattr(index, "index", 0), decode)
    ds = DS(input_dir=path, shuffle=True)
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS,
                               collate_fn=collate), lambda b: len(b[1])


def load_ffcv(path, decode):
    """FFCV: Loader(order=RANDOM, os_cache=True); RandomResizedCrop + flip when decoding."""
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
    """DALI: fn.readers.file(random_shuffle=True) in a CPU pipeline (device_id=None)."""
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


IMPORTS = {"shardpack-tar": ["shardpack"], "shardpack-msgpack": ["shardpack"],
           "files": ["PIL.Image"],
           "webdataset": ["webdataset", "PIL.Image"], "mds": ["streaming.base", "PIL.Image"],
           "litdata": ["litdata", "PIL.Image"], "ffcv": ["ffcv.loader", "ffcv.transforms"],
           "dali": ["nvidia.dali", "nvidia.dali.fn"]}
LOADERS = {"shardpack-tar": load_shardpack, "shardpack-msgpack": load_shardpack,
           "files": load_files, "webdataset": load_webdataset, "mds": load_mds,
           "litdata": load_litdata, "ffcv": load_ffcv, "dali": load_dali}


def epoch(name: str, path: str, mode: str) -> dict:
    """One epoch of loader ``name``; imports are not timed: the clock starts at the loader's
    construction. Samples, epoch seconds, first batch seconds, rate after the first batch."""
    import torch  # noqa: F401
    if name == "mds":
        writers.mds_writer_class()
    for module in IMPORTS.get(name, ()):
        importlib.import_module(module)
    if name.startswith("shardpack"):  # the public names, however lazily the package loads them
        import shardpack
        _ = shardpack.ShardDataset, shardpack.CpuDecode
    t0 = time.perf_counter()
    loader, count = LOADERS[name](path, mode == "decode")
    samples, first, n_first = 0, None, 0
    for batch in loader:
        samples += count(batch)
        if first is None:
            first, n_first = time.perf_counter() - t0, samples
    took = time.perf_counter() - t0
    steady = (samples - n_first) / (took - first) if took > first else None
    return dict(samples=samples, epoch_s=took, first_batch_s=first, steady=steady)


def convert(name: str, src: str, out: str) -> dict:
    """Write the tree ``src`` into ``out`` in peer ``name``'s format (64 MB shards or chunks)."""
    items = list_tree(src)
    shard = 64 * 10**6
    if name in ("webdataset", "mds"):
        writers.WRITERS[name](src, out, items, shard)
    elif name == "litdata":
        from litdata import optimize
        optimize(fn=functools.partial(writers.litdata_sample, src), inputs=items,
                 output_dir=out, chunk_bytes=SHARD, num_workers=2)
    elif name == "ffcv":
        convert_ffcv(src, out, items)
    return {}


def convert_ffcv(src, out, items) -> None:
    """Two .beton files: jpg.beton, an RGBImageField holding the ORIGINAL JPEG bytes (the stock
    writer re-encodes every image), and bytes.beton, a BytesField, for the bytes-only mode."""
    import numpy as np
    from ffcv.fields import BytesField, IntField, RGBImageField
    from ffcv.fields.rgb_image import IMAGE_MODES
    from ffcv.writer import DatasetWriter
    from PIL import Image

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
