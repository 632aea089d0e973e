"""Shards changed in place while a process has them mapped, and files that are not files.

A local shard, or its cached copy, truncated, flipped or copied over between epochs or during
one: never a SIGBUS, never a zero-filled or wrong sample under the default check, a one-line
error naming the shard (and the sample, where one is wrong).  Every read is hash-checked by
default; ``check="once"`` keeps the per-process memo.  A device, FIFO or folder in place of the
manifest, an index or a shard is a one-line error, never a block or a MemoryError
(docs/reading.md, "Integrity")."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import shardpack
from shardpack.core.errors import FormatError, IntegrityError, ShardpackError

from testbed.helpers import ROOT, fake_jpeg, make_tree, run_subprocess
from testbed.faults import time_limit

N = 24
PER_SHARD = 12


def _pack(root: Path, shard_format: str = "tar") -> tuple[Path, dict]:
    """A dataset of two shards of 12 samples of ~3 KB (each shard spans several pages), and its
    true bytes by key."""
    src = make_tree(root / "src", {f"c{i % 2}/{i:03d}.jpg": fake_jpeg(3000, seed=i)
                                   for i in range(N)})
    out = root / "out"
    shardpack.pack(src, out, shard_format=shard_format, workers=1, max_samples=PER_SHARD)
    truth = {s["__key__"]: bytes(s["jpg"]) for s in shardpack.open_reader(out)}
    return out, truth


def _shard_file(out: Path, shard: int = 0) -> Path:
    return out / shardpack.open_reader(out).shards[shard].name


# -- truncation: a subprocess per storage, each scenario one line of JSON -----------------------

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import shardpack
    from shardpack.core.errors import ShardpackError

    def items(ds, how):
        """(key, jpg bytes) of one epoch."""
        if how == "map":
            for i in range(len(ds)):
                s = ds[i]
                yield s["__key__"], bytes(s["jpg"])
        elif how == "batched":
            for b in ds:
                yield from zip(list(b["__key__"]), (bytes(v) for v in b["jpg"].items()))
        else:
            for s in ds:
                yield s["__key__"], bytes(s["jpg"])

    def damage(reader, cache, cut):
        entry = reader.shards[0]
        path = reader.access.cache.entry_path(reader.storage.url, entry) if cache \\
            else reader.storage.path(entry.name)
        size = os.path.getsize(path)
        # "page": a page boundary (touching a page past the end faults: SIGBUS); "mid": inside
        # the last page (the rest of that page reads as zeros)
        os.truncate(path, (size // 2) & ~4095 if cut == "page" else size - 100)

    given = json.load(sys.stdin)
    truth = given["truth"]
    for case in given["cases"]:
        where, how, when, cut, check, cache = (case[k] for k in
                                               ("where", "how", "when", "cut", "check", "cache"))
        if how == "map":
            ds = shardpack.open_dataset(where, check=check)
        else:
            ds = shardpack.ShardDataset(where, shuffle=False, batch_size=4,
                                        batched=how == "batched", check=check,
                                        cache_dir=cache, prefetch_shards=0)
        reader = ds.reader
        got, result = [], {"kind": "ok"}
        try:
            for epoch in range(2):
                for n, (key, data) in enumerate(items(ds, how)):
                    got.append(key)
                    if truth[key] != data.hex():
                        result = {"kind": "silent", "key": key}
                        break
                    if when == "during" and epoch == 0 and n == 0:
                        damage(reader, cache, cut)
                if result["kind"] != "ok":
                    break
                if when == "between" and epoch == 0:
                    damage(reader, cache, cut)
        except ShardpackError as exc:
            result = {"kind": "error", "message": str(exc)}
        print(json.dumps(result), flush=True)
''')


def _run_cases(cases: list[dict], truth: dict) -> list[dict]:
    """Run the scenarios in one subprocess: a SIGBUS there ends the process, not the tests."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=120,
                          input=json.dumps({"truth": truth, "cases": cases}))
    assert proc.returncode != -signal.SIGBUS, "SIGBUS after " + proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(results) == len(cases), proc.stdout + proc.stderr
    return results


def _copies(tmp_path: Path, count: int, shard_format: str = "tar") -> tuple[list[Path], dict]:
    """``count`` copies of one packed dataset (each scenario damages its own)."""
    first, truth = _pack(tmp_path / "base", shard_format)
    outs = []
    for i in range(count):
        outs.append(tmp_path / f"copy{i}")
        shutil.copytree(first, outs[-1])
    return outs, {k: v.hex() for k, v in truth.items()}


def test_a_truncated_local_shard_is_one_line_never_sigbus(tmp_path):
    """Truncated between epochs or during one (after the first item), at a page boundary
    (touching the map past it would fault) or inside the last page (it would read zeros), in
    every reader and check mode: one line naming the shard, never a SIGBUS or a zero-filled
    sample.  Before the size check this died of SIGBUS."""
    combos = [(how, when, cut, check)
              for how in ("samples", "batched", "map")
              for when in ("between", "during")
              for cut, check in (("page", "every"), ("mid", "none"))]
    combos += [("batched", "during", "mid", "once"), ("samples", "between", "page", "once")]
    outs, truth = _copies(tmp_path, len(combos), "msgpack")
    cases = [dict(where=str(out), how=how, when=when, cut=cut, check=check, cache=None)
             for out, (how, when, cut, check) in zip(outs, combos, strict=True)]
    for case, result in zip(cases, _run_cases(cases, truth), strict=True):
        name = _shard_file(Path(case["where"])).name
        assert result["kind"] == "error", (case["how"], case["when"], case["cut"], result)
        assert name in result["message"] and "\n" not in result["message"], result
        # found at the epoch's start (the stat: mapped again, refused), or at the next use of
        # the map (its size: a map has no epochs)
        mapped_again = case["when"] == "between" and case["how"] != "map"
        assert ("manifest says" if mapped_again else "truncated or rewritten in place") in \
            result["message"], (case, result)


def test_a_truncated_cached_copy_is_one_line_never_sigbus(tmp_path, http_server):  # noqa: F811
    """The cached copy of a remote shard, truncated while mapped: during an epoch, one line;
    between epochs the copy is found changed at the epoch's start and the cache fetches it
    again (or says why not in one line).  Never a SIGBUS or a wrong sample."""
    out, truth = _pack(tmp_path / "data")
    server = http_server(out)
    truth = {k: v.hex() for k, v in truth.items()}
    combos = [(how, when, cut) for how in ("samples", "batched")
              for when, cut in (("during", "page"), ("between", "mid"))]
    cases = [dict(where=server.url, how=how, when=when, cut=cut, check="every",
                  cache=str(tmp_path / f"cache{i}")) for i, (how, when, cut) in enumerate(combos)]
    for case, result in zip(cases, _run_cases(cases, truth), strict=True):
        if case["when"] == "during":
            assert result["kind"] == "error", (case, result)
        assert result["kind"] in ("ok", "error"), (case, result)
        if result["kind"] == "error":
            assert "shard-00000" in result["message"] and "\n" not in result["message"]


# -- flipped in place, mtime kept: caught by the default, in the same process -------------------

def _flip(path: Path, offset: int) -> None:
    """Flip one byte of ``path`` in place (os.pwrite), then put its mtime back."""
    st = os.stat(path)
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([byte[0] ^ 0x20]), offset)
    finally:
        os.close(fd)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns


def _epoch(ds) -> dict:
    if ds.batched:
        return {k: bytes(v) for b in ds for k, v in zip(list(b["__key__"]), b["jpg"].items(),
                                                        strict=True)}
    return {s["__key__"]: bytes(s["jpg"]) for s in ds}


@pytest.mark.parametrize("where", ["local", "cached"])
@pytest.mark.parametrize("batched", [False, True])
def test_a_byte_flipped_in_place_is_caught_in_the_next_epoch(tmp_path, http_server,  # noqa: F811
                                                             where, batched):
    """A byte of a mapped shard (the local file, or the cached copy of a remote one) flipped
    in place with its mtime put back, then the next epoch in the same process: the default
    check raises, naming the shard and the sample.  Before every read was checked, the
    cached case came back wrong (the memo trusted the cache's verification)."""
    out, truth = _pack(tmp_path / "data")
    url = out if where == "local" else http_server(out).url
    cache = tmp_path / "cache" if where == "cached" else None
    ds = shardpack.ShardDataset(url, shuffle=False, batch_size=4, batched=batched,
                                cache_dir=cache, prefetch_shards=0)
    assert _epoch(ds) == truth
    reader = ds.reader
    index = reader.index(0)
    name, off, size = index.sample_fields(1)[-1]
    path = Path(reader.access.cache.entry_path(reader.storage.url, reader.shards[0])
                if cache else out / reader.shards[0].name)
    _flip(path, int(index.starts[1]) + off + size // 2)
    with pytest.raises(IntegrityError, match=rf"shard-00000\.\w+, sample '{index.key(1)}'.*"
                                             "do not match the index hash"):
        _epoch(ds)


def test_check_once_misses_a_cached_copy_flipped_in_place(tmp_path, http_server):  # noqa: F811
    """What ``check="once"`` is documented to miss: a cached copy changed in place after the
    cache verified it.  The local file changed in place is caught even so (its ctime moved:
    mapped again, checked again)."""
    out, truth = _pack(tmp_path / "data")
    server = http_server(out)
    for url, cache in ((server.url, tmp_path / "cache"), (out, None)):
        ds = shardpack.ShardDataset(url, shuffle=False, batch_size=4, batched=True,
                                    cache_dir=cache, prefetch_shards=0, check="once")
        assert _epoch(ds) == truth
        reader = ds.reader
        index = reader.index(0)
        name, off, size = index.sample_fields(1)[-1]
        path = Path(reader.access.cache.entry_path(reader.storage.url, reader.shards[0])
                    if cache else out / reader.shards[0].name)
        _flip(path, int(index.starts[1]) + off + size // 2)
        if cache is not None:
            got = _epoch(ds)
            assert got[index.key(1)] != truth[index.key(1)]  # the documented miss
            _flip(path, int(index.starts[1]) + off + size // 2)  # (put it back)
        else:
            with pytest.raises(IntegrityError, match=rf"sample '{index.key(1)}'"):
                _epoch(ds)


def test_a_shard_copied_over_between_epochs_is_mapped_again(tmp_path):
    """``cp other.tar shard.tar``: same size, same inode, new bytes.  The stat at the epoch's
    start sees it, maps the shard again and forgets what was checked: refused as a shard that
    does not match its index, also with ``check="once"``.  Before, the memo kept serving the
    old checks and the new bytes came back."""
    out, truth = _pack(tmp_path / "data")
    a, b = _shard_file(out, 0), _shard_file(out, 1)
    assert a.stat().st_size == b.stat().st_size
    for check in ("once", "every"):
        ds = shardpack.ShardDataset(out, shuffle=False, batch_size=4, batched=True,
                                    check=check)
        assert _epoch(ds) == truth
        keep = a.read_bytes()
        inode = a.stat().st_ino
        shutil.copyfile(b, a)  # in place: truncate and write
        assert a.stat().st_ino == inode
        with pytest.raises(IntegrityError, match=r"shard-00000\.tar.*does not match its index"):
            _epoch(ds)
        a.write_bytes(keep)
        assert _epoch(ds) == truth  # put back: read again, whole


@pytest.mark.parametrize("check", ["every", "once", "none"])
def test_msgpack_batched_never_returns_zero_filled_samples(tmp_path, check):
    """The second half of a mapped msgpack shard zeroed in place (truncated and grown back to
    its size, mtime put back), then the next epoch of the batched path: an error in every
    check mode, never zero-filled samples.  Record headers are checked in every batch (with
    the memo, or with no check, they used to be checked once, and zeros came back)."""
    out, truth = _pack(tmp_path / "data", "msgpack")
    ds = shardpack.ShardDataset(out, shuffle=False, batch_size=4, batched=True, check=check)
    assert _epoch(ds) == truth
    path = _shard_file(out)
    st = path.stat()
    os.truncate(path, st.st_size // 2)
    os.truncate(path, st.st_size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(IntegrityError, match=r"shard-00000\.\w+"):
        got = _epoch(ds)
        assert not [k for k, v in got.items() if v != truth[k]]  # (never reached)


def test_check_option_spelling(tmp_path):
    out, _ = _pack(tmp_path / "data")
    assert shardpack.ShardDataset(out).reader.check == "every"
    assert shardpack.ShardDataset(out, trust_storage=True).reader.check == "none"
    assert shardpack.ShardDataset([out, out], check="once").reader.check == "once"
    assert shardpack.open_dataset(out, check="once").reader.check == "once"
    with pytest.raises(ValueError, match="check must be one of 'every', 'once', 'none'"):
        shardpack.DatasetReader(out, check="always")
    with pytest.raises(ValueError, match="contradicts check='every'"):
        shardpack.ShardDataset(out, trust_storage=True, check="every")


# -- not regular files -------------------------------------------------------------------------

def _replace(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:  # a device: a link to /dev/zero (stat follows it; creating device nodes needs root)
        path.symlink_to("/dev/zero")


def _reads(out: Path, how: str):
    if how == "reader":
        shardpack.open_reader(out).read_sample(0)
    elif how == "iter":
        list(shardpack.open_reader(out))
    elif how == "batched":
        list(shardpack.ShardDataset(out, batch_size=4, batched=True))
    else:
        list(shardpack.ShardDataset(out))


@pytest.mark.parametrize("what", ["manifest", "index", "shard"])
@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_a_device_fifo_or_folder_in_place_of_a_file_is_one_line(tmp_path, what, kind):
    """Manifest, index or shard replaced by a FIFO (whose open would wait for a writer), a
    folder, or /dev/zero (endless bytes): one line naming the file, within a second, from
    the readers and from the CLI."""
    out, _ = _pack(tmp_path / "data")
    reader = shardpack.open_reader(out)
    target = out / {"manifest": "shardpack.json", "index": reader.shards[0].index,
                    "shard": reader.shards[0].name}[what]
    key = reader.index(0).key(0)
    _replace(target, kind)
    name = {"fifo": "a FIFO", "folder": "a folder", "device": "a device"}[kind]
    for how in ("reader", "iter", "batched", "samples"):
        with time_limit(10), pytest.raises(FormatError) as info:
            _reads(out, how)
        assert str(info.value).startswith(f"{target}: {what} is {name}, not a regular file"), \
            (how, str(info.value))
    result = run_subprocess("cat", out, key, "--field", "jpg", timeout=30)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert f"{what} is {name}, not a regular file" in lines[0], lines
    # the commands that read whole shards: verify names it as a problem, unpack in one line
    result = run_subprocess("verify", out, timeout=30)
    assert result.returncode in (1, 2), result.stdout + result.stderr
    assert f"{what} is {name}, not a regular file" in result.stdout + result.stderr
    result = run_subprocess("unpack", out, tmp_path / "files", timeout=30)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert f"{what} is {name}, not a regular file" in lines[0], lines


def test_an_error_never_blocks_on_a_fifo_swapped_in_after_the_stat(tmp_path, monkeypatch):
    """The race the fstat closes: a FIFO in place when the file is opened (after any earlier
    look) does not block the open (O_NONBLOCK), and is refused before a byte is read."""
    out, _ = _pack(tmp_path / "data")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    from shardpack.storage import read_regular

    with time_limit(10), pytest.raises(ShardpackError, match="x is a FIFO, not a regular file"):
        read_regular(str(fifo), "x", "x")
