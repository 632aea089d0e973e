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

import errno
import json
import os
import socket
import stat
import time
import uuid

import numpy as np

from shardpack import format as fmt
from shardpack.core.errors import FileSystemError, FormatError, ShardpackError, UnsafePathError
from shardpack.read.reader import DatasetReader, record_payload

NAME_MAX = 255    # bytes in one path component, where os.pathconf cannot tell
PATH_MAX = 4096   # bytes in a whole path, the terminating NUL included
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def unpack(url, out, storage_options: dict | None = None, progress: bool = False) -> int:
    """Write every field of every sample under ``out``; returns the number of files written."""
    return _unpack(url, out, storage_options, progress, replace=False)


def unpack_replacing(url, out, storage_options: dict | None = None,
                     progress: bool = False) -> int:
    """:func:`unpack` onto an existing folder ``out`` (``export --to files --overwrite``; the
    caller has checked that it may be replaced): the new tree is built beside it and swapped in
    by two renames when complete; the old tree is then removed."""
    return _unpack(url, out, storage_options, progress, replace=True)


def _unpack(url, out, storage_options: dict | None, progress: bool, replace: bool) -> int:
    reader = DatasetReader(url, storage_options)
    check_shard_names(reader)
    out = resolve_out(out)
    remove_stale(out)  # before any refusal: a killed run's leftovers go whatever this run does
    if not replace and os.path.lexists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ShardpackError("output exists and is not an empty folder", path=out,
                             hint="choose a new folder")
    work = _work_dir(out)
    tree = os.path.join(work, WORK_TREE)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(reader), unit="sample", desc="unpacking")
    try:
        job = _Job(reader, tree, out)
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


def remove_work(work: str) -> None:
    """Remove a work folder of this run: its trees first, its owner record last, so that a
    kill on the way leaves a folder the next run can still judge (:func:`remove_stale`)."""
    for part in (WORK_OLD, WORK_TREE):
        remove_tree(os.path.join(work, part))
    remove_tree(work)


# -- the hidden work folder and its owner ---------------------------------------------------------
#
# OUT's tree is built in ``.OUT.tmp-PID-XXXXXXXX/tree`` beside OUT (on the same file system, so a
# rename publishes it); ``export --overwrite`` moves the old OUT to ``.../old`` and the new tree
# onto OUT.  Everything a run leaves behind when it is killed is in that one folder, and its
# ``owner.json`` (written right after the folder is made, before anything else) says which
# process owns it: pid, the process's start time (clock ticks since boot, /proc/PID/stat), the
# boot id and the pid namespace.  The next run for the same OUT removes a work folder whose owner
# is gone: same boot and pid namespace, and /proc/PID missing, a zombie, or started at another
# time (the pid was reused).  Anything it cannot judge (another machine over NFS, another
# container, after a reboot, not Linux, another user's folder, no record) is left alone: a
# leftover costs disk space, removing a live run's tree would break that run.

WORK_OWNER = "owner.json"
WORK_TREE = "tree"
WORK_OLD = "old"
UNMARKED_GRACE_S = 60.0  # an older release's empty work folder without its record: only past this


def _work_dir(out: str) -> str:
    """Make the hidden work folder beside ``out`` (after removing stale ones), its owner record
    and its empty ``tree``; returns its path."""
    parent, base = os.path.split(out)
    work = os.path.join(parent, f".{base}.tmp-{_name_tag()}-{uuid.uuid4().hex[:8]}")
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
            _write_all(fd, json.dumps(record).encode())
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


def _name_tag() -> str:
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
    would write every sample of that shard twice."""
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




def os_error(exc: OSError, out: str, rel: str | None = None, tmp: str | None = None,
             doing: str | None = None) -> FileSystemError:
    """One line for an OS error while unpacking or exporting to ``out``: writing ``rel`` when
    given, else ``doing`` (what failed) when given.  ``tmp`` is the hidden folder that stands for
    ``out`` until it is complete: users never see its name."""
    filename = os.fsdecode(exc.filename) if isinstance(exc.filename, (str, bytes)) else None
    if rel is None and filename and tmp and (filename + "/").startswith(tmp + "/"):
        rel, filename = os.path.relpath(filename, tmp), None
    rel = None if rel == "." else rel
    if exc.errno in _NO_SPACE:
        where = f" while writing {_shown(rel)!r}" if rel else ""
        return FileSystemError(f"out of disk space{where}; nothing was kept", path=out,
                               hint="free some space, then run the command again",
                               errno=exc.errno)
    if rel:
        return FileSystemError(f"cannot write {_shown(rel)!r}: {exc.strerror or exc}", path=out,
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


class _Job:
    """What one unpack has written so far under ``root`` (the hidden folder that becomes OUT)."""

    def __init__(self, reader: DatasetReader, root: str, out: str):
        self.reader, self.root, self.out = reader, root, out
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
            _write_all(fd, data)
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
        pos = 0
        for name, off, size in index.sample_fields(row):
            rel = f"{key}.{name}"
            if index.shard_format == "tar":
                member = fmt.parse_tar_member(payload, pos)
                why = tar_member_mismatch(member, index.member_name(key, name), size, pos, off)
                if why:
                    raise fmt.FormatError(why, path=path, offset=start + pos, key=_shown(key),
                                          hint="run 'shardpack verify'")
                pos += member.end
            if name == skip:
                continue
            why = fmt.unsafe_name_reason(rel) or job.too_long(rel)
            if why:
                raise UnsafePathError(f"refusing to write {_shown(rel)!r}: {why}", path=path,
                                      key=_shown(key))
            try:
                job.write(rel, payload[off:off + size])
            except _Clash as clash:
                raise job.clash_error(clash, key, rel, (shard, row)) from None
            except OSError as exc:
                raise os_error(exc, job.out, rel) from None
        if bar is not None:
            bar.update(1)


def tar_member_mismatch(member: fmt.TarMember, name: str, size: int, pos: int,
                        off: int) -> str | None:
    """What differs between a tar member found at ``pos`` of a payload and the index's entry
    (member ``name``, ``size`` bytes of data at payload offset ``off``), or None."""
    if member.name != name:
        return (f"tar member {_shown(member.name)!r} does not match the index, which names "
                f"it {_shown(name)!r}")
    if member.size != size:
        return f"tar member {_shown(name)!r} is {member.size} bytes, the index says {size}"
    if pos + member.data_offset != off:
        return (f"tar member {_shown(name)!r} has its data at payload offset "
                f"{pos + member.data_offset}, the index says {off}")
    return None


def _shown(name: str, limit: int = 120) -> str:
    """``name`` for a message: a key thousands of characters long is cut in the middle."""
    if len(name) <= limit:
        return name
    return f"{name[:limit // 2]}...({len(name)} characters)...{name[-limit // 4:]}"


def _pathconf(path: str, what: str, default: int) -> int:
    try:
        value = os.pathconf(path, what)
    except (OSError, ValueError):
        return default
    return value if value and value > 0 else default


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
