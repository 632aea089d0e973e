"""Samples larger than memory: pack copies large files in chunks, verify hashes large records in
chunks; the bytes are those of the in-memory path, and memory does not grow with the sample."""

import json
import os
import shutil

import pytest
import xxhash

import shardpack
from shardpack import format as fmt
from shardpack.core.errors import SourceError
from shardpack.inspect import chunked
from shardpack.inspect.verify import verify
from shardpack.write import fields, writer

from testbed.helpers import dataset_files, make_tree, peak_rss, run_cli

MODES = [("tar", "none"), ("msgpack", "none")]


def _tree(root):
    rng = __import__("random").Random(3)
    return make_tree(root, {
        "a.bin": rng.randbytes(3000), "a.txt": b"small",
        "big.bin": rng.randbytes(70_000), "big.json": b'{"n": 1}',
        "c.jpg": rng.randbytes(20_000),  # not an image: --check none below
        "d.bin": rng.randbytes(513),
    })


@pytest.fixture
def streams(monkeypatch):
    """Files from 1 KB on are streamed; returns the list of files each pass copied."""
    copied = []
    real = fields.FileStream.chunks

    def chunks(self):
        copied.append(os.path.basename(self.field.path))
        yield from real(self)

    monkeypatch.setattr(fields, "STREAM_SIZE", 1024)
    monkeypatch.setattr(fields, "STREAM_CHUNK", 1000)  # several chunks a file
    monkeypatch.setattr(fields.FileStream, "chunks", chunks)
    return copied


@pytest.mark.parametrize("shard_format,compression", MODES)
def test_streamed_pack_is_byte_identical_to_in_memory(tmp_path, monkeypatch, streams,
                                                      shard_format, compression):
    src = _tree(tmp_path / "src")
    streamed, whole = tmp_path / "streamed", tmp_path / "whole"
    shardpack.pack(src, streamed, shard_format=shard_format, compression=compression,
                   check="none", max_samples=2, workers=1)
    assert sorted(set(streams)) == ["a.bin", "big.bin", "c.jpg"]  # the files over 1 KB
    # a msgpack record is read once for its CRC32C, then copied
    assert len(streams) == 3 * (2 if shard_format == "msgpack" else 1)
    monkeypatch.setattr(fields, "STREAM_SIZE", 1 << 40)
    shardpack.pack(src, whole, shard_format=shard_format, compression=compression,
                   check="none", max_samples=2, workers=1)
    assert len(streams) == 3 * (2 if shard_format == "msgpack" else 1)  # nothing streamed
    assert dataset_files(streamed) == dataset_files(whole)
    assert verify(streamed).ok


def test_images_to_check_are_read_whole(tmp_path, streams):
    """--check needs an image whole: only files packed as they are stream."""
    src = _tree(tmp_path / "src")
    (src / "c.jpg").unlink()
    shardpack.pack(src, tmp_path / "out", workers=1)  # --check quick: no image left anyway
    assert sorted(set(streams)) == ["a.bin", "big.bin"]


def test_file_changed_between_crc_and_copy_fails_the_shard(tmp_path, monkeypatch, streams):
    """msgpack: the file is read for the record's CRC32C, then copied; other bytes the second
    time (same size and mtime) fail the pack, and no shard is published."""
    src = _tree(tmp_path / "src")
    big = src / "big.bin"
    real = writer._parts_crc

    def crc_then_change(parts):
        crc = real(parts)
        if not any(isinstance(p, fields.FileStream) and p.field.path == str(big) for p in parts):
            return crc
        st = big.stat()
        big.write_bytes(b"x" * st.st_size)
        os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns))
        return crc

    monkeypatch.setattr(writer, "_parts_crc", crc_then_change)
    out = tmp_path / "out"
    with pytest.raises(SourceError, match="changed while it was copied"):
        shardpack.pack(src, out, shard_format="msgpack", check="none", workers=1,
                       on_error="skip")
    assert not list(out.glob("*.spk"))


def test_fields_over_a_format_limit_are_refused_in_one_line(tmp_path, monkeypatch):
    src = _tree(tmp_path / "src")
    # every limit lies above the streaming size (fields under it take the plain path)
    assert fields.STREAM_SIZE <= min(writer.MAX_COMPRESSED_FIELD, fmt.MsgpackCodec.max_field)
    monkeypatch.setattr(fields, "STREAM_SIZE", 1024)
    monkeypatch.setattr(writer, "MAX_COMPRESSED_FIELD", 10_000)
    result = run_cli("pack", src, tmp_path / "z", "--format", "msgpack", "--compression",
                     "zstd", "--check", "none", ok=False)
    assert result.exit_code != 0
    assert "big.bin" in result.output and "--compression none" in result.output
    monkeypatch.setattr(fmt.MsgpackCodec, "max_field", 10_000)
    result = run_cli("pack", src, tmp_path / "m", "--format", "msgpack", "--check", "none",
                     ok=False)
    assert result.exit_code != 0 and "--format tar" in result.output
    assert "Traceback" not in result.output


@pytest.fixture
def in_chunks(monkeypatch):
    """verify reads every shard in 1000-byte ranged reads, records from 2 KB hashed in chunks;
    returns the rows so read."""
    monkeypatch.setattr(chunked, "WHOLE_SHARD", 0)
    monkeypatch.setattr(chunked, "WHOLE_RECORD", 2048)
    monkeypatch.setattr(chunked, "CHUNK", 1000)
    rows = []
    real = chunked.read_large_record

    def spy(index, row, chunks):
        rows.append(index.key(row))
        return real(index, row, chunks)

    monkeypatch.setattr(chunked, "read_large_record", spy)
    return rows


def _flip(out, key, at):
    """Flip a byte of sample ``key``'s record, ``at`` bytes from its start or its end
    (negative); the shard's hash is left stale on purpose only if not resealed."""
    manifest = json.loads((out / fmt.MANIFEST_NAME).read_text())
    for entry in manifest["shards"]:
        index = fmt.decode_index((out / entry["index"]).read_bytes())
        if key in index.keys():
            row = index.keys().index(key)
            start, end = index.span(row)
            with open(out / entry["name"], "r+b") as f:
                f.seek(start + at if at >= 0 else end + at)
                byte = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([byte[0] ^ 0x40]))
            return


@pytest.mark.parametrize("shard_format,compression", MODES)
def test_verify_in_chunks_passes_and_names_a_flipped_byte(tmp_path, in_chunks, shard_format,
                                                          compression):
    from testbed.helpers import reseal

    src = _tree(tmp_path / "src")
    out = tmp_path / "out"
    shardpack.pack(src, out, shard_format=shard_format, compression=compression,
                   check="none", workers=1)
    report = verify(out)
    assert report.ok, report.problems
    assert sorted(in_chunks) == ["a", "big", "c"]  # the records over 2 KB
    _flip(out, "big", 40_000)  # inside the large field's data
    problems = [str(p) for p in verify(out).problems]
    assert any("shard hash does not match" in p for p in problems)
    assert any("'big'" in p and "do not match the sample's hash" in p for p in problems)
    _flip(out, "big", 40_000)  # back; now a framing byte, every hash resealed
    _flip(out, "big", 3 if shard_format == "tar" else 26)
    reseal(out)
    problems = [str(p) for p in verify(out).problems]
    assert len(problems) == 1 and "'big'" in problems[0], problems


def test_truncated_shard_read_in_chunks_names_the_samples_past_its_end(tmp_path, in_chunks):
    out = tmp_path / "out"
    shardpack.pack(_tree(tmp_path / "src"), out, check="none", workers=1)
    shard = next(out.glob("*.tar"))
    os.truncate(shard, shard.stat().st_size // 2)
    problems = [str(p) for p in verify(out).problems]
    assert any("truncated" in p for p in problems)
    assert any("runs past the end of the shard" in p for p in problems)


def _run_measured(*args) -> tuple[int, int]:
    """(exit status, peak RSS in bytes) of ``python -m shardpack.cli ARGS`` under an address
    space limit of 1 GiB beyond what the interpreter and the CLI's imports map: the child's own
    VmHWM (testbed.helpers.peak_rss), not the test process's."""
    result, peak = peak_rss(*args, headroom=1 << 30, timeout=1800)
    assert peak is not None, result.stderr[-2000:]
    return result.returncode, peak


PEAK_RSS_BOUND = 512 << 20  # far below the 5 GiB sample; the CLI itself peaks near 60 MB


@pytest.mark.slow
def test_five_gib_sample_packs_and_verifies_in_bounded_memory(tmp_path):
    """A sparse 5 GiB file (real bytes at both ends) beside two small ones: ``pack`` and
    ``verify``, each a CLI subprocess whose address space may grow by 1 GiB past its imports
    (RLIMIT_AS, a fifth of the sample), must succeed with a peak RSS (the child's own VmHWM)
    under PEAK_RSS_BOUND, and the packed member must hold the file's exact bytes (compared by
    xxh3-64 in 8 MiB chunks)."""
    if shutil.disk_usage(tmp_path).free < 15 << 30:
        pytest.skip("needs 15 GiB free disk")
    size = 5 << 30
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_bytes(b"a" * 100)
    (src / "c.txt").write_bytes(b"c" * 100)
    big = src / "big.bin"
    with open(big, "wb") as f:
        f.write(os.urandom(1 << 20))
        f.truncate(size)
        f.seek(size - (1 << 20))
        f.write(os.urandom(1 << 20))
    out = tmp_path / "out"
    status, peak = _run_measured("pack", src, out, "--quiet")
    assert status == 0 and peak < PEAK_RSS_BOUND, (status, peak)
    status, peak = _run_measured("verify", out, "--quiet")
    assert status == 0 and peak < PEAK_RSS_BOUND, (status, peak)
    # the member's bytes are the file's
    manifest = json.loads((out / fmt.MANIFEST_NAME).read_text())
    for entry in manifest["shards"]:
        index = fmt.decode_index((out / entry["index"]).read_bytes())
        if "big" in index.keys():
            row = index.keys().index("big")
            (name, off, length), = index.sample_fields(row)
            assert length == size
            start = index.span(row)[0] + off
            assert _chunked_hash(out / entry["name"], start, size) == _chunked_hash(big, 0, size)
            break
    else:
        raise AssertionError("sample 'big' not packed")


def _chunked_hash(path, start: int, size: int) -> int:
    hasher = xxhash.xxh3_64()
    with open(path, "rb") as f:
        f.seek(start)
        while size:
            chunk = f.read(min(8 << 20, size))
            assert chunk
            hasher.update(chunk)
            size -= len(chunk)
    return hasher.intdigest()
