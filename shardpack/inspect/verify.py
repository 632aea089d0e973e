"""``shardpack verify``: re-hash every shard and index and check every record.

A flipped byte anywhere changes the shard's xxh3-128 (caught against the manifest) and the xxh3-64
of the sample holding it (caught against the index), so the report names the sample.  Structure is
checked too: tar headers must name ``key.field`` with the indexed size and be regular files;
msgpack records must pass CRC32C, decompress to the indexed size and unpack to the indexed fields.
Keys and field names are held to the rules of the commands that use them: a key ``unpack`` or
``export`` would refuse (:func:`shardpack.format.unsafe_name_reason`) and a field name ``pack``
would refuse (:func:`shardpack.format.check_field_name`) are problems here too, by the same
functions.
``decode=True`` (``verify --decode``) also decodes every image field in full
(:func:`shardpack.images.content.check_image_full`), so a broken image packed with ``--check none``
(or by
an older release) is named too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Sequence

from shardpack import format as fmt
from shardpack.core.deprecation import keyword_only, renamed
from shardpack.core.errors import FormatError, ShardpackError
from shardpack.inspect import chunked
from shardpack.read.reader import DatasetReader, record_payload
from shardpack.write.skips import read_skips


@dataclass(frozen=True)
class Problem:
    """One problem ``verify`` found: the file it is in, what is wrong, and the sample's key
    where one sample is at fault."""

    path: str
    reason: str
    key: str | None = None

    def __str__(self) -> str:
        where = f"{self.path}: sample {self.key!r}" if self.key is not None else self.path
        return f"{where}: {self.reason}"


@dataclass
class VerifyReport:
    """What ``verify`` checked (shards, samples, bytes) and every problem it found; the rest
    is what the indexes and shards say, gathered for the manifest's check."""

    shards: int = 0
    samples: int = 0
    bytes: int = 0
    problems: list = None
    # what the indexes and shards say, for the manifest's check
    indexes_read: int = 0
    fields: set = dataclass_field(default_factory=set)
    writer_skips: int = 0
    max_cls: int | None = None
    # ImageFolder: (cls, class folder of the key) -> [shard path, first key, samples] for each
    # sample whose key's folder is not classes[cls]
    misfiled: dict = dataclass_field(default_factory=dict)
    versions: set = dataclass_field(default_factory=set)

    @property
    def ok(self) -> bool:
        """Whether no problem was found."""
        return not self.problems


@renamed(url="dataset")
@keyword_only("storage_options", "progress", "decode")
def verify(dataset, *, storage_options: dict | None = None, progress: bool = False,
           decode: bool = False) -> VerifyReport:
    """Check the dataset at ``dataset``: every shard and index against the manifest, every
    sample against its index, and the manifest against what the indexes hold.

    Args:
        dataset: the dataset's folder or URL (``url=`` is the deprecated spelling).
        storage_options: fsspec options for a remote dataset.
        progress: show a progress bar over the shards.
        decode: also decode every image field in full.
    """
    reader = DatasetReader(dataset, storage_options=storage_options)
    report = VerifyReport(problems=[])
    shards = range(len(reader.shards))
    if progress:
        from tqdm import tqdm

        shards = tqdm(shards, unit="shard", desc="verifying")
    for number in shards:
        report.shards += 1
        report.problems += _verify_shard(reader, number, report, decode)
    report.problems += _verify_manifest(reader, report)
    return report


LAYOUTS = fmt.PACK_LAYOUTS + fmt.CONVERTED_LAYOUTS
# keys every pack and merge has written since the first release (optional ones: docs/format.md)
WRITTEN = ("classes", "layout", "skipped", "hidden", "preprocessing")


def _verify_manifest(reader: DatasetReader, report: VerifyReport) -> list[Problem]:
    """The manifest's totals and descriptions against what the indexes and shards hold: each
    difference is named (docs/format.md lists the keys)."""
    m, where = reader.manifest, reader.storage.display(fmt.MANIFEST_NAME)
    out = _manifest_totals(m, reader.shards, report, where)
    out += _verify_skip_report(reader, where)
    for key in WRITTEN:  # pack and merge write these; decode_manifest checks their values
        if key not in m.raw:
            out.append(Problem(where, f"the {key!r} key is missing (pack and merge always "
                                      "write it)"))
    if m.layout not in LAYOUTS:
        out.append(Problem(where, f"layout is {m.layout!r}, expected one of {LAYOUTS}"))
    if m.group not in (None, "image", "webdataset"):
        out.append(Problem(where, f"group is {m.group!r}, expected null, 'image' or "
                                  "'webdataset'"))
    # derivable for ImageFolder packs only (a converted label may lie outside its class list,
    # and decode_manifest allows a class list with no other layout)
    if m.layout == "imagefolder" and m.classes is not None:
        out += _class_problems(m, len(reader.shards), report, where)
    return out


def _manifest_totals(m: fmt.Manifest, shards, report: VerifyReport,
                     where: str) -> list[Problem]:
    """The manifest's counts, version, fields and skip counts against the shard entries and
    the indexes."""
    out = []

    def differs(what: str, found, derived, how: str) -> None:
        if found != derived:
            out.append(Problem(where, f"{what} is {found!r}, but {how} give {derived!r}"))

    differs("num_samples", m.num_samples, sum(s.samples for s in shards),
            "the shard entries")
    differs("num_shards", m.num_shards, len(shards), "the shard entries")
    differs("num_bytes", m.num_bytes, sum(s.bytes for s in shards),
            "the shard entries")
    if report.versions and m.version not in report.versions:
        out.append(Problem(where, f"version is {m.version!r}, but the indexes are "
                                  f"version {sorted(report.versions)}"))
    if report.indexes_read == len(shards):  # the indexes' own view, where all were readable
        differs("fields", list(m.fields), sorted(report.fields), "the indexes")
        skipped = m.skipped or {}  # decode_manifest checked its counts
        if sum(skipped.values()) < report.writer_skips:
            out.append(Problem(where, f"skipped counts {sum(skipped.values())} entries, but "
                                      f"the indexes record {report.writer_skips} skipped by "
                                      "the shard writers"))
    return out


def _class_problems(m: fmt.Manifest, shards: int, report: VerifyReport,
                    where: str) -> list[Problem]:
    """An ImageFolder pack's classes against the samples' ``cls`` labels and class folders."""
    out, classes = [], m.classes
    if report.indexes_read == shards and report.samples and "cls" not in report.fields:
        out.append(Problem(where, "layout is 'imagefolder', but no sample has a 'cls' "
                                  "field (pack gives every sample of a class folder one)"))
    if report.max_cls is not None and report.max_cls >= len(classes):
        out.append(Problem(where, f"{len(classes)} classes, but a sample has cls "
                                  f"{report.max_cls}"))
    for (cls, folder), (path, key, count) in report.misfiled.items():
        more = f" (and {count - 1:,} more samples like it)" if count > 1 else ""
        out.append(Problem(path, f"the manifest's classes[{cls}] is {classes[cls]!r}, but "
                                 f"this sample with cls {cls} is in class folder "
                                 f"{folder!r}{more}", key))
    return out


def _verify_skip_report(reader: DatasetReader, where: str) -> list[Problem]:
    """The skip report names every skip the manifest counts, each with a reason that the
    counts know: as many lines of each reason as ``skipped`` says, and the recorded size."""
    record = reader.manifest.skip_report
    if record is None:
        return []
    path = reader.storage.display(record["name"])
    try:
        size = reader.storage.size(record["name"])
        if size != record["bytes"]:
            return [Problem(path, f"the skip report has {size:,} bytes, the manifest records "
                                  f"{record['bytes']:,}")]
        rows = read_skips(reader.storage, record)
    except FileNotFoundError:
        return [Problem(path, "the skip report the manifest names is missing")]
    except (ValueError, ShardpackError) as exc:
        return [Problem(path, f"the skip report cannot be read: {str(exc)[:200]}")]
    found = Counter(r.get("reason") if isinstance(r, dict) else None for r in rows)
    counted = dict(reader.manifest.skipped or {})
    if len(rows) != record["entries"] or dict(found) != counted:
        return [Problem(path, f"the skip report names {len(rows):,} skips "
                              f"({dict(sorted(found.items(), key=str))}), the manifest counts "
                              f"{record['entries']:,} ({counted})")]
    return []


def _verify_shard(reader: DatasetReader, number: int, report: VerifyReport,
                  decode: bool = False) -> list[Problem]:
    entry = reader.shards[number]
    path = reader.shard_path(number)
    try:
        index = reader.index(number)
    except ShardpackError as exc:
        return [Problem(reader.storage.display(entry.index), exc.message)]
    report.indexes_read += 1
    report.versions.add(index.version)
    report.fields.update(index.fields)
    report.writer_skips += index.skipped
    problems_here = _index_against_manifest(reader.manifest, entry, index, path)
    if problems_here:
        return problems_here
    # field names the walk would refuse (the index decoder already refused the reserved ones)
    named = [Problem(path, f"{why} (pack would refuse it)")
             for why in map(fmt.check_field_name, index.fields) if why]
    if entry.bytes > chunked.WHOLE_SHARD:
        return named + _verify_in_chunks(reader, number, index, report, decode)
    try:
        data = reader.read_shard(number, exact=False)
    except ShardpackError as exc:
        return [Problem(path, exc.message)]
    report.bytes += len(data)
    problems = _shard_file_problems(entry, index, data, path)
    # keys unpack would refuse, undecodable images: reported after the structural checks
    found, others = _sample_problems(reader.manifest, index, data, path, report, decode)
    problems += found
    why = None if problems else index.codec.file_tail_problem(data, int(index.starts[-1]))
    if why:
        problems.append(Problem(path, why))
    return named + problems + others


def _verify_in_chunks(reader: DatasetReader, number: int, index: fmt.ShardIndex,
                      report: VerifyReport, decode: bool) -> list[Problem]:
    """:func:`_verify_shard` of a shard over :data:`~shardpack.inspect.chunked.WHOLE_SHARD`
    bytes: the same checks in one pass of ranged reads (:mod:`shardpack.inspect.chunked`)."""
    entry, path = reader.shards[number], reader.shard_path(number)
    try:
        size = reader.storage.size(entry.name)
    except ShardpackError as exc:
        return [Problem(path, exc.message)]
    report.bytes += size
    chunks = chunked.ShardChunks(reader.storage, entry.name, size)
    checks = _Checks(reader.manifest, index, path, report, decode, size)
    if size != entry.bytes:
        checks.problems.append(Problem(path, f"shard is {size} bytes, the manifest says "
                                             f"{entry.bytes} (truncated or extended)"))
    try:
        try:
            index.codec.check_file_head(chunks.read(int(index.starts[0])))
        except FormatError as exc:
            checks.problems.append(Problem(path, exc.message))
        for row in range(index.num_samples):
            checks.record(row, chunks)
        # the tail is a few blocks in a shard of the size recorded; an extended one already
        # failed, and what it holds past the records (any length) is never read
        tail = chunks.rest() if size == entry.bytes else b""
    except ShardpackError as exc:
        return checks.problems + [Problem(path, exc.message)] + checks.others
    problems = checks.problems
    if size == entry.bytes and chunks.hasher.hexdigest() != entry.hash:
        problems.insert(0, Problem(path, "shard hash does not match the manifest"))
    why = None if problems else index.codec.file_tail_problem(tail, 0)
    if why:
        problems.append(Problem(path, why))
    return problems + checks.others


def _index_against_manifest(m: fmt.Manifest, entry: fmt.ShardEntry, index: fmt.ShardIndex,
                            path: str) -> list[Problem]:
    """Where the shard's index and its manifest entry disagree (format, compression, hash,
    the name's suffix)."""
    problems = []
    for what, found, indexed in (("shard_format", m.shard_format, index.shard_format),
                                 ("compression", m.compression, index.compression)):
        if found != indexed:
            problems.append(Problem(path, f"the manifest's {what} is {found!r}, this "
                                          f"shard's index says {indexed!r}"))
    if index.shard_hash.hex() != entry.hash:
        problems.append(Problem(path, "the manifest's hash of this shard differs from the "
                                      "one its index records"))
    if not entry.name.endswith(index.codec.suffix):
        problems.append(Problem(path, f"a {index.shard_format} shard named "
                                      f"{entry.name!r}"))
    return problems


def _shard_file_problems(entry: fmt.ShardEntry, index: fmt.ShardIndex, data: bytes,
                         path: str) -> list[Problem]:
    """The shard file's size and hash against the manifest; a msgpack shard's file header."""
    problems = []
    if len(data) != entry.bytes:
        problems.append(Problem(path, f"shard is {len(data)} bytes, the manifest says "
                                      f"{entry.bytes} (truncated or extended)"))
    elif fmt.content_hash(data) != entry.hash:
        problems.append(Problem(path, "shard hash does not match the manifest"))
    try:
        index.codec.check_file_head(data)
    except ShardpackError as exc:
        problems.append(Problem(path, exc.message))
    return problems


def _sample_problems(m: fmt.Manifest, index: fmt.ShardIndex, data: bytes, path: str,
                     report: VerifyReport, decode: bool) -> tuple[list[Problem], list[Problem]]:
    """(structural problems, other problems: keys unpack would refuse, undecodable images) of
    the shard's samples, each checked against its hash, its structure, and (``decode``) its
    images."""
    view = memoryview(data)
    checks = _Checks(m, index, path, report, decode, len(data))
    for row in range(index.num_samples):
        start, end = index.span(row)
        checks.record(row, view[start:end] if end <= len(data) else None)
    return checks.problems, checks.others


class _Checks:
    """The checks of each sample of one shard, given its record (or, for a record read in
    chunks, the shard's :class:`~shardpack.inspect.chunked.ShardChunks` positioned on it):
    structural problems and other ones (keys unpack would refuse, undecodable images)."""

    def __init__(self, m: fmt.Manifest, index: fmt.ShardIndex, path: str,
                 report: VerifyReport, decode: bool, shard_size: int):
        self.index, self.path, self.report, self.decode = index, path, report, decode
        self.shard_size = shard_size
        self.problems: list[Problem] = []
        self.others: list[Problem] = []
        # ImageFolder packs: each sample's cls against the classes and its key's class folder
        # (a list, even an empty one: [] must still be compared with the labels)
        self.classes = m.classes
        self.cls_column = ("cls" if "cls" in index.fields and m.classes is not None
                           and m.layout == "imagefolder" else None)

    def key_problems(self, row: int) -> None:
        """Count the sample; the same rule for its key as unpack and export (and pack's
        listings): a key they would refuse fails here, not half-way through an unpack."""
        self.report.samples += 1
        why = fmt.unsafe_name_reason(self.index.key(row))
        if why:
            self.others.append(Problem(self.path, f"key cannot be written out by unpack or "
                                                  f"export: {why}", self.index.key(row)))

    def record(self, row: int, record) -> None:
        """Check sample ``row``: ``record`` its bytes, or the chunks it is read from (None:
        the shard ends before it)."""
        index, path, key = self.index, self.path, self.index.key(row)
        self.key_problems(row)
        start, end = index.span(row)
        large = isinstance(record, chunked.ShardChunks)
        if record is None or large and end > record.size:
            self.problems.append(Problem(path, f"sample runs past the end of the shard ({end} "
                                               f"> {self.shard_size} bytes)", key))
            return
        if large and (end - start < chunked.WHOLE_RECORD or index.compression != "none"):
            record, large = record.read(end - start), False  # (zstd: capped by pack)
        got = chunked.read_large_record(index, row, record) if large else (
            fmt.sample_hash(record), None, record)
        if got is None or len(got[2]) != end - start:
            self.problems.append(Problem(path, "sample runs past the end of the shard", key))
            return
        if got[0] != int(index.sample_hashes[row]):
            self.problems.append(Problem(path, f"bytes {start}..{end} do not match the "
                                               "sample's hash in the index", key))
            return
        try:
            payload = (chunked.check_large_record(index, row, got[2], got[1], path) if large
                       else _check_structure(index, row, got[2], path))
        except ShardpackError as exc:
            self.problems.append(Problem(path, exc.message, key))
            return
        if self.decode:  # (a record read in chunks holds its fields under CHUNK only)
            held = chunked.CHUNK if large else None
            self.others += _check_images(index, row, payload, path, key, held)
        if self.cls_column is not None:
            why = _note_cls(index, row, payload, path, self.report, key,
                            self.classes)
            if why:
                self.problems.append(Problem(path, why, key))


def _note_cls(index: fmt.ShardIndex, row: int, payload, path: str, report, key: str,
              classes: Sequence[str]) -> str | None:
    """An ImageFolder sample's class label (ASCII decimal, written by pack from its class
    folder): keep the largest seen, to compare with the classes, and check that the
    key's first component (its class folder) is ``classes[cls]``.  Returns why the label itself
    is bad, or None."""
    for name, off, size in index.sample_fields(row):
        if name == "cls":
            raw = bytes(payload[off:off + size])
            if not raw.isdigit():  # ASCII digits only (bytes.isdigit)
                return f"field 'cls' holds {raw[:40]!r}, not a class number"
            value = int(raw)
            report.max_cls = value if report.max_cls is None else max(report.max_cls, value)
            if value < len(classes):
                folder = key.split("/", 1)[0]
                if folder != classes[value]:
                    seen = report.misfiled.setdefault((value, folder), [path, key, 0])
                    seen[2] += 1
            return None
    return None


def _check_images(index: fmt.ShardIndex, row: int, payload, path: str, key: str,
                  held: int | None = None) -> list[Problem]:
    """Image fields that do not decode in full (those under ``held`` bytes, where given)."""
    from shardpack.images.content import check_image_full, is_image_field

    out = []
    for name, off, size in index.sample_fields(row):
        if not is_image_field(name) or held is not None and size >= held:
            continue
        why = check_image_full(bytes(payload[off:off + size]), name)
        if why:
            out.append(Problem(path, f"field {name!r}: {why}", key))
    return out


def _check_structure(index: fmt.ShardIndex, row: int, record, path: str):
    """The record's payload and its own structure against the index (tar members, msgpack
    map), in full; raises :class:`~shardpack.core.errors.FormatError`; returns the payload."""
    payload = record_payload(index, row, record, path)
    index.codec.check_members(index, row, payload, whole=True)
    return payload
