"""The samples a pack writes, as every source gives them: :class:`SourceSample` (a key and its
fields), :class:`SourceField` (where a field's bytes are and which reader gets them), and the
:class:`SourceReport` of what a source found besides samples.

The sources: :class:`~shardpack.write.packsource.PackSource` (``pack``: a file tree, an
ImageFolder tree, a CSV or JSONL listing; shardpack/write/walk.py, grouping.py, listing.py) and
the converters' sources (shardpack/interop/sources).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from shardpack.core.errors import SKIP_BAD, SourceError, option_hint
from shardpack.format import unsafe_name_reason
from shardpack.write.fields import FieldReader, InlineValue, LocalFiles

LAYOUTS = ("auto", "imagefolder", "files")  # pack --layout
# a sample without an image in a dataset of images (walk and listings)
NO_IMAGE_HINT = (f"remove it, pass {SKIP_BAD} to skip and count such samples, or "
                 f"{option_hint('check', 'none')} to pack them as they are")
GROUPS = ("auto", "image", "webdataset")    # pack --group


class SourceField(NamedTuple):
    """One field of a source sample, read in the shard writer by its ``reader`` (a
    :class:`~shardpack.write.fields.FieldReader` class, chosen by the walk or the source that made
    the field).  Its forms:

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
    """One sample of a source: its ``key``, its ``fields`` (sorted by name), and ``block``."""

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
        self.leave_out(where, reason, kind)

    def leave_out(self, where: str, reason: str, kind: str) -> None:
        """Count (by ``kind``) and name an entry that is no sample, in the summary and the skip
        report: a bad entry skipped, or one the source's rules leave out whatever the options
        (a file at the top of a class-folder tree)."""
        self.skipped[kind] += 1
        self.skips.append((kind, str(where), reason))
        if len(self.first_skips) < 20:
            self.first_skips.append(f"{where}: {reason}")

    def take_skips(self) -> list[tuple[str, str, str]]:
        """The skips found since the last call, as (reason, path, message); forgets them."""
        out, self.skips = self.skips, []
        return out
