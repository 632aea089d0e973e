"""The faults suite's crafted-datasets family: a FIFO, a folder or
/dev/zero in place of a dataset's files, keys and field names no pack writes, labels outside
int64, resume states that cannot belong to the dataset, and image bombs.  Each function returns a
list of :class:`.run.Try`, whose ``fn`` runs in a forked child (run.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import shardpack
from shardpack import ShardpackError

from benchmarks.common import ROOT

from .local import epoch_items
from .run import Try, call, clear, cli, other, read_epochs


# -- crafted datasets: not regular files ------------------------------------------------------

NOT_FILES = {"FIFO": "fifo", "folder": "folder", "link to /dev/zero": "device"}
HOWS = ("DatasetReader.read_sample", "DatasetReader iteration", "ShardDataset per sample",
        "ShardDataset batched", "open_dataset()[0]", "cat", "verify", "ls", "info", "unpack",
        "export --to webdataset")


def not_file_tries(clean: Path, truth: dict, timeout: float, shard_format: str) -> list[Try]:
    tries = []
    for what in ("manifest", "index", "shard"):
        for name, kind in NOT_FILES.items():
            for how in HOWS:
                tries.append(Try("crafted datasets",
                                 f"{name} in place of the {what} (right: one line)",
                                 dict(format=shard_format, how=how),
                                 _not_file_fn(clean, truth, what, kind, how), timeout))
    return tries


def _replace_file(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")


def _not_file_fn(clean, truth, what, kind, how):
    def fn(work: Path):
        out = work / "ds"
        shutil.copytree(clean, out)
        reader = shardpack.open_reader(out)
        first = reader.shards[0]
        key = reader.index(0).key(0)
        _replace_file(out / {"manifest": "shardpack.json", "index": first.index,
                             "shard": first.name}[what], kind)
        return use_dataset(out, truth, how, key, work)
    return fn


def use_dataset(out: Path, truth: dict, how: str, key: str, work: Path) -> tuple[str, str]:
    """One use of a dataset: a reader (compared with ``truth``) or a command (``ok`` is exit 0;
    unpack's and export's files are not compared here)."""
    if how == "DatasetReader.read_sample":
        def one():
            s = shardpack.open_reader(out).read_sample(0)
            yield s["__key__"], bytes(s["jpg"])
        kind, detail = read_epochs([one()], truth)
        # one sample, not all: "silent" for a short epoch is not the point here
        return ("ok", "") if detail.startswith("epoch 0 ended without error") else (kind, detail)
    if how == "DatasetReader iteration":
        def whole():
            for s in shardpack.open_reader(out):
                yield s["__key__"], bytes(s["jpg"])
        return read_epochs([whole()], truth)
    if how.startswith("ShardDataset"):
        def epochs():
            yield epoch_items(shardpack.ShardDataset(out, shuffle=False, batch_size=4,
                                                     batched=how.endswith("batched")))
        return read_epochs(epochs(), truth)
    if how == "open_dataset()[0]":
        def first():
            s = shardpack.open_dataset(out)[0]
            yield s["__key__"], bytes(s["jpg"])
        kind, detail = read_epochs([first()], truth)
        return ("ok", "") if detail.startswith("epoch 0 ended without error") else (kind, detail)
    args = {"cat": ("cat", out, key, "--field", "jpg"), "verify": ("verify", "-q", out),
            "ls": ("ls", out), "info": ("info", out), "unpack": ("unpack", "-q", out, work / "u"),
            "export --to webdataset": ("export", out, work / "e", "--to", "webdataset")}[how]
    kind, detail, _ = cli(*args)
    return kind, detail


# -- crafted datasets: keys and field names -----------------------------------------------------

BAD_KEYS = {"'..' component": "../up", "'..' inside": "a/../../b", "absolute": "/abs",
            "'//'": "a//b", "empty": "", "trailing '/'": "dir/", "'.' component": "a/./b",
            "'.'": ".", "NUL": "a\x00b",
            "not UTF-8": b"bad\xffkey".decode("utf-8", "surrogateescape")}
GOOD_KEYS = {"plain": "ok", "spaces, non-ASCII": "a/b c/\u00fc", "newline": "x\ny",
             "tab": "tab\there", "dots": "IMG_2019.01.05", "'..' inside a name":
             "..hidden-dots..x"}
KEY_COMMANDS = ("verify", "unpack", "export --to webdataset", "export --to files")


def key_tries(timeout: float) -> list[Try]:
    tries = []
    for keys, right in ((BAD_KEYS, "one line"), (GOOD_KEYS, "served")):
        for label, key in keys.items():
            for shard_format in ("tar", "msgpack"):
                if shard_format == "msgpack" and label == "not UTF-8":
                    continue  # a msgpack record's key is UTF-8 text by construction
                for command in KEY_COMMANDS:
                    row = ("key that unpack and export must refuse: " if right == "one line"
                           else "key every command takes: ")
                    tries.append(Try("crafted datasets", f"{row}{label} (right: {right})",
                                     dict(key=key, format=shard_format, command=command),
                                     _key_fn(key, shard_format, command, right), timeout))
    return tries


def _written_outside(work: Path, allowed: tuple) -> list[str]:
    """Files under ``work`` outside the folders a command may write."""
    out = []
    for d, _, names in os.walk(work):
        for n in names:
            p = os.path.join(d, n)
            if not any(p.startswith(str(a) + os.sep) for a in allowed):
                out.append(p)
    return out


def _key_fn(key, shard_format, command, right):
    def fn(work: Path):
        from benchmarks.testbed import craft

        made = work / "made"
        made.mkdir()
        ds = craft(made, [("good", [("bin", b"1")]), (key, [("bin", b"2")])], shard_format)
        target = work / "out" / "t"
        args = {"verify": ("verify", ds), "unpack": ("unpack", "-q", ds, target),
                "export --to webdataset": ("export", ds, target, "--to", "webdataset"),
                "export --to files": ("export", ds, target, "--to", "files")}[command]
        kind, detail, _ = cli(*args)
        outside = _written_outside(work, (made, target.parent))
        if outside:
            return "silent", f"{command} wrote outside OUT: {outside[:2]} ({kind})"
        if right == "one line" and kind == "ok":
            return "silent", f"{command} accepted the key {key!r}"
        return kind, detail
    return fn


RESERVED_FIELDS = ("__key__", "__index__", "__x__", "__", "a/b", "a\x00b")
DOTDOT_FIELDS = ("a..b", "..", "jpg..", "..json")
FIELD_USES = ("verify", "open_dataset()[0]", "ShardDataset per sample", "ShardDataset batched",
              "ls", "unpack", "export --to files")


def field_tries(timeout: float) -> list[Try]:
    """Field names no pack writes: reserved ones (``__key__`` would replace every key), with '/'
    or NUL, refused by verify and the readers; '..' in a name, refused by verify (readers still
    read datasets packed before that rule)."""
    tries = []
    for fields, row in ((RESERVED_FIELDS, "reserved field name (__key__, __*__, '/', NUL)"),
                        (DOTDOT_FIELDS, "field name holding '..'")):
        for field in fields:
            for use in FIELD_USES:
                tries.append(Try("crafted datasets", row, dict(field=field, use=use),
                                 _field_fn(field, use, field in RESERVED_FIELDS), timeout))
    return tries


def _field_fn(field, use, reserved):
    def fn(work: Path):
        from benchmarks.testbed import craft

        made = work / "made"
        made.mkdir()
        ds = craft(made, [("k1", [("bin", b"1"), (field, b"2")])])
        target = work / "out" / "t"
        if use in ("verify", "ls", "unpack", "export --to files"):
            args = {"verify": ("verify", ds), "ls": ("ls", ds),
                    "unpack": ("unpack", "-q", ds, target),
                    "export --to files": ("export", ds, target, "--to", "files")}[use]
            kind, detail, output = cli(*args)
            outside = _written_outside(work, (made, target.parent))
            if outside:
                return "silent", f"{use} wrote outside OUT: {outside[:2]}"
            if kind == "ok" and (use == "verify" or reserved and use != "ls"):
                return "silent", f"{use} accepted field {field!r}"
            if kind == "ok" and use == "ls" and output.splitlines() != ["k1"]:
                return "silent", f"ls printed {output!r}"
            return kind, detail
        try:
            if use == "open_dataset()[0]":
                samples = [shardpack.open_dataset(ds)[0]]
            else:
                batched = use.endswith("batched")
                got = shardpack.ShardDataset(ds, shuffle=False, batch_size=1, batched=batched)
                samples = [{k: (v[0] if k == "__key__" else bytes(next(iter(v.items()))))
                            for k, v in b.items() if k in ("__key__", "bin", field)}
                           for b in got] if batched else list(got)
        except ShardpackError as exc:
            return clear(exc)
        except Exception as exc:  # noqa: BLE001
            return other(exc)
        if [s["__key__"] for s in samples] != ["k1"] or bytes(samples[0]["bin"]) != b"1":
            return "silent", f"read back {samples!r:.200}"
        if reserved:
            return "silent", f"field {field!r} was read without an error"
        return ("ok", "") if bytes(samples[0][field]) == b"2" else \
            ("silent", f"field {field!r} read back wrong")
    return fn


# -- crafted datasets: labels outside int64 -----------------------------------------------------

BAD_LABELS = {"2**63": b"9223372036854775808", "-2**63 - 1": b"-9223372036854775809",
              "20 digits": b"99999999999999999999", "-20 digits": b"-99999999999999999999"}
BOUND_LABELS = {"2**63 - 1": b"9223372036854775807", "-2**63": b"-9223372036854775808"}
LABEL_USES = ("batched", "batched, on_error=skip", "per sample + collate",
              "DataLoader(batch_size=4, collate_fn=collate)")


def labelled(root: Path, label: bytes, shard_format: str, compression: str) -> Path:
    """Samples s0..s3 with a .bin field and labels 1, ``label``, 3, 4 (from a listing)."""
    rows = []
    for i, value in enumerate((b"1", label, b"3", b"4")):
        (root / f"{i}.bin").write_bytes(b"%d" % i)
        rows.append(f"{root}/{i}.bin,s{i},{value.decode()}")
    listing = root / "l.csv"
    listing.write_text("path,key,cls\n" + "\n".join(rows) + "\n")
    out = root / "ds"
    shardpack.pack(listing, out, shard_format=shard_format, compression=compression,
                   workers=1)
    return out


def label_tries(timeout: float) -> list[Try]:
    tries = []
    for labels, row in ((BAD_LABELS, "label outside int64 (right: one line, or skipped)"),
                        (BOUND_LABELS, "label at the int64 bounds (right: served)")):
        for name, label in labels.items():
            for shard_format, compression in (("msgpack", "zstd"), ("tar", "none")):
                for use in LABEL_USES:
                    tries.append(Try("crafted datasets", row,
                                     dict(label=name, format=f"{shard_format}+{compression}",
                                          use=use),
                                     _label_fn(label, shard_format, compression, use), timeout))
    return tries


def _label_fn(label, shard_format, compression, use):
    def fn(work: Path):
        import warnings

        import torch

        from shardpack import collate

        ds = labelled(work, label, shard_format, compression)
        value = int(label)
        in_range = -2 ** 63 <= value < 2 ** 63
        truth = {"s0": 1, "s1": value, "s2": 3, "s3": 4}
        got = []
        skip = use.endswith("skip")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if use.startswith("batched"):
                    dataset = shardpack.ShardDataset(ds, shuffle=False, batch_size=4,
                                                     batched=True,
                                                     on_error="skip" if skip else "raise")
                    for b in dataset:
                        got += zip(list(b["__key__"]), b["cls"].tolist(), strict=True)
                elif use.startswith("per sample"):
                    b = collate(list(shardpack.ShardDataset(ds, shuffle=False)))
                    got += zip(list(b["__key__"]), b["cls"].tolist(), strict=True)
                else:
                    loader = torch.utils.data.DataLoader(
                        shardpack.ShardDataset(ds, shuffle=False, batch_size=4), batch_size=4,
                        collate_fn=collate)
                    for b in loader:
                        got += zip(list(b["__key__"]), b["cls"].tolist(), strict=True)
        except ShardpackError as exc:
            wrong = [k for k, v in got if truth[k] != v]
            if wrong:
                return "silent", f"wrong label for {wrong} before: {exc}"
            if in_range:
                return "other exception", f"refused a label inside int64: {exc}"
            return clear(exc)
        except Exception as exc:  # noqa: BLE001
            return other(exc)
        wrong = [k for k, v in got if truth[k] != v]
        if wrong:
            return "silent", f"wrong label for {wrong}: {got}"
        keys = [k for k, _ in got]
        expected = ["s0", "s1", "s2", "s3"] if in_range else ["s0", "s2", "s3"]
        if keys != expected or (not in_range and not skip):
            return "silent", f"got {got} without an error"
        return "ok", ""
    return fn


# -- crafted datasets: resume states that cannot belong to the dataset ---------------------------

def impossible_states(base: dict) -> dict:
    import numpy as np

    return {
        "history of 10**6 steps": {**base, "history": [[1, 0], [2, 0]] * 500_000},
        "negative samples_seen": {**base, "history": [[1, -5]]},
        "samples_seen 10**9": {**base, "history": [[1, 10 ** 9]]},
        "world size 0": {**base, "history": [[0, 1]]},
        "world size 10**12": {**base, "history": [[10 ** 12, 1]]},
        "step as strings": {**base, "history": [["1", 0]]},
        "step as floats": {**base, "history": [[1.0, 0]]},
        "step of three": {**base, "history": [[1, 0, 0]]},
        "history as a string": {**base, "history": "[[1, 0]]"},
        "world size changed 3,000 times": {**base, "history": [[w, 0] for w in range(1, 3000)]},
        "negative epoch": {**base, "epoch": -1},
        "epoch as a string": {**base, "epoch": "0"},
        "no history": {k: v for k, v in base.items() if k != "history"},
        "negative worker position": {**base, "worker": {
            "world": 1, "rank": 0, "num_workers": 1, "worker": 0, "batch_size": 1,
            "yielded": -3}},
        "seed as a list of 10**6": {**base, "seed": list(range(10 ** 6))},
        "seed as an array": {**base, "seed": np.arange(3)},
        "version as a list of 10**6": {**base, "version": [3] * 10 ** 6},
        "a list, not a dict": [base],
    }


def state_tries(clean: Path, timeout: float) -> list[Try]:
    import numpy as np  # noqa: F401 - (the states' arrays)

    names = list(impossible_states({"history": []}))
    return [Try("crafted datasets", "impossible resume state (right: one line, at once)",
                dict(state=name, reader="batched" if batched else "per sample"),
                _state_fn(clean, name, batched), timeout)
            for name in names for batched in (False, True)]


def _state_fn(clean, name, batched):
    def fn(work: Path):
        import time

        def make():
            return shardpack.ShardDataset(clean, batch_size=4, batched=batched)
        state = impossible_states(make().state_dict(samples_seen=8))[name]
        fresh = make()
        started = time.perf_counter()
        kind, detail = call(lambda: fresh.load_state_dict(state),
                            accept=(ShardpackError, ValueError))
        took = time.perf_counter() - started
        if kind == "ok":
            return "silent", "the state was loaded"
        if kind == "clear error" and took > 1.0:
            return "other exception", f"refused after {took:.1f} s, not at once: {detail}"
        return kind, detail
    return fn


# -- image bombs --------------------------------------------------------------------------------

BOMBS = ROOT / "tests" / "robustness" / "hostile" / "images"
BOMB_USES = ("pack --check full", "verify --decode", "CpuDecode", "CpuDecode(on_error='skip')",
             "preview")
MEMORY_HEADROOM = 1 << 30  # address space a try may add: the PNG bomb alone took 1.8 GB


def bomb_tries(timeout: float) -> list[Try]:
    """Each image of tests/robustness/hostile/images (headers claiming 8,000-13,000 pixels a side,
    over or
    under the decode budget) through every command that decodes, in a process whose address
    space may grow by MEMORY_HEADROOM only (a decode that takes what the header says is a
    MemoryError: another exception)."""
    return [Try("crafted datasets", f"image bomb through {use}", dict(image=image.name),
                _bomb_fn(image, use), timeout)
            for use in BOMB_USES for image in sorted(BOMBS.iterdir())]


def limit_memory() -> None:
    """In a try's process: its address space may grow by MEMORY_HEADROOM from here on."""
    import resource

    with open("/proc/self/status") as f:
        vm = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + MEMORY_HEADROOM, vm + MEMORY_HEADROOM))


def _good_png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (9, 99, 199)).save(buf, "PNG")
    return buf.getvalue()


def _bomb_fn(image: Path, use: str):
    def fn(work: Path):
        from benchmarks.testbed import make_tree

        ext = image.suffix
        src = make_tree(work / "src", {"ok/a.png": _good_png(), f"bad/b{ext}": image.read_bytes()})
        if use != "pack --check full":
            shardpack.pack(src, work / "ds", workers=1, check="none")
        # (everything a decode needs is imported before the limit)
        import PIL.GifImagePlugin  # noqa: F401
        import PIL.JpegImagePlugin  # noqa: F401
        import PIL.PngImagePlugin  # noqa: F401
        import PIL.WebPImagePlugin  # noqa: F401

        from shardpack.inspect import preview  # noqa: F401
        from shardpack import CpuDecode
        limit_memory()
        if use == "pack --check full":
            kind, detail, _ = cli("pack", src, work / "out", "--check", "full", "--workers", "1")
            return ("silent", "packed with --check full") if kind == "ok" else (kind, detail)
        if use == "verify --decode":
            kind, detail, _ = cli("verify", "--decode", work / "ds")
            return ("silent", "verify --decode said OK") if kind == "ok" else (kind, detail)
        if use == "preview":
            kind, detail, _ = cli("preview", work / "ds", "--first", "--out", work / "p.png")
            return kind, detail
        skip = "skip" in use
        try:
            ds = shardpack.ShardDataset(work / "ds", shuffle=False, batch_size=2, batched=True,
                                        decode=CpuDecode(32, on_error="skip" if skip
                                                         else "raise"))
            batches = list(ds)
        except ShardpackError as exc:
            return clear(exc)
        except Exception as exc:  # noqa: BLE001 - MemoryError among them
            return other(exc)
        bad = {k for b in batches for k, flag in zip(list(b["__key__"]),
                                                     b["__bad__"].tolist(), strict=True)
               if flag}
        if "ok/a" in bad:
            return "silent", "the good image was marked bad"
        return "ok", f"decoded, {len(bad)} marked bad"
    return fn
