"""WebDataset tar shards -> samples.

Members are grouped the way the ``webdataset`` library groups them: consecutive members whose
names share the part before the first dot of the file name form one sample (``a/b.jpg`` and
``a/b.cls`` -> key ``a/b``, fields ``jpg`` and ``cls``).  Plain ``.tar`` members become byte ranges
of the tar file (workers read them with a few large reads); ``.tar.gz`` / ``.tgz`` shards are
decompressed as a stream (every gzip member, under the decompression cap) and their bytes carried
inline, as are GNU sparse members, expanded (:mod:`.tarread`).  A file's bytes must hold the
compression its name says.  Directory entries carry no data and are
counted in the notes; links and devices are bad entries (an error, or skipped with
``--skip-bad``); hidden members (file name starting with '.') are counted like ``pack`` counts
hidden files.
"""

from __future__ import annotations

import functools
import os
import tarfile
from typing import Iterator

from shardpack import format as fmt
from shardpack.core.errors import FormatError, SourceError
from shardpack.write.samples import SourceField, value_field
from shardpack.interop.sources.base import ContainerSource
from shardpack.interop.sources.common import ByteRanges
from shardpack.interop.sources.tarread import (HEADER_LIMIT, HEADERS_TOO_LONG, READ_ERRORS,
                                               CapExceeded, GzipTar, HeadersTooLong, cap_text,
                                               check_member_size, compression_of,
                                               decompression_cap, read_member, sparse_member)

SUFFIXES = (".tar", ".tar.gz", ".tgz")


class WebDatasetSource(ContainerSource):
    """WebDataset tar shards (``.tar``, ``.tar.gz``, ``.tgz``): members grouped into samples
    by key, as webdataset groups them (docs/convert.md, "WebDataset")."""

    format = "webdataset"
    suffixes = SUFFIXES

    def samples(self) -> Iterator[tuple[str | None, list[SourceField], str]]:
        """``(key, fields, where)`` of each sample of each tar, in file and member order."""
        self.directories = 0
        names = self.files()  # once: each refused file is counted once
        exported = self._exported(names)
        for name in names:
            shown = self.storage.display(name)
            if name.endswith(".tar"):
                members = self._scan(name, shown)
            else:
                members = self._stream(name, shown)
            yield from self._group(members, shown, name in exported)
        if self.directories:
            self.note(f"{self.directories} directory entries in the tar files were ignored "
                      "(they hold no data)")

    def _exported(self, names: list[str]) -> frozenset[str]:
        """The tar files here that ``shardpack export`` wrote, as its marker lists them: the
        escape in their member names is undone and its class names are the manifest's, so that
        export and convert give back the same dataset (docs/convert.md)."""
        from shardpack.interop.export import MARKER_NAME, read_marker

        marker = read_marker(self.storage)
        if marker is None or marker["to"] != "webdataset":
            return frozenset()
        exported = frozenset(marker["files"]).intersection(names)
        if exported:
            self.report.classes = marker["classes"]
            self.note(f"{len(exported)} tar files written by shardpack export ({MARKER_NAME}): "
                      "keys unescaped, class names restored")
        return exported

    def _group(self, members, shown: str, exported: bool = False):
        """(member name, kind, field maker) -> (key, fields, where) of consecutive members.
        Field names keep their case (webdataset lowercases them: docs/convert.md, "Export");
        ``exported``: the names carry shardpack's escape (format.tar_member_name)."""
        key, fields, where = None, [], shown
        for member_name, kind, make in members:
            member_where = f"{shown}: member {member_name!r}"
            if kind == "directory":
                self.directories += 1
                continue
            raw = member_name.encode("utf-8", "surrogateescape")
            if raw.decode("utf-8", "replace") != member_name:  # undecodable bytes, escaped
                self.bad(f"{shown}: member {raw!r}", "member name is not valid UTF-8 (keys and "
                         "field names are UTF-8 text)", "bad-name")
                continue
            if kind != "file":
                self.bad(member_where, f"tar member is a {kind}, not a regular file", "special")
                continue
            base = member_name.rsplit("/", 1)[-1]
            if base.startswith("."):
                self.report.hidden += 1
                continue
            stem, dot, field = base.partition(".")
            if not dot or not field:
                self.bad(member_where, "member name has no extension (no field name)",
                         "bad-name")
                continue
            if exported:
                stem = fmt.unescape_key_part(stem)
            member_key = member_name[:len(member_name) - len(base)] + stem
            if member_key != key:
                if fields:
                    yield key, fields, where
                key, fields, where = member_key, [], member_where
            fields.append(make(field))
        if fields:
            yield key, fields, where

    def _scan(self, name: str, shown: str):
        """Plain tar: read just the headers (seek from one to the next); fields are byte ranges
        of the tar file.  Uses shardpack's own header parser: ``tarfile``'s per-member cost made
        the scan of a tar slower than packing it (docs/benchmarks.md, "Converting").  A GNU
        sparse member is read by ``tarfile`` and carried inline, expanded."""
        url, mtime = self.url(name), self.mtime_ns(name)
        total = self.storage.size(name)
        pos, count, last = 0, 0, None
        with self.storage.open(name) as f:
            ahead = ReadAhead(f)
            while pos + fmt.TAR_BLOCK <= total:
                ahead.reach(pos)
                m = _header_at(f, pos, count, last, shown)
                if m is None:
                    return
                if m.kind == "sparse file":
                    member, data, after = sparse_member(f, pos, shown)
                    yield member, "file", functools.partial(_held, data=data)
                    pos, count, last = max(after, pos + m.end), count + 1, member
                    continue
                start = pos + m.data_offset
                if start + m.size > total:
                    raise SourceError(f"tar member {m.name!r} runs past the end of the file "
                                      f"({start + m.size} > {total} bytes): truncated",
                                      path=shown)
                if m.end <= 0:  # parse_tar_header guarantees it: the scan always advances
                    raise SourceError(f"tar member {m.name!r} at byte {pos} does not advance "
                                      "the archive", path=shown)
                yield m.name, m.kind, functools.partial(_ranged, url, m.size, mtime, start)
                pos += m.end
                count, last = count + 1, m.name
        # no end-of-archive blocks: tolerated (some writers omit them), every member was whole

    def _stream(self, name: str, shown: str):
        """Compressed tar: gzip (every member of the stream) decompressed under the cap, the tar
        read by ``tarfile`` as a stream, fields carried inline."""
        count, last = 0, None
        cap = decompression_cap(self.storage.size(name))
        with self.storage.open(name) as f:
            _check_gzip(f.read(fmt.TAR_BLOCK), shown)
            f.seek(0)
            stream = GzipTar(f, cap)
            try:
                tf = tarfile.open(fileobj=stream, mode="r|", encoding="utf-8")
                while True:
                    m = tf.next()
                    if m is None:
                        return
                    tf.members.clear()  # tarfile keeps every member it saw: bounded memory
                    kind = _stream_kind(m, tf, cap, _nth(count, last), shown)
                    stream.data()
                    data = read_member(tf, m, shown) if kind == "file" else b""
                    tf.fileobj.seek(tf.offset)  # past the data of a member not read
                    stream.headers()
                    yield m.name, kind, functools.partial(_held, data=data)
                    count, last = count + 1, m.name
            except SourceError:
                raise
            except CapExceeded:
                raise SourceError(f"{_nth(count, last)}: the tar decompresses to more than "
                                  f"{cap_text(cap)}", path=shown) from None
            except HeadersTooLong:
                raise SourceError(f"{_nth(count, last)}: {HEADERS_TOO_LONG}",
                                  path=shown) from None
            except READ_ERRORS as exc:
                raise SourceError(f"{_nth(count, last)}: not a readable compressed tar: "
                                  f"{type(exc).__name__}: {exc}", path=shown) from None


class ReadAhead:
    """Asks the kernel to start reading a local tar ahead of the header scan
    (``posix_fadvise(WILLNEED)`` on the next :attr:`WINDOW` bytes whenever the scan passes half
    of the last window).  Cold, the scan's small reads a member apart were each a wait on the disk
    (the kernel does not read ahead for a seeking reader), and the shard writers then read the
    same bytes again; with the hint both find the pages there.  A file without a descriptor
    (a remote one) or a system without the call: no hint, nothing else changes."""

    WINDOW = 8 << 20

    def __init__(self, f):
        try:
            self.fd = f.fileno() if hasattr(os, "posix_fadvise") else None
        except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
            self.fd = None
        self.hinted = 0  # bytes from the start of the file hinted so far

    def reach(self, pos: int) -> None:
        """The scan is at byte ``pos``: hint the next window once it is half used."""
        if self.fd is None or pos + self.WINDOW // 2 < self.hinted:
            return
        start = max(self.hinted, pos)
        try:
            os.posix_fadvise(self.fd, start, self.WINDOW, os.POSIX_FADV_WILLNEED)
        except OSError:
            self.fd = None
            return
        self.hinted = start + self.WINDOW


def _header_at(f, pos: int, count: int, last: str | None, shown: str):
    """The member whose headers start at byte ``pos`` of the plain tar ``f`` (read in growing
    pieces for long pax records), or None at an end-of-archive block."""
    want = HEADER_READ
    while True:
        f.seek(pos)
        head = f.read(want)
        if head[:fmt.TAR_BLOCK] == ZERO_BLOCK:
            return None
        try:
            return fmt.parse_tar_header(head)
        except FormatError as exc:
            if "truncated" in exc.message and len(head) == want and want < MAX_HEADER:
                want *= 4  # long pax records: read more of the header
                continue
            if pos == 0 and compression_of(head):
                raise SourceError(f"named .tar but its bytes are {compression_of(head)}-"
                                  "compressed", path=shown, hint="rename it .tar.gz"
                                  if compression_of(head) == "gzip" else
                                  "decompress it and convert the plain .tar") from None
            raise SourceError(f"{_nth(count, last)}: corrupt tar header at byte "
                              f"{pos + (exc.offset or 0)}: {exc.message}",
                              path=shown) from None


def _check_gzip(head: bytes, shown: str) -> None:
    """Refuse a ``.tar.gz`` / ``.tgz`` whose bytes are not gzip: the name and the bytes must
    agree (GNU tar and ``tarfile``'s ``r|*`` would read a bzip2 or xz stream under any name)."""
    kind = compression_of(head)
    if kind == "gzip":
        return
    if kind:
        what, hint = f"{kind}-compressed", "decompress it and convert the plain .tar"
    elif head[257:262] == b"ustar":
        what, hint = "a plain (uncompressed) tar", "rename it .tar"
    else:
        what, hint = "not gzip data", "check the file"
    raise SourceError(f"named as a gzip-compressed tar but its bytes are {what}", path=shown,
                      hint=hint)


def _stream_kind(m: tarfile.TarInfo, tf: tarfile.TarFile, cap: int, nth: str,
                 shown: str) -> str:
    """The kind of the member ``tarfile`` just read, its sizes checked before any of its data
    is read: a size that is not a non-negative integer, data that would end past the
    decompression cap, more than a member read into memory may hold."""
    # tarfile takes a negative size, and ignores a pax size it cannot parse
    pax_size = m.pax_headers.get("size")
    if m.size < 0 or (pax_size is not None and not (
            pax_size.isascii() and pax_size.isdigit() and len(pax_size) <= 19)):
        raise SourceError(f"{nth}: bad tar header: size "
                          f"{pax_size if pax_size is not None else m.size!r} "
                          "is not a non-negative integer", path=shown)
    if tf.offset > cap:  # where its data ends in the decompressed tar
        raise SourceError(f"tar member {m.name!r} ends at byte {tf.offset} of the "
                          f"decompressed tar, past {cap_text(cap)}", path=shown)
    kind = ("file" if m.isreg() else "directory" if m.isdir()
            else "link" if m.issym() or m.islnk() else "special file")
    if kind == "file":
        check_member_size(m, shown)
    return kind


def _nth(count: int, last: str | None) -> str:
    """Where a member whose header cannot be read is: its number, and the member before it."""
    return f"member {count + 1}" + (f" (after {last!r})" if last is not None else "")


HEADER_READ = 4096
MAX_HEADER = HEADER_LIMIT
ZERO_BLOCK = bytes(fmt.TAR_BLOCK)


def _held(name: str, data) -> SourceField:
    """A field of bytes read into memory (a buffer of their own: carried as is, not copied)."""
    return value_field(name, data)


def _ranged(url: str, size: int, mtime: int, offset: int, name: str) -> SourceField:
    return SourceField(name, url, size, mtime, None, offset, None, ByteRanges)
