"""Each bad input gets a one-line error naming the file and a non-zero exit; nothing is published.
With --skip-bad the same entries are skipped and counted instead."""

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from concurrent.futures import Executor, Future
from pathlib import Path

import pytest

import shardpack
from shardpack import format as fmt
from shardpack.core.errors import SourceError

from testbed import imagegen
from testbed.helpers import fake_jpeg, make_tree, reseal, run_cli, run_subprocess


def assert_one_line_error(result, *needles):
    assert result.exit_code != 0
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("shardpack: error:")]
    assert len(errors) == 1, result.output
    for needle in needles:
        assert needle in errors[0], errors[0]


def assert_nothing_published(out: Path):
    if out.exists():
        names = os.listdir(out)
        assert fmt.MANIFEST_NAME not in names
        assert not [n for n in names if ".tmp-" in n], names


@pytest.fixture
def src(tmp_path):
    return make_tree(tmp_path / "src", {"a/1.jpg": fake_jpeg(40), "a/2.jpg": fake_jpeg(50),
                                        "b/3.jpg": fake_jpeg(60)})


def test_missing_source(tmp_path):
    result = run_cli("pack", tmp_path / "nope", tmp_path / "out", ok=None)
    assert_one_line_error(result, "nope", "does not exist")
    assert not (tmp_path / "out").exists()


def test_empty_source(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".DS_Store").write_bytes(b"x")
    result = run_cli("pack", tmp_path / "empty", tmp_path / "out", ok=None)
    assert_one_line_error(result, "empty", "is empty")


def _add_bad(src: Path, kind: str) -> Path:
    bad = src / "a" / f"bad-{kind}.jpg"
    if kind == "fifo":
        os.mkfifo(bad)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(bad))
        s.close()
    elif kind == "device":
        try:
            os.mknod(bad, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod needs root")
    elif kind == "link-outside":
        outside = src.parent / "secret.jpg"
        outside.write_bytes(b"secret")
        os.symlink(outside, bad)
    elif kind == "broken-link":
        os.symlink(src / "nowhere.jpg", bad)
    elif kind == "link-loop":
        bad = src / "a" / "loop"
        os.symlink(src / "a", bad)
    elif kind == "self-link":
        os.symlink(bad, bad)
    return bad


BAD = {"fifo": "FIFO", "socket": "socket", "device": "device", "link-outside": "outside",
       "broken-link": "broken symlink", "link-loop": "symlink loop", "self-link": "symlink loop"}


def test_file_without_extension(src, tmp_path):
    """One sample per image (ImageFolder): a README is no sample, ignored and counted.  Grouped
    WebDataset-style it has no field name: an error, or a counted skip."""
    (src / "a" / "README").write_bytes(b"x")
    summary = shardpack.pack(src, tmp_path / "out", workers=1)
    assert summary.samples == 3 and summary.ignored == 1
    result = run_subprocess("pack", src, tmp_path / "out2", "--group", "webdataset", timeout=60)
    assert result.returncode == 2 and "no extension" in result.stderr
    assert str(src / "a" / "README") in result.stderr
    result = run_subprocess("pack", src, tmp_path / "out2", "--group", "webdataset",
                            "--skip-bad", "--overwrite", timeout=60)
    assert result.returncode == 0, result.stderr
    assert "skipped 1 bad-name" in result.stdout


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_entries_error_or_skip(src, tmp_path, kind):
    bad = _add_bad(src, kind)
    out = tmp_path / "out"
    # subprocess with a timeout: a FIFO that got opened would hang the pack
    result = run_subprocess("pack", src, out, timeout=60)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and str(bad) in line and BAD[kind] in line, line
    assert "--skip-bad" in line
    assert_nothing_published(out)
    result = run_subprocess("pack", src, out, "--skip-bad", "--overwrite", timeout=60)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / fmt.MANIFEST_NAME).read_text())
    assert manifest["num_samples"] == 3 and sum(manifest["skipped"].values()) == 1
    assert "skipped 1" in result.stdout


def test_unreadable_file(src, tmp_path):
    bad = src / "a" / "0.jpg"
    bad.write_bytes(b"private")
    bad.chmod(0)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "shardpack.cli", "pack", str(src), str(out), "--workers", "1"]
    if os.geteuid() == 0:  # root reads anything: drop the capabilities that let it
        if not shutil.which("setpriv"):
            pytest.skip("needs setpriv (util-linux) to drop root's read override")
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] + cmd
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and str(bad) in line and "ermission denied" in line, line
    assert_nothing_published(out)


def test_names_with_spaces_unicode_newlines_and_empty_files(tmp_path):
    src = make_tree(tmp_path / "src", {"a b/ü n.bin": b"", "x\ny.txt": b"nl"})
    out = tmp_path / "out"
    run_cli("pack", src, out, "--layout", "files")
    listing = run_cli("ls", out).output
    assert "a b/ü n" in listing and "$'x\\ny'" in listing  # one key a line: newline escaped
    assert run_cli("cat", out, "x\ny").output == "nl"


def test_non_utf8_name_is_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "ok.jpg").write_bytes(b"1")
    bad = os.path.join(os.fsencode(src), b"bad\xff.jpg")
    with open(bad, "wb") as f:
        f.write(b"2")
    with pytest.raises(SourceError, match="not valid UTF-8"):
        shardpack.pack(src, tmp_path / "out", workers=1)


def test_cls_file_clashes_with_class_folder(src, tmp_path):
    (src / "a" / "1.cls").write_bytes(b"7")
    result = run_cli("pack", src, tmp_path / "out", ok=None)
    assert_one_line_error(result, str(src / "a" / "1.cls"), "two sources for field 'cls'")


def test_duplicate_key_in_listing(tmp_path):
    make_tree(tmp_path, {"i/1.jpg": b"1"})
    listing = tmp_path / "l.csv"
    listing.write_text("path,key\ni/1.jpg,k\ni/1.jpg,k\n")
    result = run_cli("pack", listing, tmp_path / "out", ok=None)
    assert_one_line_error(result, "l.csv:3", "duplicate sample key 'k'")


def test_unsafe_key_in_listing(tmp_path):
    make_tree(tmp_path, {"i/1.jpg": b"1"})
    listing = tmp_path / "l.csv"
    listing.write_text("path,key\ni/1.jpg,../../etc/x\n")
    result = run_cli("pack", listing, tmp_path / "out", ok=None)
    assert_one_line_error(result, "l.csv:2", "'..'")


class MutatingExecutor(Executor):
    """Runs tasks inline, but first does something to the source (between walk and write: the
    walk's own tasks, which run on the executor too, run untouched)."""

    def __init__(self, action):
        self.action = action

    def submit(self, fn, *args, **kwargs):
        if getattr(fn, "__name__", "") == "write_shard":
            self.action()
        future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


@pytest.mark.parametrize("change,message", [
    (lambda p: p.write_bytes(b"longer than before"), "changed during the pack"),
    (lambda p: p.unlink(), "vanished during the pack"),
])
def test_file_changes_or_vanishes_during_pack(src, tmp_path, change, message):
    victim = src / "b" / "3.jpg"
    out = tmp_path / "out"
    with pytest.raises(SourceError, match=message) as info:
        shardpack.pack(src, out, executor=MutatingExecutor(lambda: change(victim)))
    assert str(victim) in str(info.value)
    assert_nothing_published(out)


def test_file_changes_during_pack_skip_bad(src, tmp_path):
    victim = src / "b" / "3.jpg"
    out = tmp_path / "out"
    summary = shardpack.pack(src, out, on_error="skip",
                             executor=MutatingExecutor(lambda: victim.write_bytes(b"xxxxxx")))
    assert summary.samples == 2 and summary.skipped == {"read-failed": 1}


def test_out_of_disk_space(tmp_path, small_disk):
    mnt = small_disk
    try:
        src = make_tree(tmp_path / "src", {f"{i}.bin": os.urandom(200_000) for i in range(12)})
        out = mnt / "out"
        result = run_subprocess("pack", src, out, "--shard-size", "500KB", timeout=120)
        assert result.returncode == 2, result.stderr
        line = result.stderr.strip()
        assert "\n" not in line and "out of disk space" in line and "--resume" in line, line
        assert_nothing_published(out)
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_corrupt_image_with_resize(tmp_path):
    good = imagegen.ALL_VALID["jpeg_rgb"][0]
    src = make_tree(tmp_path / "src", {"ok.jpg": good, "bad.jpg": b"\xff\xd8 not a jpeg"})
    result = run_cli("pack", src, tmp_path / "out", "--resize", "64", "--workers", "1", ok=None)
    assert_one_line_error(result, str(src / "bad.jpg"), "JPEG")  # the quick check, first
    assert_nothing_published(tmp_path / "out")
    result = run_cli("pack", src, tmp_path / "out2", "--resize", "64", "--workers", "1",
                     "--check", "none", ok=None)
    assert_one_line_error(result, str(src / "bad.jpg"), "not a valid JPEG")  # resize's own
    result = run_cli("pack", src, tmp_path / "out", "--resize", "64", "--skip-bad",
                     "--overwrite", "--workers", "1", "--check", "none")
    assert "skipped 1 broken-image" in result.output


def test_non_empty_out_refused_and_overwrite_rules(src, tmp_path):
    out = tmp_path / "out"
    run_cli("pack", src, out)
    before = (out / fmt.MANIFEST_NAME).read_bytes()
    result = run_cli("pack", src, out, ok=None)
    assert_one_line_error(result, str(out), "not empty", "--overwrite")
    assert (out / fmt.MANIFEST_NAME).read_bytes() == before
    result = run_cli("pack", src, out, "--resume", ok=None)
    assert_one_line_error(result, "finished dataset")
    (out / "notes.txt").write_text("user file")
    result = run_cli("pack", src, out, "--overwrite", ok=None)
    assert_one_line_error(result, "did not write", "notes.txt")
    assert (out / "notes.txt").exists() and (out / fmt.MANIFEST_NAME).read_bytes() == before
    (out / "notes.txt").unlink()
    run_cli("pack", src, out, "--overwrite", "--format", "msgpack")
    assert json.loads((out / fmt.MANIFEST_NAME).read_text())["shard_format"] == "msgpack"
    assert not list(out.glob("*.tar"))


def test_bad_options(src, tmp_path):
    result = run_cli("pack", src, tmp_path / "o", "--compression", "zstd", ok=None)
    assert_one_line_error(result, "msgpack")
    result = run_cli("pack", src, tmp_path / "o", "--shard-size", "lots", ok=None)
    assert_one_line_error(result, "'lots'")


def _tamper_member(out: Path, new_type: bytes = None, new_name: str = None):
    """Rewrite the first member header of the first tar shard, keep everything else consistent."""
    index_path = out / "shard-00000.idx"
    index = fmt.decode_index(index_path.read_bytes())
    shard = bytearray((out / "shard-00000.tar").read_bytes())
    block = shard[:512]
    if new_type is not None:
        block[156:157] = new_type
    keys = index.keys()
    if new_name is not None:
        block[:100] = new_name.encode().ljust(100, b"\0")
        keys[0] = new_name.rsplit(".", 1)[0]
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    shard[:512] = block
    (out / "shard-00000.tar").write_bytes(bytes(shard))
    index_path.write_bytes(fmt.encode_index(
        shard_format="tar", compression="none", shard_bytes=len(shard),
        shard_hash=index.shard_hash, plan_digest=0, skipped=0, fields=index.fields,
        starts=index.starts, raw_sizes=index.raw_sizes, sample_hashes=index.sample_hashes,
        field_offsets=index.field_offsets, field_sizes=index.field_sizes, keys=keys))
    reseal(out)


@pytest.mark.parametrize("tamper,message", [
    (dict(new_type=b"2"), "symlink"),
    (dict(new_type=b"3"), "character device"),
    (dict(new_name="../../evil.jpg"), "'..'"),
    (dict(new_name="/tmp/evil.jpg"), "absolute"),
])
def test_unpack_never_writes_outside(tmp_path, tamper, message):
    src = make_tree(tmp_path / "src", {"a.jpg": fake_jpeg(40), "b.jpg": fake_jpeg(40)})
    out = tmp_path / "ds"
    run_cli("pack", src, out, "--layout", "files")
    _tamper_member(out, **tamper)
    target = tmp_path / "deep" / "target"
    result = run_cli("unpack", out, target, ok=None)
    assert_one_line_error(result, message)
    assert not target.exists() and not (tmp_path / "evil.jpg").exists()
    assert not [n for n in os.listdir(tmp_path / "deep") if "tmp" in n]
