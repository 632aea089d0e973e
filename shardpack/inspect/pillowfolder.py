"""The raw files read the way most training scripts read them today: torchvision's ImageFolder with
Pillow, one file opened and decoded per sample, ``RandomResizedCrop`` + a flip, done in PIL.

``bench --sweep`` measures it as the user's starting point beside the packed dataset, so what
packing buys is measured on the user's own files.  torchvision itself is not imported (its PyPI
wheel does not import beside the CPU torch wheel): the listing is shardpack's own walk, which
labels class folders as ImageFolder does, and the crop follows ``RandomResizedCrop``'s rule
(scale 0.08-1, ratio 3/4-4/3, ten tries, then a centre crop) with the same PIL bilinear resize.
"""

from __future__ import annotations

import math
import random

import numpy as np

from shardpack.core.errors import ShardpackError

SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


class PillowFolder:
    """A map-style dataset over the image files under ``root``: ``{"image": uint8 HWC tensor
    of spec.size, "cls": int, "__index__": int}``.

    Args:
        root: an ImageFolder tree (class folders) or any tree of images.
        spec: the :class:`~shardpack.transforms.spec.TransformSpec` (its size, train, flip).
    """

    def __init__(self, root, spec):
        from shardpack.write.packsource import PackSource

        self.items = []
        for sample in PackSource(root):
            path = next((f.path for f in sample.fields if f.path is not None), None)
            label = next((f.value for f in sample.fields if f.name == "cls"), b"0")
            if path is not None:
                self.items.append((path, int(label)))
        if not self.items:
            raise ShardpackError(f"{root}: no image files to read")
        self.spec = spec

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        from PIL import Image

        from shardpack.loader.torchenv import torch

        path, label = self.items[index]
        rng = random.Random(hash((self.spec.seed, index)) & 0xFFFFFFFF)
        with Image.open(path) as image:
            image = image.convert("RGB")
            box = crop_box(image.width, image.height, rng) if self.spec.train \
                else centre_box(image.width, image.height)
            out = image.resize((self.spec.size, self.spec.size), Image.BILINEAR, box=box)
        if self.spec.train and self.spec.flip and rng.random() < 0.5:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        return {"image": torch.from_numpy(np.asarray(out).copy()), "cls": label,
                "__index__": index}


class CollateThen:
    """The DataLoader's default collate, then ``transform`` on the batch (the user's, as
    ``ShardDataset(transform=...)`` runs it on a packed batch)."""

    def __init__(self, transform=None):
        self.transform = transform

    def __call__(self, samples):
        from shardpack.loader.torchenv import torch

        batch = torch.utils.data.default_collate(samples)
        return self.transform(batch) if self.transform is not None else batch


def crop_box(width: int, height: int, rng: random.Random) -> tuple:
    """``RandomResizedCrop``'s box (left, top, right, bottom) for an image of that size."""
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        ratio = math.exp(rng.uniform(math.log(RATIO[0]), math.log(RATIO[1])))
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            x, y = rng.randint(0, width - w), rng.randint(0, height - h)
            return (x, y, x + w, y + h)
    return centre_box(width, height)


def centre_box(width: int, height: int) -> tuple:
    """The largest centred square."""
    side = min(width, height)
    x, y = (width - side) // 2, (height - side) // 2
    return (x, y, x + side, y + side)
