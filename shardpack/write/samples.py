"""Files -> samples: turn a source (a file tree, an ImageFolder tree, a CSV or JSONL listing) into
a deterministic stream of :class:`SourceSample`.

The walk is streaming: one folder's listing is held at a time (per depth), never the whole tree.
Order is deterministic: folders and files sorted by name (code point order), samples by key.

Two ways of grouping files into samples (``group``; docs/packing.md has every rule):

* ``image`` (the default for ImageFolder trees): every image file (extension in
  :data:`shardpack.images.content.IMAGE_EXTENSIONS`, any case) is exactly one sample, whatever dots
  its
  name holds: key = its path without the final extension, field = that extension as written
  (``cat/IMG_2019.01.05.JPEG`` -> key ``cat/IMG_2019.01.05``, field ``JPEG``).  A non-image file
  whose name is an image's stem (or whole name) plus one extension is a sidecar and joins that
  image (``IMG_2019.01.05.json`` or ``IMG_2019.01.05.JPEG.json`` -> field ``json``).  Anything
  else (``Thumbs.db``, ``desktop.ini``, a README) is no sample: it is ignored and counted.
* ``webdataset`` (the default for other trees): key = path up to the first dot of the file name,
  field = the rest (``0001.seg.png`` -> key ``0001``, field ``seg.png``).  :class:`FieldCensus`
  stops a pack whose field names explode (dotted names folded together).

ImageFolder (auto-detected when every top-level entry is a folder) adds the class index, by
sorted class folder name, as a field ``cls`` (ASCII decimal).  Hidden entries (names starting
with '.') are never samples: they are counted.  Bad entries (special files, broken links, links
leading outside SRC, symlink loops, names that are not UTF-8, two images with one key) raise
:class:`SourceError`, or with ``skip_bad`` are skipped and counted by reason.
"""

from __future__ import annotations

import csv
import errno
import json
import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

from shardpack.core.errors import PackError, ShardpackError, SourceError
from shardpack.write.fields import FieldReader, InlineValue, LocalFiles, RemoteFiles
from shardpack.format import (
    MANIFEST_NAME, STATE_NAME, check_field_name, split_name, unsafe_name_reason,
)
from shardpack.images.content import IMAGE_EXTENSIONS

LISTING_SUFFIXES = (".csv", ".jsonl")
# pieces of a walk on an engine listed at once, at most: each comes back to the driver whole
# (its samples, ~560 B each), so this bounds the driver's memory (docs/scale.md)
WALK_AHEAD = 32
LAYOUTS = ("auto", "imagefolder", "files")
# a folder holding one of these is a shardpack dataset (or one a pack is writing or failed to
# finish): never walked.  The manifest first: on object stores only it is looked for at the top
DATASET_MARKERS = (MANIFEST_NAME, STATE_NAME)
GROUPS = ("auto", "image", "webdataset")


class SourceField(NamedTuple):
    """One field of a source sample, read in the shard writer by its ``reader`` (a
    :class:`~shardpack.write.fields.FieldReader` class, chosen by the walk or the source that made
    the
    field).  Its forms:

    * a whole file: ``path`` set, ``offset`` None (``pack`` of a file tree; ``LocalFiles``,
      ``RemoteFiles``);
    * a byte range of a container file: ``path`` is the container's URL and ``offset`` where the
      field's ``size`` bytes start (``convert`` of uncompressed tar, MDS or LitData shards;
      ``sources.common.ByteRanges``);
    * a Parquet cell: ``path`` is the file's URL, ``column`` the column (a path into structs, e.g.
      ``("image", "bytes")``) and ``offset`` the row in the file (``sources.parquet.ParquetCells``);
    * an inline value: ``path`` None and ``value`` the bytes (class index, listing column, fields
      that a converter had to decode from compressed sources; ``InlineValue``).
    """

    name: str
    path: str | None      # file to read, or container URL, or None for an inline value
    size: int
    mtime_ns: int
    value: bytes | None = None  # inline value (class index, listing column)
    offset: int | None = None   # start of the field inside the container ``path`` (or row)
    column: tuple[str, ...] | None = None  # Parquet column of the cell (``offset`` = its row)
    reader: type[FieldReader] | None = None  # reads this field in the shard writer


def file_field(name: str, path: str, size: int, mtime_ns: int) -> SourceField:
    """A whole local file: read (and checked for changes since the walk) by the writer."""
    return SourceField(name, path, size, mtime_ns, None, None, None, LocalFiles)


def value_field(name: str, data: bytes) -> SourceField:
    """A field whose bytes travel in it."""
    return SourceField(name, None, len(data), 0, data, None, None, InlineValue)


def check_key(key: str, seen) -> tuple[str, str] | None:
    """Why ``key`` cannot be the next sample's key, as ``(reason, kind)``: unsafe as a path
    (``bad-key``) or already in ``seen`` (``duplicate``); None when it can.  The one key rule of
    ``pack``'s listings and of every converter's source."""
    why = unsafe_name_reason(key)  # dots are fine: tar member names escape them
    if why:
        return f"sample key {key!r}: {why}", "bad-key"
    if key in seen:
        return (f"duplicate sample key {key!r} (keys must be unique across the whole source)",
                "duplicate")
    return None


class SourceSample(NamedTuple):
    key: str
    fields: tuple[SourceField, ...]  # sorted by name
    block: int = 0  # > 0: this sample starts a source block read as a whole (a Parquet row
    #                 group) of about this many bytes; the planner avoids cutting blocks


@dataclass
class SourceReport:
    """What the walk found besides samples; filled in while the stream is consumed."""

    layout: str = "files"
    group: str = "webdataset"
    classes: list[str] | None = None
    skipped: Counter = field(default_factory=Counter)
    hidden: int = 0
    images: int = 0   # image files found (group "image")
    ignored: int = 0  # files that are neither images nor sidecars of one (group "image")
    first_ignored: list[str] = field(default_factory=list)
    excluded: str | None = None  # a folder left out of the walk (the output, inside SRC)
    datasets: list[str] = field(default_factory=list)  # shardpack datasets inside SRC, left out
    followed: int = 0  # links leading outside SRC that --follow-links followed
    hidden_folders: list[str] = field(default_factory=list)  # at the top: never classes
    first_skips: list[str] = field(default_factory=list)
    # every skip as (reason, path, message), until the packer takes them into its skip report
    # (:meth:`take_skips`); bounded by what the walk finds between two finished shards
    skips: list[tuple[str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # source metadata that was not carried over

    def add(self, other: "SourceReport") -> None:
        """Count in what one piece of a walk run elsewhere found (:func:`walk_unit`)."""
        self.skipped.update(other.skipped)
        self.hidden += other.hidden
        self.images += other.images
        self.ignored += other.ignored
        self.followed += other.followed
        self.first_ignored += other.first_ignored[:5 - len(self.first_ignored)]
        self.first_skips += other.first_skips[:20 - len(self.first_skips)]
        self.skips += other.skips
        self.datasets += other.datasets
        self.excluded = self.excluded or other.excluded

    def bad(self, skip_bad: bool, where: str, reason: str, kind: str, hint: str) -> None:
        """Raise a :class:`SourceError`, or with ``skip_bad`` count (by ``kind``) and remember
        the bad entry: the one rule of ``pack``'s walk and of every converter's source."""
        if not skip_bad:
            raise SourceError(reason, path=where, hint=hint)
        self.skipped[kind] += 1
        self.skips.append((kind, str(where), reason))
        if len(self.first_skips) < 20:
            self.first_skips.append(f"{where}: {reason}")

    def take_skips(self) -> list[tuple[str, str, str]]:
        """The skips found since the last call, as (reason, path, message); forgets them."""
        out, self.skips = self.skips, []
        return out


class Source:
    """An iterable of samples plus a :class:`SourceReport`."""

    def __init__(self, src: str | os.PathLike, *, layout: str = "auto", group: str = "auto",
                 skip_bad: bool = False, exclude: str | None = None,
                 follow_links: bool = False, allow_empty_classes: bool = False,
                 storage_options: dict | None = None):
        """``exclude``: a folder (real path) under SRC left out of the walk: the output folder
        when it lies inside SRC, so a pack never packs its own shards.  ``follow_links``: links
        leading outside SRC are followed (files and folders) and counted, not refused.
        ``allow_empty_classes``: a class folder without samples stays a class (torchvision's
        ``ImageFolder(allow_empty=True)``) instead of stopping the walk.  SRC is a local path
        (made absolute here: tasks may run in another folder or on another machine) or any URL
        the storage layer knows (``s3://bucket/tree``): the walk lists it through fsspec."""
        from shardpack.storage import Storage

        self.storage = Storage(src, storage_options)
        self.local = self.storage.local
        # local: the absolute path (file:// URLs too); URLs: no trailing slash, or every path
        # built from it would hold "//" (a different key on object stores)
        self.src = self.storage.root if self.local else self.storage.url.rstrip("/")
        self.skip_bad = skip_bad
        self.follow_links = follow_links
        self.allow_empty_classes = allow_empty_classes
        self.report = SourceReport()
        self._exclude = exclude
        self._field_ok: dict[str, str | None] = {}  # field name -> why it is refused (cache)
        self._runner = None
        if layout not in LAYOUTS:
            raise SourceError(f"unknown layout {layout!r}: expected one of {LAYOUTS}")
        if group not in GROUPS:
            raise SourceError(f"unknown grouping {group!r}: expected one of {GROUPS}")
        kind = self._kind()
        if kind is None:
            raise SourceError("source does not exist", path=self.src)
        if kind == "file":
            if not self.src.endswith(LISTING_SUFFIXES):
                raise SourceError("a source file must be a .csv or .jsonl listing", path=self.src)
            if not self.local:
                raise SourceError("a listing file, and the files it lists, must be local",
                                  path=self.src, hint="list a folder URL instead")
            self.report.layout = "listing"
        elif kind != "dir":
            raise SourceError("source is neither a folder nor a listing file", path=self.src)
        else:
            self.root = os.path.realpath(self.src) if self.local else self.src
            self.report.layout = self._detect(layout)
            if group == "auto":
                group = ("image" if self.report.layout == "imagefolder" and self._holds_images()
                         else "webdataset")
            self.report.group = group

    def _kind(self) -> str | None:
        """'file', 'dir', 'other' or None (missing) for SRC."""
        if self.local:
            if not os.path.exists(self.src):
                return None
            return ("file" if os.path.isfile(self.src) else "dir" if os.path.isdir(self.src)
                    else "other")
        try:
            info = self.storage.fs.info(self.storage.root)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SourceError(f"cannot reach the source: {exc}", path=self.src) from None
        return "dir" if info.get("type") == "directory" else "file"

    def use_engine(self, runner) -> None:
        """List the tree on ``runner`` (an :class:`~shardpack.write.engine.Engine`): one task per
        top-level folder (class folder), results taken in walk order, so the samples are the
        same, in the same order, whatever the engine and its worker count."""
        if not runner.inline and self.report.layout in ("imagefolder", "files"):
            self._runner = runner

    def __iter__(self) -> Iterator[SourceSample]:
        if self.report.layout == "listing":
            yield from _read_listing(self.src, self)
            return
        units = self.units()
        classes = _ClassCheck(self)
        if self._runner is None:
            for unit in units:
                classes.enter(unit)
                for sample in self.walk_unit(unit):
                    classes.count += 1
                    yield sample
            classes.enter(None)
            return
        from functools import partial

        state = self.state()
        ahead = min(2 * self._runner.workers, WALK_AHEAD)
        results = self._runner.map_ordered(partial(walk_unit, state), units, ahead)
        for unit in units:
            try:
                samples, report = next(results)
            except ShardpackError:
                raise
            except Exception as exc:  # a worker died, a cluster went away, ...
                raise PackError(f"listing this folder on the engine failed: "
                                f"{type(exc).__name__}: {exc}".splitlines()[0],
                                path=unit[0]) from None
            self.report.add(report)
            classes.enter(unit)
            classes.count += len(samples)
            yield from samples
        classes.enter(None)

    def units(self) -> list[tuple]:
        """The walk in independent pieces, in walk order: (folder, rel, class index or None,
        recurse).  In one process: the tree (or each class folder) whole.  On an engine: folders
        are split, level by level down to SPLIT_DEPTH, into their own files (one piece) and
        their subfolders (a piece each) until there are at least SPLIT_TARGET pieces a worker;
        a folder's files still come before its subfolders, so the order is the one walk's."""
        if self.report.layout == "imagefolder":
            units = [(f"{self.src}/{name}", name, cls, True)
                     for cls, name in enumerate(self.report.classes)]
        else:
            units = [(self.src, "", None, True)]
        if self._runner is None:
            return units
        target, budget = self.SPLIT_TARGET * self._runner.workers, self.SPLIT_BUDGET
        for _ in range(self.SPLIT_DEPTH):
            if sum(u[3] for u in units) >= target or budget <= 0:
                break
            split, found = [], False
            for folder, rel, cls, recurse in units:
                subfolders = self._subfolders(folder) if recurse and budget > 0 else None
                if subfolders is None:  # a leaf of the split: walked whole by one task
                    split.append((folder, rel, cls, recurse))
                    continue
                budget -= subfolders[1]
                found = found or bool(subfolders[0])
                split.append((folder, rel, cls, False))  # its own files
                prefix = f"{rel}/" if rel else ""
                split += [(path, prefix + name, cls, True) for name, path in subfolders[0]]
            units = split
            if not found:  # only files at this level: deeper splits would find nothing
                break
        return units

    def _subfolders(self, folder: str) -> tuple[list[tuple[str, str]], int] | None:
        """(subfolders, entries listed) of a folder the split may cut, or None when it must
        stay whole: it cannot be listed, or holds links or names the walk must judge itself
        (a link to a folder, a name that is not UTF-8) so that its one walk sees them."""
        try:
            if not self.local:
                entries = self._ls(folder)
                return [(n, p) for n, p, info in entries if info.get("type") == "directory"
                        and not n.startswith(".") and not self._excluded(p)], len(entries)
            dirs = []
            entries = _scandir_sorted(folder)
            for e in entries:
                if e.is_symlink() or not e.name.isascii() and not _utf8(e.name):
                    return None
                if e.is_dir(follow_symlinks=False) and not e.name.startswith(".") \
                        and not self._excluded(e.path):
                    dirs.append((e.name, f"{folder}/{e.name}"))
            return dirs, len(entries)
        except OSError:
            return None

    SPLIT_TARGET = 4  # pieces a worker, at least, when the tree is deep enough
    SPLIT_DEPTH = 3   # folder levels split on the driver (one listing per folder split)
    SPLIT_BUDGET = 100_000  # entries the driver may list to split (the tasks list the rest)

    def walk_unit(self, unit: tuple) -> Iterator[SourceSample]:
        folder, rel, cls, recurse = unit
        extra = None
        if cls is not None:
            value = str(cls).encode()
            extra = value_field("cls", value)
        yield from self._walk(folder, rel, self._ancestors(folder, rel), extra, recurse)

    def _ancestors(self, folder: str, rel: str) -> set[str]:
        """Real paths of SRC and of every folder from it down to ``folder`` (symlink loops are
        told by them); nothing for URLs (object stores have no links)."""
        if not self.local:
            return set()
        ancestors, path = {self.root}, self.src
        for part in rel.split("/") if rel else ():
            path = f"{path}/{part}"
            ancestors.add(os.path.realpath(path))
        return ancestors

    def state(self) -> dict:
        """What a worker needs to walk a unit (:func:`walk_unit`): picklable, no listings."""
        return {"src": self.src, "storage_options": self.storage.storage_options,
                "skip_bad": self.skip_bad, "exclude": self._exclude, "root": self.root,
                "layout": self.report.layout, "group": self.report.group,
                "follow_links": self.follow_links}

    @classmethod
    def from_state(cls, state: dict) -> "Source":
        from shardpack.storage import Storage

        self = cls.__new__(cls)
        self.storage = Storage(state["src"], state["storage_options"])
        self.local = self.storage.local
        self.src, self.root = state["src"], state["root"]
        self.skip_bad, self._exclude = state["skip_bad"], state["exclude"]
        self.follow_links, self.allow_empty_classes = state["follow_links"], True
        self.report = SourceReport(layout=state["layout"], group=state["group"])
        self._field_ok, self._runner = {}, None
        return self

    # -- helpers ---------------------------------------------------------------------------
    def _bad(self, path: str, reason: str, kind: str) -> None:
        self.report.bad(self.skip_bad, path, reason, kind,
                        "fix or remove it, or pass --skip-bad to skip and count such entries")

    def _detect(self, layout: str) -> str:
        """The layout, and for an ImageFolder its classes: the top-level folders, sorted by
        name, as torchvision's ``ImageFolder`` finds them (links to folders included), less
        hidden folders, a shardpack dataset and OUT (docs/packing.md, "Classes")."""
        if self.local and os.path.exists(f"{self.src}/{MANIFEST_NAME}") or not self.local and \
                self.storage.fs.exists(f"{self.storage.root.rstrip('/')}/{MANIFEST_NAME}"):
            raise SourceError(f"source folder is a shardpack dataset (it holds {MANIFEST_NAME})",
                              path=self.src, hint="point SRC at the files to pack; `shardpack "
                                                  "unpack` turns a dataset back into files")
        entries = []
        for name, path, is_dir in self._entries(self.src):
            if name.startswith(".") and is_dir:
                self.report.hidden_folders.append(name)
            if name.startswith(".") or self._excluded(path):
                continue
            if is_dir and (not self._top_link_ok(path) or self._is_dataset_folder(path)):
                continue
            entries.append((name, is_dir))
        if not entries:
            raise SourceError("source folder is empty", path=self.src,
                              hint="point SRC at a folder holding your files")
        if layout == "auto":
            layout = "imagefolder" if all(d for _, d in entries) else "files"
        if layout == "imagefolder":
            not_dirs = [name for name, d in entries if not d]
            if not_dirs:
                raise SourceError(f"--layout imagefolder needs only class folders at the top, "
                                  f"found file {not_dirs[0]!r}", path=self.src)
            self.report.classes = [name for name, _ in entries]
        return layout

    def _top_link_ok(self, path: str) -> bool:
        """A top-level folder that is a link: one leading outside SRC is refused like any other
        outside link (a class made of files the user did not point at), or followed and counted
        with ``follow_links``.  The walk below checks deeper links itself (:meth:`_classify`)."""
        if not self.local or not os.path.islink(path):
            return True
        real = os.path.realpath(path)
        if within(real, self.root):
            return True
        if self.follow_links:
            self.report.followed += 1
            return True
        self._bad(path, f"folder link points outside the source ({real})", "link-outside")
        return False

    def _is_dataset_folder(self, path: str) -> bool:
        """Whether a folder holds a shardpack dataset (its manifest, or a pack's lock or state:
        one in the making): never samples of this pack, whatever its name.  Noted in the
        report.  One stat locally; one request per top-level folder on a store (below the top
        level the walk finds the manifest in the folder's own listing, :meth:`_list`)."""
        try:
            if self.local:
                found = any(os.path.lexists(f"{path}/{name}") for name in DATASET_MARKERS)
            else:
                on_store = self.storage.root.rstrip("/") + path[len(self.src):]
                found = self.storage.fs.exists(f"{on_store}/{DATASET_MARKERS[0]}")
        except OSError:
            return False  # the walk reports a folder it cannot read
        if found:
            self.report.datasets.append(path)
        return found

    def _entries(self, folder: str, follow: bool = True) -> list[tuple[str, str, bool]]:
        """(name, path, is a folder) of a folder's entries, sorted; [] if it cannot be listed
        (the walk reports that).  ``follow=False``: a link to a folder is not a folder."""
        try:
            if self.local:
                return [(e.name, e.path, e.is_dir(follow_symlinks=follow))
                        for e in _scandir_sorted(folder)]
            return [(name, path, info["type"] == "directory")
                    for name, path, info in self._ls(folder)]
        except OSError:
            if folder == self.src:
                raise
            return []

    def _ls(self, folder: str) -> list[tuple[str, str, dict]]:
        """(name, URL, fsspec info) of a remote folder's entries, sorted by name."""
        fs, root = self.storage.fs, self.storage.root
        sub = folder[len(self.src):].lstrip("/")
        where = f"{root}/{sub}" if sub else root
        out = []
        for info in fs.ls(where, detail=True):
            full = info["name"].rstrip("/")
            if full == where.rstrip("/"):  # the folder's own marker object ("tree/")
                continue
            name = full.rsplit("/", 1)[-1]
            if name:
                out.append((name, f"{folder}/{name}", info))
        return sorted(out, key=lambda t: t[0])

    def _walk(self, folder: str, rel: str, ancestors: set[str],
              extra: SourceField | None, recurse: bool = True) -> Iterator[SourceSample]:
        """Files of ``folder`` first (grouped into samples), then its subfolders, all sorted.
        ``extra`` (the ImageFolder class field) is added to every sample."""
        listed = self._list(folder, ancestors)
        if listed is None:
            return
        files, dirs = listed
        prefix = f"{rel}/" if rel else ""
        if self.report.group == "image":
            yield from self._group_images(files, prefix, extra)
        else:
            yield from self._group_webdataset(files, prefix, extra)
        files = None
        if not recurse:
            return
        for name, path in dirs:
            inner = ancestors | {os.path.realpath(path)} if self.local else ancestors
            yield from self._walk(path, prefix + name, inner, extra)

    def _list(self, folder: str, ancestors: set[str], count: bool = True):
        """(files, folders) of one folder, sorted: files as (stem, field, path, size, mtime_ns)
        with names checked, folders as (name, path).  Hidden and bad entries are counted or
        raised here (not with ``count=False``: a look ahead that the walk repeats).  None when
        the folder cannot be listed.  Local folders: ``os.scandir`` (symlinks checked against
        SRC and its ancestors); URLs: fsspec's ``ls``, one request per folder."""
        if not count:
            report, skip = self.report, self.skip_bad
            self.report, self.skip_bad = SourceReport(), True
            try:
                return self._list(folder, ancestors)
            finally:
                self.report, self.skip_bad = report, skip
        try:
            entries = (self._scan_local(folder, ancestors) if self.local
                       else self._scan_remote(folder))
        except OSError as exc:
            self._bad(folder, f"cannot list folder: {exc.strerror or exc}", "unreadable")
            return None
        if entries is None:  # a shardpack dataset: left out whole, and named
            self.report.datasets.append(folder)
            return [], []
        files, dirs = [], []
        by_image = self.report.group == "image"
        field_ok = self._field_ok
        for name, path, size, mtime in entries:
            if size is None:
                dirs.append((name, path))
                continue
            if by_image:
                stem, dot, fname = name.rpartition(".")
                if not dot or not stem:  # no extension, or a name like "jpg": not an image
                    stem, fname = name, ""
            else:
                stem, _, fname = name.partition(".")
            why = field_ok.get(fname, True)
            if why is True:
                why = field_ok[fname] = check_field_name(fname)
            if why and not (by_image and not fname):
                self._bad(path, why, "bad-name")
                continue
            files.append((stem, fname, path, size, mtime))
        return files, dirs

    def _usable_name(self, name: str, path: str) -> bool:
        """Hidden names are counted, names that are not UTF-8 are bad entries."""
        if name[0] == ".":
            self.report.hidden += 1
            return False
        if not name.isascii():
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                self._bad(path, "file name is not valid UTF-8", "bad-name")
                return False
        return True

    def _scan_local(self, folder: str, ancestors: set[str]):
        """(name, path, size or None for a folder, mtime_ns) of a local folder's usable
        entries.  This loop runs once per file of the dataset: plain local operations."""
        out = []
        listed = _scandir_sorted(folder)
        if any(entry.name in DATASET_MARKERS for entry in listed):
            return None
        for entry in listed:
            name = entry.name
            path = f"{folder}/{name}"
            if not self._usable_name(name, path):
                continue
            if entry.is_file(follow_symlinks=False):  # the common case: no extra checks
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    kind, st = self._classify(entry, path, ancestors)
                    if kind is None:
                        continue
            else:
                kind, st = self._classify(entry, path, ancestors)
                if kind == "dir":
                    if self._excluded(path):  # OUT inside SRC: only a folder can be OUT
                        self.report.excluded = path
                    else:
                        out.append((name, path, None, 0))
                if kind != "file":
                    continue
            out.append((name, path, st.st_size, st.st_mtime_ns))
        return out

    def _scan_remote(self, folder: str):
        """The same for a folder on object storage or any fsspec URL: no links or special
        files there; the modification time, where the store gives one, guards against a
        file changing during the pack."""
        out = []
        listed = self._ls(folder)
        if any(name == DATASET_MARKERS[0] for name, _, _ in listed):
            return None
        for name, path, info in listed:
            if not self._usable_name(name, path):
                continue
            if info.get("type") == "directory":
                if self._excluded(path):  # OUT inside SRC, on the same store
                    self.report.excluded = path
                else:
                    out.append((name, path, None, 0))
            else:
                out.append((name, path, int(info.get("size") or 0), _mtime_ns(info)))
        return out

    def _group_webdataset(self, files: list, prefix: str, extra) -> Iterator[SourceSample]:
        """Key up to the first dot: consecutive files of one stem make one sample."""
        files.sort()
        reader = LocalFiles if self.local else RemoteFiles
        group_stem, group = None, []
        for stem, fname, path, size, mtime in files:
            if stem != group_stem and group:
                sample = self._sample(prefix + group_stem, group, extra)
                if sample is not None:
                    yield sample
                group = []
            group_stem = stem
            group.append(SourceField(fname, path, size, mtime, None, None, None, reader))
        if group:
            sample = self._sample(prefix + group_stem, group, extra)
            if sample is not None:
                yield sample

    def _group_images(self, files: list, prefix: str, extra) -> list[SourceSample]:
        """One sample per image file of one folder, with its sidecars; the rest is counted as
        ignored.  ``files``: (stem at the last dot, extension, path, size, mtime)."""
        images: dict[str, list] = {}  # stem -> [image file, sidecar fields...]
        names: dict[str, str] = {}    # an image's whole file name -> its stem
        others = []
        for item in sorted(files):
            stem, ext, path = item[0], item[1], item[2]
            if ext.lower() not in IMAGE_EXTENSIONS:
                others.append(item)
                continue
            self.report.images += 1
            if stem in images:
                first = images[stem][0][2]
                self._bad(path, f"two images with one key {prefix + stem!r} (also "
                                f"{os.path.basename(first)!r}); rename one of them",
                          "duplicate-key")
                continue
            images[stem] = [item]
            names[f"{stem}.{ext}"] = stem
        for item in others:
            stem, ext, path = item[0], item[1], item[2]
            owner = None
            if ext:  # a file without extension has no field name: never a sidecar
                if stem in images:
                    owner = stem
                elif stem in names:  # x.jpg.json: field jpg.json, so unpack writes it back
                    owner = names[stem]
                    item = (owner, stem[len(owner) + 1:] + "." + ext) + item[2:]
            if owner is None:  # no image of that name here: not a sample (Thumbs.db, ...)
                self.report.ignored += 1
                if len(self.report.first_ignored) < 5:
                    self.report.first_ignored.append(path)
                continue
            images[owner].append(item)
        out = []
        reader = LocalFiles if self.local else RemoteFiles
        for stem in sorted(images):
            group, seen = [], set()
            for _, ext, path, size, mtime in images[stem]:
                if ext in seen:  # cannot happen: one folder holds one file of each name
                    self._bad(path, f"a second file for field {ext!r} of sample "
                                    f"{prefix + stem!r}", "duplicate")
                    continue
                seen.add(ext)
                group.append(SourceField(ext, path, size, mtime, None, None, None, reader))
            group.sort()
            sample = self._sample(prefix + stem, group, extra)
            if sample is not None:
                out.append(sample)
        return out

    PEEK_FOLDERS = 8  # folders holding files that _holds_images looks at, at most
    PEEK_LISTINGS = 256  # folder listings it reads at most (empty folders, links)

    def _holds_images(self) -> bool:
        """Whether the tree holds images, judged from the first PEEK_FOLDERS folders (walk order)
        that hold files: an ImageFolder of images groups one sample per image, one of other files
        (audio, arrays) keeps WebDataset grouping.  A folder of only junk (Thumbs.db) does not
        decide it; a few listings are read, not the tree.  Links to folders are looked into (a
        tree of class folders that are links is common), each real folder once (no loops)."""
        looked, listed, stack, seen = 0, 0, [self.src], set()
        while stack and listed < self.PEEK_LISTINGS:
            folder = stack.pop()
            if self.local:
                real = os.path.realpath(folder)
                if real in seen:
                    continue
                seen.add(real)
            entries = self._entries(folder)
            listed += 1
            names = [n for n, _, is_dir in entries if not is_dir and not n.startswith(".")]
            if any(n.rpartition(".")[2].lower() in IMAGE_EXTENSIONS for n in names):
                return True
            looked += bool(names)
            if looked >= self.PEEK_FOLDERS:
                return False
            stack += [p for n, p, is_dir in reversed(entries)
                      if is_dir and not n.startswith(".") and not self._excluded(p)]
        return False

    def _excluded(self, path: str) -> bool:
        if self._exclude is None:
            return False
        if self.local:
            return within(os.path.realpath(path), self._exclude)
        on_store = self.storage.root.rstrip("/") + path[len(self.src):]  # URL -> store path
        return on_store == self._exclude or on_store.startswith(self._exclude + "/")

    def _sample(self, key: str, group: list, extra: SourceField | None) -> SourceSample | None:
        if extra is None:
            return SourceSample(key, tuple(group))
        for f in group:
            if f.name == extra.name:
                self._bad(f.path, f"two sources for field '{extra.name}' of the same sample "
                                  "(the class folder and a file)", "duplicate")
                return None
        group.append(extra)
        group.sort()
        return SourceSample(key, tuple(group))

    def _classify(self, entry: os.DirEntry, path: str, ancestors: set[str]):
        """('file', stat) / ('dir', None) / (None, None) after reporting a bad entry."""
        try:
            if entry.is_symlink():
                real = os.path.realpath(path)
                outside = not within(real, self.root)
                if outside and not self.follow_links:
                    self._bad(path, f"symlink points outside the source ({real})", "link-outside")
                    return None, None
                st = os.stat(path)
                if stat.S_ISDIR(st.st_mode) and real in ancestors:
                    self._bad(path, f"symlink loop: links back to {real}, a folder it lies in",
                              "link-loop")
                    return None, None
                self.report.followed += outside
            else:
                st = entry.stat(follow_symlinks=False)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self._bad(path, "symlink loop", "link-loop")
            elif isinstance(exc, FileNotFoundError):
                self._bad(path, "broken symlink or file vanished during the walk", "missing")
            else:
                self._bad(path, f"cannot stat: {exc.strerror}", "unreadable")
            return None, None
        if stat.S_ISDIR(st.st_mode):
            return "dir", None
        if not stat.S_ISREG(st.st_mode):
            what = ("FIFO" if stat.S_ISFIFO(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode)
                    else "device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                    else "special file")
            self._bad(path, f"is a {what}, not a regular file (never opened)", "special")
            return None, None
        return "file", st


class _ClassCheck:
    """Counts the samples the walk finds in each class folder and stops the walk at the end of
    a class folder that gave none: as torchvision's ``ImageFolder``, which refuses such a folder
    unless ``allow_empty=True`` (``--allow-empty-classes``).  A silent empty class would still
    take a label and shift every later one against loaders that leave it out.  A class's
    pieces of the walk (:meth:`Source.units`) come one after another."""

    def __init__(self, source: Source):
        self.source = source
        self.active = source.report.layout == "imagefolder" and not source.allow_empty_classes
        self.cls: int | None = None
        self.count = 0

    def enter(self, unit: tuple | None) -> None:
        """The walk moves to ``unit`` (None: the walk ended): check the class it leaves."""
        cls = None if unit is None else unit[2]
        if cls == self.cls:
            return
        if self.active and self.cls is not None and self.count == 0:
            name = self.source.report.classes[self.cls]
            skipped = (" (its bad entries were skipped)" if self.source.report.skipped
                       else "")
            raise SourceError(f"class folder {name!r} holds no samples{skipped}",
                              path=f"{self.source.src}/{name}",
                              hint="remove it, or pass --allow-empty-classes to keep it as a "
                                   "class without samples, as torchvision's ImageFolder("
                                   "allow_empty=True) does")
        self.cls, self.count = cls, 0


def walk_unit(state: dict, unit: tuple) -> tuple[list[SourceSample], "SourceReport"]:
    """One piece of the walk (:meth:`Source.units`), as an engine task: its samples and what
    it counted."""
    source = Source.from_state(state)
    return list(source.walk_unit(unit)), source.report


def _mtime_ns(info: dict) -> int:
    """An object's modification time in ns from fsspec info (s3 ``LastModified``, local
    ``mtime``, gcs ``updated``), else 0 (not checked)."""
    value = info.get("LastModified") or info.get("mtime") or info.get("updated")
    if value is None:
        return 0
    if isinstance(value, (int, float)):
        return int(value * 1e9)
    if isinstance(value, str):
        from datetime import datetime

        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return 0
    try:
        return int(value.timestamp() * 1e9)
    except (AttributeError, OverflowError, ValueError):
        return 0


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def within(real: str, root: str) -> bool:
    """Whether the real path ``real`` is ``root`` or lies below it."""
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _scandir_sorted(folder: str) -> list[os.DirEntry]:
    with os.scandir(folder) as it:
        return sorted(it, key=lambda e: e.name)


def _read_listing(path: str, source: Source) -> Iterator[SourceSample]:
    """CSV (header row) or JSONL: a ``path`` column/key, an optional ``key``, and any other
    columns become fields holding the value as UTF-8 text (JSON for non-scalar JSONL values)."""
    base = os.path.dirname(os.path.abspath(path))
    seen: set[str] = set()
    for lineno, row in _listing_rows(path):
        where = f"{path}:{lineno}"
        file_path = row.pop("path", None)
        if not isinstance(file_path, str) or not file_path:
            raise SourceError("row has no 'path' value", path=where)
        full = file_path if os.path.isabs(file_path) else os.path.join(base, file_path)
        name = os.path.basename(file_path)
        stem, fname = split_name(name)
        key = row.pop("key", None)
        if key is None:
            rel = os.path.dirname(file_path).lstrip("/")
            key = f"{rel}/{stem}" if rel else stem
        key = str(key)
        why = check_field_name(fname)
        problem = check_key(key, seen)
        if why or (problem and problem[1] != "duplicate"):
            source._bad(where, why or problem[0], "bad-name")
            continue
        if problem:
            raise SourceError(problem[0], path=where)
        seen.add(key)
        try:
            st = os.stat(full)
        except OSError as exc:
            source._bad(full, f"listed file cannot be read: {exc.strerror}", "missing")
            continue
        if not stat.S_ISREG(st.st_mode):
            source._bad(full, "listed path is not a regular file", "special")
            continue
        fields = [file_field(fname, full, st.st_size, st.st_mtime_ns)]
        for col, value in row.items():
            if value is None or value == "":
                continue
            why = check_field_name(col)
            if why or col == fname:
                raise SourceError(why or f"column {col!r} clashes with the file's field",
                                  path=where)
            data = (value if isinstance(value, str)
                    else json.dumps(value, separators=(",", ":"), sort_keys=True)).encode()
            fields.append(value_field(col, data))
        yield SourceSample(key, tuple(sorted(fields)))


def _listing_rows(path: str):
    with open(path, newline="", encoding="utf-8") as f:
        if path.endswith(".csv"):
            reader = csv.DictReader(f)
            if not reader.fieldnames or "path" not in reader.fieldnames:
                raise SourceError("CSV listing needs a header row with a 'path' column",
                                  path=path)
            for row in reader:
                yield reader.line_num, row
        else:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SourceError(f"bad JSON: {exc.msg}", path=f"{path}:{lineno}") from None
                if not isinstance(row, dict):
                    raise SourceError("each JSONL line must be an object", path=f"{path}:{lineno}")
                yield lineno, row
