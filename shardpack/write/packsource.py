"""``pack``'s source: a file tree, an ImageFolder tree, or a CSV or JSONL listing, as a
deterministic stream of :class:`~shardpack.write.samples.SourceSample`.

How files become samples (``group``): shardpack/write/grouping.py.  The walk of the tree and its
rules for bad entries: shardpack/write/walk.py.  Listings: shardpack/write/listing.py.
ImageFolder (auto-detected when every top-level entry is a folder) adds the class index, by
sorted class folder name, as a field ``cls`` (ASCII decimal).  On an engine, the walk runs as
independent pieces (:meth:`PackSource.units`), taken back in walk order.
"""

from __future__ import annotations

import os
from typing import Iterator

from shardpack.core.errors import PackError, ShardpackError, SourceError, option_hint
from shardpack.images.content import is_image_field
from shardpack.storage import Storage
from shardpack.write.fields import whole_files
from shardpack.write.listing import LISTING_SUFFIXES, Listing
from shardpack.write.samples import (GROUPS, LAYOUTS, NO_IMAGE_HINT, SourceReport, SourceSample,
                                     value_field)
from shardpack.write.walk import FolderWalk

# pieces of a walk on an engine listed at once, at most: each comes back to the driver whole
# (its samples, ~560 B each), so this bounds the driver's memory (docs/scale.md)
WALK_AHEAD = 32


class PackSource(FolderWalk):
    """``pack``'s source: an iterable of samples plus a :class:`SourceReport` (``report``).

    Args:
        src: a local path (made absolute here: tasks may run in another folder or on another
            machine) or any URL the storage layer knows (``s3://bucket/tree``).
        layout: "auto", "imagefolder" or "files" (docs/packing.md).
        group: "auto", "image" or "webdataset" (shardpack/write/grouping.py).
        skip_bad: bad entries are skipped and counted instead of stopping the walk.
        exclude: a folder under SRC left out of the walk (its real path, or its path on the
            store): the output folder when it lies inside SRC, so a pack never packs its own
            shards.
        follow_links: links leading outside SRC are followed (files and folders) and counted,
            not refused.
        allow_empty_classes: a class folder without samples stays a class (torchvision's
            ``ImageFolder(allow_empty=True)``) instead of stopping the walk.
        label_column: a listing's column that becomes the class label ``cls``
            (shardpack/write/listing.py); listings only.
        need_images: in a dataset of images, a sample without one is a bad entry
            (``no-image``); ``pack --check none`` packs such samples as they are.
        storage_options: fsspec options for a remote SRC.
    """

    SPLIT_TARGET = 4  # pieces a worker, at least, when the tree is deep enough
    SPLIT_DEPTH = 3   # folder levels split on the driver (one listing per folder split)
    SPLIT_BUDGET = 100_000  # entries the driver may list to split (the tasks list the rest)

    def __init__(self, src: str | os.PathLike, *, layout: str = "auto", group: str = "auto",
                 skip_bad: bool = False, exclude: str | None = None,
                 follow_links: bool = False, allow_empty_classes: bool = False,
                 label_column: str | None = None, need_images: bool = True,
                 storage_options: dict | None = None):
        self.storage = Storage(src, storage_options)
        # a local path is absolute (file:// URLs too); a URL loses its trailing slash, or every
        # path built from it would hold "//" (a different key on object stores)
        self.src = self.storage.location().rstrip("/") or "/"
        self.reader = whole_files(self.storage)
        self.skip_bad = skip_bad
        self.follow_links = follow_links
        self.allow_empty_classes = allow_empty_classes
        self.need_images = need_images
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
            if self.storage.local_path() is None:  # read with open(), its files with os.stat()
                raise SourceError("a listing file, and the files it lists, must be local",
                                  path=self.src, hint="list a folder URL instead")
            self.report.layout = "listing"
            self._listing = Listing(self.src, label_column, need_images)
            self.report.classes = self._listing.classes
            self.report.notes += self._listing.notes
        elif label_column is not None:
            raise SourceError(f"{option_hint('label_column', label_column)} is for .csv/.jsonl "
                              "listings; a folder's classes "
                              "are its top-level folders", path=self.src)
        elif kind != "dir":
            raise SourceError("source is neither a folder nor a listing file", path=self.src)
        else:
            self.root = self.storage.real(self.src)
            self.report.layout = self._detect(layout)
            if group == "auto":
                group = ("image" if self.report.layout == "imagefolder" and self._holds_images()
                         else "webdataset")
            self.report.group = group

    def _kind(self) -> str | None:
        """'file', 'dir', 'other' or None (missing) for SRC."""
        try:
            return self.storage.kind()
        except OSError as exc:
            raise SourceError(f"cannot reach the source: {exc}", path=self.src) from None

    def use_engine(self, runner) -> None:
        """List the tree on ``runner`` (an :class:`~shardpack.write.engine.Engine`): one task per
        top-level folder (class folder), results taken in walk order, so the samples are the
        same, in the same order, whatever the engine and its worker count."""
        if not runner.inline and self.report.layout in ("imagefolder", "files"):
            self._runner = runner

    def __iter__(self) -> Iterator[SourceSample]:
        """The samples, in walk order (the same whatever the engine).  Not a generator itself:
        it hands out the one that makes them, with no layer per sample."""
        if self.report.layout == "listing":
            return self._listing.samples(self._bad)
        if self.need_images and self.report.group == "webdataset" and self._holds_images():
            return self._walked(self._with_images)
        return self._walked()  # group "image": every sample is an image and its sidecars

    def _with_images(self, samples: Iterator[SourceSample]) -> Iterator[SourceSample]:
        """The samples of a tree of images, each checked to hold one: a sample without (a
        stray 00000.parquet or _stats.json beside img2dataset's folders) would fail the first
        training batch that meets it, so it is a bad entry here (``no-image``)."""
        known: dict[str, bool] = {}  # field name -> an image field? (few names, many samples)

        def has_image(fields) -> bool:
            for f in fields:
                image = known.get(f.name)
                if image is None:
                    image = known[f.name] = is_image_field(f.name)
                if image:
                    return True
            return False

        for sample in samples:
            if has_image(sample.fields):
                yield sample
                continue
            first = next((f.path for f in sample.fields if f.path), sample.key)
            self._bad(first, f"sample {sample.key!r} has no image (fields: "
                             f"{', '.join(f.name for f in sample.fields)}) in a tree of images",
                      "no-image", NO_IMAGE_HINT)

    def _walked(self, keep=None) -> Iterator[SourceSample]:
        """The samples of the walk, locally or on the engine; ``keep`` (a filter of a piece's
        samples) runs before the class check counts them, so a class left with none of its
        samples kept is as empty as one that had none."""
        units = self.units()
        classes = _ClassCheck(self)
        if self._runner is None:
            for unit in units:
                classes.enter(unit)
                samples = self.walk_unit(unit)
                for sample in samples if keep is None else keep(samples):
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
            if keep is not None:
                samples = list(keep(samples))
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

    def walk_unit(self, unit: tuple) -> Iterator[SourceSample]:
        """The samples of one piece of the walk (:meth:`units`).

        Args:
            unit: (folder, rel, class index or None, recurse).
        """
        folder, rel, cls, recurse = unit
        extra = None
        if cls is not None:
            value = str(cls).encode()
            extra = value_field("cls", value)
        yield from self._walk(folder, rel, self._ancestors(folder, rel), extra, recurse)

    def state(self) -> dict:
        """What a worker needs to walk a unit (:func:`walk_unit`): picklable, no listings."""
        return {"src": self.src, "storage_options": self.storage.storage_options,
                "skip_bad": self.skip_bad, "exclude": self._exclude, "root": self.root,
                "layout": self.report.layout, "group": self.report.group,
                "follow_links": self.follow_links}

    @classmethod
    def from_state(cls, state: dict) -> "PackSource":
        """The source that :meth:`state` describes, in a worker: it walks units, nothing else.

        Args:
            state: what :meth:`state` returned.
        """
        self = cls.__new__(cls)
        self.storage = Storage(state["src"], state["storage_options"])
        self.reader = whole_files(self.storage)
        self.src, self.root = state["src"], state["root"]
        self.skip_bad, self._exclude = state["skip_bad"], state["exclude"]
        self.follow_links, self.allow_empty_classes = state["follow_links"], True
        self.report = SourceReport(layout=state["layout"], group=state["group"])
        self._field_ok, self._runner = {}, None
        return self


class _ClassCheck:
    """Counts the samples the walk finds in each class folder and stops the walk at the end of
    a class folder that gave none: as torchvision's ``ImageFolder``, which refuses such a folder
    unless ``allow_empty=True`` (``--allow-empty-classes``).  A silent empty class would still
    take a label and shift every later one against loaders that leave it out.  A class's
    pieces of the walk (:meth:`PackSource.units`) come one after another."""

    def __init__(self, source: PackSource):
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
                              hint=f"remove it, or pass {option_hint('allow_empty_classes')} "
                                   "to keep it as a class without samples, as torchvision's "
                                   "ImageFolder(allow_empty=True) does")
        self.cls, self.count = cls, 0


def walk_unit(state: dict, unit: tuple) -> tuple[list[SourceSample], SourceReport]:
    """One piece of the walk (:meth:`PackSource.units`), as an engine task: its samples and
    what it counted.

    Args:
        state: the source's :meth:`PackSource.state`.
        unit: the piece (:meth:`PackSource.units`).
    """
    source = PackSource.from_state(state)
    return list(source.walk_unit(unit)), source.report
