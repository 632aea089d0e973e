"""What every converter's source shares: where the files are, the report, and the checks that
turn (key, fields) pairs from any format into valid, unique samples.

A subclass implements :meth:`ContainerSource.samples` and yields ``(key, fields, where)``:
``key`` as the source has it (or None to get a stable one made from the sample's position),
``fields`` a list of :class:`~shardpack.write.samples.SourceField`, ``where`` a short text naming
the
source file and member/row for error messages, and optionally a fourth item: the estimated bytes
of a source block that starts at this sample (:attr:`SourceSample.block`).  Keys are checked for
safety and uniqueness here, field names against the format's rules; with ``skip_bad`` a bad
sample is skipped and counted by reason, otherwise it raises
:class:`~shardpack.core.errors.SourceError`.
"""

from __future__ import annotations

import os
from typing import ClassVar, Iterator

from shardpack.core.errors import SKIP_BAD, SourceError, option_hint
from shardpack.format import check_field_name
from shardpack.write.samples import SourceField, SourceReport, SourceSample, check_key, value_field
from shardpack.storage import Storage, within
from shardpack.write.walk import refusal

# what to do about a source file refused (by bad-entry kind), and then ", or" the skip
SOURCE_FILE_HINTS = {"link-outside": f"pass {option_hint('follow_links')} to read what it "
                                     "points to"}
SKIP_HINT = f"pass {SKIP_BAD} to skip and count such files"


class ContainerSource:
    """A converter's source: the files of one container format (``format``, files ending in
    ``suffixes``) at ``src``, as a checked stream of
    :class:`~shardpack.write.samples.SourceSample` plus a report.  Subclasses implement
    :meth:`samples`.

    Args:
        src: the source's folder, file or URL.
        storage_options: fsspec options for a remote source.
        skip_bad: bad samples are skipped and counted instead of stopping the conversion.
        allow_pickle: pickled values are carried as their bytes instead of refused (they are
            never unpickled).
        follow_links: source files that are links leading outside ``src`` are read (counted)
            instead of refused (:meth:`source_file`).
    """

    format: ClassVar[str] = ""
    suffixes: ClassVar[tuple[str, ...]] = ()  # file names this format is made of

    def __init__(self, src: str | os.PathLike, *, storage_options: dict | None = None,
                 skip_bad: bool = False, allow_pickle: bool = False, follow_links: bool = False):
        self.src = os.fspath(src)
        self.storage_options = dict(storage_options or {})
        self.skip_bad = skip_bad
        self.allow_pickle = allow_pickle
        self.follow_links = follow_links
        self.report = SourceReport(layout=self.format)
        self.storage, self.single = _locate(self.src, self.storage_options)
        self._root = self.storage.real(self.storage.location())  # links are judged by it
        self._count = 0

    # -- for subclasses ----------------------------------------------------------------------
    def samples(self) -> Iterator[tuple[str | None, list[SourceField], str]]:
        """``(key or None, fields, where[, block bytes])`` of each sample, in source order
        (see the module docstring)."""
        raise NotImplementedError

    def files(self, suffixes: tuple[str, ...] | None = None) -> list[str]:
        """Names (relative to :attr:`storage`) of the source's data files, sorted; a single-file
        source is that file."""
        suffixes = suffixes or self.suffixes
        if self.single is not None:
            return [self.single] if self.source_file(self.single) else []
        names = [n for n in self.storage.listdir() if n.endswith(suffixes)
                 and not n.startswith(".")]
        if not names:
            raise SourceError(f"no {self.format} files ({', '.join(suffixes)}) found",
                              path=self.src, hint="check SRC and --from")
        return [n for n in names if self.source_file(n)]

    def source_file(self, name: str, required: bool = False) -> bool:
        """Whether the source's file ``name`` may be read, by ``pack``'s rule for the files it
        packs (shardpack/write/walk.py ``refusal``): a regular file, and a link leading outside
        SRC only with ``follow_links`` (then counted).  Anything else is a bad entry: an error
        naming it, or with ``skip_bad`` skipped and counted (False).  Every converter asks this
        of each file before it opens it; the open itself takes regular files only
        (shardpack/storage/regular.py), so a FIFO is never waited on.

        Args:
            name: a path relative to :attr:`storage`.
            required: the source cannot do without it (its index): an error even with
                ``skip_bad``.
        """
        kind, real, problem = self.storage.describe(name)
        if name == self.single:
            real = None  # SRC itself: followed wherever it leads, as pack follows SRC
        if problem is not None and problem[0] == "missing" and real is None:
            return True  # no such file, and no link to nothing: its read says it is missing
        refused = refusal(kind, real, problem, self._root, self.follow_links, folders=False)
        if refused is not None:
            hint = SOURCE_FILE_HINTS.get(refused[0], "fix or remove it")
            if refused[0] == "link-outside" and _hub_snapshot(self.src, real):
                hint = f"{hint}: a Hugging Face cache snapshot links into its blobs/ folder"
            self.report.bad(self.skip_bad and not required, self.storage.display(name),
                            refused[1], refused[0], hint if required else f"{hint}, or {SKIP_HINT}")
            return False
        self.report.followed += real is not None and not within(real, self._root)
        return True

    def read_json(self, name: str = "index.json"):
        """(parsed JSON file ``name`` of the source folder, its display name for messages)."""
        import json

        shown = self.storage.display(name)
        self.source_file(name, required=True)
        try:
            return json.loads(self.storage.read_bytes(name)), shown
        except ValueError as exc:
            raise SourceError(f"{name} is not valid JSON: {exc}", path=shown) from None
        except RecursionError:
            raise SourceError(f"{name} is nested too deeply to be an index", path=shown) from None

    @property
    def origin(self) -> str:
        """The source as a resume state and a manifest record it: its absolute path, or its URL
        as given."""
        return self.storage.location(self.single or "")

    def url(self, name: str) -> str:
        """The URL a worker process reads ``name`` from (an absolute path when local)."""
        return self.storage.location(name)

    def mtime_ns(self, name: str) -> int:
        """Modification time of a local file (0 when remote): the writer refuses a file that
        changed between indexing and reading."""
        return self.storage.mtime_ns(name)

    def bad(self, where: str, reason: str, kind: str) -> None:
        """Raise, or with ``skip_bad`` count and remember a bad entry."""
        self.report.bad(self.skip_bad, where, reason, kind,
                        f"fix the source, or pass {SKIP_BAD} to skip and count such samples")

    def note(self, text: str) -> None:
        """Report source metadata that shardpack's manifest has no place for (once each)."""
        if text not in self.report.notes:
            self.report.notes.append(text)

    # -- the checked stream ------------------------------------------------------------------
    def __iter__(self) -> Iterator[SourceSample]:
        seen: set[str] = set()
        for key, fields, where, *block in self.samples():
            position = self._count
            self._count += 1
            if key is None:
                key = f"{position:010d}"
            elif key.startswith("./"):
                key = key[2:]
            problem = check_key(key, seen)
            if problem:
                self.bad(where, *problem)
                continue
            names = [f.name for f in fields]
            why = next((f"field {n!r}: {r}" for n in names if (r := check_field_name(n))), None)
            if why is None and len(set(names)) != len(names):
                why = f"sample {key!r} has a field twice ({sorted(names)})"
            if why is None and not fields:
                why = f"sample {key!r} has no fields"
            if why:
                self.bad(where, why, "bad-field")
                continue
            seen.add(key)
            yield SourceSample(key, tuple(sorted(fields)), block[0] if block else 0)


def _locate(src: str, storage_options: dict) -> tuple[Storage, str | None]:
    """(storage of the folder, None) for a folder; (storage of its parent, name) for a file."""
    storage = Storage(src, storage_options)
    try:  # an HTTP folder without a listing: MDS, LitData (index.json)
        if storage.exists("index.json"):
            return storage, None
    except Exception:  # noqa: BLE001 - then it is not such a folder
        pass
    try:
        is_dir = storage.fs.isdir(storage.root)
        exists = is_dir or storage.exists()
    except Exception as exc:  # noqa: BLE001 - one clear line instead of a client traceback
        raise SourceError(f"cannot reach the source: {type(exc).__name__}: {exc}",
                          path=src) from None
    if not exists:
        raise SourceError("source does not exist", path=src)
    if is_dir:
        return storage, None
    parent, _, name = src.rstrip("/").rpartition("/")
    return Storage(parent or ".", storage_options), name


def inline(name: str, data: bytes) -> SourceField:
    """A field whose bytes the reader already holds (decompressed or decoded from a column)."""
    return value_field(name, bytes(data))


def _hub_snapshot(src: str, real: str | None) -> bool:
    """Whether SRC lies in a Hugging Face hub cache snapshot (``.../snapshots/<rev>``) whose
    files are links into the repository's ``blobs/``: the usual way such a cache is converted,
    and worth saying so in the refusal."""
    return real is not None and "/snapshots/" in f"{src}/" and "/blobs/" in real
