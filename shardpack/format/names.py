"""Names and version codes of the format: file names of a dataset, the key entry, and the rules
for keys and field names that every command shares (pack's walk and listings, the converters,
``unpack``, ``export`` and ``verify``)."""

from __future__ import annotations

FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)  # version 1: dense per-shard field table in the index (docs/format.md)
MANIFEST_NAME = "shardpack.json"
STATE_NAME = ".shardpack-pack.json"  # options of a pack in progress (or failed); removed at commit
SKIPS_NAME = "skipped.jsonl"  # the skip report (shardpack/write/skips.py), when a pack skipped any
MANIFEST_FORMAT = "shardpack"
HASH_NAME = "xxh3-128"
COMPRESSIONS = ("none", "zstd")
INDEX_SUFFIX = ".idx"
KEY_FIELD = "__key__"


def shard_stem(number: int) -> str:
    """The file name of shard ``number`` without its suffix: ``shard-NNNNN``.

    Args:
        number: the shard's position in the manifest.
    """
    return f"shard-{number:05d}"


def index_name(number: int) -> str:
    """The file name of shard ``number``'s index: ``shard-NNNNN.idx``.

    Args:
        number: the shard's position in the manifest.
    """
    return f"{shard_stem(number)}{INDEX_SUFFIX}"


def split_name(basename: str) -> tuple[str, str]:
    """``"0001.seg.png"`` -> ``("0001", "seg.png")``: the WebDataset rule, key up to the first
    dot.

    Args:
        basename: a file name without folders.
    """
    stem, dot, field = basename.partition(".")
    return stem, field


def check_field_name(field: str) -> str | None:
    """Return why ``field`` cannot be a field name, or None when it can: the one rule of the
    walk, listings, converters and ``verify``.  Refused: empty; names starting with '__' (the
    reader's own entries ``__key__``, ``__index__``, ... and any ``__*__``); '/' or NUL (a
    field is the end of a file name); '..' (never half of a path step).

    Args:
        field: the field name to judge.
    """
    if not field:
        return "has no extension, so it has no field name"
    return reserved_field_reason(field) or (
        f"field name {field!r} contains '..'" if ".." in field else None)


def reserved_field_reason(field: str) -> str | None:
    """Why a non-empty field name can never be in an index, or None.  No release wrote these
    names, so readers refuse an index that has one (a field ``__key__`` would replace the
    sample's key in every sample dict); '..' is refused when packing and by ``verify`` only, as
    datasets packed before that rule may hold it.

    Args:
        field: the field name to judge.
    """
    if field == KEY_FIELD or field.startswith("__"):
        return f"field name {field!r} is reserved (names starting with '__')"
    if "/" in field or "\x00" in field:
        return f"field name {field!r} contains '/' or NUL"
    return None


def unsafe_name_reason(name: str) -> str | None:
    """Why a member or key name must not become a path under an output folder, or None.
    Refused: absolute names, empty, '.' or '..' components (so '//' and a trailing '/'), NUL,
    and bytes that are not UTF-8 (an index key is decoded with surrogate escapes: keys are UTF-8
    text, and a tar or Parquet export could not write one).  The one key rule of pack's listings,
    the converters, ``unpack``, ``export`` and ``verify``.  A newline is allowed: a file name
    may hold one, pack keeps it and unpack writes it back (``ls`` prints it escaped).

    Args:
        name: the key or member name to judge.
    """
    if not name:
        return "empty name"
    if name.startswith("/"):
        return "absolute name"
    if "\x00" in name:
        return "name contains NUL"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "name has an empty, '.' or '..' component"
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            return "name is not valid UTF-8"
    return None


def shown_name(name: str, limit: int = 120) -> str:
    """``name`` for a message: a key thousands of characters long is cut in the middle.

    Args:
        name: the key, field or member name to show.
        limit: names up to this many characters are shown whole.
    """
    if len(name) <= limit:
        return name
    return f"{name[:limit // 2]}...({len(name)} characters)...{name[-limit // 4:]}"
