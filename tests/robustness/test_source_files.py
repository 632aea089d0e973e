"""Every file a converter reads is checked as ``pack`` checks its files: a regular file only (a
FIFO, socket or folder in a source file's place is one error line naming it, never a wait on the
FIFO), and a link leading outside SRC refused unless --follow-links; with --skip-bad such a file
is skipped and counted.  The CLI runs in a subprocess under a time limit, so a converter that
opens a FIFO fails the test instead of hanging it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shardpack import format as fmt
from testbed.peerformats import litdata, mds, spec
from testbed.tarinputs import one_sample_parquet, one_sample_tar

from testbed.helpers import run_subprocess

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

LIMIT = 60  # seconds: far more than any of these conversions takes, far less than a hang


def _webdataset(src: Path) -> None:
    src.mkdir()
    one_sample_tar(src / "0.tar", "k0")


def _parquet_top(src: Path) -> None:
    one_sample_parquet(src / "0.parquet", "k0")


def _parquet_sub(src: Path) -> None:
    one_sample_parquet(src / "data" / "0.parquet", "k0")


def _mds(src: Path) -> None:
    mds(src, {"txt": "bytes"}, [[b"x"]])


def _litdata(src: Path) -> None:
    litdata(src, ["bytes"], [[b"x"]], spec(["txt"]))


# case -> (builds a good source, the file put in place: (relative path, how a good one is made,
# or None when the source's index names it and the builder made it))
PLACES = {
    "webdataset-tar": (_webdataset, "a.tar", one_sample_tar),
    "webdataset-tar-gz": (_webdataset, "a.tar.gz", one_sample_tar),
    "parquet-top": (_parquet_top, "data.parquet", one_sample_parquet),
    "parquet-sub-folder": (_parquet_sub, "data/data.parquet", one_sample_parquet),
    "mds-shard": (_mds, "shard.00000.mds", None),
    "litdata-chunk": (_litdata, "chunk-0-0.bin", None),
}


def _source(tmp_path: Path, case: str) -> tuple[Path, Path]:
    """(SRC, the path of the file the test replaces) of a good source of ``case``."""
    build, rel, _ = PLACES[case]
    src = tmp_path / "src"
    build(src)
    target = src / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    return src, target


def _good_file(case: str, path: Path) -> None:
    """A good file of ``case`` at ``path`` (outside SRC, for a link to point at)."""
    _, _, make = PLACES[case]
    if make is None:
        build = PLACES[case][0]
        build(path.parent / "elsewhere")
        os.replace(path.parent / "elsewhere" / PLACES[case][1], path)
    else:
        make(path, "a")


def _convert(src: Path, out: Path, *extra) -> subprocess.CompletedProcess:
    try:
        return run_subprocess("convert", src, out, "--workers", "1", *extra, timeout=LIMIT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"convert of {src} did not finish in {LIMIT} s (a FIFO opened blocking?)")


def _one_line_error(result: subprocess.CompletedProcess, path: Path, *words: str) -> str:
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith(f"shardpack: error: {path}: "), lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.mark.parametrize("case", sorted(PLACES))
def test_a_fifo_in_a_source_files_place_is_one_line_never_a_hang(case, tmp_path):
    src, target = _source(tmp_path, case)
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    result = _convert(src, tmp_path / "out")
    _one_line_error(result, target, "is a FIFO, not a regular file", "--skip-bad")
    assert not (tmp_path / "out" / fmt.MANIFEST_NAME).exists()


@pytest.mark.parametrize("name", ["a.tar", "data.parquet"])
def test_a_fifo_given_as_src_is_one_line(name, tmp_path):
    src = tmp_path / name
    os.mkfifo(src)
    _one_line_error(_convert(src, tmp_path / "out"), src, "is a FIFO, not a regular file")


@pytest.mark.parametrize("kind", ["folder", "socket"])
def test_a_folder_or_socket_named_as_a_tar_is_one_line(kind, tmp_path):
    src, target = _source(tmp_path, "webdataset-tar")
    if kind == "folder":
        target.mkdir()
        (target / "x.txt").write_bytes(b"x")
    else:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(target))
        s.close()
    _one_line_error(_convert(src, tmp_path / "out"), target, f"is a {kind}, not a regular file")


@pytest.mark.parametrize("case", ["webdataset-tar", "webdataset-tar-gz", "parquet-top",
                                  "parquet-sub-folder"])
def test_skip_bad_skips_and_counts_a_fifo(case, tmp_path):
    src, target = _source(tmp_path, case)
    os.mkfifo(target)
    result = _convert(src, tmp_path / "out", "--skip-bad")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"skipped: {target}: is a FIFO, not a regular file" in result.stderr
    manifest = json.loads((tmp_path / "out" / fmt.MANIFEST_NAME).read_text())
    assert manifest["num_samples"] == 1
    assert manifest["skipped"] == {"special": 1}


@pytest.mark.parametrize("case", sorted(PLACES))
def test_an_outside_link_is_refused_unless_follow_links(case, tmp_path):
    src, target = _source(tmp_path, case)
    outside = tmp_path / "outside" / target.name
    outside.parent.mkdir()
    _good_file(case, outside)
    target.unlink(missing_ok=True)
    os.symlink(outside, target)
    line = _one_line_error(_convert(src, tmp_path / "out"), target,
                           f"symlink points outside the source ({outside})", "--follow-links")
    assert "--skip-bad" in line
    assert not (tmp_path / "out" / fmt.MANIFEST_NAME).exists()

    result = _convert(src, tmp_path / "out", "--follow-links")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "followed 1 link leading outside SRC" in result.stdout, result.stdout
    manifest = json.loads((tmp_path / "out" / fmt.MANIFEST_NAME).read_text())
    assert manifest["num_samples"] == (1 if PLACES[case][2] is None else 2)


@pytest.mark.parametrize("case", ["webdataset-tar", "parquet-sub-folder"])
def test_skip_bad_skips_and_counts_an_outside_link(case, tmp_path):
    src, target = _source(tmp_path, case)
    outside = tmp_path / "outside" / target.name
    outside.parent.mkdir()
    _good_file(case, outside)
    os.symlink(outside, target)
    result = _convert(src, tmp_path / "out", "--skip-bad")
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((tmp_path / "out" / fmt.MANIFEST_NAME).read_text())
    assert manifest["num_samples"] == 1
    assert manifest["skipped"] == {"link-outside": 1}


@pytest.mark.parametrize("case", ["mds-shard", "litdata-chunk"])
def test_an_outside_index_is_refused_with_skip_bad_too(case, tmp_path):
    src, _ = _source(tmp_path, case)
    outside = tmp_path / "index.json"
    os.replace(src / "index.json", outside)
    os.symlink(outside, src / "index.json")
    line = _one_line_error(_convert(src, tmp_path / "out", "--skip-bad"), src / "index.json",
                           "symlink points outside the source", "--follow-links")
    assert "--skip-bad" not in line
    result = _convert(src, tmp_path / "out", "--follow-links")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "followed 1 link leading outside SRC" in result.stdout, result.stdout


def test_a_missing_shard_is_still_named_missing_and_a_broken_link_broken(tmp_path):
    src, target = _source(tmp_path, "mds-shard")
    target.unlink()
    _one_line_error(_convert(src, tmp_path / "out"), target, "file is missing")
    os.symlink(src / "nothing", target)
    _one_line_error(_convert(src, tmp_path / "out"), target, "broken symlink")


def test_a_link_inside_src_is_read(tmp_path):
    src, target = _source(tmp_path, "webdataset-tar")
    (src / "kept").mkdir()
    one_sample_tar(src / "kept" / "b.tar", "b")
    os.symlink(src / "kept" / "b.tar", target)
    result = _convert(src, tmp_path / "out")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "followed" not in result.stdout
    assert json.loads((tmp_path / "out" / fmt.MANIFEST_NAME).read_text())["num_samples"] == 2


def test_follow_links_is_recorded_in_the_state_a_resume_compares(tmp_path):
    src, target = _source(tmp_path, "webdataset-tar")
    outside = tmp_path / "outside.tar"
    one_sample_tar(outside, "a")
    os.symlink(outside, target)
    (src / "z.tar").write_bytes(b"not a tar" * 200)  # the run fails after writing its state
    out = tmp_path / "out"
    _one_line_error(_convert(src, out, "--follow-links"), src / "z.tar", "corrupt tar header")
    state = json.loads((out / fmt.STATE_NAME).read_text())
    assert state["follow_links"] is True and state["from"] == "webdataset"


# the storage layer's own opens, the backstop under every converter's check: run in a child
# process, so that a blocking open fails the test instead of hanging it
STORAGE_OPENS = textwrap.dedent("""
    import sys
    from shardpack.core.errors import FormatError
    from shardpack.storage import Storage

    storage = Storage(sys.argv[1])
    for how in ("open", "open_arrow"):
        try:
            with getattr(storage, how)("a.parquet") as f:
                f.read(1)
            print(how, "read")
        except FormatError as exc:
            print(how, exc)
""")


def test_local_storage_opens_refuse_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "a.parquet")
    result = subprocess.run([sys.executable, "-c", STORAGE_OPENS, str(tmp_path)],
                            capture_output=True, text=True, timeout=LIMIT)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout
    for how, line in zip(("open", "open_arrow"), lines, strict=True):
        assert line.startswith(f"{how} {tmp_path / 'a.parquet'}: "), line
        assert "is a FIFO, not a regular file" in line, line
