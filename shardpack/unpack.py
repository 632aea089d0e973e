"""``shardpack unpack``: a dataset back to files, ``OUT/<key>.<field>``.

Safe by construction: every name is checked (no absolute names, no '..', no empty components, no
NUL), tar members must be regular files (links, devices and FIFOs are refused, never created), files
are created with O_EXCL|O_NOFOLLOW, and the tree is built in a hidden sibling folder that is renamed
onto OUT only when complete, so an error leaves no half-written OUT behind.
"""

from __future__ import annotations

import os
import shutil
import uuid

from . import format as fmt
from .errors import ShardpackError, UnsafePathError
from .reader import DatasetReader, record_payload


def unpack(url, out, storage_options: dict | None = None, progress: bool = False) -> int:
    """Write every field of every sample under ``out``; returns the number of files written."""
    reader = DatasetReader(url, storage_options)
    out = os.path.abspath(os.fspath(out))
    if os.path.lexists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ShardpackError("output exists and is not an empty folder", path=out,
                             hint="choose a new folder")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(tmp)
    written = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(reader), unit="sample", desc="unpacking")
    # An ImageFolder pack took ``cls`` from the class folder, not from a file: unpack writes the
    # class folders (empty ones too, so class numbers survive a re-pack) and no ``.cls`` files,
    # so that packing the result again gives the same samples.
    folder_classes = reader.manifest.get("layout") == "imagefolder"
    try:
        classes = (reader.manifest.get("classes") or []) if folder_classes else []
        for name in classes:
            why = (fmt.unsafe_name_reason(name) if isinstance(name, str) else "not a string")
            if why is None and "/" in name:
                why = "has a /"
            if why is None and classes.count(name) > 1:
                why = "listed twice"
            if why:
                raise UnsafePathError(f"refusing to make class folder {name!r}: {why}",
                                      path=reader.url)
            os.mkdir(os.path.join(tmp, name))
        skip = "cls" if folder_classes else None
        for shard in range(len(reader.shards)):
            written += _unpack_shard(reader, shard, tmp, bar, skip)
        if os.path.isdir(out):
            os.rmdir(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if bar is not None:
            bar.close()
    return written


def _unpack_shard(reader: DatasetReader, shard: int, root: str, bar, skip: str | None) -> int:
    index = reader.index(shard)
    path = reader.shard_path(shard)
    data = reader.storage.read_bytes(reader.shards[shard]["name"])
    if len(data) != index.shard_bytes:
        raise fmt.FormatError(f"shard is {len(data)} bytes, the index says {index.shard_bytes}",
                              path=path, hint="run 'shardpack verify'")
    view = memoryview(data)
    written = 0
    made_dirs: set[str] = set()
    for row in range(index.num_samples):
        start, end = index.span(row)
        key = index.key(row)
        payload = record_payload(index, row, view[start:end], path)
        pos = 0
        for name, off, size in index.sample_fields(row):
            rel = f"{key}.{name}"
            if index.shard_format == "tar":
                member = fmt.parse_tar_member(payload, pos)
                if member.name != index.member_name(key, name) or member.size != size:
                    raise fmt.FormatError(f"tar member {member.name!r} does not match the index "
                                          f"({index.member_name(key, name)!r})", path=path,
                                          offset=start + pos, key=key)
                pos += member.end
            if name == skip:
                continue
            why = fmt.unsafe_name_reason(rel)
            if why:
                raise UnsafePathError(f"refusing to write {rel!r}: {why}", path=path, key=key)
            _write_file(root, rel, payload[off:off + size], made_dirs)
            written += 1
        if bar is not None:
            bar.update(1)
    return written


def _write_file(root: str, rel: str, data, made_dirs: set[str]) -> None:
    folder = os.path.dirname(rel)
    if folder and folder not in made_dirs:
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        made_dirs.add(folder)
    fd = os.open(os.path.join(root, rel), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                 0o644)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
