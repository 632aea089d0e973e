"""Datasets in the shapes people download them: a README and LICENSE beside the class folders,
listings with labels and dotted names, captioning trees with metadata at the top
(docs/packing.md, "Classes" and "Listings")."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import shardpack
from shardpack import format as fmt
from shardpack.core.errors import DecodeError, SourceError

from testbed import imagegen
from testbed.helpers import run_cli, run_subprocess

JPEG = imagegen.ALL_VALID["jpeg_rgb"][0]
PNG = imagegen.ALL_VALID["png_rgb"][0]
TOP_FILES = ("README.md", "LICENSE", "labels.txt")


def images(folder: Path, names) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(PNG if name.lower().endswith(".png") else JPEG)


def keys_and_labels(out) -> dict[str, int]:
    reader = shardpack.open_reader(out)
    return {s["__key__"]: int(bytes(s["cls"])) for s in map(reader.read_sample,
                                                             range(len(reader)))}


def torchvision_labels(src: Path) -> dict[str, int]:
    """torchvision's ImageFolder rules written out (it does not import beside this torch):
    classes are the sorted top-level FOLDERS (files at the top are never looked at), every image
    below a class folder is a sample.  Hidden folders left out: torchvision alone makes them
    classes (docs/packing.md)."""
    classes = sorted(e.name for e in os.scandir(src) if e.is_dir() and e.name[0] != ".")
    out = {}
    for idx, name in enumerate(classes):
        for root, _, files in os.walk(src / name, followlinks=True):
            for f in files:
                if f.lower().endswith((".jpg", ".jpeg", ".png")):
                    out[os.path.relpath(os.path.join(root, f), src).rsplit(".", 1)[0]] = idx
    return out


@pytest.fixture
def downloaded(tmp_path):
    """Class folders with dotted, upper-case names, and a README, LICENSE and labels.txt at the
    top, plus hidden junk there (.DS_Store, .ipynb_checkpoints/)."""
    src = tmp_path / "src"
    images(src / "cat", ["IMG_2019.01.05.JPEG", "b.jpg", "c.png"])
    images(src / "dog", ["d.0.jpg", "e.PNG"])
    images(src / "eel" / "nested", ["f.jpg"])
    for name in TOP_FILES:
        (src / name).write_text("about this dataset\n")
    (src / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (src / ".ipynb_checkpoints").mkdir()
    return src


def test_files_at_the_top_of_a_class_tree_are_left_out_and_named(downloaded, tmp_path):
    out = tmp_path / "out"
    summary = shardpack.pack(downloaded, out, workers=1)
    assert summary.classes == ["cat", "dog", "eel"]
    assert keys_and_labels(out) == torchvision_labels(downloaded)
    assert summary.skipped == {"top-level-file": 3}
    assert summary.hidden == 2  # .DS_Store and .ipynb_checkpoints, at the top
    report = [json.loads(line) for line in (out / fmt.SKIPS_NAME).read_text().splitlines()]
    assert sorted(os.path.basename(r["path"]) for r in report) == sorted(TOP_FILES)
    assert {r["reason"] for r in report} == {"top-level-file"}
    assert "skipped 3 top-level-file" in summary.line()
    run_cli("verify", out)  # the skip counts agree with the report
    # --layout imagefolder accepts the tree, with the same labels
    again = shardpack.pack(downloaded, tmp_path / "forced", workers=1, layout="imagefolder")
    assert keys_and_labels(tmp_path / "forced") == keys_and_labels(out)
    assert again.skipped == {"top-level-file": 3}


def test_labels_match_hugging_face_with_a_readme_at_the_top(tmp_path):
    import datasets

    src = tmp_path / "src"
    for i, name in enumerate(["ant", "bee", "b.c"]):
        images(src / name, [f"{name}-{k}.jpg" for k in range(2 + i)])
    (src / "README.md").write_text("# my dataset\n")
    (src / "LICENSE").write_text("CC-BY\n")
    out = tmp_path / "out"
    shardpack.pack(src, out, workers=1)
    ds = datasets.load_dataset("imagefolder", data_dir=str(src), split="train",
                               cache_dir=str(tmp_path / "hf-cache"))
    names = ds.features["label"].names
    classes = json.loads((out / fmt.MANIFEST_NAME).read_text())["classes"]
    assert classes == names
    got = keys_and_labels(out)
    assert sorted(classes[v] for v in got.values()) == sorted(names[r["label"]] for r in ds)
    assert got == torchvision_labels(src)


def test_a_top_level_of_images_stays_a_flat_dataset(tmp_path):
    src = tmp_path / "src"
    images(src, ["a.jpg", "b.jpg"])
    images(src / "more", ["c.jpg"])
    (src / "README.md").write_text("x")
    summary = shardpack.pack(src, tmp_path / "out", workers=1, on_error="skip")
    assert summary.classes is None
    assert "top-level-file" not in summary.skipped


def test_imagefolder_layout_needs_folders_at_the_top(tmp_path):
    src = tmp_path / "src"
    images(src, ["a.jpg"])
    with pytest.raises(SourceError, match="needs class folders at the top") as err:
        shardpack.pack(src, tmp_path / "out", layout="imagefolder")
    assert 'layout="files"' in str(err.value)


def test_hidden_entries_at_the_top_are_counted_in_a_flat_tree_too(tmp_path):
    src = tmp_path / "src"
    images(src, ["a.jpg"])
    (src / ".DS_Store").write_bytes(b"x")
    (src / ".ipynb_checkpoints").mkdir()
    summary = shardpack.pack(src, tmp_path / "out", workers=1)
    assert summary.hidden == 2


# -- listings -------------------------------------------------------------------------------------

@pytest.fixture
def listed(tmp_path):
    pics = tmp_path / "pics"
    images(pics, ["shot.00.v2.jpg", "shot.01.v2.jpg", "shot.02.v2.jpg", "shot.03.v2.jpg"])
    return tmp_path


def write_listing(folder: Path, kind: str, rows: list[dict]) -> Path:
    path = folder / f"list.{kind}"
    if kind == "csv":
        cols = list(rows[0])
        path.write_text(",".join(cols) + "\n" + "".join(
            ",".join(str(r[c]) for c in cols) + "\n" for r in rows))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_listing_keys_keep_their_dots(listed, kind):
    rows = [{"path": f"pics/shot.0{i}.v2.jpg", "caption": f"shot {i}"} for i in range(4)]
    out = listed / "out"
    shardpack.pack(write_listing(listed, kind, rows), out, workers=1)
    reader = shardpack.open_reader(out)
    assert [reader.read_sample(i)["__key__"] for i in range(len(reader))] == \
        [f"pics/shot.0{i}.v2" for i in range(4)]
    assert bytes(reader.read_sample(0)["jpg"]) == JPEG


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_listing_name_labels_become_classes(listed, kind):
    names = ["europe", "asia", "europe", "africa"]
    rows = [{"path": f"pics/shot.0{i}.v2.jpg", "region": names[i]} for i in range(4)]
    out = listed / "out"
    summary = shardpack.pack(write_listing(listed, kind, rows), out, workers=1,
                             label_column="region")
    assert summary.classes == ["africa", "asia", "europe"]
    got = keys_and_labels(out)
    assert [got[f"pics/shot.0{i}.v2"] for i in range(4)] == \
        [summary.classes.index(n) for n in names]
    assert "region" not in shardpack.open_reader(out).read_sample(0)
    run_cli("verify", out)
    # training reads the labels: one batch through the README pipeline
    ds = shardpack.ShardDataset(out, batch_size=4, batched=True, decode=shardpack.CpuDecode(32))
    batch = next(iter(ds))
    assert sorted(batch["cls"].tolist()) == sorted(summary.classes.index(n) for n in names)


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_listing_integer_labels_are_kept(listed, kind):
    rows = [{"path": f"pics/shot.0{i}.v2.jpg", "label": i * 7} for i in range(4)]
    out = listed / "out"
    summary = shardpack.pack(write_listing(listed, kind, rows), out, workers=1,
                             label_column="label")
    assert summary.classes is None
    assert sorted(keys_and_labels(out).values()) == [0, 7, 14, 21]


@pytest.mark.parametrize("column", ["cls", "label"])
def test_a_label_column_of_names_without_the_option_is_refused(listed, column):
    rows = [{"path": f"pics/shot.0{i}.v2.jpg", column: "europe"} for i in range(4)]
    listing = write_listing(listed, "csv", rows)
    with pytest.raises(SourceError, match=f"column '{column}' holds class names") as err:
        shardpack.pack(listing, listed / "out")
    assert f'label_column="{column}"' in str(err.value)
    result = run_cli("pack", listing, listed / "cli", ok=False)
    assert result.exit_code == 2
    assert f"--label-column {column}" in result.output and "label_column=" not in result.output
    assert not (listed / "cli" / fmt.MANIFEST_NAME).exists()


def test_convert_takes_label_column_for_listings(listed):
    rows = [{"path": f"pics/shot.0{i}.v2.jpg", "y": ["b", "a"][i % 2]} for i in range(4)]
    out = listed / "out"
    run_cli("convert", write_listing(listed, "jsonl", rows), out, "--label-column", "y", "-q")
    assert json.loads((out / fmt.MANIFEST_NAME).read_text())["classes"] == ["a", "b"]


def test_a_listing_row_without_a_label_is_bad(listed):
    rows = [{"path": f"pics/shot.0{i}.v2.jpg", "y": "" if i == 2 else "a"} for i in range(4)]
    listing = write_listing(listed, "csv", rows)
    with pytest.raises(SourceError, match="no value in the label column 'y'"):
        shardpack.pack(listing, listed / "out", label_column="y")
    summary = shardpack.pack(listing, listed / "skip", label_column="y", on_error="skip")
    assert summary.samples == 3 and summary.skipped == {"no-label": 1}


def test_label_column_is_refused_for_a_folder(listed):
    with pytest.raises(SourceError, match="for .csv/.jsonl listings"):
        shardpack.pack(listed / "pics", listed / "out", label_column="y")


# -- samples without an image ---------------------------------------------------------------------

@pytest.fixture
def captioning(tmp_path):
    """img2dataset's output: numbered folders of jpg + txt + json, with a parquet and a stats
    file per folder at the top."""
    src = tmp_path / "src"
    for part in ("00000", "00001"):
        for i in range(3):
            stem = src / part / f"{part}{i:04d}"
            stem.parent.mkdir(parents=True, exist_ok=True)
            stem.with_suffix(".jpg").write_bytes(JPEG)
            stem.with_suffix(".txt").write_text(f"a photo {i}")
            stem.with_suffix(".json").write_text("{}")
        (src / f"{part}.parquet").write_bytes(b"PAR1" + b"\0" * 8 + b"PAR1")
        (src / f"{part}_stats.json").write_text("{}")
    return src


def test_a_sample_without_an_image_is_an_error_naming_it(captioning, tmp_path):
    with pytest.raises(SourceError, match="has no image") as err:
        shardpack.pack(captioning, tmp_path / "out", layout="files")
    assert "00000.parquet" in str(err.value) and 'on_error="skip"' in str(err.value)
    summary = shardpack.pack(captioning, tmp_path / "skip", layout="files", on_error="skip")
    assert summary.samples == 6 and summary.skipped == {"no-image": 4}
    # as a class tree, the files at the top are left out instead
    auto = shardpack.pack(captioning, tmp_path / "auto", workers=1)
    assert auto.samples == 6 and auto.skipped == {"top-level-file": 4}


def test_decode_names_the_missing_image_field(tmp_path):
    """A converted WebDataset may hold a sample without an image (converters carry samples as
    they are): decode names the missing field, not "0 bytes"."""
    import io
    import tarfile

    tar = tmp_path / "w.tar"
    with tarfile.open(tar, "w") as t:
        for name, data in (("a.jpg", JPEG), ("b.json", b"{}"), ("c.jpg", JPEG)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    out = tmp_path / "out"
    shardpack.convert(tar, out, workers=1)
    ds = shardpack.ShardDataset(out, batch_size=3, batched=True, shuffle=False,
                                decode=shardpack.CpuDecode(32))
    with pytest.raises(DecodeError, match=r"has no image \(no jpg field.*its fields: json\)"):
        next(iter(ds))


# -- messages that name what the reader can pass --------------------------------------------------

def test_python_errors_name_keywords_and_the_cli_names_flags(tmp_path):
    src = tmp_path / "src"
    images(src / "a", ["x.jpg"])
    (src / "a" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    with pytest.raises(SourceError) as err:
        shardpack.pack(src, tmp_path / "out")
    assert 'on_error="skip"' in str(err.value) and "--skip-bad" not in str(err.value)
    result = run_subprocess("pack", src, tmp_path / "cli")
    assert result.returncode == 2
    assert "--skip-bad" in result.stderr and 'on_error="skip"' not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bench_files_over_a_broken_link_names_its_own_option(tmp_path):
    src = tmp_path / "src"
    images(src / "a", ["x.jpg", "y.jpg"])
    images(src / "b", ["z.jpg"])
    (src / "a" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    bad = run_cli("bench", "--files", src, "--workers", "0", ok=False)
    assert bad.exit_code == 2 and "--skip-bad" in bad.output
    good = run_cli("bench", "--files", src, "--workers", "0", "--skip-bad")
    assert "skipped       1 link-outside" in good.output
    assert "samples/s" in good.output


def test_info_stats_plot_without_labels_prints_the_statistics(tmp_path):
    src = tmp_path / "src"
    images(src, ["a.jpg", "b.jpg"])
    out = tmp_path / "out"
    shardpack.pack(src, out, workers=1)
    result = run_cli("info", out, "--stats", "--plot", tmp_path / "p.png", ok=False)
    assert result.exit_code == 2
    assert "sizes" in result.output and "images    pixel sizes" in result.output
    assert result.output.strip().splitlines()[-1].startswith("shardpack: error:")
    assert "no class labels to plot" in result.output
    assert not (tmp_path / "p.png").exists()


def test_an_option_a_command_lacks_is_spelled_as_the_cli_spells_it_elsewhere():
    from shardpack.cli.common import flag_spelling
    from shardpack.cli.main import main

    commands = main.commands
    spell = flag_spelling(commands["info"], commands.values())
    assert spell("on_error", "skip") == "--skip-bad"  # info has none: pack's spelling
    assert spell("group", "image") == "--group image"
    assert flag_spelling(commands["pack"])("resume", True) == "--resume"
    assert flag_spelling(None)("some_option", 3) == "--some-option 3"


def test_a_note_names_both_spellings_and_no_marker(listed):
    rows = [{"path": f"pics/shot.0{i}.v2.jpg", "label": i} for i in range(4)]
    summary = shardpack.pack(write_listing(listed, "csv", rows), listed / "out", workers=1)
    note = next(n for n in summary.notes if "column 'label' holds integers" in n)
    assert "--label-column label" in note and "\x1f" not in note
    result = run_cli("pack", write_listing(listed, "csv", rows), listed / "cli")
    assert "\x1f" not in result.output


def test_bench_skip_bad_is_for_files(tmp_path):
    src = tmp_path / "src"
    images(src, ["a.jpg"])
    shardpack.pack(src, tmp_path / "out", workers=1)
    result = run_cli("bench", tmp_path / "out", "--skip-bad", ok=False)
    assert result.exit_code == 2 and "--skip-bad is for --files" in result.output


def test_a_refused_tar_beside_an_export_marker_is_counted_once(tmp_path):
    src = tmp_path / "src"
    images(src / "a", ["x.jpg", "y.jpg"])
    shardpack.pack(src, tmp_path / "ds", workers=1)
    run_cli("export", tmp_path / "ds", tmp_path / "wds", "--to", "webdataset")
    os.mkfifo(tmp_path / "wds" / "zz.tar")
    summary = shardpack.convert(tmp_path / "wds", tmp_path / "back", workers=1,
                                on_error="skip")
    assert summary.skipped == {"special": 1} and summary.samples == 2


def test_a_class_whose_samples_all_lack_an_image_is_empty(tmp_path):
    """--group webdataset on a class tree: a class holding only image-less samples, skipped as
    no-image, is an empty class (an error without --allow-empty-classes), as if it held none."""
    src = tmp_path / "src"
    images(src / "a", ["x.jpg"])
    (src / "b").mkdir()
    (src / "b" / "notes.txt").write_text("no image here")
    with pytest.raises(SourceError, match="class folder 'b' holds no samples"):
        shardpack.pack(src, tmp_path / "out", group="webdataset", on_error="skip", workers=1)
    summary = shardpack.pack(src, tmp_path / "kept", group="webdataset", on_error="skip",
                             allow_empty_classes=True, workers=1)
    assert summary.samples == 1 and summary.skipped == {"no-image": 1}


def test_a_cls_column_training_cannot_read_is_refused(listed):
    """A listing never makes a cls field training cannot read: past int64, or not an integer."""
    for value in ("99999999999999999999", "3.5"):
        rows = [{"path": f"pics/shot.0{i}.v2.jpg", "cls": value} for i in range(4)]
        with pytest.raises(SourceError, match="column 'cls' holds class names"):
            shardpack.pack(write_listing(listed, "csv", rows), listed / "out")
