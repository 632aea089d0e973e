"""The walk of a folder tree for ``pack``: folders and files in a deterministic order, bad entries
refused or counted, files grouped into samples (shardpack/write/grouping.py).

The walk is streaming: one folder's listing is held at a time (per depth), never the whole tree.
Order is deterministic: folders and files sorted by name (code point order), samples by key.
Hidden entries (names starting with '.') are never samples: they are counted.  Bad entries
(special files, broken links, links leading outside SRC, symlink loops, names that are not UTF-8,
two images with one key) raise :class:`SourceError`, or with ``skip_bad`` are skipped and counted
by reason.  Every listing, stat and path comparison is the storage's
(:class:`~shardpack.storage.folders.Folders`): links and special files are what a local scan
reports, an object store has none.
"""

from __future__ import annotations

from typing import Iterator

from shardpack.core.errors import SKIP_BAD, SourceError, option_hint
from shardpack.format import MANIFEST_NAME, STATE_NAME, check_field_name
from shardpack.images.content import IMAGE_EXTENSIONS
from shardpack.storage import within
from shardpack.write.grouping import group_images, group_webdataset
from shardpack.write.samples import SourceField, SourceSample

# a folder holding one of these is a shardpack dataset (or one a pack is writing or failed to
# finish): never walked.  The manifest first: on object stores only it is looked for at the top
DATASET_MARKERS = (MANIFEST_NAME, STATE_NAME)
BAD_HINT = f"fix or remove it, or pass {SKIP_BAD} to skip and count such entries"


class FolderWalk:
    """The folder walk of :class:`~shardpack.write.packsource.PackSource` (a base class: it
    uses the source's ``storage``, ``src``, ``root`` (SRC's real path), ``report``, ``skip_bad``,
    ``follow_links``, ``reader`` (the files' field reader class) and ``_exclude`` (a folder left
    out of the walk: its real path or path on the store))."""

    PEEK_FOLDERS = 8  # folders holding files that _holds_images looks at, at most
    PEEK_LISTINGS = 256  # folder listings it reads at most (empty folders, links)

    def _bad(self, path: str, reason: str, kind: str, hint: str = BAD_HINT) -> None:
        self.report.bad(self.skip_bad, path, reason, kind, hint)

    def _detect(self, layout: str) -> str:
        """The layout, and for an ImageFolder its classes: the top-level folders, sorted by
        name, as torchvision's ``ImageFolder`` finds them (links to folders included), less
        hidden folders, a shardpack dataset and OUT (docs/packing.md, "Classes").  Files at the
        top of a class-folder tree (README.md, LICENSE, labels.txt) are no samples: left out,
        counted and named (``top-level-file``), as both torchvision and Hugging Face ignore
        them, when the folders hold images; a top level holding images is a flat dataset."""
        if self.storage.exists(MANIFEST_NAME):
            raise SourceError(f"source folder is a shardpack dataset (it holds {MANIFEST_NAME})",
                              path=self.src, hint="point SRC at the files to pack; `shardpack "
                                                  "unpack` turns a dataset back into files")
        folders, files, hidden = [], [], 0
        for name, path, is_dir, is_link in self.storage.entries(self.src):
            if name.startswith("."):
                hidden += 1
                if is_dir:
                    self.report.hidden_folders.append(name)
                continue
            if self._excluded(path):
                continue
            if not is_dir:
                files.append((name, path))
            elif self._top_link_ok(path, is_link) and not self._is_dataset_folder(path):
                folders.append(name)
        if not folders and not files:
            raise SourceError("source folder is empty", path=self.src,
                              hint="point SRC at a folder holding your files")
        if layout == "auto":
            classes = folders and (not files or not any(_is_image_name(n) for n, _ in files)
                                   and self._holds_images())
            layout = "imagefolder" if classes else "files"
        if layout == "imagefolder":
            self._top_files(folders, files)
            self.report.hidden += hidden  # the walk lists class folders, never the top
            self.report.classes = folders
        return layout

    def _top_files(self, folders: list[str], files: list[tuple[str, str]]) -> None:
        """The top level of a class-folder tree: its folders are the classes, its files are
        left out (never opened), each counted and named."""
        if not folders:
            raise SourceError(f"{option_hint('layout', 'imagefolder')} needs class folders at "
                              f"the top, found only files (e.g. {files[0][0]!r})", path=self.src,
                              hint=f"pass {option_hint('layout', 'files')} to pack them as a "
                                   "flat dataset")
        for _, path in files:
            self.report.leave_out(path, "a file at the top of a class-folder tree is no sample "
                                        "(torchvision's ImageFolder ignores it too)",
                                  "top-level-file")

    def _top_link_ok(self, path: str, is_link: bool) -> bool:
        """A top-level folder that is a link: one leading outside SRC is refused like any other
        outside link (a class made of files the user did not point at), or followed and counted
        with ``follow_links``.  The walk below checks deeper links itself (:meth:`_follow`)."""
        if not is_link:
            return True
        real = self.storage.real(path)
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
        level the walk finds the markers in the folder's own listing, :meth:`_list`)."""
        try:
            found = self.storage.marked(path, DATASET_MARKERS)
        except OSError:
            return False  # the walk reports a folder it cannot read
        if found:
            self._note_dataset(path)
        return found

    def _note_dataset(self, path: str) -> None:
        # the top-level check and the walk below may both meet one dataset folder: named once
        if path not in self.report.datasets:
            self.report.datasets.append(path)

    def _entries(self, folder: str) -> list[tuple[str, str, bool]]:
        """(name, path, is a folder) of a folder's entries, sorted; [] if it cannot be listed
        (the walk reports that)."""
        try:
            return [(n, p, d) for n, p, d, _ in self.storage.entries(folder)]
        except OSError:
            if folder == self.src:
                raise
            return []

    def _subfolders(self, folder: str) -> tuple[list[tuple[str, str]], int] | None:
        """(subfolders, entries listed) of a folder an engine's split may cut, or None when it
        must stay whole: it cannot be listed, or holds links or names the walk must judge
        itself (a link, a name that is not UTF-8) so that its one walk sees them."""
        try:
            entries = self.storage.entries(folder)
        except OSError:
            return None
        if any(link or not name.isascii() and not _utf8(name) for name, _, _, link in entries):
            return None
        return [(n, p) for n, p, is_dir, _ in entries if is_dir and not n.startswith(".")
                and not self._excluded(p)], len(entries)

    def _ancestors(self, folder: str, rel: str) -> set[str]:
        """Real paths of SRC and of every folder from it down to ``folder`` (symlink loops are
        told by them)."""
        ancestors, path = {self.root}, self.src
        for part in rel.split("/") if rel else ():
            path = f"{path}/{part}"
            ancestors.add(self.storage.real(path))
        return ancestors

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
            groups = group_images(files, prefix, self.reader, self.report, self._bad)
        else:
            groups = group_webdataset(files, self.reader)
        for stem, group in groups:
            sample = self._sample(prefix + stem, group, extra)
            if sample is not None:
                yield sample
        files = groups = None
        if not recurse:
            return
        for name, path in dirs:
            inner = ancestors | {self.storage.real(path)}
            yield from self._walk(path, prefix + name, inner, extra)

    def _list(self, folder: str, ancestors: set[str]):
        """(files, folders) of one folder, sorted: files as (stem, field, path, size, mtime_ns)
        with names checked, folders as (name, path).  Hidden and bad entries are counted or
        raised here.  None when the folder cannot be listed."""
        try:
            entries = self.storage.scan(folder, DATASET_MARKERS)
        except OSError as exc:
            self._bad(folder, f"cannot list folder: {exc.strerror or exc}", "unreadable")
            return None
        if entries is None:  # a shardpack dataset: left out whole, and named
            self._note_dataset(folder)
            return [], []
        files, dirs = [], []
        cut = _image_cut if self.report.group == "image" else _webdataset_cut
        field_ok, usable = self._field_ok, self._usable_name
        # this loop runs once per file of the dataset: a plain regular file takes the name
        # checks only
        for name, path, kind, size, mtime, real, problem in entries:
            if not usable(name, path):
                continue
            if kind != "file" or real is not None:
                kind = self._follow(path, kind, real, problem, ancestors)
                if kind == "dir":
                    self._folder(name, path, dirs)
                if kind != "file":
                    continue
            stem, fname = cut(name)
            why = field_ok.get(fname, True)
            if why is True:
                why = field_ok[fname] = check_field_name(fname)
            if why and (fname or cut is _webdataset_cut):
                self._bad(path, why, "bad-name")
                continue
            files.append((stem, fname, path, size, mtime))
        return files, dirs

    def _folder(self, name: str, path: str, dirs: list) -> None:
        """A folder of the walk goes into ``dirs``, unless it is OUT (inside SRC)."""
        if self._excluded(path):
            self.report.excluded = path
        else:
            dirs.append((name, path))

    def _follow(self, path: str, kind: str | None, real: str | None, problem,
                ancestors: set[str]) -> str | None:
        """'file' or 'dir' for a folder, a link or an entry stat refused, after the rules for
        links (outside SRC, loops) and special files; None after reporting a bad entry."""
        refused = refusal(kind, real, problem, self.root, self.follow_links)
        if refused is None and real is not None and kind == "dir" and real in ancestors:
            refused = "link-loop", f"symlink loop: links back to {real}, a folder it lies in"
        if refused is not None:
            self._bad(path, refused[1], refused[0])
            return None
        self.report.followed += real is not None and not within(real, self.root)
        return kind

    def _usable_name(self, name: str, path: str) -> bool:
        """Hidden names are counted, names that are not UTF-8 are bad entries."""
        if name[0] == ".":
            self.report.hidden += 1
            return False
        if not name.isascii() and not _utf8(name):
            self._bad(path, "file name is not valid UTF-8", "bad-name")
            return False
        return True

    def _holds_images(self) -> bool:
        """:meth:`_peek_images`, looked at once per source (the layout, the grouping and the
        no-image check all ask; on an object store each look is up to PEEK_LISTINGS
        requests)."""
        found = getattr(self, "_peeked", None)
        if found is None:
            found = self._peeked = self._peek_images()
        return found

    def _peek_images(self) -> bool:
        """Whether the tree holds images, judged from the first PEEK_FOLDERS folders (walk order)
        that hold files: an ImageFolder of images groups one sample per image, one of other files
        (audio, arrays) keeps WebDataset grouping.  A folder of only junk (Thumbs.db) does not
        decide it; a few listings are read, not the tree.  Links to folders are looked into (a
        tree of class folders that are links is common), each real folder once (no loops)."""
        looked, listed, stack, seen = 0, 0, [self.src], set()
        while stack and listed < self.PEEK_LISTINGS:
            folder = stack.pop()
            real = self.storage.real(folder)
            if real in seen:
                continue
            seen.add(real)
            entries = self._entries(folder)
            listed += 1
            names = [n for n, _, is_dir in entries if not is_dir and not n.startswith(".")]
            if any(_is_image_name(n) for n in names):
                return True
            looked += bool(names)
            if looked >= self.PEEK_FOLDERS:
                return False
            stack += [p for n, p, is_dir in reversed(entries)
                      if is_dir and not n.startswith(".") and not self._excluded(p)]
        return False

    def _excluded(self, path: str) -> bool:
        return self._exclude is not None and within(self.storage.real(path), self._exclude)

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


def refusal(kind: str | None, real: str | None, problem: tuple[str, str] | None, root: str,
            follow_links: bool, folders: bool = True) -> tuple[str, str] | None:
    """Pack's rule for one entry a storage's scan reports (or a converter's source file,
    shardpack/interop/sources/base.py): (bad-entry kind, reason) when it must not be read, else
    None.  Refused: a link leading outside ``root`` (SRC's real path) without
    ``follow_links``, an entry stat refused, a special file, a folder unless ``folders``.

    Args:
        kind: 'file', 'dir', a special file's kind, or None (``problem`` says why).
        real: its real path when a link is on the way, else None.
        problem: (bad-entry kind, reason) of an entry that cannot be told, or None.
        root: the real path of SRC.
        follow_links: whether links leading outside SRC are read.
        folders: whether a folder is wanted here (the walk) or a file only (a converter).
    """
    if real is not None and not follow_links and not within(real, root):
        return "link-outside", f"symlink points outside the source ({real})"
    if problem is not None:
        return problem
    if kind == "file" or (kind == "dir" and folders):
        return None
    what = "folder" if kind == "dir" else kind
    return "special", f"is a {what}, not a regular file (never opened)"


def _image_cut(name: str) -> tuple[str, str]:
    """(stem, field) of a file name, cut at the last dot (group "image"): no extension, or a
    name like "jpg", is no image (field "")."""
    stem, dot, fname = name.rpartition(".")
    return (stem, fname) if dot and stem else (name, "")


def _webdataset_cut(name: str) -> tuple[str, str]:
    """(stem, field) of a file name, cut at the first dot (group "webdataset")."""
    stem, _, fname = name.partition(".")
    return stem, fname


def _is_image_name(name: str) -> bool:
    return name.rpartition(".")[2].lower() in IMAGE_EXTENSIONS


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False

