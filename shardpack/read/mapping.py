"""Shards mapped into memory by a dataset reader: at most a few open per process, each checked
against its index size before every use and against its file's identity at each epoch's start
(a shard truncated or replaced in place is refused or mapped again, never read as it was)."""

from __future__ import annotations

import mmap
import os

from shardpack.core.errors import IntegrityError
from shardpack.storage import check_regular, open_regular


class ShardMaps:
    """The shard maps of :class:`~shardpack.read.reader.DatasetReader` (a mixin: it uses the
    reader's ``access`` mode, ``shards``, ``check`` mode, lock and per-process state)."""

    def shard_buffer(self, shard: int) -> memoryview | None:
        """A read-only memory map of the shard (local file, or its verified copy in the cache),
        checked against the manifest's size; None for remote storage without a cache.  At most
        MAX_OPEN_SHARDS stay open per process (closing one releases its cache lock).

        Every call first checks that the mapped file still has the size its index records (an
        fstat): a page of a map past the end of its file faults (SIGBUS) when touched, and
        the part of a page past the end reads as zeros, so a shard truncated or rewritten in
        place while mapped is unmapped and refused in one line instead.  A file truncated in
        the moment between this check and the copy of its bytes still faults: nothing but
        not mapping could rule that out (docs/reading.md, "Integrity")."""
        with self._lock:
            held = self._buffers.get(shard)
            if held is not None:
                self._buffers.move_to_end(shard)
        if held is not None:
            self._in_bounds(shard, held)
            return held.view
        opened = self.access.open(shard)
        if opened is None:  # this mode reads chunks, it maps nothing
            return None
        path, entry = opened
        try:
            # a cached copy through the fd the cache locked and verified: the path could
            # name another file by now (evicted and fetched again)
            view, mapped, identity = map_file(path, self.shards[shard].bytes,
                                          self.shard_path(shard),
                                          getattr(entry, "fd", -1) if entry is not None else -1)
            if self._copies.get(shard) != identity:
                # another file than the one this process checked samples of (replaced since,
                # or first seen): what was checked says nothing about it
                self._forget(shard)
                self._copies[shard] = identity
            if entry is not None and self.check == "once":  # the cache hashed the whole file
                self._seen(shard)[:] = True
            elif entry is None:
                self._check_identity(shard, view)
        except BaseException:
            if entry is not None:
                entry.close()
            raise
        # cached shards stay locked (never evicted) while open: keep few open, so the cache
        # limit can be honoured; local files can stay open freely
        limit = self.MAX_OPEN_SHARDS if entry is None else self.access.open_limit
        with self._lock:
            self._buffers[shard] = Mapped(view, mapped, entry, path, identity)
            while len(self._buffers) > limit:
                _, old = self._buffers.popitem(last=False)
                if old.entry is not None:
                    old.entry.close()
        return view

    def _in_bounds(self, shard: int, held: "Mapped") -> None:
        """Refuse a mapped shard whose file no longer has its mapped size (see
        :meth:`shard_buffer`), unmapping it: a later read maps it again, and checks it."""
        try:  # mmap.size() is an fstat of the mapped file: its size now
            size = held.map.size() if held.map is not None else 0
        except OSError:
            size = -1
        if size == held.identity[2]:
            return
        self._unmap(shard, held)
        now = f"now {size} bytes" if size >= 0 else "no longer readable"
        raise IntegrityError(f"shard is {now}, its index says {held.identity[2]}: truncated or "
                             "rewritten in place while it was being read",
                             path=self.shard_path(shard),
                             hint="a published shard must not change; run 'shardpack verify'")

    def _unmap(self, shard: int, held: "Mapped") -> None:
        """Close the map ``held`` of ``shard`` (if it is still the open one) and forget what was
        checked or parsed of the shard.  Views of it handed out stay valid (the memory map
        closes when the last one goes)."""
        with self._lock:
            if self._buffers.get(shard) is held:
                del self._buffers[shard]
            self._forget(shard)
            self._copies.pop(shard, None)
        if held.entry is not None:
            held.entry.close()

    def _forget(self, shard: int) -> None:
        """Drop what this process checked (the memo) and parsed (labels) of ``shard``."""
        self.checked.pop(shard, None)
        for key in [k for k in list(self.labels) if k[0] == shard]:
            self.labels.pop(key, None)

    def revalidate(self) -> int:
        """Stat the file of every shard mapped now (ShardDataset calls this at each epoch's
        start, in each process that reads): one whose device, inode, size, mtime or ctime
        changed since it was mapped (replaced, rewritten or touched in place) is unmapped and
        what was checked of it forgotten, so its next read maps the file that is there now and
        checks it as any newly mapped shard.  Returns how many were unmapped."""
        with self._lock:
            held = list(self._buffers.items())
        changed = 0
        for shard, mapped in held:
            try:
                st = os.stat(mapped.path)
                now = identity_of(st, cached=mapped.entry is not None)
            except OSError:  # gone (a cached copy removed by another reader): map again
                now = None
            if now != mapped.identity:
                self._unmap(shard, mapped)
                changed += 1
        return changed


def identity_of(st: os.stat_result, cached: bool = False) -> tuple:
    """What tells one copy of a shard from another: device, inode, size, mtime, and ctime,
    which every change through the file system moves (a write, a truncation, and the
    ``os.utime`` that puts an mtime back), so a file rewritten in place counts as another
    copy even with its mtime kept.  Not ctime for a ``cached`` copy: the cache moves it itself
    (its access-time stamps, for LRU), on every open by any reader; a new copy there is a new
    inode (a rename), and bytes changed in place are the hash check's to catch."""
    if cached:
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class Mapped:
    """One shard's open map in a process: the view handed out, the mmap (whose ``size()`` is
    an fstat of the mapped file: the check before each use), the cache entry held open (or
    None), the file's path and its identity (:func:`identity_of`) when mapped."""

    __slots__ = ("view", "map", "entry", "path", "identity")

    def __init__(self, view, mapped, entry, path: str, identity: tuple):
        self.view, self.map, self.entry, self.path, self.identity = \
            view, mapped, entry, path, identity


def map_file(path: str, expected: int, display: str,
         held: int = -1) -> tuple[memoryview, object, tuple]:
    """(read-only view of the file, its mmap (None for an empty file), its identity:
    :func:`identity_of`).  A regular file of the size the manifest records, or a one-line
    error.  ``held``: an open fd of the file (a cache entry's) to map instead of ``path``; it
    stays open."""
    if held >= 0:
        st = os.fstat(held)
        check_regular(st, display, "shard")
        fd = os.dup(held)
    else:
        fd, st = open_regular(path, display, "shard")
    try:
        if st.st_size != expected:
            raise IntegrityError(f"shard is {st.st_size} bytes, the manifest says {expected} "
                                 "(truncated or replaced)", path=display,
                                 hint="run 'shardpack verify'")
        identity = identity_of(st, cached=held >= 0)
        if not st.st_size:
            return memoryview(b""), None, identity
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        return memoryview(mapped), mapped, identity
    finally:
        os.close(fd)
