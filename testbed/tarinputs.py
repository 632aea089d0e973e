"""Converter inputs as other tools write them, for the converter tests and the fault benchmark:
tars that GNU tar writes (sparse members, base-256 sizes), BGZF-style multi-member gzip, one-sample
tars and Parquet files, and what GNU tar itself extracts, to compare a conversion with."""

from __future__ import annotations

import gzip
import io
import random
import subprocess
import tarfile
from pathlib import Path


def gnu_tar(*args, cwd) -> None:
    """Run GNU ``tar ARGS`` in ``cwd``; a failure raises."""
    subprocess.run(["tar", *map(str, args)], cwd=cwd, check=True, capture_output=True)


def gnu_extracted(archive: Path, where: Path) -> dict:
    """``{key: {field: bytes}}`` of the regular files GNU tar extracts from ``archive`` into
    the new folder ``where`` (key: the path up to the first dot of the name)."""
    where.mkdir()
    gnu_tar("-xf", archive, cwd=where)
    out: dict = {}
    for path in sorted(p for p in where.rglob("*") if p.is_file()):
        head, _, base = path.relative_to(where).as_posix().rpartition("/")
        stem, _, field = base.partition(".")
        out.setdefault(f"{head}/{stem}" if head else stem, {})[field] = path.read_bytes()
    return out


def converted(out: Path) -> dict:
    """``{key: {field: bytes}}`` of the shardpack dataset at ``out``."""
    import shardpack

    return {s["__key__"]: {k: bytes(v) for k, v in s.items() if k != "__key__"}
            for s in shardpack.open_reader(out)}


def sparse_tree(root: Path) -> list[str]:
    """Two sparse files under ``root`` (one with 7 data segments, more than an old GNU header
    holds; one ending in a hole) and their labels; returns the member names in archive
    order."""
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


def tar_with_offsets(n: int) -> tuple[bytes, list[int]]:
    """A ustar tar of ``n`` samples (a .bin and a .cls each) and where each member ends."""
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


def bgzf(raw: bytes, ends: list[int], on_boundaries: bool) -> bytes:
    """``raw`` as gzip members of about 64 KiB (each ending on a tar member's end, or 7 bytes
    past 64 KiB, inside a member), and BGZF's empty last member."""
    cuts, last = [], 0
    for end in ends:
        if end - last >= 64 << 10:
            last = end if on_boundaries else last + (64 << 10) + 7
            cuts.append(last)
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    return b"".join(gzip.compress(p, mtime=0) for p in pieces) + gzip.compress(b"", mtime=0)


def base256_tar() -> bytes:
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


def one_sample_tar(path: Path, key: str) -> None:
    """A tar (gzipped for a .gz name) holding one sample, ``KEY.txt`` = the key."""
    with tarfile.open(path, "w:gz" if path.name.endswith(".gz") else "w") as tf:
        info = tarfile.TarInfo(f"{key}.txt")
        info.size = len(key)
        tf.addfile(info, io.BytesIO(key.encode()))


def one_sample_parquet(path: Path, key: str) -> None:
    """A Parquet file holding one sample: ``__key__`` and ``txt`` = the key."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"__key__": [key], "txt": [key.encode()]}), path)
