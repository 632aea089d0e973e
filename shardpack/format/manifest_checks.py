"""The manifest's checks: every value :func:`~shardpack.format.manifest.decode_manifest` types is
checked here first, so a manifest that decodes holds only values its readers expect
(docs/format.md, "Manifest")."""

from __future__ import annotations

import json

from shardpack.core.errors import FormatError, VersionError

from .codecs import SHARD_FORMATS, SHARD_SUFFIXES, codec_for
from .index import MIN_INDEX_BYTES
from .names import (
    COMPRESSIONS, HASH_NAME, MANIFEST_FORMAT, READ_VERSIONS, SKIPS_NAME, index_name, shard_stem,
    unsafe_name_reason,
)

SHARD_KEYS = ("name", "index", "samples", "bytes", "hash", "index_bytes", "index_hash")
MAX_COUNT = 1 << 53  # counts and byte sizes a manifest may state (exact as JSON numbers anywhere)


def check_manifest(manifest: dict, path: str | None) -> None:
    """Raise :class:`FormatError` or :class:`VersionError` unless ``manifest`` is a manifest
    this release reads: known codes, well-formed shard entries in order, and values of the
    right types.

    Args:
        manifest: the decoded JSON value.
        path: the manifest file, for errors.
    """
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise FormatError(f"not a shardpack manifest (no \"format\": \"{MANIFEST_FORMAT}\")",
                          path=path)
    _check_manifest_codes(manifest, path)
    shards = manifest.get("shards")
    if not isinstance(shards, list) or any(
            not isinstance(s, dict) or any(k not in s for k in SHARD_KEYS) for s in shards):
        raise FormatError(f"manifest shards must be a list of objects with {SHARD_KEYS}",
                          path=path)
    seen: set = set()
    for number, s in enumerate(shards):
        _check_shard_entry(number, s, manifest["shard_format"], seen, path)
    if sum(s["samples"] for s in shards) >= MAX_COUNT:
        raise FormatError("manifest shards hold more samples than any dataset can", path=path)
    _check_manifest_values(manifest, path)


def parse_manifest(data: bytes, path: str | None):
    """The JSON value of a manifest file, with a key written twice in one object refused.

    Args:
        data: the file's bytes.
        path: the manifest file, for errors.
    """
    try:
        manifest = json.loads(data, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise FormatError(f"manifest writes the key {exc.key!r} twice in one object (a JSON "
                          "reader would keep either copy)", path=path) from None
    except (ValueError, RecursionError) as exc:  # ValueError: bad JSON, UTF-8, huge integers
        what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise FormatError(f"manifest is not valid JSON: {what}", path=path) from None
    return manifest


def _check_manifest_codes(manifest: dict, path: str | None) -> None:
    """Version, shard format, compression and hash: values this reader knows."""
    version = manifest.get("version")
    if not is_int(version) or version not in READ_VERSIONS:  # 2.0 == 2, True == 1: refused
        raise VersionError(f"unsupported manifest version: expected one of {READ_VERSIONS}, "
                           f"found {version!r}", path=path, hint="upgrade shardpack to read it")
    if manifest.get("shard_format") not in SHARD_FORMATS:
        raise VersionError(f"unknown shard format: expected one of {SHARD_FORMATS}, found "
                           f"{manifest.get('shard_format')!r}", path=path)
    if manifest.get("compression") not in COMPRESSIONS:
        raise VersionError(f"unknown compression: expected one of {COMPRESSIONS}, found "
                           f"{manifest.get('compression')!r}", path=path)
    if manifest.get("hash") != HASH_NAME:
        raise VersionError(f"unknown hash: expected {HASH_NAME!r}, found "
                           f"{manifest.get('hash')!r}", path=path)


def _check_shard_entry(number: int, s: dict, shard_format: str, seen: set,
                       path: str | None) -> None:
    """Shard entry ``number``: safe file names not used before (``seen``, updated), the names
    of shard ``number``, counts and hashes of the right types."""
    for name in (s["name"], s["index"]):
        if not isinstance(name, str) or "/" in name or "\x00" in name or \
                name in ("", ".", ".."):
            raise FormatError(f"manifest names an unsafe shard file {name!r}", path=path)
        if name in seen:
            raise FormatError(f"manifest names the file {name!r} twice", path=path)
        seen.add(name)
    # entry N is shard N: a swapped or reordered entry (each still matching its own file)
    # would change which samples have which position.  The suffix is compared with
    # shard_format by verify and by the index (which records the shard's format).
    expected = codec_for(shard_format).shard_name(number)
    stem = shard_stem(number)
    if s["name"] not in (stem + suffix for suffix in SHARD_SUFFIXES) or \
            s["index"] != index_name(number):
        raise FormatError(f"manifest shard entry {number} names {s['name']!r} and "
                          f"{s['index']!r}, expected {expected!r} and "
                          f"{index_name(number)!r} (entries are numbered in order)"[:300],
                          path=path)
    for key in ("samples", "bytes", "index_bytes"):
        if not is_count(s[key]):
            raise FormatError(f"manifest shard {number} ({s['name']}): {key!r} must be a "
                              f"non-negative integer, found {s[key]!r}", path=path)
    # every sample costs at least MIN_INDEX_BYTES of its index: a count the index cannot
    # hold is refused before anything is sized by it
    if s["samples"] * MIN_INDEX_BYTES > s["index_bytes"]:
        raise FormatError(f"manifest shard {number} ({s['name']}) claims {s['samples']:,} "
                          f"samples, more than its {s['index_bytes']:,}-byte index can hold",
                          path=path)
    for key in ("hash", "index_hash"):
        if not isinstance(s[key], str) or len(s[key]) != 32 or \
                s[key].strip("0123456789abcdef"):
            raise FormatError(f"manifest shard {number} ({s['name']}): {key!r} must be 32 "
                              f"hex digits", path=path)


def _check_manifest_values(manifest: dict, path: str | None) -> None:
    """The top-level values besides the shards: counts, fields, classes, notes, layout, and
    the optional ``part`` and ``merged_from``."""
    for key in ("num_samples", "num_shards", "num_bytes"):
        if key in manifest and not is_count(manifest[key]):
            raise FormatError(f"manifest {key!r} must be a non-negative integer, found "
                              f"{manifest[key]!r}", path=path)
    fields = manifest.get("fields")
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise FormatError("manifest 'fields' must be a list of field names", path=path)
    classes = manifest.get("classes")
    if classes is not None and (not isinstance(classes, list)
                                or not all(isinstance(c, str) for c in classes)):
        raise FormatError("manifest 'classes' must be null or a list of names", path=path)
    _check_notes(manifest, path)
    _check_layout(manifest, path)
    part = manifest.get("part")  # pack --part I/N (optional key)
    if part is not None and not (isinstance(part, dict) and is_count(part.get("index"))
                                 and is_count(part.get("count"))
                                 and part["index"] < part["count"]):
        raise FormatError(f"manifest 'part' must be null or {{\"index\": I, \"count\": N}} "
                          f"with 0 <= I < N, found {part!r}"[:300], path=path)
    merged = manifest.get("merged_from")  # shardpack merge (optional key)
    if merged is not None and not (is_count(merged) and merged >= 1):
        raise FormatError(f"manifest 'merged_from' must be a positive integer, found "
                          f"{merged!r}"[:300], path=path)


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list) -> dict:
    """``json.loads`` object hook: a key written twice in one object is refused (plain
    ``json.loads`` keeps the last copy, other readers may keep the first)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


CONVERTED_LAYOUTS = ("webdataset", "mds", "litdata", "parquet")  # convert --from: layout = from
PACK_LAYOUTS = ("imagefolder", "files", "listing")                # pack's walk or listing


def _check_notes(manifest: dict, path: str | None) -> None:
    """The informational keys, when present: ``hidden``/``ignored`` counts, ``skipped`` counts
    by reason, ``preprocessing`` null or ``{"resize": N, "quality": Q, "pixels": F}`` (each
    part optional)."""
    for key in ("hidden", "ignored"):
        if key in manifest and not is_count(manifest[key]):
            raise FormatError(f"manifest {key!r} must be a non-negative integer, found "
                              f"{manifest[key]!r}"[:300], path=path)
    if "skipped" in manifest:
        skipped = manifest["skipped"]
        if not isinstance(skipped, dict) or not all(is_count(v) for v in skipped.values()):
            raise FormatError(f"manifest 'skipped' must map reasons to non-negative integers, "
                              f"found {skipped!r}"[:300], path=path)
    report = manifest.get("skip_report")
    if report is not None and not (isinstance(report, dict) and report.get("name") == SKIPS_NAME
                                   and is_count(report.get("entries"))
                                   and is_count(report.get("bytes"))):
        raise FormatError(f"manifest 'skip_report' must be null or {{\"name\": "
                          f"\"{SKIPS_NAME}\", \"entries\": N, \"bytes\": B}}, found "
                          f"{report!r}"[:300], path=path)
    pre = manifest.get("preprocessing")
    if pre is not None and not _is_preprocessing(pre):
        raise FormatError(f"manifest 'preprocessing' must be null or {{\"resize\": N, "
                          f"\"quality\": Q, \"pixels\": \"raw\" or \"auto:B\"}} (each part "
                          f"optional; integers, N > 0), found {pre!r}"[:300], path=path)


def _is_preprocessing(pre) -> bool:
    """``{"resize": N, "quality": Q}`` (both or neither) and ``"pixels"`` (``raw``, ``auto:B``),
    at least one of them."""
    if not isinstance(pre, dict) or not pre or set(pre) - {"resize", "quality", "pixels"}:
        return False
    if ("resize" in pre) != ("quality" in pre):
        return False
    if "resize" in pre and not (is_count(pre["resize"]) and pre["resize"] > 0
                                and is_count(pre["quality"])):
        return False
    pixels = pre.get("pixels", "raw")
    return isinstance(pixels, str) and (pixels == "raw" or (
        pixels.startswith("auto:") and pixels[5:].isdigit()))


def _check_layout(manifest: dict, path: str | None) -> None:
    """What the layout implies, as pack, convert and merge write it (docs/format.md):

    * ``imagefolder``: ``classes`` a list of distinct folder names (non-empty, no '/', not '.' or
      '..'); ``verify`` checks each sample's ``cls`` and key against them;
    * ``files``, ``listing``: no class list (pack's walk has no classes there);
    * ``group`` only with ``imagefolder`` and ``files`` (how the walk grouped files);
    * a ``source`` record (convert) names the layout: ``source.from`` is the layout, one of
      :data:`CONVERTED_LAYOUTS`.

    An unknown layout is left to ``verify``: a later release may add one."""
    layout = manifest.get("layout")
    classes = manifest.get("classes")
    where = f"manifest layout {layout!r}"
    if isinstance(classes, list) and len(set(classes)) != len(classes):
        seen: set = set()
        twice = next(c for c in classes if c in seen or seen.add(c))
        raise FormatError(f"manifest 'classes' lists {twice!r} twice: class names must be "
                          "distinct"[:300], path=path)
    source = manifest.get("source")
    if source is not None:
        if not isinstance(source, dict):
            raise FormatError(f"manifest 'source' must be an object, found {source!r}"[:300],
                              path=path)
        origin = source.get("from")
        if origin is not None and (origin not in CONVERTED_LAYOUTS or origin != layout):
            raise FormatError(f"manifest 'source' says converted from {origin!r}, so layout "
                              f"must be {origin!r}, found {layout!r}"[:300], path=path)
    if layout not in PACK_LAYOUTS + CONVERTED_LAYOUTS:  # unknown or missing: verify names it
        return
    if manifest.get("group") is not None and layout not in ("imagefolder", "files"):
        raise FormatError(f"{where} has no file grouping: 'group' must be null, found "
                          f"{manifest['group']!r}"[:300], path=path)
    if layout == "files" and classes is not None:  # a listing's label column has classes
        raise FormatError(f"{where} has no class folders: 'classes' must be null, found a list "
                          f"of {len(classes)}"[:300], path=path)
    if layout != "imagefolder":
        return
    if not classes:
        raise FormatError(f"{where} needs the class folder names: 'classes' must be a "
                          f"non-empty list, found {classes!r}"[:300], path=path)
    for number, name in enumerate(classes):
        why = unsafe_name_reason(name) or ("has a '/'" if "/" in name else None)
        if why:
            raise FormatError(f"manifest classes[{number}] {name!r} cannot be a class folder "
                              f"name: {why}"[:300], path=path)


def is_int(value) -> bool:
    """Whether ``value`` is a JSON integer (not a bool).

    Args:
        value: a decoded JSON value.
    """
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value) -> bool:
    """Whether ``value`` is a count or byte size a manifest may state: an integer (not a bool)
    in ``0 <= value < MAX_COUNT``.

    Args:
        value: a decoded JSON value.
    """
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_COUNT
