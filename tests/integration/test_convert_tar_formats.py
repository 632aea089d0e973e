"""convert --from webdataset reads a tar the way GNU tar does, or refuses it in one line: GNU
sparse members (old GNU, pax 0.0, 0.1, 1.0) expanded exactly, multi-member gzip read whole,
base-256 sizes, a compression that must match the file's name, and decompression that stops at
the cap.  Every accepted input is compared with GNU tar's own extraction."""

import bz2
import gzip
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import struct
import textwrap
import zlib

import pytest

from shardpack import format as fmt
from shardpack.interop.convert import convert
from shardpack.core.errors import SourceError

from testbed.helpers import run_subprocess
from testbed.tarinputs import (base256_tar, bgzf, converted, gnu_extracted, gnu_tar,
                                sparse_tree, tar_with_offsets)

pytestmark = pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")


def _same_as_gnu_tar(archive, tmp_path, name="out") -> dict:
    convert(archive, tmp_path / name, workers=1)
    got = converted(tmp_path / name)
    assert got == gnu_extracted(archive, tmp_path / f"{name}-gnu")
    return got


# -- sparse members ------------------------------------------------------------------------
SPARSE = {"gnu": ["--format=gnu"], "pax-0.0": ["--format=posix", "--sparse-version=0.0"],
          "pax-0.1": ["--format=posix", "--sparse-version=0.1"],
          "pax-1.0": ["--format=posix", "--sparse-version=1.0"]}


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
@pytest.mark.parametrize("kind", sorted(SPARSE))
def test_sparse_members_are_expanded_like_gnu_tar(tmp_path, kind, suffix):
    names = sparse_tree(tmp_path / "src")
    archive = tmp_path / f"sparse{suffix}"
    gnu_tar("--sparse", *SPARSE[kind], "-czf" if suffix == ".tar.gz" else "-cf", archive,
             *names, cwd=tmp_path / "src")
    got = _same_as_gnu_tar(archive, tmp_path)
    assert sorted(got) == ["k/a", "k/b"]
    assert len(got["k/a"]["bin"]) == 1_048_616 and len(got["k/b"]["bin"]) == 300_000
    assert got["k/a"]["bin"] == (tmp_path / "src/k/a.bin").read_bytes()


def test_a_sparse_member_over_the_expansion_cap_is_refused(tmp_path):
    (tmp_path / "src").mkdir()
    with open(tmp_path / "src/big.bin", "wb") as f:  # 300 MiB of holes around 4 KiB of data
        f.truncate(300 << 20)
        f.seek(1 << 20)
        f.write(b"y" * 4096)
    gnu_tar("--sparse", "--format=posix", "-cf", tmp_path / "s.tar", "big.bin",
             cwd=tmp_path / "src")
    with pytest.raises(SourceError, match=r"s\.tar: tar member 'big\.bin' is a sparse file of "
                                          r"314572800 bytes holding 4096: refused"):
        convert(tmp_path / "s.tar", tmp_path / "out", workers=1)


# -- multi-member gzip ---------------------------------------------------------------------
@pytest.mark.parametrize("cut", ["member boundaries", "mid-member"])
def test_multi_member_gzip_is_read_whole(tmp_path, cut):
    raw, ends = tar_with_offsets(100)
    archive = tmp_path / "bgzf.tar.gz"
    archive.write_bytes(bgzf(raw, ends, on_boundaries=cut == "member boundaries"))
    assert gzip.decompress(archive.read_bytes()) == raw  # several members, read whole
    got = _same_as_gnu_tar(archive, tmp_path)
    assert len(got) == 100


# -- base-256 sizes ------------------------------------------------------------------------
def test_base_256_sizes_read_as_gnu_tar_reads_them(tmp_path):
    raw = base256_tar()
    (tmp_path / "b.tar").write_bytes(raw)
    (tmp_path / "b.tar.gz").write_bytes(gzip.compress(raw, mtime=0))
    plain = _same_as_gnu_tar(tmp_path / "b.tar", tmp_path, "plain")
    assert plain == _same_as_gnu_tar(tmp_path / "b.tar.gz", tmp_path, "gz")
    assert plain["b"]["bin"] == bytes(range(256)) * 3
    assert fmt.parse_tar_header(raw, 1024).size == 768
    negative = bytearray(raw)
    negative[1024 + 124] = 0xff
    with pytest.raises(fmt.FormatError):
        fmt.parse_tar_header(bytes(negative), 1024)


# -- compression must match the name ---------------------------------------------------------
MISMATCH = {  # file name -> (how its bytes are made from a tar, words the error line holds)
    "bz.tgz": (bz2.compress, "named as a gzip-compressed tar but its bytes are "
                             "bzip2-compressed"),
    "xz.tar.gz": (lzma.compress, "its bytes are xz-compressed"),
    "plain.tgz": (lambda raw: raw, "its bytes are a plain (uncompressed) tar", "rename it .tar"),
    "gz.tar": (lambda raw: gzip.compress(raw, mtime=0),
               "named .tar but its bytes are gzip-compressed", "rename it .tar.gz"),
}


@pytest.mark.parametrize("name", sorted(MISMATCH))
def test_compression_must_match_the_name(tmp_path, name):
    raw, _ = tar_with_offsets(3)
    make, *words = MISMATCH[name]
    (tmp_path / name).write_bytes(make(raw))
    result = run_subprocess("convert", tmp_path / name, tmp_path / "out", "--workers", "1",
                            timeout=60)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"shardpack: error: {tmp_path / name}: "), lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert not (tmp_path / "out" / fmt.MANIFEST_NAME).exists()


# -- decompression cap -----------------------------------------------------------------------
BOMB_RUN = textwrap.dedent("""
    import json, resource, sys
    import numpy, PIL.Image, zstandard  # noqa: F401 - before the limit
    import shardpack.interop.sources.webdataset  # noqa: F401
    from shardpack.interop.convert import convert
    from shardpack.core.errors import ShardpackError

    def vm():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

    limit = vm() + (512 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        convert(sys.argv[1], sys.argv[2], workers=1, progress=False)
        result = ["ok", ""]
    except ShardpackError as exc:
        result = [type(exc).__name__, str(exc)]
    except MemoryError as exc:
        result = ["MemoryError", str(exc)]
    # the peak of this image (VmHWM, KiB): ru_maxrss would start at the forking test process's
    rss = int(next(line.split()[1] for line in open("/proc/self/status")
                   if line.startswith("VmHWM:")))
    print(json.dumps(result + [rss]))
""")


def _gzip_bomb(header: bytes, chunks: int, tail: bytes) -> tuple[bytes, float]:
    """One gzip stream of ``header``, ``chunks`` x 16 MiB of zeros and ``tail``, built in well
    under a second (the deflate blocks of one chunk, compressed once and repeated: each starts
    afresh, so they decode the same anywhere), and the ratio of a chunk."""
    def deflate(data: bytes, mode: int) -> bytes:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        return c.compress(data) + c.flush(mode)

    zeros = bytes(16 << 20)
    block = deflate(zeros, zlib.Z_SYNC_FLUSH)
    crc = zlib.crc32(header)
    for _ in range(chunks):
        crc = zlib.crc32(zeros, crc)
    crc = zlib.crc32(tail, crc)
    size = len(header) + chunks * len(zeros) + len(tail)
    body = deflate(header, zlib.Z_SYNC_FLUSH) + block * chunks + deflate(tail, zlib.Z_FINISH)
    head = b"\x1f\x8b\x08\x00" + bytes(4) + b"\x02\xff"
    return head + body + struct.pack("<II", crc, size & 0xFFFFFFFF), len(zeros) / len(block)


def test_a_gzip_bomb_is_refused_before_it_is_read(tmp_path):
    """One 320 MiB member of zeros in a 327 KB gzip (deflate's best ratio, just over the 1024x
    cap): refused, naming the member, before its data is read, in a process whose address
    space is 512 MiB above its start (reading the member whole, as before, ran out of memory)
    and whose peak RSS stays far below the member.  (The same bytes read whole by the code
    before the cap: MemoryError.)"""
    info = tarfile.TarInfo("k.bin")
    info.size = 20 * (16 << 20)
    data, ratio = _gzip_bomb(info.tobuf(format=tarfile.USTAR_FORMAT), 20, bytes(1024))
    assert ratio > 1024  # deflate's ratio on zeros: over the cap
    archive = tmp_path / "bomb.tar.gz"
    archive.write_bytes(data)
    result = subprocess.run([sys.executable, "-c", BOMB_RUN, str(archive), str(tmp_path / "o")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    kind, message, rss_kib = json.loads(result.stdout.splitlines()[-1])
    assert kind == "SourceError", message
    assert "tar member 'k.bin' ends at byte 335544832 of the decompressed tar, past the cap" \
        in message and "bomb.tar.gz" in message
    assert rss_kib < 200 << 10


def test_the_decompression_cap_stops_a_stream_between_members(tmp_path, monkeypatch):
    from shardpack.interop.sources import tarread

    raw, ends = tar_with_offsets(40)
    archive = tmp_path / "t.tar.gz"
    archive.write_bytes(gzip.compress(raw, mtime=0))
    monkeypatch.setattr(tarread, "EXPANSION_FLOOR", 20_000)
    monkeypatch.setattr(tarread, "MAX_EXPANSION", 0)
    with pytest.raises(SourceError, match=r"t\.tar\.gz: (tar member 's\d+\.(bin|cls)' ends at "
                                          r"byte \d+ of the decompressed tar, past|member \d+ "
                                          r"\(after '.*'\): the tar decompresses to more than) "
                                          r"the cap of 20000 bytes: refused"):
        convert(archive, tmp_path / "out", workers=1)
    assert not (tmp_path / "out" / fmt.MANIFEST_NAME).exists()
    monkeypatch.setattr(tarread, "EXPANSION_FLOOR", len(raw))  # the whole tar fits: read
    assert convert(archive, tmp_path / "out2", workers=1).samples == 40


def _gnu_sparse_header(name: bytes, stored: int, realsize: int, extended: bool) -> bytes:
    """An old GNU sparse (type ``S``) header block: one segment of ``stored`` bytes at 0."""
    block = bytearray(512)
    block[:len(name)] = name
    block[100:108] = b"0000644\0"
    block[124:136] = b"%011o\0" % stored
    block[156:157] = b"S"
    block[257:265] = b"ustar  \0"
    block[386:410] = b"%011o\0" % 0 + b"%011o\0" % stored
    block[482] = int(extended)
    block[483:495] = b"%011o\0" % realsize
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_endless_sparse_headers_are_refused(tmp_path, suffix):
    """Old GNU sparse extension blocks that never end (3,000 of them, 1.5 MB, each saying
    another follows): tarfile would read them all into memory; refused past 1 MiB."""
    ext = bytearray(512)
    ext[504] = 1
    raw = (_gnu_sparse_header(b"k.bin", 512, 4096, True) + bytes(ext) * 3000
           + bytes(512) + bytes(1024))
    archive = tmp_path / f"s{suffix}"
    archive.write_bytes(gzip.compress(raw, mtime=0) if suffix == ".tar.gz" else raw)
    with pytest.raises(SourceError, match=r"its headers \(pax records, GNU long names, sparse "
                                          r"map\) run over 1 MiB: refused"):
        convert(archive, tmp_path / "out", workers=1)


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_a_short_sparse_header_is_one_error(tmp_path, suffix):
    """An old GNU sparse header that says an extension block follows, at the end of the file:
    one SourceError (tarfile itself raised IndexError)."""
    raw = _gnu_sparse_header(b"k.bin", 0, 4096, True)
    archive = tmp_path / f"s{suffix}"
    archive.write_bytes(gzip.compress(raw, mtime=0) if suffix == ".tar.gz" else raw)
    with pytest.raises(SourceError, match=r"s\.tar(\.gz)?: "):
        convert(archive, tmp_path / "out", workers=1)


def test_the_scan_of_a_local_tar_asks_the_kernel_to_read_ahead(tmp_path, monkeypatch):
    """A cold tar's header scan would wait on the disk at every member: the scan hints the
    kernel (WILLNEED) window by window ahead of it, over the whole file, and the data converted
    is the same."""
    import io
    import os

    from shardpack.interop.sources import webdataset as wds

    src = tmp_path / "src"
    src.mkdir()
    members = {f"{i:04d}.bin": bytes([i % 251]) * (3000 + i) for i in range(60)}
    with tarfile.open(src / "shard-0.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, fileobj=io.BytesIO(data))
    size = (src / "shard-0.tar").stat().st_size
    hints = []
    real = os.posix_fadvise

    def record(fd, offset, length, advice):
        if advice == os.POSIX_FADV_WILLNEED:
            hints.append((offset, length))
        return real(fd, offset, length, advice)
    monkeypatch.setattr(wds.os, "posix_fadvise", record)
    monkeypatch.setattr(wds.ReadAhead, "WINDOW", 32 << 10)
    convert(str(src), str(tmp_path / "out"), workers=1)
    assert len(hints) >= size // (32 << 10) - 1, hints
    covered = sorted(hints)
    assert covered[0][0] == 0 and covered[-1][0] + covered[-1][1] >= size - (32 << 10), covered
    assert all(a + n == b for (a, n), (b, _) in zip(covered, covered[1:], strict=False)), covered
    got = converted(tmp_path / "out")
    assert {k: v["bin"] for k, v in got.items()} == {n[:-4]: d for n, d in members.items()}


def test_a_file_without_a_descriptor_is_scanned_without_hints():
    import io

    from shardpack.interop.sources.webdataset import ReadAhead

    ahead = ReadAhead(io.BytesIO(b"x" * 10))
    assert ahead.fd is None
    ahead.reach(0)  # no hint, no error
