"""convert --from webdataset reads a tar the way GNU tar does, or refuses it in one line: GNU
sparse members (old GNU, pax 0.0, 0.1, 1.0) expanded exactly, multi-member gzip read whole,
base-256 sizes, a compression that must match the file's name, and decompression that stops at
the cap.  Every accepted input is compared with GNU tar's own extraction."""

import bz2
import gzip
import io
import json
import lzma
import random
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
from shardpack.read.reader import DatasetReader

from testbed.helpers import run_subprocess

pytestmark = pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")


def _gnu_tar(*args, cwd) -> None:
    subprocess.run(["tar", *map(str, args)], cwd=cwd, check=True, capture_output=True)


def _extracted(archive, where) -> dict:
    """``{key: {field: bytes}}`` of what GNU tar extracts from ``archive`` (regular files)."""
    where.mkdir()
    _gnu_tar("-xf", archive, cwd=where)
    out: dict = {}
    for path in sorted(p for p in where.rglob("*") if p.is_file()):
        rel = path.relative_to(where).as_posix()
        head, _, base = rel.rpartition("/")
        stem, _, field = base.partition(".")
        out.setdefault(f"{head}/{stem}" if head else stem, {})[field] = path.read_bytes()
    return out


def _converted(out) -> dict:
    return {s["__key__"]: {k: bytes(v) for k, v in s.items() if k != "__key__"}
            for s in DatasetReader(out)}


def _same_as_gnu_tar(archive, tmp_path, name="out") -> dict:
    convert(archive, tmp_path / name, workers=1)
    got = _converted(tmp_path / name)
    assert got == _extracted(archive, tmp_path / f"{name}-gnu")
    return got


# -- sparse members ------------------------------------------------------------------------
def _sparse_tree(root) -> list[str]:
    """Two sparse files (one with 7 data segments, more than an old GNU header holds, one ending
    in a hole) and their labels; returns the member names in archive order."""
    rng = random.Random(5)
    (root / "k").mkdir(parents=True)
    with open(root / "k/a.bin", "wb") as f:
        f.truncate(1_048_616)
        for i in range(7):
            f.seek(i * 151_000)
            f.write(rng.randbytes(3000 + i))
    with open(root / "k/b.bin", "wb") as f:
        f.truncate(300_000)
        f.seek(4096)
        f.write(b"x" * 5000)
    (root / "k/a.cls").write_bytes(b"3")
    (root / "k/b.cls").write_bytes(b"1")
    return ["k/a.bin", "k/a.cls", "k/b.bin", "k/b.cls"]


SPARSE = {"gnu": ["--format=gnu"], "pax-0.0": ["--format=posix", "--sparse-version=0.0"],
          "pax-0.1": ["--format=posix", "--sparse-version=0.1"],
          "pax-1.0": ["--format=posix", "--sparse-version=1.0"]}


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
@pytest.mark.parametrize("kind", sorted(SPARSE))
def test_sparse_members_are_expanded_like_gnu_tar(tmp_path, kind, suffix):
    names = _sparse_tree(tmp_path / "src")
    archive = tmp_path / f"sparse{suffix}"
    _gnu_tar("--sparse", *SPARSE[kind], "-czf" if suffix == ".tar.gz" else "-cf", archive,
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
    _gnu_tar("--sparse", "--format=posix", "-cf", tmp_path / "s.tar", "big.bin",
             cwd=tmp_path / "src")
    with pytest.raises(SourceError, match=r"s\.tar: tar member 'big\.bin' is a sparse file of "
                                          r"314572800 bytes holding 4096: refused"):
        convert(tmp_path / "s.tar", tmp_path / "out", workers=1)


# -- multi-member gzip ---------------------------------------------------------------------
def _tar_with_offsets(n: int) -> tuple[bytes, list[int]]:
    """A tar of ``n`` samples (a .bin and a .cls each) and where each member ends."""
    rng = random.Random(3)
    buf, ends = io.BytesIO(), []
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(n):
            for field, data in (("bin", rng.randbytes(rng.randint(100, 3000))),
                                ("cls", str(i % 7).encode())):
                info = tarfile.TarInfo(f"s{i:04d}.{field}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
                ends.append(tf.offset)
    return buf.getvalue(), ends


@pytest.mark.parametrize("cut", ["member boundaries", "mid-member"])
def test_multi_member_gzip_is_read_whole(tmp_path, cut):
    raw, ends = _tar_with_offsets(100)
    cuts, last = [], 0
    for end in ends:  # BGZF-style: gzip members of about 64 KiB
        if end - last >= 64 << 10:
            last = end if cut == "member boundaries" else last + (64 << 10) + 7
            cuts.append(last)
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert len(pieces) >= 3
    archive = tmp_path / "bgzf.tar.gz"
    archive.write_bytes(b"".join(gzip.compress(p, mtime=0) for p in pieces)
                        + gzip.compress(b"", mtime=0))  # BGZF's empty end member
    got = _same_as_gnu_tar(archive, tmp_path)
    assert len(got) == 100


# -- base-256 sizes ------------------------------------------------------------------------
def _base256_tar() -> bytes:
    """A ustar tar whose second member's size field is GNU base-256."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in (("a.txt", b"first"), ("b.bin", bytes(range(256)) * 3)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    raw = bytearray(buf.getvalue())
    at = 1024  # the second header
    raw[at + 124:at + 136] = b"\x80" + (768).to_bytes(11, "big")
    raw[at + 148:at + 156] = b" " * 8
    raw[at + 148:at + 156] = b"%06o\0 " % sum(raw[at:at + 512])
    return bytes(raw)


def test_base_256_sizes_read_as_gnu_tar_reads_them(tmp_path):
    raw = _base256_tar()
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
    raw, _ = _tar_with_offsets(3)
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

    raw, ends = _tar_with_offsets(40)
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
