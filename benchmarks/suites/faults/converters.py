"""The faults suite's converter families: tars the way GNU tar writes them (sparse members,
multi-member gzip, base-256 sizes), compressed tars whose name says another compression,
decompression bombs (gzip and a Parquet dictionary), and source files that are not regular
files or lead outside SRC.  Each function returns a list of :class:`.run.Try`, whose ``fn``
runs in a forked child (run.py); every conversion is ``shardpack convert`` in that child."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .crafted import limit_memory
from testbed.tarinputs import (base256_tar, bgzf, converted, gnu_extracted, gnu_tar,
                                one_sample_parquet, one_sample_tar, sparse_tree,
                                tar_with_offsets)

from .run import Try, cli

TARS = "convert: tar and Parquet"
SOURCES = "convert: source files"


def _as_gnu_tar(archive: Path, work: Path) -> tuple[str, str]:
    """Convert ``archive``: ok when what it holds is what GNU tar extracts, a clear error when
    refused in one line, silent when it converted to anything else."""
    kind, detail, _ = cli("convert", archive, work / "out", "--workers", "1")
    if kind != "ok":
        return kind, detail
    got, want = converted(work / "out"), gnu_extracted(archive, work / "gnu")
    if got != want:
        wrong = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        return "silent", (f"{len(got)} samples converted, GNU tar extracts {len(want)}; "
                          f"differ: {wrong[:3]}")
    return "ok", f"{len(got)} samples, as GNU tar extracts them"


# -- tars as GNU tar writes them -------------------------------------------------------------------

SPARSE = {"GNU old": ["--format=gnu"], "pax 0.0": ["--format=posix", "--sparse-version=0.0"],
          "pax 0.1": ["--format=posix", "--sparse-version=0.1"],
          "pax 1.0": ["--format=posix", "--sparse-version=1.0"]}


def tar_format_tries(timeout: float) -> list[Try]:
    """Sparse members of every GNU tar format, BGZF-style gzip, base-256 sizes: each converted
    and compared with GNU tar's own extraction."""
    tries = [Try(TARS, "sparse members, made by GNU tar --sparse (right: GNU tar's bytes)",
                 dict(format=kind, suffix=suffix), _sparse_fn(kind, suffix), timeout)
             for kind in SPARSE for suffix in (".tar", ".tar.gz")]
    tries += [Try(TARS, "BGZF-style multi-member .tar.gz (right: GNU tar's bytes)",
                  dict(members="ending on tar member boundaries" if on else "ending inside "
                       "tar members"), _bgzf_fn(on), timeout) for on in (True, False)]
    tries += [Try(TARS, "base-256 size field (right: GNU tar's bytes)", dict(suffix=suffix),
                  _base256_fn(suffix), timeout) for suffix in (".tar", ".tar.gz")]
    return tries


def _sparse_fn(kind, suffix):
    def fn(work: Path):
        names = sparse_tree(work / "src")
        archive = work / f"sparse{suffix}"
        gnu_tar("--sparse", *SPARSE[kind], "-czf" if suffix == ".tar.gz" else "-cf", archive,
                 *names, cwd=work / "src")
        return _as_gnu_tar(archive, work)
    return fn


def _bgzf_fn(on_boundaries):
    def fn(work: Path):
        raw, ends = tar_with_offsets(100)
        archive = work / "bgzf.tar.gz"
        archive.write_bytes(bgzf(raw, ends, on_boundaries))
        return _as_gnu_tar(archive, work)
    return fn


def _base256_fn(suffix):
    def fn(work: Path):
        import gzip

        raw = base256_tar()
        archive = work / f"b{suffix}"
        archive.write_bytes(gzip.compress(raw, mtime=0) if suffix == ".tar.gz" else raw)
        return _as_gnu_tar(archive, work)
    return fn


# -- a compression its name does not say -----------------------------------------------------------

MISNAMED = {"bzip2 named .tgz": ("bz2", "x.tgz"), "xz named .tgz": ("xz", "x.tgz"),
            "bzip2 named .tar.gz": ("bz2", "x.tar.gz"), "xz named .tar.gz": ("xz", "x.tar.gz"),
            "plain tar named .tgz": ("plain", "x.tgz"), "gzip named .tar": ("gz", "x.tar")}


def misnamed_tries(timeout: float) -> list[Try]:
    """A tar compressed otherwise than its name says: refused in one line (GNU tar's -a would
    pick the compression from the name; reading the bytes as another would be a guess)."""
    return [Try(TARS, "compressed tar whose name says another compression (right: one line)",
                dict(case=case), _misnamed_fn(*made), timeout) for case, made in MISNAMED.items()]


def _misnamed_fn(how, name):
    def fn(work: Path):
        import bz2
        import gzip
        import lzma

        raw, _ = tar_with_offsets(3)
        make = {"bz2": bz2.compress, "xz": lzma.compress, "plain": lambda b: b,
                "gz": lambda b: gzip.compress(b, mtime=0)}[how]
        (work / name).write_bytes(make(raw))
        kind, detail, _ = cli("convert", work / name, work / "out", "--workers", "1")
        if kind == "ok":
            return "silent", f"converted {len(converted(work / 'out'))} samples from {name}"
        return kind, detail
    return fn


# -- decompression bombs ---------------------------------------------------------------------------

def _gzip_bomb(header: bytes, chunks: int, tail: bytes, members: bool = False) -> bytes:
    """A gzip of ``header``, ``chunks`` x 16 MiB of zeros and ``tail`` (deflate's best ratio,
    just over the 1024x cap), built in well under a second: one chunk's deflate blocks are
    compressed once and repeated.  ``members``: each chunk a gzip member of its own."""
    import struct
    import zlib

    def deflate(data: bytes, mode: int) -> bytes:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        return c.compress(data) + c.flush(mode)

    def member(body: bytes, crc: int, size: int) -> bytes:
        return b"\x1f\x8b\x08\x00" + bytes(4) + b"\x02\xff" + body + struct.pack(
            "<II", crc, size & 0xFFFFFFFF)

    zeros = bytes(16 << 20)
    if members:
        one = member(deflate(zeros, zlib.Z_FINISH), zlib.crc32(zeros), len(zeros))
        return (member(deflate(header, zlib.Z_FINISH), zlib.crc32(header), len(header))
                + one * chunks + member(deflate(tail, zlib.Z_FINISH), zlib.crc32(tail),
                                        len(tail)))
    block = deflate(zeros, zlib.Z_SYNC_FLUSH)
    crc = zlib.crc32(header)
    for _ in range(chunks):
        crc = zlib.crc32(zeros, crc)
    crc = zlib.crc32(tail, crc)
    body = deflate(header, zlib.Z_SYNC_FLUSH) + block * chunks + deflate(tail, zlib.Z_FINISH)
    return member(body, crc, len(header) + chunks * len(zeros) + len(tail))


def _header(name: str, size: int, pax: bool = False) -> bytes:
    import tarfile

    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.PAX_FORMAT if pax else tarfile.USTAR_FORMAT)


GZIP_BOMBS = ("one 320 MiB member of zeros", "one 320 MiB member, a gzip member per 16 MiB",
              "pax size of 320 MiB", "320 MiB of zeros after the end-of-archive blocks")


def bomb_tries(timeout: float) -> list[Try]:
    """Gzip bombs (about 330 KB that decompress to 320 MiB) and Parquet dictionary bombs (one
    1 MiB value referred to by 2,000 rows: 2 GB of cells in a few KB), each converted in a
    process whose address space may grow by 1 GiB only (a conversion that expands them is a
    MemoryError: another exception)."""
    tries = [Try(TARS, "gzip decompression bomb (right: one line, in bounded memory)",
                 dict(case=case), _gzip_bomb_fn(case), timeout) for case in GZIP_BOMBS]
    tries += [Try(TARS, "Parquet dictionary bomb (right: one line, in bounded memory)",
                  dict(case=case), _parquet_bomb_fn(case), timeout) for case in PARQUET_BOMBS]
    return tries


def _gzip_bomb_fn(case):
    def fn(work: Path):
        import shardpack.interop.sources.webdataset  # noqa: F401 - before the limit

        size = 20 * (16 << 20)
        end = bytes(1024)
        if case.startswith("320 MiB of zeros after"):  # a small good tar, then the zeros
            raw, _ = tar_with_offsets(3)
            data = _gzip_bomb(raw[:-1024], 20, end)
        else:
            data = _gzip_bomb(_header("k.bin", size, pax=case.startswith("pax")), 20, end,
                              members="gzip member per" in case)
        archive = work / "bomb.tar.gz"
        archive.write_bytes(data)
        limit_memory()
        if case.startswith("320 MiB of zeros after"):
            return _as_gnu_tar(archive, work)
        kind, detail, _ = cli("convert", archive, work / "out", "--workers", "1")
        return ("silent", "converted the bomb") if kind == "ok" else (kind, detail)
    return fn


PARQUET_BOMBS = ("dictionary column (Arrow schema stored)", "no Arrow schema stored",
                 "image struct's bytes", "list elements")


def _parquet_bomb_fn(case):
    def fn(work: Path):
        import pyarrow as pa
        import pyarrow.parquet as pq

        import shardpack.interop.sources.parquet  # noqa: F401 - before the limit

        rows, value = 2_000, b"\0" * (1 << 20)

        def repeated(v):
            kind = pa.string() if isinstance(v, str) else pa.binary()
            return pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()),
                                                  pa.array([v], kind))

        store = case != "no Arrow schema stored"
        if case.startswith("image"):
            table = pa.table({"image": pa.StructArray.from_arrays(
                [repeated(value), pa.array(["x.png"] * rows)], ["bytes", "path"])})
        elif case.startswith("list"):
            table = pa.table({"tags": pa.ListArray.from_arrays(
                pa.array([0, rows], pa.int32()), repeated("t" * (1 << 20)))})
        else:
            table = pa.table({"data": repeated(value)})
        src = work / "bomb.parquet"
        pq.write_table(table, src, compression="zstd", store_schema=store)
        limit_memory()
        kind, detail, _ = cli("convert", src, work / "out", "--workers", "1")
        return ("silent", "converted the bomb") if kind == "ok" else (kind, detail)
    return fn


# -- source files that are not regular files, or lead outside SRC ----------------------------------

def _source(src: Path, case: str) -> None:
    """A good source of ``case`` with one sample (k0), without the file the try puts in place
    unless the source's index names it (MDS, LitData)."""
    from testbed.peerformats import litdata, mds, spec

    if case.startswith("WebDataset"):
        src.mkdir()
        one_sample_tar(src / "0.tar", "k0")
    elif case.startswith("Parquet"):
        one_sample_parquet(src / ("0.parquet" if "top" in case else "data/0.parquet"), "k0")
    elif case.startswith("MDS"):
        mds(src, {"txt": "bytes"}, [[b"x"]])
    else:
        litdata(src, ["bytes"], [[b"x"]], spec(["txt"]))


# case -> the file put in place, relative to SRC
PLACES = {"WebDataset folder, a.tar": "a.tar", "WebDataset folder, a.tar.gz": "a.tar.gz",
          "Parquet, data.parquet at the top": "data.parquet",
          "Parquet, data.parquet in a sub-folder": "data/data.parquet",
          "MDS shard": "shard.00000.mds", "LitData chunk": "chunk-0-0.bin"}


def source_file_tries(timeout: float) -> list[Try]:
    """A FIFO in a source file's place, and a link to a good file outside SRC (no
    --follow-links), in every converter's source: one line naming the file, never a wait."""
    return [Try(SOURCES, row, dict(source=case), _source_file_fn(case, what), timeout)
            for what, row in (("fifo", "a FIFO in a source file's place (right: one line)"),
                              ("link", "a link leading outside SRC, without --follow-links "
                                       "(right: one line)"))
            for case in PLACES]


def _source_file_fn(case, what):
    def fn(work: Path):
        src = work / "src"
        _source(src, case)
        target = src / PLACES[case]
        target.parent.mkdir(parents=True, exist_ok=True)
        if what == "fifo":
            target.unlink(missing_ok=True)
            os.mkfifo(target)
        else:
            outside = work / "outside" / target.name
            outside.parent.mkdir()
            if target.exists():  # (MDS, LitData: the index names it)
                shutil.move(target, outside)
            elif target.name.startswith("a.tar"):
                one_sample_tar(outside, "a")
            else:
                one_sample_parquet(outside, "a")
            os.symlink(outside, target)
        kind, detail, _ = cli("convert", src, work / "out", "--workers", "1")
        if kind == "ok":
            return "silent", f"converted with the {what} in place: {detail}"
        if kind == "clear error" and str(target) not in detail:
            return "silent", f"the line does not name {target}: {detail}"
        if (work / "out" / "shardpack.json").exists():
            return "silent", f"a dataset was published in OUT ({kind}: {detail})"
        return kind, detail
    return fn
