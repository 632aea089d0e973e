"""The files of the shard cache: opening them without following a link, the trust a folder
must earn, their identity, their hash, and removing one nobody holds.

Every name under the cache root is opened relative to an open fd of its folder (``dir_fd``)
and with ``O_NOFOLLOW``: a symbolic link is never followed, wherever it is planted, and a
folder of the layout is not looked up through its path again (docs/remote.md, "The cache")."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time

from shardpack import format as fmt
from shardpack.core.errors import CacheError

NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # (a FIFO planted there never blocks)
FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
LOCK_NAME = ".lock"
FOLDER_MODE = 0o755  # whatever the umask: a group-writable folder would be refused


def trusted_owners() -> set[int]:
    """The users whose folders the cache trusts: this process's and root's (root can change
    any file anyway)."""
    return {os.geteuid(), 0}


def check_trusted(fd: int, path: str, what: str = "the cache folder") -> None:
    """A one-line CacheError unless the open folder ``fd`` belongs to this user or root and no
    other user can write in it (sticky bit or not: docs/remote.md, "The cache")."""
    st = os.fstat(fd)
    if st.st_uid not in trusted_owners():
        raise CacheError(f"{what} belongs to another user (uid {st.st_uid}), who could plant "
                         "links in it: not used", path=path,
                         hint="give a cache_dir of your own: cache_dir=, --cache-dir or "
                              "$SHARDPACK_CACHE")
    if st.st_mode & 0o022:
        raise CacheError(f"{what} is writable by other users (mode "
                         f"{stat.S_IMODE(st.st_mode):04o}), who could plant links in it: not "
                         "used", path=path,
                         hint=f"chmod go-w {path}, or give a cache_dir of your own")


def open_root(path: str) -> int:
    """An fd of the cache folder ``path`` (the path itself may be a link: the user gave it),
    checked by :func:`check_trusted`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise CacheError(f"cannot open the cache folder: {exc.strerror or exc}",
                         path=path) from exc
    try:
        check_trusted(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_folder(root: int, name: str, path: str, writable: bool,
                create: bool = False) -> int | None:
    """An fd of the cache's folder ``name`` in the open folder ``root`` (``path``: its full
    path, for messages), checked by :func:`check_trusted`; None when missing and not
    ``create``.  A link or a file in its place is removed when ``writable`` (the cache never
    makes one; unlink removes the link itself, and never a folder), else a CacheError."""
    for _ in range(3):  # (another process may remove or make it meanwhile)
        try:
            fd = os.open(name, FOLDER, dir_fd=root)
        except FileNotFoundError:
            if not create:
                return None
            try:
                os.mkdir(name, FOLDER_MODE, dir_fd=root)
            except FileExistsError:
                pass
            continue
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            refuse_or_remove(root, name, path, writable, "folder")
            continue
        try:
            check_trusted(fd, path, "a folder of the cache")
        except BaseException:
            os.close(fd)
            raise
        return fd
    raise CacheError("cannot make a folder of the cache: something keeps taking its place",
                     path=path)


def refuse_or_remove(folder: int, name: str, path: str, writable: bool, kind: str) -> None:
    """Something the cache never makes (a symbolic link, a FIFO, ...) where it keeps a
    ``kind``: removed when ``writable`` (fetched again: nothing behind it is read or written),
    else a one-line CacheError.  A folder in the place of a file is always an error."""
    try:
        st = os.lstat(name, dir_fd=folder)
    except FileNotFoundError:
        return  # gone meanwhile
    if stat.S_ISDIR(st.st_mode) and kind != "folder":
        raise CacheError(f"a folder is where the cache keeps a {kind}", path=path,
                         hint="remove it")
    if not writable:
        raise CacheError(f"{describe(st)} is where the cache keeps a {kind}: not followed, and "
                         "the cache folder is read-only", path=path,
                         hint="remove it where the cache is writable")
    if not stat.S_ISDIR(st.st_mode):
        try:
            os.unlink(name, dir_fd=folder)
        except FileNotFoundError:
            pass


def describe(st: os.stat_result) -> str:
    """What a file the cache did not make is, in words."""
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    return "a file" if stat.S_ISREG(st.st_mode) else "a special file"


def open_file(folder: int, name: str, path: str, writable: bool) -> int | None:
    """An fd (read-only) of the cached regular file ``name`` in the open folder ``folder``, or
    None when missing.  Anything else in its place is dealt with by :func:`refuse_or_remove`
    (then None: it is fetched again)."""
    try:
        fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        refuse_or_remove(folder, name, path, writable, "cached file")
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        refuse_or_remove(folder, name, path, writable, "cached file")
        return None
    return fd


def listing(root: int, root_path: str) -> tuple[list, list]:
    """(the cached files: (atime, bytes, folder, name), the rest: (folder, name, bytes)) of
    the open cache folder ``root``, no link followed.  The rest is temp files, and what the
    cache never makes (links, special files): folder is "" at the top."""
    files, rest = [], []
    for folder, name, st in scan(root, root_path):
        if not folder and name == LOCK_NAME:
            continue
        if stat.S_ISREG(st.st_mode) and not name.startswith("."):
            files.append((st.st_atime_ns, st.st_size, folder, name))
        elif not stat.S_ISREG(st.st_mode) or ".tmp-" in name:
            rest.append((folder, name, st.st_size if stat.S_ISREG(st.st_mode) else 0))
    return files, rest


def scan(root: int, root_path: str):
    """(folder name or "" for the root, name, lstat) of every entry in the cache's two levels
    (the root and its folders), no link followed.  A dataset's folder that another user owns or
    can write is left out: never listed, counted or evicted (reading that dataset refuses it),
    so one such folder (made by an older release under umask 002) does not stop the others."""
    with os.scandir(root) as tops:
        listed = list(_stats(tops))
    for folder, st in listed:
        if not stat.S_ISDIR(st.st_mode):
            yield "", folder, st
            continue
        try:
            fd = open_folder(root, folder, os.path.join(root_path, folder), False)
        except OSError:  # a CacheError (untrusted), unreadable, or gone meanwhile
            continue
        if fd is None:
            continue
        try:
            with os.scandir(fd) as entries:
                listed_here = list(_stats(entries))
        finally:
            os.close(fd)
        for name, st_here in listed_here:
            yield folder, name, st_here


def _stats(entries):
    for entry in entries:
        try:
            yield entry.name, entry.stat(follow_symlinks=False)
        except FileNotFoundError:  # removed by another process meanwhile
            continue


def open_lock(root: int, path: str, read_only: bool) -> int:
    """An fd of the cache's lock file in the open cache folder ``root`` (``path``: its path),
    made when missing; -1 in a read-only cache without one.  A link in its place is refused,
    not removed: two processes that both found it could each remove the lock file the other
    had just made, and then lock different files."""
    try:
        if read_only:
            fd = os.open(LOCK_NAME, os.O_RDONLY | NOFOLLOW, dir_fd=root)
        else:
            try:
                fd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o644, dir_fd=root)
            except PermissionError:  # another user's lock file: a read-only fd locks it too
                fd = os.open(LOCK_NAME, os.O_RDONLY | NOFOLLOW, dir_fd=root)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            fd = -2
        elif read_only:
            return -1
        else:
            raise CacheError(f"cannot create the cache's lock file: {exc.strerror or exc}",
                             path=path) from exc
    if fd == -2 or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd >= 0:
            os.close(fd)
        raise CacheError("the cache's lock file is not a regular file (a symbolic link?), "
                         "which the cache never makes: not followed", path=path,
                         hint=f"remove it (rm {path}): the cache makes a new one")
    return fd


def make_temp(folder: int, name: str) -> tuple[str, int]:
    """(name, fd) of a new temp file to download ``name`` into, in the open folder
    ``folder``."""
    for _ in range(3):
        temp = f".{name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
        try:  # O_EXCL: a name already taken (a planted link too) is never opened
            return temp, os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644,
                                 dir_fd=folder)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "the temp file names are taken")


def live_temp(folder: int, name: str, read_only: bool) -> int | None:
    """An fd of a temp file (in the open ``folder``) some live process is downloading ``name``
    into, or None; temp files of dead processes (and links at their names) are deleted (left
    alone in a read-only cache)."""
    prefix = f".{name}.tmp-"
    for other in os.listdir(folder):
        if not other.startswith(prefix):
            continue
        try:
            fd = os.open(other, os.O_RDONLY | NOFOLLOW, dir_fd=folder)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            fd = -1  # a link: nobody's download
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return fd  # held: a live download
                os.close(fd)
                raise
            os.close(fd)
        if not read_only:
            unlink_quietly(folder, other)  # lock free: its writer died
    return None


def remove_empty_folders(root: int) -> None:
    """Remove the empty folders in the open cache folder ``root``."""
    for folder in os.listdir(root):
        try:
            os.rmdir(folder, dir_fd=root)  # (only an empty folder goes: never a link or file)
        except OSError:
            pass


def identity(path: str, fd: int | None = None) -> tuple[str, int, int]:
    """(path, size, mtime) of a cache file; from its open fd when given (another thread or
    process may have deleted the path meanwhile)."""
    st = os.fstat(fd) if fd is not None else os.stat(path)
    return path, st.st_size, st.st_mtime_ns


def file_hash(fd: int) -> str:
    """xxh3-128 of the whole open file ``fd``."""
    return fd_hash(fd, os.fstat(fd).st_size) or ""


def fd_hash(fd: int, size: int) -> str | None:
    """xxh3-128 of the first ``size`` bytes of the open file (None if it is shorter now), read
    into one reused 1 MB buffer: faster than a memory map, and than fresh chunks whose pages are
    new memory each time (docs/remote.md)."""
    hasher = fmt.new_content_hasher()
    view = memoryview(bytearray(1 << 20))
    offset = 0
    while offset < size:
        n = os.preadv(fd, [view[:min(len(view), size - offset)]], offset)
        if n == 0:
            return None  # truncated meanwhile
        hasher.update(view[:n])
        offset += n
    return hasher.hexdigest()


def remove_if_free(folder: int, name: str) -> bool:
    """Delete the cache file (or temp file) ``name`` in the open folder ``folder`` unless some
    process holds a lock on it (a reader, or a live download); whether it was deleted.  A link
    or another file the cache never makes there is deleted as it is (never followed)."""
    try:
        fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=folder)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            return False  # gone meanwhile, or not ours to open
        return unlink_quietly(folder, name)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        st = os.lstat(name, dir_fd=folder)
        if (st.st_dev, st.st_ino) != (os.fstat(fd).st_dev, os.fstat(fd).st_ino):
            return False  # replaced meanwhile: not the file this lock is on
        os.unlink(name, dir_fd=folder)
        return True
    except OSError:
        return False  # held: in use
    finally:
        os.close(fd)


def unlink_quietly(folder: int, name: str) -> bool:
    """Delete ``name`` in the open folder ``folder`` (a link itself, never what it points to);
    whether it was deleted."""
    try:
        os.unlink(name, dir_fd=folder)
        return True
    except OSError:
        return False
