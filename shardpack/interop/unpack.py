"""``shardpack unpack``: a dataset back to files, ``OUT/<key>.<field>``.

Safe by construction: every name is checked (no absolute names, no '..', no empty components, no
NUL, no component or whole path longer than the file system allows), tar members must be regular
files (links, devices and FIFOs are refused, never created), files are created with
O_EXCL|O_NOFOLLOW and folders one level at a time (never following a link), and the tree is built
in a hidden sibling folder that is renamed onto OUT only when complete, so an error leaves no
half-written OUT behind.  That hidden folder records its owner process (:func:`owner_record`); a
run killed with SIGKILL cannot remove it, so the next run for the same OUT removes the hidden
folders whose owner is gone, and only those (:func:`remove_stale`).  A dataset that names one
shard file twice, two samples whose names clash (``a`` with field ``jpg`` is the file
``a.jpg``; ``a.jpg/b`` needs the folder ``a.jpg``), a full disk and the like are each one
:class:`~shardpack.core.errors.ShardpackError` naming what is at fault.  OUT itself may be a
symbolic link to an empty folder: the folder it points to is filled (the link stays);
links are never followed inside OUT.
"""

from __future__ import annotations

import os
import stat

import numpy as np

from shardpack import format as fmt
from shardpack.core.deprecation import keyword_only, renamed
from shardpack.interop.pixelsout import pixels_writer
from shardpack.core.errors import FormatError, ShardpackError, UnsafePathError
from shardpack.interop.workdir import (
    UNMARKED_GRACE_S, WORK_OLD, WORK_OWNER, WORK_TREE, make_work_dir, os_error, owner_record,
    remove_stale, remove_tree, remove_work, write_all,
)
from shardpack.read.reader import DatasetReader, record_payload

NAME_MAX = 255    # bytes in one path component, where os.pathconf cannot tell
PATH_MAX = 4096   # bytes in a whole path, the terminating NUL included
_shown = fmt.shown_name  # names in messages: a key thousands of characters long is cut
# the work folder's names, also here where they were first (tests, tools and export import them)
__all__ = ["NAME_MAX", "PATH_MAX", "UNMARKED_GRACE_S", "WORK_OLD", "WORK_OWNER", "WORK_TREE",
           "check_shard_names", "os_error", "owner_record", "remove_stale", "remove_tree",
           "remove_work", "resolve_out", "unpack", "unpack_replacing"]


@renamed(url="dataset")
@keyword_only("storage_options", "progress")
def unpack(dataset, out, *, storage_options: dict | None = None, progress: bool = False,
           pixels_as: str = "npy") -> int:
    """Write every field of every sample under ``out``; returns the number of files written.

    Args:
        dataset: the dataset's folder or URL (``url=`` is the deprecated spelling).
        out: the output folder (absent, or an empty folder).
        storage_options: fsspec options for a remote dataset.
        progress: show a progress bar.
        pixels_as: raw-pixel fields (``pack --pixels``) as stored (``"npy"``) or as PNG files
            (``"png"``).
    """
    return _unpack(dataset, out, storage_options, progress, replace=False, pixels_as=pixels_as)


def unpack_replacing(url, out, storage_options: dict | None = None,
                     progress: bool = False, pixels_as: str = "npy") -> int:
    """:func:`unpack` onto an existing folder ``out`` (``export --to files --overwrite``; the
    caller has checked that it may be replaced): the new tree is built beside it and swapped in
    by two renames when complete; the old tree is then removed.

    Args:
        url: the dataset's folder or URL.
        out: the folder to replace.
        storage_options: fsspec options for a remote dataset.
        progress: show a progress bar.
        pixels_as: as :func:`unpack`'s.
    """
    return _unpack(url, out, storage_options, progress, replace=True, pixels_as=pixels_as)


def _unpack(url, out, storage_options: dict | None, progress: bool, replace: bool,
            pixels_as: str = "npy") -> int:
    write_field = pixels_writer(pixels_as)
    reader = DatasetReader(url, storage_options=storage_options)
    check_shard_names(reader)
    out = resolve_out(out)
    remove_stale(out)  # before any refusal: a killed run's leftovers go whatever this run does
    if not replace and os.path.lexists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ShardpackError("output exists and is not an empty folder", path=out,
                             hint="choose a new folder")
    work = make_work_dir(out)
    tree = os.path.join(work, WORK_TREE)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(reader), unit="sample", desc="unpacking")
    try:
        job = _Job(reader, tree, out, write_field)
        _fill(job, bar)
        if replace:
            old = os.path.join(work, WORK_OLD)
            os.rename(out, old)
            try:
                os.rename(tree, out)
            except BaseException:
                os.rename(old, out)
                raise
        else:
            if os.path.isdir(out):
                os.rmdir(out)
            os.rename(tree, out)
    except BaseException as exc:
        remove_work(work)
        if isinstance(exc, OSError) and not isinstance(exc, ShardpackError):
            raise os_error(exc, out, tmp=tree) from None
        raise
    finally:
        if bar is not None:
            bar.close()
    remove_work(work)  # the owner record and, replacing, the old tree (a kill: the next run)
    return job.written


def _fill(job: _Job, bar) -> None:
    reader = job.reader
    # An ImageFolder pack took ``cls`` from the class folder, not from a file: unpack writes the
    # class folders (empty ones too, so class numbers survive a re-pack) and no ``.cls`` files,
    # so that packing the result again gives the same samples.
    folder_classes = reader.manifest.layout == "imagefolder"
    classes = list(reader.manifest.classes or ()) if folder_classes else []
    for name in classes:
        why = (fmt.unsafe_name_reason(name) if isinstance(name, str) else "not a string")
        if why is None and "/" in name:
            why = "has a /"
        if why is None and classes.count(name) > 1:
            why = "listed twice"
        if why is None:
            why = job.too_long(name)
        if why:
            raise UnsafePathError(f"refusing to make class folder {_shown(name)!r}: {why}",
                                  path=reader.storage.url)
        job.mkdir(name)
    skip = "cls" if folder_classes else None
    for shard in range(len(reader.shards)):
        _unpack_shard(job, shard, bar, skip)


def check_shard_names(reader) -> None:
    """Refuse a manifest that names one shard or index file twice: unpacking or exporting it
    would write every sample of that shard twice.

    Args:
        reader: the dataset's reader.
    """
    seen: set[str] = set()
    for entry in reader.shards:
        for name in (entry.name, entry.index):
            if name in seen:
                raise FormatError(f"the manifest names the shard file {name!r} twice",
                                  path=reader.storage.display(fmt.MANIFEST_NAME),
                                  hint="the manifest was edited or damaged")
            seen.add(name)


def resolve_out(out) -> str:
    """The absolute output folder.  Decision: a symbolic link given as OUT is followed (once, here:
    the folder it points to is the one filled, and the link is kept), as ``cp`` and ``tar -C``
    do; a link to nothing or to something not a folder is refused, naming both."""
    out = os.path.abspath(os.fspath(out))
    if not os.path.islink(out):
        return out
    target = os.path.realpath(out)
    if not os.path.isdir(target):
        what = "does not exist" if not os.path.lexists(target) else "is not a folder"
        raise UnsafePathError(f"output is a symbolic link to {target!r}, which {what}",
                              path=out, hint="remove the link, or point it at an empty folder")
    return target




class _Job:
    """What one unpack has written so far under ``root`` (the hidden folder that becomes OUT)."""

    def __init__(self, reader: DatasetReader, root: str, out: str, field_out=None):
        self.reader, self.root, self.out = reader, root, out
        self.field_out = field_out or pixels_writer("npy")  # (name, bytes) written for a field
        self.written = 0
        self.made_dirs: set[str] = set()
        self.name_max = _pathconf(root, "PC_NAME_MAX", NAME_MAX)
        self.path_max = _pathconf(root, "PC_PATH_MAX", PATH_MAX)
        self.root_bytes = len(os.fsencode(root)) + 1

    def too_long(self, rel: str) -> str | None:
        """Why ``rel`` cannot be a path under the output folder on this file system, or None."""
        if 4 * len(rel) <= self.name_max and self.root_bytes + 4 * len(rel) < self.path_max:
            return None  # the usual case: short enough even if every character took 4 bytes
        try:
            parts = [len(os.fsencode(p)) for p in rel.split("/")]
        except UnicodeEncodeError:
            return "the name cannot be encoded for the file system"
        longest = max(parts)
        if longest > self.name_max:
            return (f"a part of the name is {longest} bytes, more than the file system allows "
                    f"({self.name_max})")
        total = self.root_bytes + sum(parts) + len(parts) - 1
        if total >= self.path_max:
            return (f"the path would be {total} bytes, more than the file system allows "
                    f"({self.path_max - 1}); the key has {len(parts) - 1} folder levels")
        return None

    def mkdir(self, folder: str) -> None:
        """Make ``folder`` and its parents, one level at a time (``os.makedirs`` recurses once
        per level); an existing file there is a :class:`_Clash`."""
        if folder in self.made_dirs:
            return
        parts = folder.split("/")
        known = len(parts) - 1
        while known and "/".join(parts[:known]) not in self.made_dirs:
            known -= 1
        for level in range(known + 1, len(parts) + 1):
            sub = "/".join(parts[:level])
            path = os.path.join(self.root, sub)
            try:
                os.mkdir(path)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    raise _Clash(sub, folder=True) from None
            self.made_dirs.add(sub)

    def write(self, rel: str, data) -> None:
        folder = os.path.dirname(rel)
        if folder:
            self.mkdir(folder)
        try:
            fd = os.open(os.path.join(self.root, rel),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            raise _Clash(rel, folder=False) from None
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        self.written += 1

    def clash_error(self, clash: _Clash, key: str, rel: str, here: tuple[int, int]):
        """The error for a name already taken under the output folder, naming both samples."""
        path = self.reader.shard_path(here[0])
        taken = os.path.join(self.root, clash.rel)
        is_dir = os.path.isdir(taken) and not os.path.islink(taken)
        other = _writer_of(self.reader, clash.rel, is_dir, here)
        if other is None:
            return UnsafePathError(f"cannot write {_shown(rel)!r}: {_shown(clash.rel)!r} already "
                                   "exists (two names that differ only in case, on a "
                                   "case-insensitive file system?)", path=path, key=_shown(key))
        if other == key:
            return UnsafePathError(f"sample {_shown(key)!r} is in the dataset twice, so "
                                   f"{_shown(rel)!r} would be written twice", path=path)
        first, second = (f"a folder for sample {_shown(other)!r}", f"a file of sample "
                         f"{_shown(key)!r}") if is_dir else (
                         f"a file of sample {_shown(other)!r}",
                         f"a folder for sample {_shown(key)!r}")
        return UnsafePathError(f"samples {_shown(other)!r} and {_shown(key)!r} clash: "
                               f"{_shown(clash.rel)!r} is both {first} and {second}", path=path,
                               hint="one file system path cannot be both; rename one sample")


class _Clash(Exception):
    def __init__(self, rel: str, folder: bool):
        super().__init__(rel)
        self.rel, self.folder = rel, folder


def _writer_of(reader: DatasetReader, rel: str, is_dir: bool, here: tuple[int, int]):
    """The key of the sample, before position ``here`` (shard, row), that wrote the file
    ``rel`` (or made the folder ``rel``); None if none did.  Slow, only for error messages."""
    for shard in range(here[0] + 1):
        index = reader.index(shard)
        rows = here[1] if shard == here[0] else index.num_samples
        for row in range(rows):
            key = index.key(row)
            for name, _, _ in index.sample_fields(row):
                mine = f"{key}.{name}"
                if (mine.startswith(rel + "/") if is_dir else mine == rel):
                    return key
    return None


def _unpack_shard(job: _Job, shard: int, bar, skip: str | None) -> None:
    reader = job.reader
    index = reader.index(shard)
    path = reader.shard_path(shard)
    data = reader.read_shard(shard, exact=False)
    if len(data) != index.shard_bytes:
        raise fmt.FormatError(f"shard is {len(data)} bytes, the index says {index.shard_bytes}",
                              path=path, hint="run 'shardpack verify'")
    view = memoryview(data)
    # every sample against its index hash before any of it is written (a swapped or changed
    # shard is named here, not written out under the wrong keys)
    reader.check_rows(shard, np.arange(index.num_samples, dtype=np.int64), view, fresh=True)
    for row in range(index.num_samples):
        start, end = index.span(row)
        key = index.key(row)
        why = fmt.unsafe_name_reason(key)  # the key itself, as verify and export judge it:
        if why:                            # '' or 'dir/' would still make file names
            raise UnsafePathError(f"refusing to write sample {_shown(key)!r}: {why}", path=path,
                                  key=_shown(key))
        payload = record_payload(index, row, view[start:end], path)
        try:  # tar members: regular files, named and placed as the index says
            index.codec.check_members(index, row, payload)
        except FormatError as exc:
            raise FormatError(exc.message, path=path, offset=start + (exc.offset or 0),
                              key=_shown(key), hint="run 'shardpack verify'") from None
        for name, off, size in index.sample_fields(row):
            if name != skip:
                name, data = job.field_out(name, payload[off:off + size])
                _write_field(job, f"{key}.{name}", data, key, (shard, row))
        if bar is not None:
            bar.update(1)


def _write_field(job: _Job, rel: str, data, key: str, here: tuple[int, int]) -> None:
    """Write one field's bytes as ``rel`` under the output folder, or raise naming the sample
    at position ``here`` (shard, row)."""
    why = fmt.unsafe_name_reason(rel) or job.too_long(rel)
    if why:
        raise UnsafePathError(f"refusing to write {_shown(rel)!r}: {why}",
                              path=job.reader.shard_path(here[0]), key=_shown(key))
    try:
        job.write(rel, data)
    except _Clash as clash:
        raise job.clash_error(clash, key, rel, here) from None
    except OSError as exc:
        raise os_error(exc, job.out, rel) from None


def _pathconf(path: str, what: str, default: int) -> int:
    try:
        value = os.pathconf(path, what)
    except (OSError, ValueError):
        return default
    return value if value and value > 0 else default


