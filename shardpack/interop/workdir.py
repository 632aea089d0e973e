"""The hidden work folder of ``unpack`` and ``export --to files``, and its owner.

OUT's tree is built in ``.OUT.tmp-PID-XXXXXXXX/tree`` beside OUT (on the same file system, so a
rename publishes it); ``export --overwrite`` moves the old OUT to ``.../old`` and the new tree
onto OUT.  Everything a run leaves behind when it is killed is in that one folder, and its
``owner.json`` (written right after the folder is made, before anything else) says which
process owns it: pid, the process's start time (clock ticks since boot, /proc/PID/stat), the
boot id and the pid namespace.  The next run for the same OUT removes a work folder whose owner
is gone: same boot and pid namespace, and /proc/PID missing, a zombie, or started at another
time (the pid was reused).  Anything it cannot judge (another machine over NFS, another
container, after a reboot, not Linux, another user's folder, no record) is left alone: a
leftover costs disk space, removing a live run's tree would break that run.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import time
import uuid

from shardpack.core.errors import FileSystemError
from shardpack.format import shown_name

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


WORK_OWNER = "owner.json"
WORK_TREE = "tree"
WORK_OLD = "old"
UNMARKED_GRACE_S = 60.0  # an older release's empty work folder without its record: only past this


def make_work_dir(out: str) -> str:
    """Make the hidden work folder beside ``out`` (after removing stale ones), its owner record
    and its empty ``tree``; returns its path."""
    parent, base = os.path.split(out)
    work = os.path.join(parent, f".{base}.tmp-{name_tag()}-{uuid.uuid4().hex[:8]}")
    try:
        os.makedirs(parent, exist_ok=True)
        remove_stale(out)
        os.mkdir(work)
    except OSError as exc:
        raise os_error(exc, out, doing="cannot create the output folder") from None
    try:
        record = owner_record() or {"pid": os.getpid()}
        record["command"] = "shardpack unpack/export"
        fd = os.open(os.path.join(work, WORK_OWNER),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            write_all(fd, json.dumps(record).encode())
        finally:
            os.close(fd)
        os.mkdir(os.path.join(work, WORK_TREE))
    except OSError as exc:
        remove_tree(work)
        raise os_error(exc, out, doing="cannot create the output folder") from None
    return work


def _read_small(path: str, limit: int = 4096) -> bytes | None:
    """Up to ``limit`` bytes of a regular file (never a link, FIFO or device), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _process_start(pid: int) -> int | None:
    """Start time of process ``pid`` (clock ticks after boot), or None when there is no such
    process (or it is a zombie: it has exited and only waits to be reaped)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    data = _read_small(f"/proc/{pid}/stat")
    if not data:
        return None
    fields = data[data.rfind(b")") + 2:].split()  # the name in (...) may hold spaces
    try:
        return None if fields[0] in (b"Z", b"X") else int(fields[19])  # state; starttime
    except (IndexError, ValueError):
        return None


def _this_system() -> tuple[str, str] | None:
    """(boot id, pid namespace) of this process, or None without Linux's /proc."""
    boot = _read_small("/proc/sys/kernel/random/boot_id")
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return (boot.decode("ascii", "replace").strip(), namespace) if boot else None


def name_tag() -> str:
    """What a work folder's name says of its owner, so that a folder without its record (a
    kill between the ``mkdir`` and writing ``owner.json``, or while the folder is removed) can
    still be judged: ``PID-START-BOOT`` (start: clock ticks after boot; BOOT: the boot id's
    first 8 characters), or the pid alone where /proc cannot tell more."""
    record = owner_record()
    if record is None:
        return str(os.getpid())
    return f"{record['pid']}-{record['start']}-{record['boot'][:8]}"


def _named_owner_gone(tag: str) -> bool | None:
    """From a work folder name's tag (``PID-START-BOOT``, its name after ``.tmp-`` less the
    random part): True when the process it names is gone (same boot, and no process with that
    pid and start time), False when it lives or the name is of another boot, None when the name
    tells too little (an older release's ``PID``)."""
    parts = tag.split("-")
    if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    here = _this_system()
    if here is None or here[0][:8] != parts[2]:
        return False  # another boot or machine: the pid means nothing here
    return _process_start(int(parts[0])) != int(parts[1])


def owner_record(pid: int | None = None) -> dict | None:
    """What a work folder records of its owner, process ``pid`` (default: this one), or None
    where it cannot be known (no /proc, no such process)."""
    pid = os.getpid() if pid is None else pid
    here, start = _this_system(), _process_start(pid)
    if here is None or start is None:
        return None
    return {"pid": pid, "start": start, "boot": here[0], "pidns": here[1],
            "host": socket.gethostname()}


def _owner_gone(path: str, name_pid: str) -> bool:
    """Whether the work folder ``path`` is stale: its recorded owner process is gone."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        return False  # a link, a file, or another user's: not ours to remove
    try:
        record = json.loads(_read_small(os.path.join(path, WORK_OWNER)) or b"")
    except ValueError:
        record = None
    if not isinstance(record, dict):
        # killed between making the folder and writing its record, or while removing it: the
        # name says who made it (pid, start time, boot); an older release's name holds the pid
        # alone, trusted only for an empty folder past a grace time
        try:
            empty = set(os.listdir(path)) <= {WORK_OWNER}
        except OSError:
            return False
        named = _named_owner_gone(name_pid)
        if named is not None:
            return named
        name_pid = name_pid.split("-", 1)[0]
        return (empty and time.time() - info.st_mtime > UNMARKED_GRACE_S
                and name_pid.isdigit() and _process_start(int(name_pid)) is None)
    here = _this_system()
    if here is None or "start" not in record:
        return False
    if (record.get("boot"), record.get("pidns")) != here:
        return False  # another boot, machine or container: the pid means nothing here
    return _process_start(record.get("pid")) != record["start"]


def remove_stale(out: str) -> list[str]:
    """Remove the hidden work folders ``.OUT.tmp-*`` beside ``out`` whose owner process is gone
    (a run killed with SIGKILL, or by the OOM killer); returns their paths.  A live run's folder
    (another process writing the same OUT right now) is never touched."""
    parent, base = os.path.split(out)
    prefix = f".{base}.tmp-"
    removed = []
    try:
        with os.scandir(parent) as entries:
            names = [e.name for e in entries if e.name.startswith(prefix)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(parent, name)
        if _owner_gone(path, name[len(prefix):].rsplit("-", 1)[0]):
            remove_tree(path)
            removed.append(path)
    return removed


def remove_work(work: str) -> None:
    """Remove a work folder of this run: its trees first, its owner record last, so that a
    kill on the way leaves a folder the next run can still judge (:func:`remove_stale`)."""
    for part in (WORK_OLD, WORK_TREE):
        remove_tree(os.path.join(work, part))
    remove_tree(work)


def os_error(exc: OSError, out: str, rel: str | None = None, tmp: str | None = None,
             doing: str | None = None) -> FileSystemError:
    """One line for an OS error ``exc`` while unpacking or exporting to ``out``: writing ``rel``
    when given, else ``doing`` (what failed) when given.  ``tmp`` is the hidden folder that
    stands for ``out`` until it is complete: users never see its name."""
    filename = os.fsdecode(exc.filename) if isinstance(exc.filename, (str, bytes)) else None
    if rel is None and filename and tmp and (filename + "/").startswith(tmp + "/"):
        rel, filename = os.path.relpath(filename, tmp), None
    rel = None if rel == "." else rel
    if exc.errno in _NO_SPACE:
        where = f" while writing {shown_name(rel)!r}" if rel else ""
        return FileSystemError(f"out of disk space{where}; nothing was kept", path=out,
                               hint="free some space, then run the command again",
                               errno=exc.errno)
    if rel:
        return FileSystemError(f"cannot write {shown_name(rel)!r}: {exc.strerror or exc}", path=out,
                               errno=exc.errno)
    if doing:
        about = f" ({filename})" if filename and filename != out else ""
        return FileSystemError(f"{doing}: {exc.strerror or exc}{about}", path=out,
                               errno=exc.errno)
    return FileSystemError(str(exc.strerror or exc), path=filename or out, errno=exc.errno)


def remove_tree(path: str) -> None:
    """``shutil.rmtree(path, ignore_errors=True)`` without recursion (a key may nest folders
    thousands deep, past Python's recursion limit) and without following links."""
    stack, stuck = [path], set()
    while stack:
        top = stack[-1]
        deeper = False
        try:
            with os.scandir(top) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.path not in stuck:
                            stack.append(entry.path)
                            deeper = True
                    else:
                        try:
                            os.unlink(entry.path)
                        except OSError:
                            pass
        except FileNotFoundError:
            stack.pop()
            continue
        except OSError:
            pass
        if deeper:
            continue
        stack.pop()
        try:
            os.rmdir(top)
        except FileNotFoundError:
            pass
        except OSError:
            stuck.add(top)


def write_all(fd: int, data) -> None:
    """Write all of ``data`` to the open file ``fd`` (``os.write`` may write less at once).

    Args:
        fd: an open file descriptor.
        data: the bytes to write.
    """
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
