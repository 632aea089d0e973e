"""The transform spec: one frozen value read by CpuDecode, GpuDecoder and DeviceLoader.  The same
crop box and flip for a (seed, epoch, sample) on the CPU and the GPU path (the GPU path driven by
its CPU stand-in for nvJPEG, so no CUDA is needed), the spec's normalisation, dtype and layout on
the device, and the old keyword spellings kept as deprecated aliases."""

import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import shardpack
from shardpack import CpuDecode, DeviceLoader, ShardDataset
from shardpack.loader.stages import EpochAware, EpochStage, tell_epoch
from shardpack.transforms import decode as cpu_path
from shardpack.transforms import gpudecode as gpu_path
from shardpack.transforms.decode import CropOptions, decode_image
from shardpack.transforms.gpudecode import GpuDecoder, standin_backend
from shardpack.transforms.spec import Crop, TransformSpec, plan_crop, spec_of

from testbed.helpers import make_tree
from testbed.imagegen import ramp_photo


@pytest.fixture(scope="module")
def small_ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("specds")
    src = make_tree(root / "src", {f"c{i % 2}/{i:02d}.jpg": ramp_photo(i, 64 + 8 * i, 48)
                                   for i in range(8)})
    shardpack.pack(src, root / "ds", workers=1, max_samples=4)
    return root / "ds"


def _bytes_batch(blobs):
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blobs], out=offsets[1:])
    return torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8), offsets.tolist()


# -- the spec itself ------------------------------------------------------------------------------

def test_spec_is_frozen_hashable_and_checked():
    spec = TransformSpec(32, dtype=torch.bfloat16, scale=[0.5, 1], layout="NHWC")
    assert spec.dtype == "bfloat16" and spec.scale == (0.5, 1.0) and hash(spec) == hash(
        TransformSpec(32, dtype="bfloat16", scale=(0.5, 1.0), layout="NHWC"))
    with pytest.raises(AttributeError):
        spec.size = 16
    assert CropOptions is TransformSpec  # the older name
    for bad, message in [(dict(size=0), "size"), (dict(scale=(1, 0.5)), "scale"),
                         (dict(ratio=(0, 1)), "ratio"), (dict(mean=None), "mean and std"),
                         (dict(std=(1, 0, 1)), "std must be > 0"), (dict(dtype="int7"), "dtype"),
                         (dict(dtype="uint8"), "not uint8"), (dict(layout="CHW"), "layout"),
                         (dict(crop_fraction=0), "crop_fraction"), (dict(seed=1.5), "seed"),
                         (dict(mean=(1, 2)), "three numbers")]:
        with pytest.raises(ValueError, match=message):
            TransformSpec(**bad)
    assert TransformSpec(dtype="uint8", mean=None, std=None).normalized is False


def test_keywords_or_a_spec_not_both():
    spec = TransformSpec(48, seed=5, flip=False)
    assert CpuDecode(spec=spec).spec is spec
    assert CpuDecode(48, seed=5, flip=False).spec == spec
    assert spec_of(None, normalize=False).mean is None
    with pytest.raises(TypeError, match="either spec= or size="):
        CpuDecode(64, spec=spec)
    with pytest.raises(TypeError, match="either spec= or normalize="):
        DeviceLoader([], spec=spec, normalize=False)
    assert DeviceLoader([], size=48, seed=5, flip=False).spec == spec


# -- one crop rule for both paths -----------------------------------------------------------------

def _recording(monkeypatch, module, log):
    """Wrap ``module``'s plan_crop: each plan is logged under the sample's draw key."""
    def plan(height, width, spec, rnd):
        crop = plan_crop(height, width, spec, rnd)
        log[(rnd.key if rnd is not None else None, height, width)] = crop
        return crop

    monkeypatch.setattr(module, "plan_crop", plan)


@pytest.mark.parametrize("train", [True, False])
def test_cpu_and_gpu_paths_plan_the_same_crops_and_flips(monkeypatch, train):
    blobs = [ramp_photo(i, 200 + 30 * i, 150 + 10 * i) for i in range(10)]
    spec = TransformSpec(40, train=train, seed=11)
    ids, epoch = [7 + 3 * i for i in range(len(blobs))], 4
    cpu_plans, gpu_plans = {}, {}
    _recording(monkeypatch, cpu_path, cpu_plans)
    _recording(monkeypatch, gpu_path, gpu_plans)
    cpu = [decode_image(b, spec, spec.random(epoch, i)) for b, i in zip(blobs, ids, strict=True)]
    data, offsets = _bytes_batch(blobs)
    dec = GpuDecoder(torch.device("cpu"), spec, backend=standin_backend())
    gpu, bad = dec(data, offsets, ids, [f"k{i}" for i in ids], epoch=epoch, stream=None)
    assert not bad and len(cpu_plans) == len(gpu_plans) == len(blobs)
    assert cpu_plans == gpu_plans  # the same boxes and flips, for the same draws
    flips = [crop.flip for crop in cpu_plans.values()]
    if train:
        assert any(flips) and not all(flips)  # both kinds, so the flip is shown to be applied
    else:
        assert not any(flips) and len({c.box for c in cpu_plans.values()}) == len(blobs)
    # the pixels agree within 16/255 (a DCT-scaled decode, another resize kernel), a flipped
    # image is nearer the CPU's flipped one than its mirror
    for i, (c, g) in enumerate(zip(cpu, gpu.numpy(), strict=True)):
        same = np.abs(g.astype(int) - c.astype(int)).mean()
        mirrored = np.abs(g.astype(int) - c[:, ::-1].astype(int)).mean()
        assert same < 16 and (not flips[i] or same < mirrored), (i, same, mirrored)


def test_plan_crop_draws_the_box_then_the_flip():
    spec = TransformSpec(16, seed=2)
    rnd = spec.random(3, 9)
    crop = plan_crop(100, 80, spec, rnd)
    assert isinstance(crop, Crop) and rnd.n >= 3  # box draws, then one for the flip
    assert plan_crop(100, 80, spec, spec.random(3, 9)) == crop  # a pure function of the key
    assert not plan_crop(100, 80, TransformSpec(16, seed=2, flip=False), spec.random(3, 9)).flip
    assert spec.replace(train=False).random(3, 9) is None


# -- the device side: normalisation, dtype, layout ------------------------------------------------

def test_device_loader_applies_the_specs_normalisation_dtype_and_layout(small_ds):
    spec = TransformSpec(24, seed=3, mean=(0.5, 0.25, 0.0), std=(0.5, 0.25, 1.0),
                         dtype="float64", layout="NHWC")
    raw = spec.replace(mean=None, std=None, dtype="uint8")

    def loader(decode_on, spec, decode=None):
        ds = ShardDataset(small_ds, batch_size=4, batched=True, shuffle=False, decode=decode)
        return DeviceLoader(DataLoader(ds, batch_size=None), device="cpu", decode_on=decode_on,
                            spec=spec, decode_backend=standin_backend())

    plain = [b["image"] for b in loader("cpu", raw, CpuDecode(spec=raw))]
    cpu = [b["image"] for b in loader("cpu", spec, CpuDecode(spec=spec))]
    gpu = [b["image"] for b in loader("gpu", spec)]
    mean = torch.tensor([127.5, 63.75, 0.0], dtype=torch.float64)
    std = torch.tensor([127.5, 63.75, 255.0], dtype=torch.float64)
    for p, c, g in zip(plain, cpu, gpu, strict=True):
        assert p.dtype == torch.uint8 and p.shape == (4, 24, 24, 3)
        assert c.dtype == g.dtype == torch.float64 and c.shape == g.shape == (4, 24, 24, 3)
        assert torch.equal(c, (p.to(torch.float64) - mean) / std)
        assert ((c - g) * std).abs().mean() < 12  # same crops and flips, other decoders
    nchw = next(iter(loader("cpu", TransformSpec(24), CpuDecode(24))))["image"]
    assert nchw.shape == (4, 3, 24, 24) and nchw.is_contiguous(memory_format=torch.channels_last)


def test_cpu_normalisation_in_float32_matches_the_formula_in_both_layouts(small_ds):
    """float32 on the CPU is normalised image by image in one fused op: the same values (to
    float32 rounding) as the plain formula, in the layout and memory format the spec asks."""
    for layout in ("NCHW", "NHWC"):
        spec = TransformSpec(24, seed=3, mean=(0.5, 0.25, 0.1), std=(0.5, 0.25, 0.9),
                             layout=layout)
        raw = spec.replace(mean=None, std=None, dtype="uint8", layout="NHWC")

        def images(spec):
            ds = ShardDataset(small_ds, batch_size=4, batched=True, shuffle=False,
                              decode=CpuDecode(spec=spec))
            return [b["image"] for b in DeviceLoader(DataLoader(ds, batch_size=None),
                                                     device="cpu", spec=spec)]

        mean = torch.tensor([127.5, 63.75, 25.5])
        std = torch.tensor([127.5, 63.75, 229.5])
        for p, c in zip(images(raw), images(spec), strict=True):
            want = (p.to(torch.float32) - mean) / std
            if layout == "NCHW":
                want = want.permute(0, 3, 1, 2)
                assert c.is_contiguous(memory_format=torch.channels_last)
            assert c.dtype == torch.float32 and c.shape == want.shape
            assert torch.allclose(c, want, atol=1e-5)


# -- old spellings and epoch-aware stages ---------------------------------------------------------

def test_old_keyword_spellings_warn_and_still_work(small_ds):
    with pytest.warns(DeprecationWarning, match="decode= is deprecated, use decode_on="):
        dl = DeviceLoader([], device="cpu", decode="cpu", prefetch_batches=3)
    assert dl.decode_on == "cpu" and dl.prefetch_batches == 3
    with pytest.warns(DeprecationWarning, match="prefetch= is deprecated, use prefetch_batches="):
        assert DeviceLoader([], "cpu", None, prefetch=5).prefetch_batches == 5
    with pytest.warns(DeprecationWarning, match="prefetch= is deprecated, use prefetch_shards="):
        ds = ShardDataset(small_ds, prefetch=0)
    assert ds.reader.prefetch == 0
    with pytest.raises(TypeError, match="got both"):
        ShardDataset(small_ds, prefetch=0, prefetch_shards=1)


def test_epoch_aware_stages_are_told_the_epoch():
    class Crops(EpochStage):
        def __call__(self, batch):
            return batch

    class Old:  # the older form: an epoch attribute only
        epoch = 0

    crops, old = Crops(), Old()
    assert isinstance(crops, EpochAware) and isinstance(CpuDecode(), EpochAware)
    assert not isinstance(old, EpochAware) and not isinstance(len, EpochAware)
    tell_epoch(crops, 3)
    with pytest.warns(DeprecationWarning, match="begin"):
        tell_epoch(old, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tell_epoch(None, 5)
        tell_epoch(len, 5)
    assert crops.epoch == 3 and old.epoch == 4


def test_the_fallback_crop_keeps_at_least_one_pixel():
    """Ratios a one-pixel-wide image cannot meet: the centre crop rounds to at least a pixel (it
    rounded to none, and the resize raised)."""
    import numpy as np

    from shardpack.images.formats.raw import pixels_npy
    from shardpack.transforms.decode import decode_image
    from shardpack.transforms.spec import TransformSpec, plan_crop

    spec = TransformSpec(size=8, ratio=(3.0, 4.0), scale=(0.99, 1.0), mean=None, std=None,
                         dtype="uint8")
    for epoch in range(20):
        crop = plan_crop(50, 1, spec, spec.random(epoch, 0))
        assert crop.height >= 1 and crop.width == 1
        image = decode_image(pixels_npy(np.full((50, 1, 3), 9, np.uint8)), spec,
                             spec.random(epoch, 0))
        assert image.shape == (8, 8, 3) and (image == 9).all()
