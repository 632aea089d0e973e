"""Trees as users assemble them: folder links inside and outside SRC, empty class folders, a
dataset packed inside SRC, many skipped entries (docs/packing.md)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import shardpack
from shardpack import format as fmt
from shardpack.core.errors import SourceError

from testbed import imagegen
from testbed.helpers import run_cli

JPEG = imagegen.ALL_VALID["jpeg_rgb"][0]
PNG = imagegen.ALL_VALID["png_rgb"][0]


def images(folder: Path, count: int, prefix: str = "img", data: bytes = JPEG) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / f"{prefix}{i:03d}.jpg").write_bytes(data)


def keys_and_labels(out) -> dict[str, int]:
    reader = shardpack.open_reader(out)
    got = {}
    for i in range(len(reader)):
        sample = reader.read_sample(i)
        got[sample["__key__"]] = int(bytes(sample["cls"]))
    return got


def imagefolder_labels(src: Path, allow_empty: bool = False) -> dict[str, int]:
    """What torchvision's ImageFolder gives, written out from its rules (torchvision does not
    import beside this torch): classes = sorted top-level folders (links followed), every
    image file below a class folder (os.walk, links followed) a sample, an empty class refused
    unless ``allow_empty``.  Keys as shardpack writes them: path without the extension."""
    classes = sorted(e.name for e in os.scandir(src) if e.is_dir())
    out = {}
    for idx, name in enumerate(classes):
        found = 0
        for root, _, files in sorted(os.walk(src / name, followlinks=True)):
            for f in files:
                if f.lower().endswith((".jpg", ".jpeg", ".png")):
                    rel = os.path.relpath(os.path.join(root, f), src)
                    out[rel.rsplit(".", 1)[0]] = idx
                    found += 1
        if not found and not allow_empty:
            raise FileNotFoundError(f"Found no valid file for the classes {name}")
    return out


# -- links ----------------------------------------------------------------------------------------

@pytest.fixture
def linked_tree(tmp_path):
    """SRC with class folders a (real), b (a link to a folder outside SRC), c (real, holding a
    link to a folder outside and a file link inside SRC)."""
    outside = tmp_path / "elsewhere"
    images(outside / "b-photos", 3)
    images(outside / "more", 2, "more")
    src = tmp_path / "src"
    images(src / "a", 2)
    images(src / "c", 1)
    (src / "b").symlink_to(outside / "b-photos", target_is_directory=True)
    (src / "c" / "more").symlink_to(outside / "more", target_is_directory=True)
    (src / "c" / "alias.jpg").symlink_to(src / "a" / "img000.jpg")  # inside SRC: fine
    return src


def test_a_class_folder_linked_from_outside_is_refused_naming_the_link(linked_tree, tmp_path):
    result = run_cli("pack", linked_tree, tmp_path / "out", "-q", "--workers", "1", ok=False)
    assert result.exit_code == 2
    assert f"{linked_tree}/b: folder link points outside the source" in result.output
    assert not (tmp_path / "out" / fmt.MANIFEST_NAME).exists()


def test_skip_bad_counts_outside_folder_links(linked_tree, tmp_path):
    out = tmp_path / "out"
    summary = shardpack.pack(linked_tree, out, workers=1, on_error="skip")
    assert summary.skipped == {"link-outside": 2}  # b, and c/more
    assert summary.classes == ["a", "c"]
    assert sorted(keys_and_labels(out)) == ["a/img000", "a/img001", "c/alias", "c/img000"]
    report = [json.loads(line) for line in (out / fmt.SKIPS_NAME).read_text().splitlines()]
    assert {(r["reason"], r["path"]) for r in report} == {
        ("link-outside", f"{linked_tree}/b"), ("link-outside", f"{linked_tree}/c/more")}


def test_follow_links_packs_outside_folders_and_counts_them(linked_tree, tmp_path):
    out = tmp_path / "out"
    result = run_cli("pack", linked_tree, out, "-q", "--workers", "1", "--follow-links")
    assert "followed 2 links leading outside SRC" in result.output
    got = keys_and_labels(out)
    assert got == imagefolder_labels(linked_tree)  # torchvision follows links too
    assert got["b/img002"] == 1 and got["c/more/more001"] == 2
    assert shardpack.open_reader(out).read_sample(0)["jpg"] == JPEG


def test_class_folders_that_are_links_group_one_sample_per_image(tmp_path):
    """--group auto looks through folder links: dotted names stay whole keys."""
    outside = tmp_path / "elsewhere"
    images(outside / "x", 2, "IMG_2019.01.")
    src = tmp_path / "src"
    src.mkdir()
    (src / "x").symlink_to(outside / "x", target_is_directory=True)
    out = tmp_path / "out"
    shardpack.pack(src, out, workers=1, follow_links=True)
    assert sorted(keys_and_labels(out)) == ["x/IMG_2019.01.000", "x/IMG_2019.01.001"]


@pytest.mark.parametrize("follow", [False, True])
def test_a_link_loop_is_an_error_naming_it(tmp_path, follow):
    src = tmp_path / "src"
    images(src / "a" / "sub", 1)
    (src / "a" / "sub" / "up").symlink_to(src / "a", target_is_directory=True)
    with pytest.raises(SourceError, match=r"a/sub/up: symlink loop: links back to .*/a\b"):
        shardpack.pack(src, tmp_path / "out", workers=1, follow_links=follow)
    outside = tmp_path / "outside"
    images(outside, 1)
    (outside / "back").symlink_to(outside, target_is_directory=True)
    shutil.rmtree(src / "a" / "sub")
    (src / "a" / "out").symlink_to(outside, target_is_directory=True)
    with pytest.raises(SourceError, match=r"a/out/back: symlink loop"):
        shardpack.pack(src, tmp_path / "out2", workers=1, follow_links=True)


# -- classes as torchvision gives them ------------------------------------------------------------

@pytest.fixture
def tree_with_empty_class(tmp_path):
    src = tmp_path / "src"
    images(src / "ant", 2)
    (src / "bee").mkdir(parents=True)
    (src / "bee" / "Thumbs.db").write_bytes(b"junk")  # junk only: still empty
    images(src / "cat", 3)
    (src / "dog" / "nested").mkdir(parents=True)  # only an empty subfolder
    images(src / "eel", 1, data=PNG)
    return src


def test_an_empty_class_folder_is_an_error_naming_it(tree_with_empty_class, tmp_path):
    with pytest.raises(FileNotFoundError):  # what torchvision says about this tree
        imagefolder_labels(tree_with_empty_class)
    result = run_cli("pack", tree_with_empty_class, tmp_path / "out", "-q", ok=False)
    assert result.exit_code == 2
    assert f"{tree_with_empty_class}/bee: class folder 'bee' holds no samples" in result.output
    assert "--allow-empty-classes" in result.output
    assert not (tmp_path / "out" / fmt.MANIFEST_NAME).exists()


@pytest.mark.parametrize("engine", ["local", "inline"])
def test_allow_empty_classes_keeps_torchvision_labels(tree_with_empty_class, tmp_path, engine):
    out = tmp_path / "out"
    workers = 1 if engine == "inline" else 2
    summary = shardpack.pack(tree_with_empty_class, out, workers=workers,
                             allow_empty_classes=True)
    assert summary.classes == ["ant", "bee", "cat", "dog", "eel"]
    assert keys_and_labels(out) == imagefolder_labels(tree_with_empty_class, allow_empty=True)


def test_labels_match_hugging_face_imagefolder(tmp_path):
    """Hugging Face's imagefolder and torchvision's ImageFolder agree on trees without empty
    folders, and so does shardpack: every sample's label, not only the class list.  (Hugging
    Face labels only trees whose images lie at one depth.)"""
    import datasets  # a dev dependency: this test must not skip

    src = tmp_path / "src"
    for i, name in enumerate(["Zebra", "ant", "b.c", "bee", "ünï", "10", "9"]):
        images(src / name, 2 + i % 3, f"{name}-")
    (src / ".hidden").mkdir()  # not a class for either loader
    (src / ".hidden" / "x.jpg").write_bytes(JPEG)
    out = tmp_path / "out"
    summary = shardpack.pack(src, out, workers=1)
    assert any("hidden top-level folder" in n and ".hidden" in n for n in summary.notes)
    ds = datasets.load_dataset("imagefolder", data_dir=str(src), split="train",
                               cache_dir=str(tmp_path / "hf-cache"))
    names = ds.features["label"].names
    hf = sorted((names[row["label"]], row["image"].size) for row in ds)
    got = keys_and_labels(out)
    classes = json.loads((out / fmt.MANIFEST_NAME).read_text())["classes"]
    assert classes == names
    assert sorted((classes[label], (64, 48)) for label in got.values()) == \
        sorted((n, (64, 48)) for n, _ in hf)
    assert len(got) == len(ds)
    # torchvision alone makes a hidden folder a class (docs/packing.md): without it, the same
    shutil.rmtree(src / ".hidden")
    assert imagefolder_labels(src) == got


# -- a dataset inside SRC -------------------------------------------------------------------------

def test_a_dataset_inside_src_is_left_out_and_named(tmp_path):
    src = tmp_path / "photos"
    images(src / "cat", 3)
    images(src / "dog", 2)
    first = shardpack.pack(src, src / "shards", workers=1)  # OUT inside SRC
    assert first.classes == ["cat", "dog"]
    images(src / "dog" / "old-pack-src", 1)
    shardpack.pack(src / "dog" / "old-pack-src", src / "dog" / "packed", workers=1)
    result = run_cli("pack", src, tmp_path / "again", "-q", "--workers", "1")
    assert "left out 2 shardpack datasets inside SRC" in result.output
    assert f"{src}/shards" in result.output and f"{src}/dog/packed" in result.output
    got = keys_and_labels(tmp_path / "again")
    assert sorted(set(got.values())) == [0, 1]
    assert json.loads((tmp_path / "again" / fmt.MANIFEST_NAME).read_text())["classes"] == \
        ["cat", "dog"]
    assert len(got) == 6 and not any("shard" in k or "packed" in k for k in got)


def test_a_dataset_as_src_is_refused(tmp_path):
    images(tmp_path / "src" / "a", 2)
    shardpack.pack(tmp_path / "src", tmp_path / "ds", workers=1)
    with pytest.raises(SourceError, match="source folder is a shardpack dataset"):
        shardpack.pack(tmp_path / "ds", tmp_path / "again", workers=1)


# -- every skip named ----------------------------------------------------------------------------

def test_every_skip_is_named_in_the_report(tmp_path):
    src = tmp_path / "src"
    images(src / "a", 5)
    for i in range(12):  # zero-byte images: skipped by the writer
        (src / "a" / f"empty{i:02d}.png").write_bytes(b"")
    for i in range(4):  # broken links: skipped by the walk
        (src / "a" / f"gone{i}.jpg").symlink_to(src / "nowhere")
    (src / "a" / "dup.jpg").write_bytes(JPEG)
    (src / "a" / "dup.JPEG").write_bytes(JPEG)  # one key twice
    out = tmp_path / "out"
    result = run_cli("pack", src, out, "-q", "--skip-bad", "--workers", "1",
                     "--max-samples", "4")
    lines = result.output.splitlines()
    assert sum(line.startswith("skipped: /") for line in lines) == 10
    assert f"the first 10 of 17 shown; every skipped entry is named with its reason in " \
           f"{out}/{fmt.SKIPS_NAME}" in result.output
    manifest = json.loads((out / fmt.MANIFEST_NAME).read_text())
    assert manifest["skipped"] == {"broken-image": 12, "duplicate-key": 1, "missing": 4}
    report = [json.loads(line) for line in (out / fmt.SKIPS_NAME).read_text().splitlines()]
    assert manifest["skip_report"] == {"name": fmt.SKIPS_NAME, "entries": 17,
                                       "bytes": (out / fmt.SKIPS_NAME).stat().st_size}
    named = {(r["reason"], os.path.basename(r["path"])) for r in report}
    assert named == ({("broken-image", f"empty{i:02d}.png") for i in range(12)}
                     | {("missing", f"gone{i}.jpg") for i in range(4)}
                     | {("duplicate-key", "dup.jpg")})
    assert all(r["message"] for r in report)
    assert run_cli("verify", out).exit_code == 0
    assert f"(each named in {fmt.SKIPS_NAME})" in run_cli("info", out).output
    lines = (out / fmt.SKIPS_NAME).read_text().splitlines()
    size = (out / fmt.SKIPS_NAME).stat().st_size
    kept = "\n".join(lines[:-1])
    (out / fmt.SKIPS_NAME).write_text(kept + " " * (size - len(kept.encode()) - 1) + "\n")
    result = run_cli("verify", out, ok=False)  # a line lost (same size): named
    assert result.exit_code == 1 and "the skip report names 16 skips" in result.output
    # a pack without skips leaves no report, also where an older run of OUT had one
    for path in (src / "a").iterdir():
        if not path.name.startswith("img"):
            path.unlink()
    shardpack.pack(src, out, workers=1, overwrite=True)
    assert not (out / fmt.SKIPS_NAME).exists()
    assert "skip_report" not in json.loads((out / fmt.MANIFEST_NAME).read_text())


def test_resumed_shards_keep_their_skips_named(tmp_path):
    src = tmp_path / "src"
    images(src / "a", 6)
    for i in range(3):
        (src / "a" / f"img00{i}x.png").write_bytes(b"")  # broken, spread over the shards
    out = tmp_path / "out"
    shardpack.pack(src, out, workers=1, on_error="skip", max_samples=3)
    whole = sorted(json.loads(line)["path"]
                   for line in (out / fmt.SKIPS_NAME).read_text().splitlines())
    # as an interrupted run leaves it: no manifest, the complete shards, the state
    manifest = json.loads((out / fmt.MANIFEST_NAME).read_text())
    (out / fmt.MANIFEST_NAME).unlink()
    (out / fmt.SKIPS_NAME).unlink()
    (out / ".shardpack-pack.json").write_text(json.dumps({
        "shardpack": shardpack.__version__, "source": str(src),
        "options": shardpack.write.plan.PackOptions(on_error="skip", max_samples=3).as_dict()}))
    summary = shardpack.pack(src, out, workers=1, on_error="skip", max_samples=3, resume=True)
    assert summary.reused_shards == manifest["num_shards"]
    again = sorted(json.loads(line)["path"]
                   for line in (out / fmt.SKIPS_NAME).read_text().splitlines())
    assert again == whole and len(whole) == 3


# -- a real tree that Debian ships ----------------------------------------------------------------

ICONS = Path("/usr/share/icons/Adwaita")  # adwaita-icon-theme: PNG icons, file links inside


@pytest.mark.slow
@pytest.mark.skipif(not ICONS.is_dir(), reason="no Adwaita icon theme on this machine")
def test_a_class_tree_assembled_from_links_to_a_real_icon_theme(tmp_path):
    """Class folders that are links to the icon theme's size folders: refused naming the first
    link, then packed with --follow-links with torchvision's labels and every byte intact."""
    src = tmp_path / "icons"
    src.mkdir()
    sizes = sorted(p.name for p in ICONS.iterdir()
                   if p.is_dir() and any(p.rglob("*.png")))[:4]
    for name in sizes:
        (src / name).symlink_to(ICONS / name, target_is_directory=True)
    result = run_cli("pack", src, tmp_path / "refused", "-q", ok=False)
    assert f"{src}/{sizes[0]}: folder link points outside the source" in result.output
    out = tmp_path / "out"
    result = run_cli("pack", src, out, "-q", "--follow-links")
    assert f"followed {len(sizes)} links" in result.output
    want = imagefolder_labels(src)
    assert keys_and_labels(out) == want and len(want) > 100
    reader = shardpack.open_reader(out)
    for i in range(0, len(reader), 7):
        sample = reader.read_sample(i)
        assert bytes(sample["png"]) == (src / f"{sample['__key__']}.png").read_bytes()
