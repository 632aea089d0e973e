"""unpack and export on hostile datasets: every error a dataset or a full disk can
cause is one ``shardpack: error:`` line and exit status 2, never a traceback, and nothing
half-written is left: OUT is not created (or is unchanged) and no hidden temp folder stays beside
it."""

import json
import os
from pathlib import Path

import pytest

import shardpack
from shardpack import format as fmt
from shardpack.interop.unpack import remove_tree

from testbed.helpers import fake_jpeg, make_tree, reseal, run_cli


def _pack(tmp_path: Path, keys, name: str = "ds", shard_format: str = "tar") -> Path:
    """A dataset whose samples have exactly ``keys`` (one .jpg field each), packed from a CSV
    listing, so that keys no file system could hold are possible."""
    make_tree(tmp_path / "img", {"1.jpg": fake_jpeg(40, seed=1), "2.jpg": fake_jpeg(50, seed=2)})
    listing = tmp_path / f"{name}.csv"
    listing.write_text("path,key\n" + "".join(f"img/{1 + n % 2}.jpg,{key}\n"
                                              for n, key in enumerate(keys)))
    out = tmp_path / name
    shardpack.pack(listing, out, shard_format=shard_format)
    return out


def _one_error(result, *needles) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output, result.output
    errors = [ln for ln in result.output.splitlines() if ln.startswith("shardpack: error:")]
    assert len(errors) == 1, result.output
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def _no_leftovers(target: Path, existed: dict | None = None) -> None:
    """``target`` was not created (or holds what it held: ``existed``), and no hidden folder
    (``.NAME.tmp-*``, ``.NAME.new-*``, ``.NAME.old-*``) or temp file is left beside or in it."""
    if existed is None:
        assert not os.path.lexists(target), os.listdir(target)
    else:
        assert {p.name: p.read_bytes() for p in target.iterdir()} == existed
    hidden = [n for n in os.listdir(target.parent) if n.startswith(f".{target.name}.")]
    assert not hidden, hidden


def _export_cases(target: Path):
    return [("unpack", target), ("export", target, "--to", "files"),
            ("export", target, "--to", "webdataset"), ("export", target, "--to", "parquet")]


# 1. ENAMETOOLONG ------------------------------------------------------------------------------

@pytest.mark.parametrize("key,needles", [
    ("x" * 300, ["a part of the name is 304 bytes", "(255)"]),
    ("/".join(["y" * 200] * 25), ["the path would be", "more than the file system allows"]),
])
@pytest.mark.parametrize("how", ["unpack", "export"])
def test_name_too_long(tmp_path, key, needles, how):
    ds = _pack(tmp_path, ["ok", key])
    target = tmp_path / "out"
    args = ("unpack", ds, target) if how == "unpack" else ("export", ds, target, "--to", "files")
    line = _one_error(run_cli(*args, ok=None), str(ds / "shard-00000.tar"), *needles)
    assert len(line) < 600, line  # a long key is cut in the middle, not printed in full
    _no_leftovers(target)


# 2. Deep nesting ------------------------------------------------------------------------------

def test_thousands_of_levels_is_one_line(tmp_path):
    ds = _pack(tmp_path, ["a/" * 3000 + "b"])
    target = tmp_path / "out"
    _one_error(run_cli("unpack", ds, target, ok=None), "3000 folder levels",
               "more than the file system allows")
    _no_leftovers(target)


def test_deep_tree_is_made_and_removed_without_recursion(tmp_path):
    """1100 levels (past Python's recursion limit) fit in PATH_MAX: made one level at a time
    (os.makedirs recurses per level), and removed the same way when a later sample fails
    (shutil.rmtree recurses too).  Slow-ish: rmdir costs ~1 ms on ext4."""
    deep = "a/" * 1100 + "b"
    ds = _pack(tmp_path, [deep, "c", "c.jpg/d"])
    target = tmp_path / "out"
    try:
        _one_error(run_cli("unpack", ds, target, ok=None), "'c'", "'c.jpg/d'", "clash")
        _no_leftovers(target)
        ok = _pack(tmp_path, [deep], name="ok")
        run_cli("unpack", ok, target)
        assert (target / f"{deep}.jpg").read_bytes() == fake_jpeg(40, seed=1)
    finally:  # pytest's clean-up of old tmp_paths uses shutil.rmtree: it would fail on them
        for name in os.listdir(tmp_path):
            if name == "out" or name.startswith(".out."):
                remove_tree(str(tmp_path / name))
    assert not os.path.lexists(target)


# 3. A file where a folder must go -------------------------------------------------------------

@pytest.mark.parametrize("keys,needles", [
    (["a", "a.jpg/b"], ["samples 'a' and 'a.jpg/b' clash", "'a.jpg' is both a file of sample 'a' "
                                                            "and a folder for sample 'a.jpg/b'"]),
    (["a.jpg/b", "a"], ["samples 'a.jpg/b' and 'a' clash", "'a.jpg' is both a folder for sample "
                                                            "'a.jpg/b' and a file of sample 'a'"]),
])
@pytest.mark.parametrize("how", ["unpack", "export"])
def test_file_and_folder_clash(tmp_path, keys, needles, how):
    ds = _pack(tmp_path, keys)
    target = tmp_path / "out"
    args = ("unpack", ds, target) if how == "unpack" else ("export", ds, target, "--to", "files")
    _one_error(run_cli(*args, ok=None), *needles)
    _no_leftovers(target)


def test_same_key_twice(tmp_path):
    ds = _pack(tmp_path, ["a", "b"], shard_format="msgpack")  # msgpack: keys from the index
    index_path = ds / "shard-00000.idx"
    index = fmt.decode_index(index_path.read_bytes())
    index_path.write_bytes(fmt.encode_index(
        shard_format=index.shard_format, compression=index.compression,
        shard_bytes=index.shard_bytes, shard_hash=index.shard_hash, plan_digest=index.plan_digest,
        skipped=index.skipped, fields=index.fields, starts=index.starts,
        raw_sizes=index.raw_sizes, sample_hashes=index.sample_hashes,
        field_offsets=index.field_offsets, field_sizes=index.field_sizes, keys=["a", "a"]))
    reseal(ds)
    target = tmp_path / "out"
    _one_error(run_cli("unpack", ds, target, ok=None), "sample 'a' is in the dataset twice",
               "'a.jpg'")
    _no_leftovers(target)


# 4. A shard listed twice in the manifest ------------------------------------------------------

@pytest.mark.parametrize("how", range(4))
def test_shard_listed_twice(tmp_path, how):
    ds = _pack(tmp_path, ["a", "b"])
    manifest = json.loads((ds / fmt.MANIFEST_NAME).read_text())
    manifest["shards"].append(dict(manifest["shards"][0]))
    manifest["num_samples"] *= 2
    (ds / fmt.MANIFEST_NAME).write_bytes(fmt.encode_manifest(manifest))
    reseal(ds)
    target = tmp_path / "out"
    args = _export_cases(target)[how]
    _one_error(run_cli(args[0], ds, *args[1:], ok=None), "shard-00000", "twice")
    _no_leftovers(target)


# 5. A full disk -------------------------------------------------------------------------------


def test_out_of_disk_space(tmp_path, small_disk):
    src = make_tree(tmp_path / "src", {f"{i}.bin": os.urandom(200_000) for i in range(12)})
    ds = tmp_path / "ds"
    shardpack.pack(src, ds, shard_size="1MB")
    target = small_disk / "out"
    for args in _export_cases(target):
        line = _one_error(run_cli(args[0], ds, *args[1:], ok=None), "out of disk space",
                          "run the ")
        assert "--resume" not in line, line
        if args[-1] in ("webdataset", "parquet") and target.is_dir():
            # these keep the (empty) OUT they made, as tests/integration/test_export.py expects
            assert not os.listdir(target), os.listdir(target)
            target.rmdir()
        _no_leftovers(target)
        assert not os.listdir(small_disk), os.listdir(small_disk)


# 6. A symbolic link as OUT --------------------------------------------------------------------

def test_symlinked_out_is_followed(tmp_path):
    """Decision: OUT itself may be a link to an empty folder; that folder is filled and the link
    kept, for unpack and every export (``--overwrite`` replaces what the folder holds)."""
    ds = _pack(tmp_path, ["a", "b/c"])
    for n, args in enumerate(_export_cases(None)):
        real = tmp_path / f"real{n}"
        real.mkdir()
        link = tmp_path / f"link{n}"
        link.symlink_to(real)
        run_cli(args[0], ds, link, *args[2:])
        if args[0] == "export":
            run_cli(args[0], ds, link, *args[2:], "--overwrite")
        assert link.is_symlink() and os.readlink(link) == str(real)
        names = sorted(os.listdir(real))
        assert names == (["a.jpg", "b"] if n < 2 else
                         ["_shardpack_export.json", "part-00000.parquet"] if n == 3 else
                         ["_shardpack_export.json", "shard-000000.tar"]), names
        assert not [p for p in os.listdir(tmp_path) if p.startswith((".real", ".link"))]


@pytest.mark.parametrize("kind", ["dangling", "file", "busy"])
def test_symlinked_out_refused(tmp_path, kind):
    ds = _pack(tmp_path, ["a"])
    real = tmp_path / "real"
    if kind == "file":
        real.write_bytes(b"mine")
    elif kind == "busy":
        make_tree(real, {"mine.txt": b"mine"})
    link = tmp_path / "link"
    link.symlink_to(real)
    needles = {"dangling": ["symbolic link", str(real), "which does not exist"],
               "file": ["symbolic link", str(real), "which is not a folder"],
               "busy": ["empty"]}[kind]
    for args in _export_cases(link):
        _one_error(run_cli(args[0], ds, *args[1:], ok=None), *needles)
        assert link.is_symlink() and os.readlink(link) == str(real)
        if kind == "dangling":
            assert not os.path.lexists(real)
        elif kind == "file":
            assert real.read_bytes() == b"mine"
        else:
            _no_leftovers(real, {"mine.txt": b"mine"})
        assert sorted(os.listdir(tmp_path)) == sorted(["img", "ds.csv", "ds", "link"]
                                                      + ([] if kind == "dangling" else ["real"]))


# 7. A tar member that differs from the index --------------------------------------------------

def test_tar_member_size_differs_from_the_index(tmp_path):
    ds = _pack(tmp_path, ["a", "b"])
    shard = bytearray((ds / "shard-00000.tar").read_bytes())
    assert shard[124:136] == b"%011o\0" % 40
    shard[124:136] = b"%011o\0" % 39  # same padding: the next member still parses
    shard[148:156] = b" " * 8
    shard[148:156] = b"%06o\0 " % sum(shard[:512])
    (ds / "shard-00000.tar").write_bytes(bytes(shard))
    reseal(ds)
    target = tmp_path / "out"
    _one_error(run_cli("unpack", ds, target, ok=None), "sample 'a'",
               "tar member 'a.jpg' is 39 bytes, the index says 40")
    _no_leftovers(target)
    result = run_cli("verify", ds, ok=None)
    assert result.exit_code == 1
    assert "tar member 'a.jpg' is 39 bytes, the index says 40" in result.output, result.output
