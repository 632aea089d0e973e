"""Image trees as people have them: dotted, spaced and unicode names, upper-case
extensions, every image format, sidecars, OS junk, nested folders, broken images.  Every check
compares against what the test put in: sample count, bytes, labels, what peers see."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

import shardpack
from shardpack import format as fmt
from shardpack.core.errors import BrokenImageError, SourceError

from testbed import imagegen
from testbed.helpers import ROOT, read_tree, run_cli

CLASSES = ["n01440764", "n01443537"]

# (class, name, generator of the image bytes) for every image of the tree
IMAGE_NAMES = [
    (0, "n01440764_10026.JPEG", "jpeg_rgb"),
    (0, "IMG_2019.01.05_1234.jpg", "jpeg_rgb"),
    (0, "IMG_2019.01.05_1235.jpg", "jpeg_progressive"),
    (0, "photo.v2.final.png", "png_rgba"),
    (0, "Screen Shot 2020-05-05 at 5.05.05 PM.png", "png_palette"),
    (0, "ünïcödé bild.webp", "webp"),
    (0, "scan.2020.TIF", "tiff_8"),
    (0, "nested/deeper/IMG_0001.GIF", "gif"),
    (0, "nested/cmyk.Jpg", "jpeg_cmyk"),
    (1, "gray.jpeg", "jpeg_gray"),
    (1, "n01443537_2.JPEG", "jpeg_exif_thumbnail"),
    (1, "motion.photo.jpg", "jpeg_motion_photo"),
    (1, "deep16.png", "png_16"),
    (1, "scan16.tiff", "tiff_16"),
    (1, "bitmap.BMP", "bmp"),
    (1, "takeout.jpg", "jpeg_rgb"),
    (1, "png named as.jpg", "png_as_jpg"),
    (1, "palette.transparent.png", "png_palette_transparent"),
]
SIDECARS = {  # file -> the image key it joins, as (class, key without class)
    "IMG_2019.01.05_1235.json": b'{"iso": 100}',
    "photo.v2.final.txt": b"a caption",
    "takeout.jpg.json": b'{"takeout": true}',
}
JUNK = ["Thumbs.db", "desktop.ini", "README", "notes.txt", "orphan.json"]
BROKEN = {  # name -> generator of broken bytes
    "empty.jpg": "empty",
    "truncated.JPEG": "truncated_jpeg",
    "error page.png": "html_page",
    "cut png.png": "truncated_png",
    "cut webp.webp": "truncated_webp",
    "cut.gif.gif": "truncated_gif",
}


def valid_bytes(name: str) -> bytes:
    return imagegen.ALL_VALID[name][0]


def build_tree(root: Path, broken: bool = False) -> dict:
    """The messy tree; returns {key: {field: bytes}} of the samples it must give."""
    expected: dict[str, dict[str, bytes]] = {}
    for cls, name, gen in IMAGE_NAMES:
        path = root / CLASSES[cls] / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = valid_bytes(gen)
        path.write_bytes(data)
        stem, ext = name.rsplit(".", 1)
        expected[f"{CLASSES[cls]}/{stem}"] = {ext: data, "cls": str(cls).encode()}
    for name, data in SIDECARS.items():
        (root / CLASSES[0 if "IMG" in name or "photo" in name else 1] / name).write_bytes(data)
    expected["n01440764/IMG_2019.01.05_1235"]["json"] = SIDECARS["IMG_2019.01.05_1235.json"]
    expected["n01440764/photo.v2.final"]["txt"] = SIDECARS["photo.v2.final.txt"]
    expected["n01443537/takeout"]["jpg.json"] = SIDECARS["takeout.jpg.json"]
    for name in JUNK:
        (root / CLASSES[1] / name).write_bytes(b"junk")
    (root / CLASSES[0] / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    if broken:
        for name, gen in BROKEN.items():
            (root / CLASSES[1] / "bad" / name).parent.mkdir(exist_ok=True)
            (root / CLASSES[1] / "bad" / name).write_bytes(imagegen.ALL_BROKEN[gen][0])
    return expected


def dataset_samples(out) -> dict:
    reader = shardpack.open_reader(out)
    samples = {}
    for i in range(len(reader)):
        sample = reader.read_sample(i)
        key = sample.pop("__key__")
        samples[key] = {k: bytes(v) for k, v in sample.items()}
    return samples


@pytest.fixture
def messy(tmp_path):
    src = tmp_path / "src"
    return src, build_tree(src)


@pytest.mark.parametrize("shard_format", ["tar", "msgpack"])
def test_messy_tree_gives_one_sample_per_image_with_exact_bytes(messy, tmp_path, shard_format):
    src, expected = messy
    summary = shardpack.pack(src, tmp_path / "out", shard_format=shard_format, workers=2)
    assert summary.samples == len(IMAGE_NAMES) == len(expected)
    assert summary.images == len(IMAGE_NAMES)
    assert summary.ignored == len(JUNK)
    assert summary.hidden == 1
    line = summary.line()
    assert f"{len(IMAGE_NAMES)} image files found" in line and "into 1 shard " in line
    assert f"ignored {len(JUNK)} files" in line
    assert dataset_samples(tmp_path / "out") == expected
    manifest = json.loads((tmp_path / "out" / fmt.MANIFEST_NAME).read_text())
    assert manifest["classes"] == CLASSES and manifest["ignored"] == len(JUNK)
    assert manifest["group"] == "image"


def test_peers_see_the_same_sample_count(messy, tmp_path):
    import webdataset as wds

    src, expected = messy
    out = tmp_path / "out"
    shardpack.pack(src, out, shard_size="40KB", workers=1)
    tars = sorted(str(p) for p in out.glob("*.tar"))
    assert len(tars) > 1
    seen = list(wds.WebDataset(tars, shardshuffle=False))
    assert len(seen) == len(expected)
    # their keys are the escaped member stems; the bytes are ours
    reader = shardpack.open_reader(out)
    ours = [reader.read_sample(i) for i in range(len(reader))]
    assert [s["__key__"] for s in seen] == [
        fmt.tar_member_name(s["__key__"], "x")[:-2] for s in ours]
    # GNU tar / Python's tarfile read every member
    members = sum(len(tarfile.open(t).getnames()) for t in tars)
    assert members == sum(len(v) for v in expected.values())


def test_hugging_face_datasets_sees_the_same_sample_count(messy, tmp_path):
    import datasets  # a dev dependency: this test must not skip
    src, expected = messy
    out = tmp_path / "out"
    shardpack.pack(src, out, workers=1)
    names = json.loads((out / fmt.MANIFEST_NAME).read_text())["fields"]
    features = datasets.Features({n: datasets.Value("binary") for n in names
                                  if n not in ("json", "txt")})
    features["json"] = features["jpg.json"] = datasets.Value("string")
    features["txt"] = datasets.Value("string")
    features["cls"] = datasets.Value("int64")
    ds = datasets.load_dataset("webdataset", data_files={"train": [str(p) for p in
                                                                    out.glob("*.tar")]},
                               split="train", features=features,
                               cache_dir=str(tmp_path / "hf-cache"))
    assert len(ds) == len(expected)


def test_default_decode_reads_every_sample(messy, tmp_path):
    src, expected = messy
    shardpack.pack(src, tmp_path / "out", workers=1)
    ds = shardpack.ShardDataset(tmp_path / "out", batch_size=7, batched=True, shuffle=False,
                                decode=shardpack.CpuDecode(32, train=False))
    seen = 0
    for batch in ds:
        assert batch["image"].shape[1:] == (32, 32, 3)
        assert not batch["__bad__"].any(), list(batch["__key__"])
        assert int(batch["image"].float().std()) > 0
        seen += len(batch["__key__"])
    assert seen == len(expected)


def test_unpack_then_pack_round_trips(messy, tmp_path):
    src, expected = messy
    shardpack.pack(src, tmp_path / "a", workers=1)
    run_cli("unpack", tmp_path / "a", tmp_path / "files")
    files = read_tree(tmp_path / "files")
    assert not any(name.endswith(".cls") for name in files)
    assert "n01443537/takeout.jpg.json" in files  # the sidecar's own name comes back
    for key, fields in expected.items():
        for field, data in fields.items():
            if field != "cls":
                assert files[f"{key}.{field}"] == data
    shardpack.pack(tmp_path / "files", tmp_path / "b", workers=1)
    assert dataset_samples(tmp_path / "b") == expected


def test_index_grows_with_the_fields_a_sample_has(tmp_path):
    """Many field names across a shard must not cost every sample: 20 sidecar kinds, each in
    one sample, against the same tree with none."""
    jpg = valid_bytes("jpeg_rgb")
    for variant in ("plain", "sidecars"):
        root = tmp_path / variant / "c"
        root.mkdir(parents=True)
        for i in range(200):
            (root / f"img.{i:04d}.jpg").write_bytes(jpg)
            if variant == "sidecars" and i < 20:
                (root / f"img.{i:04d}.x{i}").write_bytes(b"side")
        shardpack.pack(root.parent, tmp_path / f"out-{variant}", workers=1)
    sizes = {v: json.loads((tmp_path / f"out-{v}" / fmt.MANIFEST_NAME).read_text())
             ["shards"][0]["index_bytes"] for v in ("plain", "sidecars")}
    # 20 extra fields present in 20 samples: a few hundred bytes more, not 200 x 20 x 16
    assert sizes["sidecars"] - sizes["plain"] < 20 * 40 + 400
    per_sample = sizes["plain"] / 200
    assert per_sample < 76 + len("c/img.0000") + 8


def test_two_thousand_dotted_names_are_two_thousand_samples(tmp_path):
    jpg = valid_bytes("jpeg_rgb")
    folder = tmp_path / "src" / "photos"
    folder.mkdir(parents=True)
    for i in range(2000):
        (folder / f"IMG_2019.01.{i % 28 + 1:02d}_{i}.jpg").write_bytes(jpg)
    summary = shardpack.pack(tmp_path / "src", tmp_path / "out", workers=1)
    assert summary.samples == 2000
    with pytest.raises(SourceError, match=r"group=\"image\""):
        shardpack.pack(tmp_path / "src", tmp_path / "out2", group="webdataset", workers=1)
    result = run_cli("pack", tmp_path / "src", tmp_path / "out3", "--group", "webdataset",
                     "-q", ok=False)
    assert result.exit_code == 2
    assert "--group image" in result.output and "IMG_2019" in result.output
    assert not (tmp_path / "out3" / fmt.MANIFEST_NAME).exists()


def wds_tree(src: Path, count: int, seg: str, json_too: bool = False) -> Path:
    """A tree grouped WebDataset-style: NNNN.jpg + NNNN.seg.png (+ NNNN.json)."""
    src.mkdir()
    for i in range(count):
        (src / f"{i:04d}.jpg").write_bytes(valid_bytes("jpeg_rgb"))
        (src / f"{i:04d}.seg.png").write_bytes(valid_bytes(seg))
        if json_too:
            (src / f"{i:04d}.json").write_bytes(b"{}")
    return src


def test_webdataset_grouping_still_groups_by_first_dot(tmp_path):
    src = wds_tree(tmp_path / "src", 30, "png_rgba", json_too=True)
    summary = shardpack.pack(src, tmp_path / "out", workers=1)
    assert summary.samples == 30
    assert summary.fields == ["jpg", "json", "seg.png"]


def test_broken_images_stop_the_pack_naming_the_file(tmp_path):
    src = tmp_path / "src"
    build_tree(src, broken=True)
    result = run_cli("pack", src, tmp_path / "out", "-q", "--workers", "1", ok=False)
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "bad/" in lines[0], result.output
    assert not (tmp_path / "out" / fmt.MANIFEST_NAME).exists()
    with pytest.raises(BrokenImageError):
        shardpack.pack(src, tmp_path / "out2", workers=1)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_kind_is_caught(tmp_path, name):
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "good.jpg").write_bytes(valid_bytes("jpeg_rgb"))
    (src / name).write_bytes(imagegen.ALL_BROKEN[BROKEN[name]][0])
    with pytest.raises(BrokenImageError) as info:
        shardpack.pack(src.parent, tmp_path / "out", workers=1)
    assert name in str(info.value)
    summary = shardpack.pack(src.parent, tmp_path / "out2", workers=1, on_error="skip")
    assert summary.samples == 1 and summary.skipped == {"broken-image": 1}


def test_skip_bad_counts_broken_images(tmp_path):
    src = tmp_path / "src"
    expected = build_tree(src, broken=True)
    summary = shardpack.pack(src, tmp_path / "out", workers=2, on_error="skip")
    assert summary.samples == len(expected)
    assert summary.skipped == {"broken-image": len(BROKEN)}
    assert f"skipped {len(BROKEN)} broken-image" in summary.line()
    assert dataset_samples(tmp_path / "out") == expected


def test_full_check_and_verify_decode_catch_a_corrupt_but_complete_image(tmp_path):
    """A PNG whose compressed pixel data is scrambled keeps every chunk in place (the quick
    check passes) but does not decode: the full check and verify --decode name it."""
    import struct

    from shardpack.images.content import check_image

    good = valid_bytes("png_rgb")
    corrupt = bytearray(good)
    at = corrupt.index(b"IDAT")
    length = struct.unpack(">I", corrupt[at - 4:at])[0]
    for k in range(at + 6, at + length):
        corrupt[k] ^= 0x5A
    corrupt = bytes(corrupt)
    assert check_image(corrupt, "png") is None  # structurally whole
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "good.png").write_bytes(good)
    (src / "bad.png").write_bytes(corrupt)
    shardpack.pack(src.parent, tmp_path / "out", workers=1)  # quick: passes
    with pytest.raises(BrokenImageError, match="bad.png"):
        shardpack.pack(src.parent, tmp_path / "out2", workers=1, check="full")
    result = run_cli("verify", tmp_path / "out", "--decode", ok=None)
    assert result.exit_code == 1 and "c/bad" in result.output and "c/good" not in result.output
    assert run_cli("verify", tmp_path / "out").exit_code == 0


def test_two_images_with_one_key_are_refused(tmp_path):
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "x.jpg").write_bytes(valid_bytes("jpeg_rgb"))
    (src / "x.png").write_bytes(valid_bytes("png_rgba"))
    with pytest.raises(SourceError, match="two images with one key 'c/x'"):
        shardpack.pack(src.parent, tmp_path / "out", workers=1)
    summary = shardpack.pack(src.parent, tmp_path / "out2", workers=1, on_error="skip")
    assert summary.samples == 1 and summary.skipped == {"duplicate-key": 1}


def test_out_inside_src_is_left_out(messy, tmp_path):
    src, expected = messy
    out = src / "n01440764" / "shards"
    first = shardpack.pack(src, out, workers=1)
    assert first.samples == len(expected)
    assert any("left the output folder out" in n for n in first.notes)
    again = shardpack.pack(src, out, workers=1, overwrite=True)
    assert again.samples == len(expected)
    assert dataset_samples(out) == expected


def jpeg_folder(tmp_path, count: int, empty: str) -> Path:
    """SRC with one class folder of ``count`` JPEGs and one empty (broken) image ``empty``."""
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    for i in range(count):
        (src / f"{i:03d}.jpg").write_bytes(valid_bytes("jpeg_rgb"))
    (src / empty).write_bytes(b"")
    return src


def test_resume_refusal_names_the_option(tmp_path):
    src = jpeg_folder(tmp_path, 10, "zzz.jpg")
    out = tmp_path / "out"
    run_cli("pack", src.parent, out, "-q", "--workers", "1", "--max-samples", "3", ok=False)
    state_path = out / ".shardpack-pack.json"
    state = json.loads(state_path.read_text())
    del state["failed"]  # as an interrupted run leaves it
    state_path.write_text(json.dumps(state))
    result = run_cli("pack", src.parent, out, "-q", "--resume", "--check", "full", ok=False)
    assert result.exit_code == 2
    assert "--check was 'quick', now 'full'" in result.output
    assert "--max-samples was 3, now None" in result.output
    # after a failed run (nothing published) --resume with other options starts afresh
    state_path.write_text(json.dumps({**state, "failed": "an error"}))
    (src / "zzz.jpg").unlink()
    result = run_cli("pack", src.parent, out, "-q", "--resume", "--check", "full")
    assert "removed what a failed pack left" in result.output
    assert len(shardpack.open_reader(out)) == 10


@pytest.fixture
def mixed_ds(messy, tmp_path):
    """The messy tree packed: .JPEG, .jpg, .Jpg, .png, .webp, .GIF, .BMP, .TIF in one dataset."""
    src, expected = messy
    out = tmp_path / "ds"
    shardpack.pack(src, out, workers=1, max_samples=7)
    return out, expected


def _readme_training_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Train on it"):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("```", start)]


def test_readme_training_snippet_runs_on_mixed_formats(mixed_ds, tmp_path):
    """The README's training snippet as written, on CPU: only the path, the device and the
    worker count differ; the loop body counts what it trains on."""
    import subprocess
    import sys

    ds, expected = mixed_ds
    code = _readme_training_snippet()
    assert 'device="cuda"' in code and '"shards/train"' in code and "keep = " in code
    assert "\nepochs = 90\n" in code  # the snippet defines what it uses: it must run as is
    code = (code.replace('"shards/train"', repr(str(ds))).replace('device="cuda"', 'device="cpu"')
            .replace("\nepochs = 90\n", "\nepochs = 2\n")
            .replace("num_workers=8", "num_workers=2").replace("batch_size=256", "batch_size=5")
            .replace("CpuDecode(224", "CpuDecode(32"))
    code = code.replace("        ...\n", "        seen.append((len(images), int(keep.sum())))\n")
    script = f"seen = []\n{code}\nprint('SEEN', sum(n for n, _ in seen))\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"SEEN {2 * len(expected)}" in done.stdout  # every image, both epochs, none masked


def test_bench_decode_cpu_on_mixed_formats(mixed_ds):
    ds, expected = mixed_ds
    out = run_cli("bench", ds, "--batch-size", "6", "--workers", "1", "--decode", "cpu",
                  "--size", "32", "--step-ms", "1", "-q").output
    assert f"({len(expected)} samples," in out and "undecodable" not in out, out


def test_train_example_on_mixed_formats(mixed_ds, tmp_path):
    import subprocess
    import sys

    ds, expected = mixed_ds
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "train_example.py"), str(ds),
                           "--out", str(tmp_path / "run"), "--epochs", "1", "--batch-size", "4",
                           "--size", "32", "--workers", "1", "--log-seen"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    seen = [i for line in (tmp_path / "run" / "seen-rank0.jsonl").read_text().splitlines()
            for i in json.loads(line)["ids"]]
    assert sorted(seen) == list(range(len(expected)))


def test_field_census_counts_dotted_names_only():
    from shardpack.write.plan import FieldCensus
    from shardpack.write.samples import SourceField, SourceSample

    def sample(key, *names):
        return SourceSample(key, tuple(SourceField(n, "/x", 1, 0) for n in names))

    census = FieldCensus()  # WebDataset samples: dotted names repeat in every sample
    for i in range(100):
        census.add(sample(f"{i:04d}", "jpg", "seg.png", "depth.png", "json"))
    census.check()
    census = FieldCensus()  # 3 folded camera files: under the threshold, accepted
    census.add(sample("IMG_2019", *(f"01.0{d}_1.jpg" for d in range(3))))
    census.check()
    census = FieldCensus()  # 4 of them: refused, naming a sample and a field
    census.add(sample("IMG_2019", *(f"01.0{d}_1.jpg" for d in range(4))))
    with pytest.raises(SourceError, match=r"sample 'IMG_2019' has field '01.00_1.jpg'"):
        census.check()
    census = FieldCensus()  # numbered frames folded per folder repeat across folders...
    for folder in range(3):
        census.add(sample(f"v{folder}/frame", *(f"{i:04d}.jpg" for i in range(200))))
    census.check()
    with pytest.raises(SourceError, match="257 image fields"):  # ...but not past 256 a sample
        census.add(sample("v9/frame", *(f"{i:04d}.jpg" for i in range(257))))


def test_decode_picks_the_primary_image_of_a_webdataset_sample(tmp_path):
    src = wds_tree(tmp_path / "src", 6, "png_palette")
    shardpack.pack(src, tmp_path / "ds", workers=1)
    ds = shardpack.ShardDataset(tmp_path / "ds", batch_size=6, batched=True, shuffle=False,
                                decode=shardpack.CpuDecode(16, train=False))
    (batch,) = list(ds)
    assert not batch["__bad__"].any() and "jpg" not in batch
    assert bytes(batch["seg.png"].item(0)) == valid_bytes("png_palette")  # left for the user
    from shardpack.transforms.decode import CropOptions, decode_image

    want = decode_image(valid_bytes("jpeg_rgb"), CropOptions(16, train=False))
    assert (batch["image"][0].numpy() == want).all()  # the jpg, not the segmentation map
    for i in range(6):
        (src / f"{i:04d}.png").write_bytes(valid_bytes("png_rgb"))
    shardpack.pack(src, tmp_path / "ds2", workers=1)
    ds = shardpack.ShardDataset(tmp_path / "ds2", batch_size=6, batched=True,
                                decode=shardpack.CpuDecode(16, on_error="skip"))
    with pytest.raises(ValueError, match=r"3 image fields \(jpg, png, seg.png\).*field="):
        list(ds)  # jpg or png: a question for the user, never silently zeros


def test_a_failed_run_is_cleared_by_any_rerun_an_interrupted_one_is_not(tmp_path):
    """A failed pack published nothing: a rerun into the same OUT, with the same or changed
    options, starts afresh.  An interrupted run (no failure mark: killed, or still running)
    stays refused and untouched, naming --resume."""
    src = jpeg_folder(tmp_path, 12, "zzz.jpg")
    out = tmp_path / "out"
    args = ("pack", src.parent, out, "-q", "--workers", "1", "--max-samples", "4")
    result = run_cli(*args, ok=False)
    assert result.exit_code == 2 and "rerun into the same OUT" in result.output
    assert len(list(out.glob("*.idx"))) == 3  # complete shards stay, for --resume
    state_path = out / ".shardpack-pack.json"
    state = json.loads(state_path.read_text())
    assert "zzz.jpg" in state["failed"]
    before = sorted(p.name for p in out.iterdir())
    # an interrupted run (no failure mark: killed, or still running): refused, nothing removed
    state_path.write_text(json.dumps({k: v for k, v in state.items() if k != "failed"}))
    result = run_cli(*args, ok=False)
    assert result.exit_code == 2 and "--resume" in result.output
    assert sorted(p.name for p in out.iterdir()) == before
    # the failed run with other options (--skip-bad): starts afresh
    state_path.write_text(json.dumps(state))
    result = run_cli(*args, "--skip-bad")
    assert "failed pack" in result.output and "--resume would" not in result.output
    assert len(shardpack.open_reader(out)) == 12
    # the same command once the source is fixed, after another failure: starts afresh too
    (src / "zzz.jpg").write_bytes(b"")
    run_cli(*args, "--overwrite", ok=False)
    (src / "zzz.jpg").unlink()
    assert "--resume would have kept" in run_cli(*args).output
    assert len(shardpack.open_reader(out)) == 12


class _Bar:
    """Records what the packer does to its progress bar."""

    def __init__(self):
        self.n, self.total, self.updates = 0, 0, 0

    def update(self, k):
        self.n += k
        self.updates += 1

    def refresh(self):
        pass

    def set_postfix_str(self, text):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_moves_with_files_inside_a_shard(tmp_path, monkeypatch, workers):
    import importlib

    from shardpack.write import writer

    pack_module = importlib.import_module("shardpack.write.pack")

    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    for i in range(300):
        (src / f"{i:03d}.jpg").write_bytes(valid_bytes("jpeg_rgb"))
    bar = _Bar()
    monkeypatch.setattr(pack_module, "_progress", lambda enabled: bar if enabled else None)
    monkeypatch.setattr(writer, "PROGRESS_EVERY", 16)
    summary = shardpack.pack(src.parent, tmp_path / "out", workers=workers, progress=True,
                             max_samples=150)
    assert summary.shards == 2 and bar.n == bar.total == 300
    if workers == 1:  # inline: the writer moves the bar every 16 samples
        assert bar.updates >= 300 // 16
