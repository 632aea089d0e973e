"""Fault-campaign logic shared by the faults suite and tests/robustness/test_integrity.py (issue
16):
what one full read of a damaged dataset came back with (under a time limit), and the sweep of
systematic edits to a dataset's manifest, each checked with ``shardpack verify``."""

from __future__ import annotations

import json
import math
import signal
import time
from collections import namedtuple
from contextlib import contextmanager
from pathlib import Path

import shardpack
from shardpack import format as fmt
from shardpack.core.errors import ShardpackError
from shardpack.inspect.verify import LAYOUTS

READERS = ["iter", "map", "batched", "samples"]
KINDS = ("ok", "clear error", "silent", "other exception", "hang")


def read_shardpack(out, how: str, batch_size: int = 5):
    """Every (key, jpg bytes) through one reader: iteration, map-style, batched or per-sample
    ShardDataset."""
    if how == "iter":
        for s in shardpack.open_reader(out):
            yield s["__key__"], bytes(s["jpg"])
    elif how == "map":
        ds = shardpack.MapDataset(out)
        for i in range(len(ds)):
            s = ds[i]
            yield s["__key__"], bytes(s["jpg"])
    elif how == "batched":
        ds = shardpack.ShardDataset(out, batch_size=batch_size, batched=True, shuffle=False)
        for b in ds:
            yield from zip(list(b["__key__"]), (bytes(v) for v in b["jpg"].items()),
                           strict=True)
    else:
        for s in shardpack.ShardDataset(out, shuffle=False):
            yield s["__key__"], bytes(s["jpg"])


class Hang(BaseException):
    """Raised into a read that ran past its time limit (a BaseException, so that no reader's
    ``except Exception`` can swallow it)."""


@contextmanager
def time_limit(seconds: float | None):
    """Raise :class:`Hang` in this (main) thread after ``seconds``, by SIGALRM: a wait in
    Python code, ``time.sleep``, a lock or a blocking read is interrupted; C code that never
    returns to the interpreter is not (the bench's faulthandler backstop covers that).  Any
    timer already set (pytest-timeout's) is put back, less the time spent here."""
    if not seconds:
        yield
        return

    def on_alarm(signum, frame):
        raise Hang(f"no result after {seconds:g} s")

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    started = time.monotonic()
    old_timer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_timer:
            signal.setitimer(signal.ITIMER_REAL,
                             max(old_timer - (time.monotonic() - started), 1e-3))


Outcome = namedtuple("Outcome", "kind error")


def outcome(read, truth: dict, timeout: float | None = None) -> Outcome:
    """Run ``read()`` (an iterable of (key, bytes)) to the end against ``truth`` (key -> bytes).
    kind: 'silent' (a wrong or missing sample came back, whatever happened next), else 'ok',
    'clear error' (a ShardpackError), 'other exception' or 'hang' (past ``timeout`` seconds);
    error: the exception, if one ended the read."""
    got, error = [], None
    try:
        with time_limit(timeout):
            for key, data in read():
                got.append((key, data))
        kind = "ok"
    except Hang as exc:
        kind, error = "hang", exc
    except ShardpackError as exc:
        kind, error = "clear error", exc
    except Exception as exc:  # noqa: BLE001 - what a peer raises is whatever it raises
        kind, error = "other exception", exc
    if any(truth.get(k) != d for k, d in got) or \
            (kind == "ok" and sorted(k for k, _ in got) != sorted(truth)):
        kind = "silent"
    return Outcome(kind, error)


# ---------------------------------------------------------------------------------------------
# Manifest edits through verify
# ---------------------------------------------------------------------------------------------

Edit = namedtuple("Edit", "kind where change text no_effect")
"""kind: what was done (rows of the table); where: the manifest path ('shards[1].bytes');
change: old -> new, short; text: the edited file's bytes; no_effect: why verify has nothing to
check in it (the edit leaves nothing verify could or should refuse), or None."""

ENUMS = {"shard_format": fmt.SHARD_FORMATS, "compression": fmt.COMPRESSIONS,
         "layout": LAYOUTS,
         "group": (None, "image", "webdataset")}
OPTIONAL = ("group", "ignored", "source")  # docs/format.md: optional keys
WALK_COUNTS = ("hidden", "ignored")  # counts of the source walk: nothing else records them


def _short(value) -> str:
    text = json.dumps(value, allow_nan=True)
    return text if len(text) <= 40 else text[:37] + "..."


def _where(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _get(doc, path):
    for part in path:
        doc = doc[part]
    return doc


def _replaced(doc, path, value):
    """A deep copy of ``doc`` with the value at ``path`` replaced (``_DROP``: removed)."""
    doc = json.loads(json.dumps(doc))
    *parent, last = path
    holder = _get(doc, parent)
    if value is _DROP:
        del holder[last]
    else:
        holder[last] = value
    return doc


_DROP = object()


def _value_edits(path, value, manifest):
    """(kind, new value[, how, shown when the values are too long]) for one value: numbers,
    strings, lists, objects and nulls each get the edits of their type, then type changes."""
    key = next((p for p in reversed(path) if isinstance(p, str)), "")
    enums = ENUMS.get(key, ()) if len(path) == 1 else ()  # other valid values of a top key
    if isinstance(value, bool):
        yield "type: bool -> number", int(value)
    elif isinstance(value, int):
        yield from _int_edits(value)
    elif isinstance(value, str):
        yield from _str_edits(key, value, enums)
    elif value is None:
        yield from _null_edits(key, enums)
    elif isinstance(value, list):
        yield from _list_edits(key, value)
    elif isinstance(value, dict):
        yield from _dict_edits(key, value)
    if len(path) == 3 and path[0] == "shards":  # a shard entry's value: its neighbour's
        shards = manifest["shards"]
        other = shards[path[1] + 1 if path[1] + 1 < len(shards) else path[1] - 1][path[2]]
        if other != value:
            yield "shard entry: value of the neighbouring shard", other


def _int_edits(value: int):
    for kind, new in (("number +1", value + 1), ("number -1", value - 1),
                      ("number 0", 0), ("number negative", -abs(value) - 7),
                      ("number huge (2**64)", 2 ** 64), ("number as string", str(value)),
                      ("number as float (+0.5)", value + 0.5),
                      ("number as equal float", float(value)), ("number NaN", math.nan),
                      ("type: number -> bool", True), ("type: -> null", None),
                      ("type: -> list", [value])):
        if new != value or type(new) is not type(value):
            yield kind, new


def _str_edits(key: str, value: str, enums):
    if len(value) == 32 and not value.strip("0123456789abcdef"):  # a hash: one digit off
        yield "string: one character changed", value[:-1] + ("0" if value[-1] != "0" else "1")
    else:
        yield "string: one character changed", value[:-1] + chr(ord(value[-1]) ^ 1)
    yield "string: appended to", value + "x"
    yield "string emptied", ""
    if value.upper() != value:
        yield "string upper-cased", value.upper()
    yield "string: surrounding space", f" {value} "
    for other in enums:
        if other != value:
            yield "string: another valid value", other
    if key in ("name", "index"):
        yield "string: a path (../, /)", "../" + value
        yield "string: a path (../, /)", "/tmp/" + value
    yield "type: string -> number", 0
    yield "type: -> null", None
    yield "type: -> list", [value]


def _null_edits(key: str, enums):
    for other in enums:
        if other is not None:
            yield "string: another valid value", other
    valid = ({"resize": 64, "quality": 90} if key == "preprocessing"
             else ["c0", "c1"] if key == "classes" else None)
    for kind, new in (("null -> number", 0), ("null -> string", "x"),
                      ("null -> list", []), ("null -> object", {}),
                      ("null -> valid value", valid)):
        if new is not None:
            yield kind, new


def _list_edits(key: str, value: list):
    for i in range(len(value)):
        yield "list: element dropped", value[:i] + value[i + 1:], f"[{i}] dropped"
        yield "list: element duplicated", value[:i + 1] + value[i:], f"[{i}] duplicated"
    for i in range(len(value) - 1):
        swapped = list(value)
        swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
        yield ("list: shard entries swapped" if key == "shards"
               else "list: neighbours swapped"), swapped, f"[{i}] <-> [{i + 1}]"
    if len(value) > 2:
        yield "list: reversed", value[::-1], "reversed"
    if key in ("fields", "classes"):
        yield "list: element added", sorted(value + ["zz"])
        yield "list: element added", ["aa"] + value
    yield "list emptied", []
    yield "type: -> null", None
    yield "type: list -> object", {}
    yield "type: list -> string", ",".join(map(str, value)) if key != "shards" else "x"


def _dict_edits(key: str, value: dict):
    for k in sorted(value):
        yield f"key removed: {k}", {x: v for x, v in value.items() if x != k}
    yield "unknown key added", {**value, "zz_unknown": 1}
    if value:
        yield "object emptied", {}
    yield "type: -> null", None
    yield "type: object -> list", list(value.values())
    yield "type: object -> string", "x"
    if key == "skipped":
        yield "object: count added", {**value, "bad image": 3}


def _no_effect(kind, path, new, before: dict, after) -> str | None:
    """Why an edit leaves nothing verify could or should refuse; None when it should be refused.
    Decided by rule, before seeing what verify does."""
    top = path[0] if path else None
    if kind == "unknown key added":
        return ("an unknown key is ignored by design: keys are added without a version bump "
                "(`source` was)")
    if top in WALK_COUNTS and len(path) == 1 and fmt.is_count(new):
        return f"`{top}` counts files the source walk left out; nothing in the dataset records it"
    if top in OPTIONAL and new is _DROP:
        return "optional key (docs/format.md)"
    if top == "group" and new in ENUMS["group"]:
        return "how pack grouped files: another valid value; nothing in the shards records it"
    if top == "preprocessing" and (new is None or new == {"resize": 64, "quality": 90}):
        return "a note of pack's options, valid either way; nothing in the shards records it"
    skipped = after.get("skipped") if isinstance(after, dict) else None
    if top == "skipped" and isinstance(skipped, dict) and all(
            fmt.is_count(v) for v in skipped.values()) and \
            sum(skipped.values()) >= sum(before["skipped"].values()):
        return ("a count of entries skipped while walking the source; only the part the shard "
                "writers skipped is recorded (verify checks that part)")
    return None


def _text_edits(manifest, clean: bytes):
    """Edits of the file's text that keep its JSON content (the first five) or not."""
    same = "same JSON content, written differently"
    body = clean.decode()
    yield "text: compact (no whitespace)", json.dumps(manifest, sort_keys=True,
                                                      separators=(",", ":")).encode(), same
    yield "text: keys in reverse order", json.dumps(
        dict(reversed(list(manifest.items()))), indent=2).encode(), same
    yield "text: trailing blank lines", clean + b"\n\n  \n", same
    yield "text: UTF-8 byte order mark", b"\xef\xbb\xbf" + clean, same
    yield "text: key written twice, same value", \
        body.replace("{", '{\n "num_samples": %d,' % manifest["num_samples"], 1).encode(), same
    wrong = manifest["num_samples"] + 1
    yield "text: key written twice, first copy wrong", \
        body.replace("{", '{\n "num_samples": %d,' % wrong, 1).encode(), None
    yield "text: key written twice, last copy wrong", \
        body.rstrip().removesuffix("}").encode() + \
        b',\n "num_samples": %d\n}\n' % wrong, None
    yield "text: truncated", clean[:len(clean) // 2], None
    yield "text: not UTF-8", clean.replace(b'"shardpack"', b'"shard\xffpack"', 1), None


def manifest_edits(clean: bytes) -> list[Edit]:
    """Every edit of a valid manifest (``clean``: its file's bytes): each key and nested value
    gets the edits of its type, each key of each object is removed, plus text-level edits."""
    manifest = json.loads(clean)
    edits = [Edit(kind, "(file)", "", text, why) for kind, text, why in
             _text_edits(manifest, clean)]

    def walk(path, value):
        for kind, new, *how in _value_edits(path, value, manifest):
            where, change = path, f"{_short(value)} -> {_short(new)}"
            if how and len(change) > 60:
                change = how[0]
            if kind.startswith("key removed: "):  # named by the key it removes
                where = path + (kind.removeprefix("key removed: "),)
                kind, new, change = "key removed", _DROP, ""
            doc = _replaced(manifest, where, new) if where else new
            text = json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=False,
                              allow_nan=True).encode()
            edits.append(Edit(kind, _where(where) or "(manifest)", change if path else "",
                              text, _no_effect(kind, where, new, manifest, doc)))
        if isinstance(value, dict):
            for k in sorted(value):
                walk(path + (k,), value[k])
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(path + (i,), item)

    walk((), manifest)
    return edits


def verify_says(out) -> tuple[str, str]:
    """``shardpack verify -q OUT`` in process: ('refused', its first BAD line or its one error
    line), ('accepted', its OK line) or ('traceback', the exception or the odd output)."""
    from click.testing import CliRunner

    from shardpack.cli.main import main

    result = CliRunner().invoke(main, ["verify", "-q", str(out)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return "traceback", f"{type(result.exception).__name__}: {result.exception}"
    lines = result.output.splitlines()
    if result.exit_code == 0 and lines and lines[-1].startswith("OK"):
        return "accepted", lines[-1]
    bad = [ln for ln in lines if ln.startswith("BAD ")]
    errors = [ln for ln in lines if ln.startswith("shardpack: error: ")]
    if (result.exit_code == 1 and bad) or (result.exit_code == 2 and len(errors) == 1
                                           and len(lines) == 1):
        return "refused", (bad or errors)[0]
    return "traceback", f"exit {result.exit_code}: {result.output[-300:]!r}"


Swept = namedtuple("Swept", "edit result said")


def sweep(out: Path, edits: list[Edit]) -> list[Swept]:
    """Each edit written to OUT's manifest in turn and verified; the manifest is put back.
    result: 'refused', 'accepted', 'no effect' (accepted, and ``edit.no_effect`` says why
    nothing was to be refused) or 'traceback'."""
    path = Path(out) / fmt.MANIFEST_NAME
    clean = path.read_bytes()
    assert verify_says(out)[0] == "accepted", verify_says(out)
    done = []
    try:
        for edit in edits:
            path.write_bytes(edit.text)
            result, said = verify_says(out)
            if result == "accepted" and edit.no_effect:
                result = "no effect"
            done.append(Swept(edit, result, said))
    finally:
        path.write_bytes(clean)
    return done
