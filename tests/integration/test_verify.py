"""`shardpack verify` catches any flipped byte and truncation, naming the shard and sample."""

import json
import random
import re

import pytest

import shardpack
from shardpack import format as fmt

from testbed.helpers import fake_jpeg, make_tree, reseal, run_cli

MODES = [("tar", "none"), ("msgpack", "none"), ("msgpack", "zstd")]


@pytest.fixture
def dataset(tmp_path, request):
    shard_format, compression = request.param
    rng = random.Random(1)
    files = {f"c{i % 3}/{i:04d}.jpg": fake_jpeg(rng.randint(32, 4000), seed=i) for i in range(40)}
    files.update({f"c0/{i:04d}.json": b'{"i": %d}' % i for i in range(0, 40, 3)})
    src = make_tree(tmp_path / "src", files)
    out = tmp_path / "out"
    shardpack.pack(src, out, shard_format=shard_format, compression=compression, max_samples=15,
                   workers=1)
    return out


def _samples_at(out, shard_name, pos):
    entry = next(s for s in json.loads((out / "shardpack.json").read_text())["shards"]
                 if s["name"] == shard_name)
    index = fmt.decode_index((out / entry["index"]).read_bytes())
    for i in range(index.num_samples):
        a, b = index.span(i)
        if a <= pos < b:
            return index.key(i)
    return None


@pytest.mark.parametrize("dataset", MODES, indirect=True)
def test_clean_dataset_verifies(dataset):
    result = run_cli("verify", dataset)
    assert result.output.startswith("OK: 3 shards, 40 samples")


@pytest.mark.parametrize("dataset", MODES, indirect=True)
def test_every_flipped_byte_is_caught(dataset):
    rng = random.Random(7)
    shards = sorted(p for p in dataset.iterdir() if p.suffix in (".tar", ".spk"))
    for trial in range(25):
        shard = rng.choice(shards)
        data = bytearray(shard.read_bytes())
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
        original = shard.read_bytes()
        shard.write_bytes(bytes(data))
        try:
            result = run_cli("verify", dataset, ok=None)
            assert result.exit_code == 1, (trial, pos)
            assert f"BAD {shard}" in result.output
            key = _samples_at(dataset, shard.name, pos)
            if key is not None:
                assert f"sample {key!r}" in result.output, result.output
        finally:
            shard.write_bytes(original)
    assert run_cli("verify", dataset).exit_code == 0


@pytest.mark.parametrize("dataset", MODES, indirect=True)
def test_truncated_shard_is_named(dataset):
    shard = sorted(p for p in dataset.iterdir() if p.suffix in (".tar", ".spk"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2])
    result = run_cli("verify", dataset, ok=None)
    assert result.exit_code == 1
    assert f"BAD {shard}: shard is {len(data) // 2} bytes" in result.output
    assert "runs past the end of the shard" in result.output


@pytest.mark.parametrize("dataset", MODES, indirect=True)
def test_missing_shard_and_bad_index_are_named(dataset):
    (dataset / "shard-00002.idx").write_bytes(b"garbage")
    (dataset / "shard-00001.tar").unlink(missing_ok=True)
    (dataset / "shard-00001.spk").unlink(missing_ok=True)
    result = run_cli("verify", dataset, ok=None)
    assert result.exit_code == 1
    assert "shard-00002.idx: index is 7 bytes, the manifest says" in result.output
    assert "shard-00001." in result.output and "missing" in result.output


@pytest.mark.parametrize("dataset", [("tar", "none")], indirect=True)
def test_structural_checks_catch_resealed_tampering(dataset):
    """Hashes recomputed after tampering: only the structure check can see it."""
    shard = dataset / "shard-00000.tar"
    data = bytearray(shard.read_bytes())
    data[0:4] = b"zzzz"  # the first member's name
    data[148:156] = b" " * 8
    data[148:156] = b"%06o\0 " % sum(data[:512])
    shard.write_bytes(bytes(data))
    reseal(dataset)
    result = run_cli("verify", dataset, ok=None)
    assert result.exit_code == 1 and "does not match the index" in result.output


def test_reader_checks_crc_on_read(tmp_path):
    from shardpack.core.errors import IntegrityError
    from shardpack.read.reader import DatasetReader

    src = make_tree(tmp_path / "src", {"a.bin": b"x" * 1000})
    out = tmp_path / "out"
    shardpack.pack(src, out, shard_format="msgpack", workers=1)
    shard = out / "shard-00000.spk"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"shard-00000.spk, sample 'a', offset 16: sample "
                                             r"bytes do not match the index hash"):
        DatasetReader(out).read_sample(0)
    # storage trusted: no hash check, and the record's own CRC still catches it
    with pytest.raises(IntegrityError, match=r"shard-00000.spk, sample 'a', offset 16: record "
                                             r"CRC32C mismatch"):
        DatasetReader(out, trust_storage=True).read_sample(0)


# -- the manifest against the data (edits verify used to accept) ----------------------

def _folders(tmp_path, shard_format="tar", classes=("c0", "c1", "c2"), empty=()):
    """An ImageFolder pack: 12 samples in the given class folders, 4 shards of 3."""
    files = {f"{classes[i % len(classes)]}/{i:03d}.jpg": fake_jpeg(200, seed=i)
             for i in range(12)}
    src = make_tree(tmp_path / "src", files)
    for name in empty:
        (src / name).mkdir()
    out = tmp_path / "out"
    shardpack.pack(src, out, shard_format=shard_format, workers=1, max_samples=3,
                   allow_empty_classes=bool(empty))
    return out


def _files_layout(tmp_path):
    """A files-layout pack (classes null) whose samples carry .cls sidecars."""
    files = {}
    for i in range(9):
        files[f"{i:03d}.bin"] = bytes([i]) * 8
        files[f"{i:03d}.cls"] = str(i % 3).encode()
    out = tmp_path / "files-out"
    shardpack.pack(make_tree(tmp_path / "files-src", files), out, shard_format="msgpack",
                   compression="zstd", workers=1, max_samples=4)
    return out


def _edit(out, change) -> dict:
    """Apply ``change`` (a function of the manifest dict) to OUT's manifest; return the clean
    one."""
    path = out / fmt.MANIFEST_NAME
    clean = json.loads(path.read_text())
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    return clean


def _reader_refuses(out, needle: str) -> None:
    """Every reader refuses it (decode_manifest), and verify, info and ls say so in one line."""
    from shardpack.core.errors import FormatError

    with pytest.raises(FormatError, match=needle):
        shardpack.open_reader(out)
    for command in ("verify", "info", "ls"):
        result = run_cli(command, out, ok=None)
        lines = result.output.splitlines()
        assert result.exit_code == 2 and len(lines) == 1, (command, result.output)
        assert lines[0].startswith(f"shardpack: error: {out / fmt.MANIFEST_NAME}: "), lines
        assert re.search(needle, lines[0]), (needle, lines[0])


def _verify_says(out, *needles: str) -> str:
    """verify reads the data and refuses (exit 1), each needle on one BAD line."""
    result = run_cli("verify", out, ok=None)
    assert result.exit_code == 1, result.output
    bad = [ln for ln in result.output.splitlines() if ln.startswith("BAD ")]
    for needle in needles:
        assert any(needle in ln for ln in bad), (needle, result.output)
    return result.output


def test_folder_and_files_packs_verify(tmp_path):
    assert run_cli("verify", _folders(tmp_path)).output.startswith("OK: 4 shards, 12 samples")
    assert run_cli("verify", _files_layout(tmp_path)).output.startswith("OK: 3 shards")


def test_an_empty_class_folder_is_a_class(tmp_path):
    """A class folder with no samples kept by --allow-empty-classes keeps its class number
    (unpack writes it back), so a class name no sample uses is valid, wherever it sorts."""
    out = _folders(tmp_path, classes=("b", "d"), empty=("a", "c", "z"))
    assert json.loads((out / fmt.MANIFEST_NAME).read_text())["classes"] == \
        ["a", "b", "c", "d", "z"]
    assert run_cli("verify", out).exit_code == 0


@pytest.mark.parametrize("classes,shard,key,cls,listed,folder", [
    (["c1", "c0", "c2"], "shard-00000", "c0/000", 0, "c1", "c0"),     # neighbours swapped
    (["c2", "c1", "c0"], "shard-00000", "c0/000", 0, "c2", "c0"),     # reversed
    (["C0", "c1", "c2"], "shard-00000", "c0/000", 0, "C0", "c0"),     # upper-cased
    (["c0", " c1 ", "c2"], "shard-00001", "c1/001", 1, " c1 ", "c1"),  # padded
    (["c0", "c1", "c2x"], "shard-00002", "c2/002", 2, "c2x", "c2"),   # renamed
    (["aa", "c0", "c1", "c2"], "shard-00000", "c0/000", 0, "aa", "c0"),  # a name added first
])
def test_class_names_must_match_the_class_folders(tmp_path, classes, shard, key, cls, listed,
                                                  folder):
    out = _folders(tmp_path)
    _edit(out, lambda m: m.update(classes=classes))
    text = _verify_says(out, f"{out / shard}.tar: sample {key!r}: the manifest's classes[{cls}] "
                             f"is {listed!r}, but this sample with cls {cls} is in class folder "
                             f"{folder!r} (and 3 more samples like it)")
    assert text.count("BAD ") <= len(classes)  # once per class and folder, not per sample


def test_too_few_or_no_class_names(tmp_path):
    out = _folders(tmp_path)
    clean = _edit(out, lambda m: m.update(classes=["c0", "c1"]))
    _verify_says(out, "2 classes, but a sample has cls 2")
    for value, needle in (([], r"'classes' must be a non-empty list, found \[\]"),
                          (None, r"'classes' must be a non-empty list, found None")):
        (out / fmt.MANIFEST_NAME).write_text(json.dumps({**clean, "classes": value}))
        _reader_refuses(out, needle)
    (out / fmt.MANIFEST_NAME).write_text(json.dumps(
        {k: v for k, v in clean.items() if k != "classes"}))
    _reader_refuses(out, "'classes' must be a non-empty list")


def test_the_labels_are_read_whatever_the_class_list_holds(tmp_path):
    """verify reads every ImageFolder sample's cls when the classes are a list (it used to skip
    them for [], a falsy list, which readers now refuse before verify looks): an ImageFolder
    pack of one class, renamed."""
    out = _folders(tmp_path, classes=("only",))
    from shardpack.inspect.verify import verify

    _edit(out, lambda m: m.update(classes=["other"]))
    report = verify(out)
    assert report.max_cls == 0 and not report.ok
    assert "classes[0] is 'other', but this sample with cls 0 is in class folder 'only' (and " \
        "11 more samples like it)" in str(report.problems[0])


@pytest.mark.parametrize("classes,needle", [
    (["c0", "c0", "c1", "c2"], r"'classes' lists 'c0' twice: class names must be distinct"),
    (["c0", "c1", "c2", "c2"], r"'classes' lists 'c2' twice"),
    (["", "c1", "c2"], r"classes\[0\] '' cannot be a class folder name: empty name"),
    (["c0", "..", "c2"], r"classes\[1\] '..' cannot be a class folder name"),
    (["c0", "c1", "a/b"], r"classes\[2\] 'a/b' cannot be a class folder name: has a '/'"),
    (["c0", "c1", "/abs"], r"classes\[2\] '/abs' cannot be a class folder name"),
    (["c0", "c1", "x\x00"], r"classes\[2\] 'x\\x00' cannot be a class folder name"),
])
def test_class_names_must_be_distinct_and_folder_names(tmp_path, classes, needle):
    out = _folders(tmp_path)
    _edit(out, lambda m: m.update(classes=classes))
    _reader_refuses(out, needle)


def test_a_class_list_on_a_files_layout_is_refused(tmp_path):
    """pack writes a class list for ImageFolder trees and labelled listings only: on a files
    layout it would describe labels nothing assigned (their cls came from .cls sidecars)."""
    out = _files_layout(tmp_path)
    for classes in (["c0", "c1"], [], ["a", "b", "c"]):
        _edit(out, lambda m, classes=classes: m.update(classes=classes))
        _reader_refuses(out, r"layout 'files' has no class folders: 'classes' must be null, "
                             f"found a list of {len(classes)}")
    # a listing's classes are its --label-column names: allowed
    _edit(out, lambda m: m.update(layout="listing", group=None, classes=["a"]))
    shardpack.open_reader(out)


def test_a_converted_class_list_is_not_a_folder_list(tmp_path):
    """parquet --label-column: the classes are label values, not key prefixes (the keys are row
    positions), and a label may be -1 or lie outside the list: verify accepts it."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    from shardpack.interop.convert import convert

    src = tmp_path / "src.parquet"
    pq.write_table(pa.table({"bin": [b"a", b"b", b"c"], "species": ["emu", "cat", "emu"]}), src)
    convert(src, tmp_path / "conv", workers=1, label_column="species")
    m = json.loads((tmp_path / "conv" / fmt.MANIFEST_NAME).read_text())
    assert (m["layout"], m["source"]["from"], m["classes"]) == ("parquet", "parquet",
                                                               ["cat", "emu"])
    assert run_cli("verify", tmp_path / "conv").exit_code == 0
    # ... and its layout cannot be made an ImageFolder's
    _edit(tmp_path / "conv", lambda m: m.update(layout="imagefolder"))
    _reader_refuses(tmp_path / "conv", r"'source' says converted from 'parquet', so layout "
                                       r"must be 'parquet', found 'imagefolder'")


def test_imagefolder_samples_carry_cls(tmp_path):
    """A files-layout pack relabelled an ImageFolder (classes made up): no sample has cls."""
    files = {f"{i:03d}.bin": bytes([i]) * 8 for i in range(6)}
    out = tmp_path / "out"
    shardpack.pack(make_tree(tmp_path / "src", files), out, workers=1)
    _edit(out, lambda m: m.update(layout="imagefolder", classes=["a"]))
    _verify_says(out, "layout is 'imagefolder', but no sample has a 'cls' field")


# -- shard entries in order --------------------------------------------------------------------

@pytest.mark.parametrize("shard_format", ["tar", "msgpack"])
def test_shard_entries_swapped_or_reordered_are_refused(tmp_path, shard_format):
    out = _folders(tmp_path, shard_format)
    suffix = fmt.SHARD_SUFFIX[shard_format]

    def swap(m):
        m["shards"][1], m["shards"][2] = m["shards"][2], m["shards"][1]

    clean = _edit(out, swap)
    _reader_refuses(out, rf"shard entry 1 names 'shard-00002\{suffix}' and 'shard-00002.idx', "
                         rf"expected 'shard-00001\{suffix}' and 'shard-00001.idx'")
    (out / fmt.MANIFEST_NAME).write_text(json.dumps({**clean, "shards": clean["shards"][::-1]}))
    _reader_refuses(out, "shard entry 0 names 'shard-00003")
    # the files renamed to match: still not shard N at entry N
    (out / "shard-00001.idx").rename(out / "shard-00007.idx")
    _edit(out, lambda m: m.update(shards=clean["shards"]) or m["shards"][1].update(
        index="shard-00007.idx"))
    _reader_refuses(out, "shard entry 1 names .* expected .*'shard-00001.idx'")


def test_merged_datasets_are_numbered_in_order(tmp_path):
    """merge renumbers the parts' shards consecutively: the result passes every check."""
    a = _folders(tmp_path / "a")
    src_b = make_tree(tmp_path / "src-b", {f"{c}/{i:03d}-b.jpg": fake_jpeg(100, seed=i)
                                           for i, c in enumerate(("c0", "c1", "c2") * 2)})
    b = tmp_path / "b"
    shardpack.pack(src_b, b, workers=1, max_samples=2)
    shardpack.merge([a, b], tmp_path / "merged")
    names = [s["name"] for s in json.loads((tmp_path / "merged" / fmt.MANIFEST_NAME)
                                           .read_text())["shards"]]
    assert names == [fmt.shard_name(i, "tar") for i in range(7)]
    assert run_cli("verify", tmp_path / "merged").exit_code == 0


# -- layout consistency ------------------------------------------------------------------------

@pytest.mark.parametrize("layout,needle", [
    ("files", "layout 'files' has no class folders: 'classes' must be null, found a list of 3"),
    ("listing", "layout 'listing' has no file grouping: 'group' must be null, found 'image'"),
    ("webdataset", "layout 'webdataset' has no file grouping"),
    ("mds", "layout 'mds' has no file grouping"),
    ("litdata", "layout 'litdata' has no file grouping"),
    ("parquet", "layout 'parquet' has no file grouping"),
])
def test_layout_set_to_another_valid_value(tmp_path, layout, needle):
    out = _folders(tmp_path)
    _edit(out, lambda m: m.update(layout=layout))
    _reader_refuses(out, needle)


def test_layout_of_a_files_pack_set_to_another_value(tmp_path):
    out = _files_layout(tmp_path)
    clean = _edit(out, lambda m: m.update(layout="imagefolder"))
    _reader_refuses(out, r"layout 'imagefolder' needs the class folder names: 'classes' must be "
                         r"a non-empty list, found None")
    for layout in ("listing", "webdataset", "parquet"):
        (out / fmt.MANIFEST_NAME).write_text(json.dumps({**clean, "layout": layout}))
        _reader_refuses(out, f"layout '{layout}' has no file grouping: 'group' must be null, "
                             "found 'webdataset'")


def test_converted_layout_names_its_source(tmp_path):
    """convert --from F writes layout F and source.from F; merge keeps both."""
    out = _files_layout(tmp_path)
    _edit(out, lambda m: m.update(layout="mds", group=None,
                                  source={"from": "webdataset", "notes": []}))
    _reader_refuses(out, "'source' says converted from 'webdataset', so layout must be "
                         "'webdataset', found 'mds'")
    _edit(out, lambda m: m.update(layout="webdataset", source="webdataset"))
    _reader_refuses(out, "'source' must be an object, found 'webdataset'")
    _edit(out, lambda m: m.update(layout="imagefolder", classes=["a"],
                                  source={"from": "imagefolder"}))
    _reader_refuses(out, "'source' says converted from 'imagefolder'")
    _edit(out, lambda m: m.update(layout="webdataset", source={"from": "webdataset"}))
    assert run_cli("verify", out).exit_code == 0


# -- informational keys, version, the JSON text ------------------------------------------------

@pytest.mark.parametrize("key,value,needle", [
    ("hidden", -1, "'hidden' must be a non-negative integer, found -1"),
    ("hidden", "0", "'hidden' must be a non-negative integer, found '0'"),
    ("hidden", 0.0, "'hidden' must be a non-negative integer, found 0.0"),
    ("hidden", True, "'hidden' must be a non-negative integer, found True"),
    ("hidden", None, "'hidden' must be a non-negative integer, found None"),
    ("hidden", 2 ** 64, "'hidden' must be a non-negative integer"),
    ("ignored", "5", "'ignored' must be a non-negative integer, found '5'"),
    ("ignored", [0], "'ignored' must be a non-negative integer, found \\[0\\]"),
    ("skipped", None, "'skipped' must map reasons to non-negative integers, found None"),
    ("skipped", [], "'skipped' must map reasons to non-negative integers, found \\[\\]"),
    ("skipped", {"bad image": -1}, "'skipped' must map reasons to non-negative integers"),
    ("skipped", {"bad image": "1"}, "'skipped' must map reasons to non-negative integers"),
    ("preprocessing", {}, "'preprocessing' must be null or \\{\"resize\": N, \"quality\": Q, "
                          "\"pixels\""),
    ("preprocessing", {"pixels": "raw:1"}, "'preprocessing' must be null or"),
    ("preprocessing", {"pixels": "auto:x"}, "'preprocessing' must be null or"),
    ("preprocessing", {"quality": 90}, "'preprocessing' must be null or"),
    ("preprocessing", 0, "'preprocessing' must be null or"),
    ("preprocessing", {"resize": 64}, "'preprocessing' must be null or"),
    ("preprocessing", {"resize": "64", "quality": 90}, "'preprocessing' must be null or"),
    ("preprocessing", {"resize": 0, "quality": 90}, "'preprocessing' must be null or"),
])
def test_informational_keys_have_their_types(tmp_path, key, value, needle):
    out = _folders(tmp_path)
    _edit(out, lambda m: m.update({key: value}))
    _reader_refuses(out, needle)


def test_keys_pack_always_writes_are_required_by_verify(tmp_path):
    out = _files_layout(tmp_path)
    for key in ("hidden", "skipped", "preprocessing", "classes", "layout"):
        clean = _edit(out, lambda m, key=key: m.pop(key))
        _verify_says(out, f"the {key!r} key is missing")
        (out / fmt.MANIFEST_NAME).write_text(json.dumps(clean))
    for key in ("group", "ignored"):  # optional (older packs did not write them)
        clean = _edit(out, lambda m, key=key: m.pop(key))
        assert run_cli("verify", out).exit_code == 0
        (out / fmt.MANIFEST_NAME).write_text(json.dumps(clean))


def test_valid_preprocessing_and_counts_are_read(tmp_path):
    out = _folders(tmp_path)
    _edit(out, lambda m: m.update(preprocessing={"resize": 64, "quality": 90}, hidden=3,
                                  ignored=2, skipped={"bad image": 4}))
    result = run_cli("info", out)
    assert "2 files neither images nor sidecars" in result.output
    assert "4 bad image" in result.output


@pytest.mark.parametrize("version", [2.0, 1.0, True, "2", None])
def test_version_must_be_an_integer(tmp_path, version):
    out = _folders(tmp_path)
    _edit(out, lambda m: m.update(version=version))
    from shardpack.core.errors import VersionError

    with pytest.raises(VersionError, match=rf"expected one of \(1, 2\), found {version!r}"):
        shardpack.open_reader(out)
    _reader_refuses(out, re.escape(f"found {version!r}"))


@pytest.mark.parametrize("where", ["top", "shard entry"])
def test_a_key_written_twice_is_refused(tmp_path, where):
    out = _folders(tmp_path)
    path = out / fmt.MANIFEST_NAME
    text = path.read_text()
    if where == "top":
        n = json.loads(text)["num_samples"]
        path.write_text(text.replace("{", '{\n "num_samples": %d,' % (n + 1), 1))
        _reader_refuses(out, "manifest writes the key 'num_samples' twice in one object")
    else:  # the last copy equal: refused all the same (other JSON readers keep the first)
        entry = '"name": "shard-00000.tar",'
        assert entry in text
        path.write_text(text.replace(entry, entry + ' "samples": 4,', 1))
        _reader_refuses(out, "manifest writes the key 'samples' twice")
