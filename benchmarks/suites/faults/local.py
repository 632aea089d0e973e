"""The faults suite's local families: shards changed in place between
epochs of one process, kill -9 mid-command, and other cases (crafted datasets are in
crafted.py).
Each function here returns a list of :class:`.run.Try`, whose ``fn`` runs in a forked
child (run.py)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import sys
from pathlib import Path

import shardpack

from .run import Try, call, cli, read_epochs

# -- datasets -------------------------------------------------------------------------------------

N, PER_SHARD = 24, 12


def shard_dataset(root: Path, shard_format: str) -> tuple[Path, dict]:
    """24 samples of ~3 KB in two shards of 12, both of the same size (each spans several pages,
    so a truncation can land on a page boundary), and the true bytes by key."""
    from benchmarks.testbed import fake_jpeg, make_tree

    src = make_tree(root / f"src-{shard_format}",
                    {f"c{i % 2}/{i:03d}.jpg": fake_jpeg(3000, seed=i) for i in range(N)})
    out = root / f"ds-{shard_format}"
    shardpack.pack(src, out, shard_format=shard_format, workers=1, max_samples=PER_SHARD)
    reader = shardpack.open_reader(out)
    truth = {s["__key__"]: bytes(s["jpg"]) for s in reader}
    sizes = {(out / s.name).stat().st_size for s in reader.shards}
    assert len(reader.shards) == 2 and len(sizes) == 1, sizes
    return out, truth


def epoch_items(ds):
    """(key, jpg bytes) of one epoch of a ShardDataset, per sample or batched."""
    if ds.batched:
        for b in ds:
            yield from zip(list(b["__key__"]), (bytes(v) for v in b["jpg"].items()),
                           strict=True)
    else:
        for s in ds:
            yield s["__key__"], bytes(s["jpg"])


def check_kwargs(check: str) -> dict:
    """check="every" is the default (passed as nothing); "none" as trust_storage=True."""
    return {"every": {}, "once": {"check": "once"}, "none": {"trust_storage": True}}[check]


CHECK_NAMES = {"every": 'check="every" (default)', "once": 'check="once"',
               "none": "trust_storage=True"}


def two_epochs(ds, damage, when: str):
    """Epoch 0 whole, then ``damage()`` and epoch 1 ("between"), or epoch 1 with ``damage()``
    after its first item ("during")."""
    yield epoch_items(ds)
    if when == "between":
        damage()
        yield epoch_items(ds)
    else:
        def damaged():
            for n, item in enumerate(epoch_items(ds)):
                yield item
                if n == 0:
                    damage()
        yield damaged()


# -- damage -----------------------------------------------------------------------------------

def keep_mtime(path, change) -> None:
    st = os.stat(path)
    change()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def flip_at(path, offset: int, restore_mtime: bool = True) -> None:
    def change():
        fd = os.open(path, os.O_RDWR)
        try:
            byte = os.pread(fd, 1, offset)
            os.pwrite(fd, bytes([byte[0] ^ 0x20]), offset)
        finally:
            os.close(fd)
    keep_mtime(path, change) if restore_mtime else change()


def copy_over(src, dst, restore_mtime: bool) -> None:
    """``cp src dst``: truncate and write, same inode (``cp -p``: its mtime put back)."""
    change = lambda: shutil.copyfile(src, dst)  # noqa: E731
    keep_mtime(dst, change) if restore_mtime else change()


def damage_grid(size: int, rng: random.Random, flips: int):
    """Every try of an in-place family: (case name, params, when, check, batched, damage) for
    each damage (:func:`damages`), between or during an epoch, check mode and reader."""
    cases = damages(size, rng, flips)
    for when in ("between", "during"):
        label = "between epochs" if when == "between" else "during an epoch"
        for check in ("every", "once", "none"):
            for row, what, damage in cases:
                for batched in (False, True):
                    params = dict(damage=what, reader="batched" if batched else "per sample")
                    yield (f"{row}, {label}; {CHECK_NAMES[check]}", params, when, check,
                           batched, damage)


def damages(size: int, rng: random.Random, flips: int) -> list[tuple[str, str, object]]:
    """(row name, what, fn(shard, other)) for one shard of ``size`` bytes: copied over by the
    other shard (plain and with its mtime kept), ``flips`` bytes flipped (mtime kept), and
    truncations at 0, one page, the page boundary nearest half, 100 bytes short (inside the last
    page) and one byte short."""
    out = [("copied over by another shard of the same size (cp)", "cp",
            lambda a, b: copy_over(b, a, False)),
           ("copied over by another shard of the same size (cp)", "cp, mtime kept",
            lambda a, b: copy_over(b, a, True))]
    for _ in range(flips):
        at = rng.randrange(size)
        out.append(("one byte flipped in place, mtime kept", f"byte {at} flipped",
                    lambda a, b, at=at: flip_at(a, at)))
    for cut in (0, 4096, (size // 2) & ~4095, size - 100, size - 1):
        out.append(("truncated", f"truncated to {cut} of {size} bytes",
                    lambda a, b, cut=cut: os.truncate(a, cut)))
    return out


# -- in-place local damage --------------------------------------------------------------------

def inplace_tries(datasets: dict, flips: int, seed: int, timeout: float) -> list[Try]:
    """Shard 0 of a local dataset damaged between two epochs of one ShardDataset, or during the
    second (after its first item), for each check mode, reader and format."""
    tries = []
    rng = random.Random(seed)
    for shard_format, (clean, truth) in datasets.items():
        first = shardpack.open_reader(clean).shards
        size = (clean / first[0].name).stat().st_size
        for case, params, when, check, batched, damage in damage_grid(size, rng, flips):
            tries.append(Try("in-place local damage", case, dict(format=shard_format, **params),
                             _inplace_fn(clean, truth, check, batched, when, damage,
                                         first[0].name, first[1].name), timeout))
    return tries


def _inplace_fn(clean, truth, check, batched, when, damage, name0, name1):
    def fn(work: Path):
        out = work / "ds"
        shutil.copytree(clean, out)
        ds = shardpack.ShardDataset(out, shuffle=False, batch_size=4, batched=batched,
                                    prefetch_shards=0, **check_kwargs(check))
        return read_epochs(two_epochs(ds, lambda: damage(out / name0, out / name1), when),
                           truth)
    return fn


# -- process faults: kill -9 mid-command, then run again ------------------------------------------

EVENTS = ("open", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.link", "os.symlink",
          "os.truncate", "os.utime", "os.chmod", "shutil.rmtree", "shutil.move")


def _killed_at(n: int | None, run, report: int | None = None, note: int | None = None) -> None:
    """In a fresh process group: run ``run()`` and SIGKILL the whole group (this process and
    any pool workers) at the ``n``-th file-system event (an open, a rename, a removal, a mkdir,
    ...) of this process, after writing that event to the file descriptor ``note``; ``n`` None
    counts the events of a whole run into ``report`` (a pipe)."""
    os.setpgid(0, 0)
    me, count = os.getpid(), [0]

    def hook(event, args):
        if event in EVENTS and os.getpid() == me:
            count[0] += 1
            if n is not None and count[0] >= n:
                if note is not None:  # (os.write: no audit event of its own)
                    os.write(note, f"{event}{tuple(args)[:2]!r}".encode())
                os.killpg(0, signal.SIGKILL)

    sys.addaudithook(hook)
    run()
    if report is not None:
        os.write(report, str(count[0]).encode())


def count_events(run) -> int:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            _killed_at(None, run, w)
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while piece := os.read(r, 100):
        data += piece
    os.close(r)
    os.waitpid(pid, 0)
    return int(data)


def kill_and_wait(n: int, run) -> tuple[int, str]:
    """Run ``run()`` in a child killed at event ``n``: (its wait status, the event)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            _killed_at(n, run, note=w)
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while piece := os.read(r, 4096):
        data += piece
    os.close(r)
    return os.waitpid(pid, 0)[1], data.decode(errors="replace")


def _hidden(out: Path) -> list[str]:
    return sorted(n for n in os.listdir(out.parent) if n.startswith(f".{out.name}."))


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def process_dataset(root: Path) -> tuple[Path, Path]:
    """40 small files in two classes, packed into 4 shards of 10: (source, dataset)."""
    from benchmarks.testbed import fake_jpeg, make_tree

    src = make_tree(root / "src-kill", {f"c{i % 2}/{i:03d}.jpg": fake_jpeg(300 + 37 * i, seed=i)
                                        for i in range(40)})
    shardpack.pack(src, root / "ds-kill", workers=1, max_samples=10)
    return src, root / "ds-kill"


KILL_COMMANDS = ("unpack", "export --to files", "export --to files --overwrite", "pack",
                 "pack --workers 2")


def process_tries(src: Path, clean: Path, points: int, timeout: float) -> list[Try]:
    """Each command killed with SIGKILL at one file-system event of its run (every event of a
    clean run's, when it has at most ``points``; else ``points`` spread over them), then run
    again as a user would: the same command (``--resume`` for pack).  Right: the output of a
    clean run, and no hidden work folder left beside OUT."""
    from benchmarks.testbed import read_tree

    reference = read_tree(clean)
    tries = []
    for command in KILL_COMMANDS:
        out = _scratch_out(command)
        total = count_events(_command(command, src, clean, out))
        shutil.rmtree(out.parent, ignore_errors=True)
        events = range(1, total + 1) if total <= points else \
            sorted({1 + (total - 1) * i // (points - 1) for i in range(points)})
        rerun = "--resume" if command.startswith("pack") else "the same command"
        for n in events:
            tries.append(Try("process faults", f"kill -9 during {command}, then {rerun}",
                             dict(event=f"{n} of {total}"),
                             _kill_fn(command, src, clean, n, reference), timeout))
    return tries


def _scratch_out(command: str) -> Path:
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="count-"))
    out = root / "out"
    if command.endswith("--overwrite"):
        (out / "earlier").mkdir(parents=True)
        (out / "earlier" / "file.txt").write_bytes(b"an earlier export")
    return out


def _command(command: str, src: Path, clean: Path, out: Path):
    from shardpack import export
    from shardpack.interop.unpack import unpack

    if command == "unpack":
        return lambda: unpack(clean, out)
    if command.startswith("export"):
        return lambda: export(clean, out, to="files", overwrite=command.endswith("--overwrite"))
    workers = 2 if "--workers 2" in command else 1
    return lambda: shardpack.pack(src, out, workers=workers, max_samples=10)


def _rerun_args(command, src, clean, out) -> list:
    if command.startswith("pack"):
        return ["pack", "-q", src, out, "--max-samples", "10", "--resume", "--workers",
                "2" if "--workers 2" in command else "1"]
    if command == "unpack":
        return ["unpack", "-q", clean, out]
    return ["export", "-q", clean, out, "--to", "files"] + (
        ["--overwrite"] if command.endswith("--overwrite") else [])


def _kill_fn(command, src, clean, n, reference):
    def fn(work: Path):
        from benchmarks.testbed import read_tree

        from shardpack.interop.unpack import UNMARKED_GRACE_S

        out = work / "out"
        if command.endswith("--overwrite"):
            (out / "earlier").mkdir(parents=True)
            (out / "earlier" / "file.txt").write_bytes(b"an earlier export")
        status, event = kill_and_wait(n, _command(command, src, clean, out))
        note = f" (killed at {event})" if os.WIFSIGNALED(status) else \
            " (the run ended before that event)"
        kind, detail, _ = cli(*_rerun_args(command, src, clean, out))
        left = _hidden(out)
        if left:
            # what a rerun a minute later finds (an empty folder without its owner record is
            # left alone for UNMARKED_GRACE_S: it may be a live run's, just made)
            for name in left:
                old = os.stat(out.parent / name).st_mtime - UNMARKED_GRACE_S - 1
                os.utime(out.parent / name, (old, old))
            later, _, _ = cli(*_rerun_args(command, src, clean, out))
            said = f"{kind}: {detail}" if detail else kind
            return "silent", (f"the rerun ({said}) left {left} beside OUT; a rerun a minute "
                              f"later ({later}) left {_hidden(out)}{note}")
        if not out.exists():
            return ("other exception" if kind == "ok" else kind), f"no OUT: {detail}{note}"
        got = read_tree(out) if command.startswith("pack") else _tree(out)
        want = reference if command.startswith("pack") else _unpacked(clean)
        if got != want:
            diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            return "silent", f"OUT differs from a clean run's ({kind}): {diff[:4]}{note}"
        return kind, (detail + note) if kind != "ok" else note.strip()
    return fn


def _unpacked(clean: Path) -> dict:
    """What a clean unpack of ``clean`` writes (computed once per process)."""
    if clean not in _UNPACKED:
        import tempfile

        from shardpack.interop.unpack import unpack

        with tempfile.TemporaryDirectory() as tmp:
            unpack(clean, Path(tmp) / "u")
            _UNPACKED[clean] = _tree(Path(tmp) / "u")
    return _UNPACKED[clean]


_UNPACKED: dict = {}


# -- other: paths holding "::", keys that would print over two lines, collate errors --------------

COLON_USES = ("pack", "pack (CLI)", "ShardDataset per sample", "ShardDataset batched",
              "verify", "info", "ls", "unpack")


def colon_tries(src: Path, clean: Path, timeout: float) -> list[Try]:
    """A local path holding "::" (fsspec's chain separator) is a local path: pack writes there,
    not to the part before "::", and every reader reads it."""
    return [Try("other", 'local path holding "::" (right: served)', dict(use=use, path=form),
                _colon_fn(src, clean, use, form), timeout)
            for use in COLON_USES for form in ("DIR/ds::v2", "file://DIR/ds::v2")]


def _colon_fn(src, clean, use, form):
    def fn(work: Path):
        from benchmarks.testbed import read_tree

        path = work / "ds::v2"
        url = f"file://{path}" if form.startswith("file") else str(path)
        if not use.startswith("pack"):
            shutil.copytree(clean, path)
            truth = {s["__key__"]: bytes(s["jpg"]) for s in shardpack.open_reader(clean)}
        if use == "pack":
            kind, detail = call(lambda: shardpack.pack(src, url, workers=1, max_samples=10))
        elif use == "pack (CLI)":
            kind, detail, _ = cli("pack", "-q", src, url, "--workers", "1", "--max-samples", "10")
        elif use.startswith("ShardDataset"):
            def epochs():
                yield epoch_items(shardpack.ShardDataset(url, shuffle=False, batch_size=4,
                                                         batched=use.endswith("batched")))
            kind, detail = read_epochs(epochs(), truth)
        else:
            args = {"verify": ("verify", "-q", url), "info": ("info", url), "ls": ("ls", url),
                    "unpack": ("unpack", "-q", url, work / "u")}[use]
            kind, detail, _ = cli(*args)
        stray = [p.name for p in work.iterdir() if p.name not in ("ds::v2", "u")]
        if stray:
            return "silent", f"written beside the path: {stray} ({kind})"
        if use.startswith("pack") and kind == "ok" and read_tree(path) != read_tree(clean):
            return "silent", "pack wrote other bytes"
        return kind, detail
    return fn


LS_KEYS = {"plain": "plain/key", "newline": "x\ny", "CR, tab, backslash, quote":
           "cr\rtab\tbs\\q'", "escape sequence": "esc\x1b[31mred", "DEL": "del\x7f",
           "C1 control (NEL)": "c1\x85next", "line and paragraph separators":
           "ls\u2028ps\u2029", "not UTF-8": b"raw\xff\xfe".decode("utf-8", "surrogateescape"),
           "$'...' already": "$'quoted'", "zero-width joiner": "zwj\u200d\u00fc"}


def ls_tries(timeout: float) -> list[Try]:
    """`shardpack ls` and `ls --long` print each key on one line, whatever it holds."""
    return [Try("other", "ls: every key on one line (right: served)",
                dict(key=key, command=command), _ls_fn(key, command), timeout)
            for key in LS_KEYS.values() for command in ("ls", "ls --long")]


def _ls_fn(key, command):
    def fn(work: Path):
        from benchmarks.testbed import craft

        ds = craft(work, [("first", [("bin", b"1")]), (key, [("bin", b"2"), ("x\ny", b"3")])])
        kind, detail, output = cli(*command.split(), ds)
        if kind != "ok":
            return kind, detail
        lines = output.split("\n")[:-1]
        if len(lines) != 2:
            return "silent", f"{len(lines)} lines for 2 keys: {output!r}"
        return "ok", ""
    return fn


def collate_tries(timeout: float) -> list[Try]:
    return [Try("other", "collate error names the sample (right: one line)", dict(case=name),
                _collate_fn(name), timeout) for name in COLLATE_CASES]


def _sample(key, index, **fields):
    return {"__key__": key, **fields, "__index__": index, "__repeat__": False}


COLLATE_CASES = ("label not a number", "label outside int64", "label an int, not bytes",
                 "a label missing", "tensors of two shapes", "a float field missing")


def _collate_fn(name):
    def fn(work: Path):
        import torch

        from shardpack import collate

        batch = {
            "label not a number": [_sample("a", 0, cls=b"1"), _sample("b", 7, cls=b"x")],
            "label outside int64": [_sample("a", 0, cls=b"1"),
                                    _sample("b", 7, cls=b"99999999999999999999")],
            "label an int, not bytes": [_sample("a", 0, cls=b"1"), _sample("b", 7, cls=10**12)],
            "a label missing": [_sample("a", 0, cls=b"1", jpg=b"j"), _sample("b", 3, jpg=b"k")],
            "tensors of two shapes": [_sample("a", 0, img=torch.zeros(3, 4)),
                                      _sample("b", 5, img=torch.zeros(3, 5))],
            "a float field missing": [_sample("a", 0, meta=1.5), _sample("b", 2)],
        }[name]
        kind, detail = call(lambda: collate(batch))
        if kind == "clear error" and "'b'" not in detail:
            return "other exception", f"the error does not name the sample: {detail}"
        if kind == "ok":
            return "silent", "collated without an error"
        return kind, detail
    return fn
