"""The transform spec: one frozen description of what an image becomes, read by the CPU and the
GPU paths alike.

* Its crop part (``size``, ``train``, ``scale``, ``ratio``, ``flip``, ``crop_fraction``, ``seed``)
  is read where images decode: :class:`~shardpack.CpuDecode` in the DataLoader workers,
  :class:`~shardpack.transforms.gpudecode.GpuDecoder` on the device.  Both call
  :func:`plan_crop` with the same :class:`SampleRandom` (a hash of seed, epoch and sample index),
  so a sample gets the same crop box and flip on either path, in any process.
* Its output part (``mean``, ``std``, ``dtype``, ``layout``) is read by
  :class:`~shardpack.DeviceLoader`, which turns uint8 NHWC images into normalised tensors on the
  device, whichever path decoded them.

Pass the same spec to ``CpuDecode(spec=...)`` and ``DeviceLoader(spec=...)``, or let each build
its own from its keyword arguments.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import struct
from dataclasses import dataclass

import xxhash

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # of pixel values / 255, as torchvision's
IMAGENET_STD = (0.229, 0.224, 0.225)
LAYOUTS = ("NCHW", "NHWC")
DTYPES = ("float32", "float16", "bfloat16", "float64", "uint8")


@dataclass(frozen=True)
class TransformSpec:
    """What an image becomes: crop, flip, normalisation, dtype and layout.  Frozen and checked
    when made: a bad value is a ValueError here, not in every worker.

    Args:
        size: output side in pixels (images come out ``size`` x ``size``).
        train: True: a random-resized crop (torchvision's rule) and a random flip; False: resize
            the short side to ``size / crop_fraction`` and crop the centre.
        scale: the random crop's area range, as fractions of the image's.
        ratio: the random crop's aspect ratio range (width / height).
        flip: flip half the training images horizontally.
        crop_fraction: evaluation's centre crop, as a fraction of the short side.
        seed: the crops' seed: with the epoch and the sample's index it decides each crop.
        mean: per-channel mean of pixel values / 255 subtracted on the device (RGB), or None
            for no normalisation (then ``std`` is None too).
        std: per-channel standard deviation of pixel values / 255 divided by, or None.
        dtype: the device tensor's dtype: a name (``"float32"``, ``"float16"``,
            ``"bfloat16"``, ``"float64"``, ``"uint8"``) or a ``torch.dtype`` of one.
        layout: ``"NCHW"`` (shape [B, 3, H, W] in channels-last memory, the default) or
            ``"NHWC"`` (shape [B, H, W, 3]).
    """

    size: int = 224
    train: bool = True
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    crop_fraction: float = 0.875
    seed: int = 0
    mean: tuple[float, float, float] | None = IMAGENET_MEAN
    std: tuple[float, float, float] | None = IMAGENET_STD
    dtype: str = "float32"
    layout: str = "NCHW"

    def __post_init__(self):
        _set = self._set
        _set("size", _integer("size", self.size))
        if self.size < 1:
            raise ValueError(f"size must be a whole number of pixels >= 1, got {self.size!r}")
        _set("seed", _integer("seed", self.seed))
        _set("train", bool(self.train))
        _set("flip", bool(self.flip))
        _set("scale", _range("scale", self.scale))
        _set("ratio", _range("ratio", self.ratio))
        _set("crop_fraction", _fraction("crop_fraction", self.crop_fraction))
        _set("mean", _channels("mean", self.mean))
        _set("std", _channels("std", self.std))
        if (self.mean is None) != (self.std is None):
            raise ValueError("mean and std go together: give both, or neither (no "
                             "normalisation)")
        if self.std is not None and min(self.std) <= 0:
            raise ValueError(f"std must be > 0, got {self.std}")
        _set("dtype", _dtype_name(self.dtype))
        if self.dtype == "uint8" and self.mean is not None:
            raise ValueError("normalised pixels are not uint8: with dtype='uint8' pass "
                             "mean=None, std=None")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")

    def _set(self, name: str, value) -> None:  # (frozen: only __post_init__ sets fields)
        object.__setattr__(self, name, value)

    @property
    def normalized(self) -> bool:
        """Whether images are normalised with ``mean`` and ``std``."""
        return self.mean is not None

    def replace(self, **changes) -> "TransformSpec":
        """A copy with ``changes`` (checked like a new spec).

        Args:
            **changes: fields and their new values.
        """
        return dataclasses.replace(self, **changes)

    def random(self, epoch: int, index: int) -> "SampleRandom | None":
        """The draws of sample ``index`` in ``epoch`` (None for evaluation: no randomness).

        Args:
            epoch: the epoch the sample is read in.
            index: the sample's global index.
        """
        return SampleRandom(self.seed, epoch, index) if self.train else None


def spec_of(spec: TransformSpec | None, *, normalize: bool | None = None,
            **fields) -> TransformSpec:
    """The spec a stage reads: ``spec``, or one built from the keyword arguments the stage was
    given (None: not given, the spec's default).  Both is a TypeError: which would win?

    Args:
        spec: a whole spec, or None.
        normalize: True: ImageNet's mean and std; False: none (mean and std None).
        **fields: spec fields, None where not given.
    """
    given = {name: value for name, value in fields.items() if value is not None}
    if normalize is not None:  # (mean and std None: no normalisation)
        given["mean"], given["std"] = (IMAGENET_MEAN, IMAGENET_STD) if normalize else (None, None)
    if spec is None:
        return TransformSpec(**given)
    if not isinstance(spec, TransformSpec):
        raise TypeError(f"spec must be a TransformSpec, got {type(spec).__name__}")
    if given:
        names = sorted({"normalize" if n in ("mean", "std") else n for n in given})
        raise TypeError(f"pass either spec= or {', '.join(n + '=' for n in names)}, not both "
                        "(the spec holds them)")
    return spec


def _integer(name: str, value) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _fraction(name: str, value) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        out = math.nan
    if not 0 < out <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return out


def _range(name: str, value) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (low, high) pair of numbers, got {value!r}") \
            from None
    if not (0 < lo <= hi and math.isfinite(hi)):
        raise ValueError(f"{name} must have 0 < low <= high, got {value!r}")
    return lo, hi


def _channels(name: str, value) -> tuple[float, float, float] | None:
    if value is None:
        return None
    try:
        out = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        out = ()
    if len(out) != 3 or not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name} must be three numbers (R, G, B) or None, got {value!r}")
    return out


def _dtype_name(dtype) -> str:
    """``"float32"`` for ``"float32"`` or ``torch.float32`` (whose str is ``"torch.float32"``)."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES} (or its torch.dtype), got {dtype!r}")
    return name


class SampleRandom:
    """Uniform floats from a hash of (seed, epoch, index, draw): cheap, and the same in any
    process or worker, so resumed epochs crop identically.

    Args:
        seed: the spec's seed.
        epoch: the epoch.
        index: the sample's global index.
    """

    __slots__ = ("key", "n")

    def __init__(self, seed: int, epoch: int, index: int):
        self.key = struct.pack("<qqq", seed, epoch, index)
        self.n = 0

    def uniform(self, lo: float = 0.0, hi: float = 1.0) -> float:
        """The next draw, uniform in [lo, hi).

        Args:
            lo: the low end.
            hi: the high end.
        """
        self.n += 1
        bits = xxhash.xxh3_64_intdigest(self.key + struct.pack("<q", self.n))
        return lo + (hi - lo) * (bits >> 11) / float(1 << 53)


@dataclass(frozen=True)
class Crop:
    """One sample's crop box in original pixels and whether it is flipped."""

    top: int
    left: int
    height: int
    width: int
    flip: bool

    @property
    def box(self) -> tuple[int, int, int, int]:
        """(top, left, height, width)."""
        return self.top, self.left, self.height, self.width


def plan_crop(height: int, width: int, spec: TransformSpec, rnd: SampleRandom | None) -> Crop:
    """The crop box and flip of an image of ``height`` x ``width``: the one function both the
    CPU and the GPU path call, so a sample crops and flips the same on either.  The box is drawn
    first (:func:`crop_box`), then the flip (:func:`should_flip`), from ``rnd``.

    Args:
        height: the image's height in pixels.
        width: its width.
        spec: the transform spec.
        rnd: the sample's draws (:meth:`TransformSpec.random`); None: no randomness.
    """
    top, left, ch, cw = crop_box(height, width, spec, rnd)
    return Crop(top, left, ch, cw, should_flip(rnd, spec))


def crop_box(height: int, width: int, spec: TransformSpec, rnd: SampleRandom | None
             ) -> tuple[int, int, int, int]:
    """(top, left, crop_height, crop_width) in original pixels; same rule as torchvision's
    RandomResizedCrop (10 tries, then a center crop at the nearest allowed ratio) for training,
    resize-then-center-crop for evaluation.

    Args:
        height: the image's height in pixels.
        width: its width.
        spec: the transform spec (its crop part).
        rnd: the sample's draws; None: evaluation's centre crop.
    """
    if spec.train and rnd is not None:
        return _random_box(height, width, spec, rnd)
    side = min(height, width) * spec.crop_fraction
    ch = cw = max(1, int(round(side)))
    return (height - ch) // 2, (width - cw) // 2, min(ch, height), min(cw, width)


def _random_box(height: int, width: int, spec: TransformSpec, rnd: SampleRandom
                ) -> tuple[int, int, int, int]:
    area = height * width
    log_lo, log_hi = math.log(spec.ratio[0]), math.log(spec.ratio[1])
    for _ in range(10):
        target = area * rnd.uniform(*spec.scale)
        aspect = math.exp(rnd.uniform(log_lo, log_hi))
        cw = int(round(math.sqrt(target * aspect)))
        ch = int(round(math.sqrt(target / aspect)))
        if 0 < cw <= width and 0 < ch <= height:
            top = int(rnd.uniform(0, height - ch + 1))
            left = int(rnd.uniform(0, width - cw + 1))
            return min(top, height - ch), min(left, width - cw), ch, cw
    in_ratio = width / height
    # at least one pixel: a 1-pixel-wide image under ratios of 3-4 would round to no rows
    if in_ratio < spec.ratio[0]:
        cw, ch = width, max(1, int(round(width / spec.ratio[0])))
    elif in_ratio > spec.ratio[1]:
        ch, cw = height, max(1, int(round(height * spec.ratio[1])))
    else:
        cw, ch = width, height
    return (height - ch) // 2, (width - cw) // 2, ch, cw


def should_flip(rnd: SampleRandom | None, spec: TransformSpec) -> bool:
    """Whether this sample is flipped horizontally (training with ``flip`` on: one draw).

    Args:
        rnd: the sample's draws (after the crop box's).
        spec: the transform spec.
    """
    return bool(spec.train and spec.flip and rnd is not None and rnd.uniform() < 0.5)
