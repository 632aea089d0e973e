"""Files of this machine: regular-file reads, atomic writes by rename, hard links, folder walks
with links and special files told apart, flock-able lock files."""

from __future__ import annotations

import errno
import mmap
import os
import stat
import uuid
from contextlib import contextmanager
from typing import Iterator

import fsspec
from fsspec.implementations.local import LocalFileSystem

from shardpack import format as fmt
from shardpack.core.errors import DatasetNotFoundError, PackError, RESUME
from shardpack.storage.base import TEMP_MARK, Storage, within
from shardpack.storage.regular import file_kind, open_regular, read_regular, read_span

# os.link errors that mean "no hard link here", not "something is wrong": another file system,
# links not allowed (protected_hardlinks, FAT, some FUSE), too many links
NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK})


def is_local(url: str, protocol: str) -> bool:
    """Whether ``url`` names files of this machine: a path, ``file://`` or ``local://``, and
    no fsspec chain (:func:`local_url_path`).

    Args:
        url: a path or URL.
        protocol: its scheme ("file" for a plain path).
    """
    return protocol in ("file", "local") and ("::" not in url or local_url_path(url, protocol)
                                              is not None)


def local_url_path(url: str, protocol: str | None) -> str | None:
    """The local path ``url`` names when it holds ``::`` but is no fsspec chain (fsspec would
    split ``/data/a::b`` into the chain ``/data/a`` and ``b``): a path that exists, or one that
    is not a chain of known protocols (``simplecache::s3://...`` and ``zip://x::s3://...`` stay
    chains; ``/data/a::b`` and ``file:///data/a::v2`` are paths, existing or not, so a pack
    never writes to ``/data/a`` instead).  None otherwise.

    Args:
        url: a path or URL.
        protocol: its scheme ("file" for a plain path).
    """
    if "::" not in url or protocol not in ("file", "local"):
        return None
    scheme, path = fsspec.core.split_protocol(url)
    if os.path.lexists(path) or not _is_chain(url):
        return path
    return None


def _is_chain(url: str) -> bool:
    """Whether ``url`` is an fsspec chain: its first ``::`` piece is a known protocol's name
    (``simplecache::...``), or every piece is a URL of a known protocol (``zip://x::s3://...``).
    ``file:///data/a::v2`` is neither."""
    known = set(fsspec.available_protocols())
    pieces = url.split("::")
    return pieces[0] in known or all(fsspec.core.split_protocol(piece)[0] in known
                                     for piece in pieces)


class LocalStorage(Storage):
    """A folder of this machine: reads of regular files only (shardpack/storage/regular.py),
    atomic writes by a hidden temp file, fsync and rename, hard links between datasets."""

    def _connect(self) -> tuple:
        path = local_url_path(self.url, self.protocol)
        if path is not None:  # a local path holding "::", not an fsspec chain
            self.protocol = "file"
            return LocalFileSystem(), LocalFileSystem._strip_protocol(path)
        return fsspec.core.url_to_fs(self.url, **self._fs_options())

    def location(self, name: str = "") -> str:
        """The absolute path of ``name``.

        Args:
            name: a path relative to the root ("" for the root).
        """
        return self.path(name)

    def local_path(self, name: str = "") -> str:
        """The absolute path of ``name``.

        Args:
            name: a path relative to the root ("" for the root).
        """
        return self.path(name)

    def mtime_ns(self, name: str) -> int:
        """The file's modification time (ns).

        Args:
            name: a path relative to the root.
        """
        return os.stat(self.path(name)).st_mtime_ns

    def kind(self, name: str = "", *, request: bool = True) -> str | None:
        """'file', 'dir', 'other' (links followed), or None when nothing is there.

        Args:
            name: a path relative to the root ("" for the root).
            request: unused: a stat is no request.
        """
        try:
            mode = os.stat(self.path(name)).st_mode
        except (OSError, ValueError):
            return None
        return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"

    def entries(self, folder: str) -> list[tuple[str, str, bool, bool]]:
        """(name, path, is a folder (links followed), is a link) of each entry, sorted.

        Args:
            folder: a local folder.
        """
        return [(e.name, e.path, e.is_dir(), e.is_symlink()) for e in _scandir_sorted(folder)]

    def scan(self, folder: str, stop: tuple[str, ...] = ()) -> list[tuple] | None:
        """See :meth:`Storage.scan`: regular files by one lstat (the loop runs once per file of
        a pack: plain local operations); links resolved and followed; special files named.

        Args:
            folder: a local folder.
            stop: names that make the scan stop at once.
        """
        listed = _scandir_sorted(folder)
        if stop and any(entry.name in stop for entry in listed):
            return None
        out = []
        for entry in listed:
            name = entry.name
            path = f"{folder}/{name}"
            if entry.is_file(follow_symlinks=False):  # the common case: no extra checks
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    pass
                else:
                    out.append((name, path, "file", st.st_size, st.st_mtime_ns, None, None))
                    continue
            out.append(_classify(entry, path))
        return out

    def real(self, path: str) -> str:
        """The real path (links resolved).

        Args:
            path: a local path.
        """
        return os.path.realpath(path)

    def marked(self, folder: str, names: tuple[str, ...]) -> bool:
        """Whether ``folder`` holds one of ``names`` (one stat each).

        Args:
            folder: a local folder.
            names: file names.
        """
        return any(os.path.lexists(f"{folder}/{name}") for name in names)

    def describe(self, name: str) -> tuple[str | None, str | None, tuple[str, str] | None]:
        """See :meth:`Storage.describe`: one stat (links followed) and the real path.

        Args:
            name: a path relative to the root.
        """
        path = self.path(name)
        real = os.path.realpath(path)
        real = None if real == os.path.abspath(path) else real
        try:
            return _mode_kind(os.stat(path).st_mode), real, None
        except OSError as exc:
            return None, real, _stat_problem(exc)

    def every_folder(self, names: list[str]) -> bool:
        """Whether every one of ``names`` is a folder (links followed).

        Args:
            names: names of entries of the root.
        """
        return all(os.path.isdir(self.path(n)) for n in names)

    def has_file_below(self, suffix: str, depth: int, peek: int) -> bool:
        """See :meth:`Storage.has_file_below`: only the first ``peek`` entries of each folder
        are looked at, so a tree of a million images is not walked to tell.

        Args:
            suffix: the end of the name.
            depth: folder levels looked into.
            peek: entries of each folder looked at.
        """
        def look(folder: str, level: int) -> bool:
            try:
                with os.scandir(folder) as it:
                    for n, entry in enumerate(it):
                        if n >= peek:
                            return False
                        if entry.name.startswith("."):
                            continue
                        if entry.name.endswith(suffix):
                            return True
                        if level < depth and entry.is_dir() and look(entry.path, level + 1):
                            return True
            except OSError:
                return False
            return False

        return look(self.root, 1)

    def contains(self, other: Storage, strictly: bool = False) -> str | None:
        """``other``'s real path when it is this folder or lies below it (and this is a folder).

        Args:
            other: another storage.
            strictly: whether this folder itself does not count.
        """
        if not isinstance(other, LocalStorage) or not os.path.isdir(self.root):
            return None
        root, real = os.path.realpath(self.root), os.path.realpath(other.root)
        if strictly and real == root:
            return None
        return real if within(real, root) else None

    def place(self) -> tuple[str, str]:
        """("local", the real path of the root)."""
        return "local", os.path.realpath(self.root)

    def lock_file(self, name: str) -> int:
        """An fd of the lock file ``name`` in the root, made (with the root) when missing.

        Args:
            name: the lock file's name.
        """
        root = self.root
        if os.path.lexists(root) and not os.path.isdir(root):
            raise FileExistsError(errno.EEXIST, "exists and is not a folder", root)
        os.makedirs(root, exist_ok=True)
        return os.open(os.path.join(root, name),
                       os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)

    def can_link(self, source: Storage) -> bool:
        """Whether ``source`` is local too (then :meth:`copy_from` tries a hard link).

        Args:
            source: the storage copied from.
        """
        return isinstance(source, LocalStorage)

    def _fetch(self, name: str, start: int | None, end: int | None, size: int | None) -> bytes:
        # regular files only: never a FIFO's wait or /dev/zero's flood
        return read_span(self.path(name), self.display(name), file_kind(name), start, end, size,
                         self._manifest_cap(name))

    def _fetch_ranges(self, ranges: list, asked: list) -> list[bytes]:
        # each range through the regular-file read: exact bytes or an IntegrityError naming the
        # file, never a FIFO's wait, as for one range
        return [self._fetch(name, start, end, None) if end > start else b""
                for name, start, end in ranges]

    def read_manifest(self) -> bytes:
        """The manifest, a regular file no longer than the manifest cap (its size is checked
        before a byte is read)."""
        name = fmt.MANIFEST_NAME
        return read_regular(self.path(name), self.display(name), "manifest",
                            limit=self._manifest_cap(name))

    @contextmanager
    def open(self, name: str, mode: str = "rb"):
        """The file ``name``, open (a context manager): for reading, a regular file only
        (shardpack/storage/regular.py), so a FIFO put in its place is refused, never waited on.

        Args:
            name: a path relative to the root.
            mode: the mode to open it in.
        """
        if mode != "rb":
            with super().open(name, mode) as f:
                yield f
            return
        fd, _ = open_regular(self.path(name), self.display(name), file_kind(name))
        with os.fdopen(fd, "rb") as f:
            yield f

    def open_arrow(self, name: str):
        """A memory map of ``name`` for pyarrow: it reads it without a Python file object in
        the way (docs/benchmarks.md, "Converting").  A regular file only, mapped from the fd
        that was checked (shardpack/storage/regular.py): a FIFO is refused, never waited on.

        Args:
            name: a path relative to the root.
        """
        import pyarrow as pa

        fd, st = open_regular(self.path(name), self.display(name), file_kind(name))
        try:
            if not st.st_size:  # (mmap refuses an empty file; pyarrow then says what is wrong)
                return pa.BufferReader(b"")
            return pa.BufferReader(pa.py_buffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ)))
        finally:
            os.close(fd)  # the map holds the file

    @contextmanager
    def open_atomic(self, name: str) -> Iterator:
        """A hidden temp file in the same folder, fsynced and renamed onto ``name`` when the
        block exits without error, then the folder fsynced: a crash leaves the old file, the
        new one, or a temp file that :meth:`remove_temp_files` sweeps.

        Args:
            name: a path relative to the root.
        """
        tmp = self.path(f".{name}{TEMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            with open(tmp, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path(name))
            _fsync_dir(self.root)
        except BaseException as exc:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                raise PackError("out of disk space while writing", path=self.display(name),
                                hint=f"free some space, then rerun with {RESUME}") from None
            raise

    def _copy_direct(self, source: Storage, name: str, dest: str, size: int) -> str | None:
        if not isinstance(source, LocalStorage):
            return None
        try:
            os.link(source.path(name), self.path(dest))
        except FileNotFoundError:
            if not os.path.exists(source.path(name)):
                raise DatasetNotFoundError("file is missing", path=source.display(name)) from None
            raise
        except OSError as exc:
            if exc.errno not in NO_LINK:
                raise
            return None
        self._check_size(dest, size, source.display(name))
        return "linked"


def _scandir_sorted(folder: str) -> list[os.DirEntry]:
    with os.scandir(folder) as it:
        return sorted(it, key=lambda e: e.name)


def _classify(entry: os.DirEntry, path: str) -> tuple:
    """The :meth:`LocalStorage.scan` entry of anything but a plainly readable regular file:
    a link (resolved, its target's kind), a folder, a special file, or what stat refused."""
    real = None
    try:
        if entry.is_symlink():
            real = os.path.realpath(path)
            st = os.stat(path)
        else:
            st = entry.stat(follow_symlinks=False)
    except OSError as exc:
        return entry.name, path, None, None, 0, real, _stat_problem(exc)
    kind = _mode_kind(st.st_mode)
    return (entry.name, path, kind, st.st_size if kind == "file" else None, st.st_mtime_ns,
            real, None)


def _stat_problem(exc: OSError) -> tuple[str, str]:
    """(bad-entry kind, reason) of an entry whose stat failed."""
    if exc.errno == errno.ELOOP:
        return "link-loop", "symlink loop"
    if isinstance(exc, FileNotFoundError):
        return "missing", "broken symlink or file vanished during the walk"
    return "unreadable", f"cannot stat: {exc.strerror}"


def _mode_kind(mode: int) -> str:
    """'file', 'dir', or the kind of a special file, for messages."""
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return ("FIFO" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode)
            else "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "special file")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
