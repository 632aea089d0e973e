"""Field readers: how the shard writer gets the bytes of a source field.

Every :class:`~shardpack.write.samples.SourceField` names the :class:`FieldReader` class that reads
it (``SourceField.reader``), chosen by whoever made the field: the walk of a file tree
(:class:`LocalFiles`, :class:`RemoteFiles`), a converter's source (byte ranges of a container,
``sources/common.ByteRanges``; Parquet cells, ``sources/parquet.ParquetCells``), or anyone
holding the bytes already (:class:`InlineValue`).  A shard task opens one reader per class its
fields name (:meth:`~shardpack.write.plan.ShardTask.open_readers`), giving each its own fields in
task order so it can read ahead or batch; the writer then calls ``read`` per field and knows
nothing of the kinds.

A reader class must be a module-level class (tasks are pickled to worker processes and cluster
workers, and a field pickles its reader as a reference).
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

import crc32c

from shardpack.core.errors import DatasetNotFoundError, ShardpackError, SourceError
from shardpack.storage import Storage, storage_options_by_keyword

if TYPE_CHECKING:
    from shardpack.write.samples import SourceField


class FieldReader:
    """Reads the fields of one kind for one shard task.

    Args:
        fields: the task's fields of this kind, in the order they will be read (a skipped
            sample leaves its fields unread).
        storage_options: for the source's storage; keyword-only (by position it is deprecated).
    """

    @storage_options_by_keyword
    def __init__(self, fields: list[SourceField], *, storage_options: dict | None = None):
        self.options = storage_options

    def read(self, f: SourceField) -> bytes:
        """The bytes of ``f`` (bytes-like), or a :class:`SourceError` saying why not.

        Args:
            f: one of the fields this reader was opened on.
        """
        raise NotImplementedError

    def open_stream(self, f: SourceField) -> FileStream | None:
        """``f`` as a :class:`FileStream` the writer copies in chunks, where this reader can
        stream it and it is at least :data:`STREAM_SIZE` bytes; else None (read it whole).

        Args:
            f: one of the fields this reader was opened on.
        """
        return None

    @staticmethod
    def where(f: SourceField) -> str:
        """Where ``f`` comes from, for error messages.

        Args:
            f: a field.
        """
        return f.path


class InlineValue(FieldReader):
    """A field whose bytes travel in it (``SourceField.value``): a class index, a listing
    column, a value a converter had to decode."""

    def read(self, f: SourceField) -> bytes:
        """The bytes the field carries.

        Args:
            f: a field with ``value`` set.
        """
        return f.value

    @staticmethod
    def where(f: SourceField) -> str:
        """The field's name, for error messages.

        Args:
            f: a field.
        """
        return f"field '{f.name}'"


class LocalFiles(FieldReader):
    """Whole local files (``pack`` of a local tree or listing), refused if they changed since the
    walk (:func:`read_file`).  Reads ahead: before each file is read, the kernel is asked to
    start reading the next files (``posix_fadvise(WILLNEED)``: an open, a hint and a close per
    file, no data copied).  A cold tree of small files is otherwise read one file at a time, each
    read waiting for the disk; with the hints the disk has up to AHEAD_FILES requests queued.
    Bounded by files and bytes ahead; a file it cannot open is left for the real read to
    report."""

    AHEAD_FILES = 64
    AHEAD_BYTES = 32 << 20

    @storage_options_by_keyword
    def __init__(self, fields: list[SourceField], *, storage_options: dict | None = None):
        super().__init__(fields, storage_options=storage_options)
        self.order = fields
        self.pos = 0    # first field not started
        self.next = 0   # first field not hinted yet
        self.ahead = 0  # bytes hinted and not yet started
        self.hinting = hasattr(os, "posix_fadvise") and len(fields) > 1

    def read(self, f: SourceField) -> bytes:
        """The file's bytes (:func:`read_file`), the next files hinted first.

        Args:
            f: a whole-file field.
        """
        if self.hinting:
            self.advance(f)
        return read_file(f)

    def open_stream(self, f: SourceField) -> FileStream | None:
        """A file of :data:`STREAM_SIZE` bytes or more, opened and checked as :func:`read_file`
        checks it (still a regular file of the walk's size and mtime), for the writer to copy
        in chunks; None for a smaller one.

        Args:
            f: a whole-file field.
        """
        return FileStream(f) if f.size >= STREAM_SIZE else None

    def advance(self, f: SourceField) -> None:
        """``f`` is about to be read: hint the files that now fall in the window after it.

        Args:
            f: the field about to be read.
        """
        order, i = self.order, self.pos
        while i < len(order) and order[i] is not f:  # (skipped samples leave fields behind)
            i += 1
        if i == len(order):  # not one of this task's fields: nothing to move
            return
        for g in order[self.pos:min(i + 1, self.next)]:
            self.ahead -= g.size
        self.pos = i + 1
        self.next = max(self.next, self.pos)
        limit = min(len(order), self.pos + self.AHEAD_FILES)
        while self.next < limit and self.ahead < self.AHEAD_BYTES:
            g = order[self.next]
            self.next += 1
            self.ahead += g.size
            try:
                fd = os.open(g.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            except OSError:
                self.hinting = False  # not supported here: stop trying
            finally:
                os.close(fd)


# A whole local file from this size on is not read into memory: the shard writer copies it in
# chunks of STREAM_CHUNK bytes (docs/packing.md, "Large samples").
STREAM_SIZE = 64 << 20
STREAM_CHUNK = 8 << 20


def _open_unchanged(f: SourceField) -> int:
    """An open descriptor of ``f``'s file, still a regular file of the walk's size and mtime."""
    try:
        fd = os.open(f.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SourceError("file vanished during the pack", path=f.path) from None
    except OSError as exc:
        raise SourceError(f"cannot read: {exc.strerror}", path=f.path) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != f.size or st.st_mtime_ns != f.mtime_ns:
        os.close(fd)
        why = ("is no longer a regular file" if not stat.S_ISREG(st.st_mode) else
               f"file changed during the pack (size {f.size} -> {st.st_size})")
        raise SourceError(why, path=f.path, hint="pack again once the source is stable")
    return fd


class FileStream:
    """A large local file the shard writer copies in chunks instead of reading it whole: a
    stand-in for the field's bytes (``len`` is the walk's size).  Opened and checked when the
    sample's fields are read (a failure there is the field's, skippable); each pass of
    :meth:`chunks` reads the whole file again, and raises :class:`SourceError` if it no longer
    has the walk's size and mtime, or (a second pass: a msgpack record is read once for its
    CRC32C, then copied) gives other bytes than the first."""

    def __init__(self, f: SourceField):
        self.field = f
        self.fd = _open_unchanged(f)
        self.crc: int | None = None  # of the first pass

    def __len__(self) -> int:
        return self.field.size

    def chunks(self):
        """The file's bytes, STREAM_CHUNK at a time, checked against the walk at the end."""
        f, crc, pos = self.field, 0, 0
        while pos < f.size:
            chunk = self._read(pos, min(STREAM_CHUNK, f.size - pos))
            if not chunk:
                break
            crc = crc32c.crc32c(chunk, crc)
            pos += len(chunk)
            yield chunk
        if pos != f.size or self._grew() or self.crc is not None and crc != self.crc:
            raise SourceError("file changed while it was copied into the shard", path=f.path,
                              hint="pack again once the source is stable")
        self.crc = crc

    def _read(self, pos: int, n: int) -> bytes:
        try:
            return os.pread(self.fd, n, pos)
        except OSError as exc:
            raise SourceError(f"cannot read: {exc.strerror}", path=self.field.path) from None

    def _grew(self) -> bool:
        """Whether the file has a byte past the walk's size, or another mtime."""
        try:
            return bool(os.pread(self.fd, 1, self.field.size)) or \
                os.fstat(self.fd).st_mtime_ns != self.field.mtime_ns
        except OSError as exc:
            raise SourceError(f"cannot read: {exc.strerror}", path=self.field.path) from None

    def close(self) -> None:
        """Close the file."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class RemoteStream(FileStream):
    """A large source file on object storage, copied in chunks by ranged reads: checked as
    :class:`RemoteFiles` checks a file (it must still hold the walk's size; growth and changes
    in place are not caught), and, between the two passes of a msgpack record, by CRC32C."""

    def __init__(self, f: SourceField, storage: Storage):
        self.field, self.crc, self.fd = f, None, -1
        self.storage, self.name = storage, f.path.rpartition("/")[2]
        try:
            size = storage.size(self.name)
        except DatasetNotFoundError:
            raise SourceError("file vanished during the pack", path=f.path) from None
        except (ShardpackError, OSError) as exc:
            raise SourceError(f"cannot read: {exc}", path=f.path) from None
        if size < f.size:
            raise SourceError(f"file changed during the pack (size {f.size} -> {size})",
                              path=f.path, hint="pack again once the source is stable")

    def _read(self, pos: int, n: int) -> bytes:
        try:
            return self.storage.read_bytes(self.name, pos, pos + n)
        except (ShardpackError, OSError) as exc:
            raise SourceError(f"cannot read: {exc}", path=self.field.path) from None

    def _grew(self) -> bool:
        return False


def read_file(f: SourceField) -> bytes:
    """The bytes of a whole local file, refusing a file that changed since the walk.

    Args:
        f: a whole-file field (``path``, ``size`` and ``mtime_ns`` from the walk).
    """
    try:
        fd = os.open(f.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        import socket

        raise SourceError(f"file vanished during the pack (or host {socket.gethostname()} "
                          "does not see it: on a cluster, SRC must be where every worker "
                          "reads it)", path=f.path) from None
    except OSError as exc:
        raise SourceError(f"cannot read: {exc.strerror}", path=f.path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SourceError("is no longer a regular file", path=f.path)
        want = f.size + 1  # one byte more than planned: a short read is EOF, a full one growth
        data = os.read(fd, want)
        total = len(data)
        if 0 < total < want and total < f.size:  # short read before the planned size: keep going
            chunks = [data]
            while total < want:
                chunk = os.read(fd, want - total)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            data = b"".join(chunks)
    except OSError as exc:
        raise SourceError(f"cannot read: {exc.strerror}", path=f.path) from None
    finally:
        os.close(fd)
    if total != f.size or st.st_mtime_ns != f.mtime_ns:
        raise SourceError(f"file changed during the pack (size {f.size} -> "
                          f"{max(total, st.st_size)})", path=f.path,
                          hint="pack again once the source is stable")
    return data


class RemoteFiles(FieldReader):
    """Whole source files on object storage (a ``pack`` of ``s3://...``): fetched ahead in
    batches of up to AHEAD_FILES files / AHEAD_BYTES, each batch as concurrent requests
    (``Storage.read_ranges``), since one request at a time would make a shard of small files
    cost one round trip per file.  Each file is read up to the size the walk listed: a file
    that shrank since is an error; one that changed in place at the same size, or grew, is not
    caught (that would cost a metadata request per file; docs/scale.md)."""

    AHEAD_FILES = 64
    AHEAD_BYTES = 32 << 20

    @storage_options_by_keyword
    def __init__(self, fields: list[SourceField], *, storage_options: dict | None = None):
        super().__init__(fields, storage_options=storage_options)
        self.order = fields
        self.next = 0
        self.got: dict[str, bytes] = {}
        self.storages: dict[str, Storage] = {}

    def read(self, f: SourceField) -> bytes:
        """The file's bytes, from the batch fetched ahead.

        Args:
            f: a whole-file field.
        """
        if f.path not in self.got:
            self._fetch(f)
        data = self.got.pop(f.path)
        if isinstance(data, SourceError):  # this file's own error, raised when it is read
            raise data
        return data

    def open_stream(self, f: SourceField) -> FileStream | None:
        """A file of :data:`STREAM_SIZE` bytes or more, its size checked, for the writer to
        copy in chunks by ranged reads (:class:`RemoteStream`); None for a smaller one.

        Args:
            f: a whole-file field.
        """
        if f.size < STREAM_SIZE:
            return None
        parent = f.path.rpartition("/")[0]
        storage = self.storages.get(parent)
        if storage is None:
            storage = self.storages[parent] = Storage(parent, self.options)
        return RemoteStream(f, storage)

    def _fetch(self, f: SourceField) -> None:
        while self.next < len(self.order) and self.order[self.next].path != f.path:
            self.next += 1  # (skipped samples leave their files behind)
        batch, total = [], 0
        for g in self.order[self.next:]:
            if len(batch) >= self.AHEAD_FILES or (batch and total + g.size > self.AHEAD_BYTES):
                break
            batch.append(g)
            total += g.size
        self.next += len(batch)
        if not batch or batch[0].path != f.path:
            batch.insert(0, f)
        self.got.clear()
        by_parent: dict[str, list[SourceField]] = {}
        for g in batch:
            by_parent.setdefault(g.path.rpartition("/")[0], []).append(g)
        for parent, files in by_parent.items():
            storage = self.storages.get(parent)
            if storage is None:
                storage = self.storages[parent] = Storage(parent, self.options)
            names = [g.path.rpartition("/")[2] for g in files]
            try:
                datas = storage.read_ranges([(n, 0, g.size)
                                             for n, g in zip(names, files, strict=True)])
            except (ShardpackError, OSError):  # one short or missing file spoils the batch:
                datas = [self._one(storage, n, g)  # one by one
                         for n, g in zip(names, files, strict=True)]
            for g, data in zip(files, datas, strict=True):
                if not isinstance(data, SourceError) and len(data) < g.size:
                    data = SourceError(f"file changed during the pack (size {g.size} -> "
                                       f"{len(data)})", path=g.path,
                                       hint="pack again once the source is stable")
                self.got[g.path] = data if isinstance(data, SourceError) else data[:g.size]

    @staticmethod
    def _one(storage: Storage, name: str, f: SourceField) -> bytes | SourceError:
        """One file's bytes, or the error that reading it gave (kept for when it is read)."""
        try:
            return storage.read_bytes(name) if f.size else b""
        except DatasetNotFoundError:
            return SourceError("file vanished during the pack", path=f.path)
        except (ShardpackError, OSError) as exc:
            return SourceError(f"cannot read: {exc}", path=f.path)


def whole_files(storage: Storage) -> type[FieldReader]:
    """The reader of the whole files a walk of ``storage`` finds: :class:`LocalFiles` where they
    are files of this machine (read by path, read ahead by the kernel, refused if changed since
    the walk), else :class:`RemoteFiles` (batches of concurrent requests).

    Args:
        storage: the walked tree's storage.
    """
    return LocalFiles if storage.local_path() is not None else RemoteFiles


@storage_options_by_keyword
def open_container(f: SourceField, *,
                   storage_options: dict | None = None) -> tuple[Storage, str]:
    """(storage of the folder, file name) of the container file a field points into (a byte
    range, a Parquet cell); a container that changed since it was indexed is refused.

    Args:
        f: a field with ``path`` naming its container.
        storage_options: for the container's storage; keyword-only (by position it is
            deprecated).
    """
    parent, _, name = f.path.rpartition("/")
    storage = Storage(parent or ".", storage_options)
    if f.mtime_ns and storage.mtime_ns(name) != f.mtime_ns:
        raise SourceError("file changed during the conversion", path=f.path,
                          hint="convert again once the source is stable")
    return storage, name
