"""The faults suite's families of what shardpack must refuse to mix up: a resume state loaded
into another packing of the same samples, links planted in the cache's own folder (and a cache
folder others can write), and two exports into one OUT at once.  Each function returns a list
of :class:`.run.Try`, whose ``fn`` runs in a forked child (run.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import shardpack

from .run import Try, call, cli, fork_all, read_epochs, worst

RESUME = "resume identity"
CACHE = "cache folder links"
EXPORT = "concurrent export"


# -- resume states and the dataset they were saved on ----------------------------------------------

def _packed(work: Path, name: str, per_shard: int, other: bool = False) -> Path:
    """120 samples (30, named o*, when ``other``) packed ``per_shard`` a shard into work/name."""
    from benchmarks.testbed import make_tree

    src = work / ("src-other" if other else "src")
    if not src.exists():
        files = ({f"o{i:02d}.bin": b"o%d" % i for i in range(30)} if other
                 else {f"{i:03d}.bin": b"%d" % i for i in range(120)})
        make_tree(src, files)
    shardpack.pack(src, work / name, workers=1, max_samples=per_shard)
    return work / name


def _keys(ds) -> list[str]:
    if ds.batched:
        return [k for b in ds for k in list(b["__key__"])]
    return [s["__key__"] for s in ds]


# case -> ((per shard of the source the state is saved on, of the one it is loaded into), and
# for a mixture the second source's; None: no mixture)
REPACKED = {"40 a shard, loaded into 30 a shard": ((40, 30), None),
            "30 a shard, loaded into 40 a shard": ((30, 40), None),
            "mixture, source 1 repacked (10 a shard, loaded into 15)": ((40, 40), (10, 15))}
SAME = {"one dataset": ((40, 40), None), "mixture": ((40, 40), (10, 10))}


def resume_tries(timeout: float) -> list[Try]:
    """A state saved after 8 samples (through JSON, as a checkpoint holds it) loaded into the
    same samples packed into other shards (refused in one line: the sample count alone cannot
    tell them apart), and into the same packing made again (resumed where it stopped)."""
    tries = []
    for cases, row in ((REPACKED, "state loaded into another packing of the same samples "
                                  "(right: one line)"),
                       (SAME, "state loaded into the same packing made again, byte for byte "
                              "(right: resumed exactly)")):
        for case, (first, second) in cases.items():
            for batched in (False, True):
                tries.append(Try(RESUME, row, dict(case=case, reader="batched" if batched
                                                   else "per sample"),
                                 _resume_fn(first, second, batched, cases is SAME), timeout))
    return tries


def _resume_fn(first, second, batched, same):
    def fn(work: Path):
        saved = [_packed(work, "a", first[0])]
        loaded = [saved[0] if first[0] == first[1] else _packed(work, "a2", first[1])]
        if second is not None:
            saved.append(_packed(work, "b", second[0], other=True))
            loaded.append(_packed(work, "b2", second[1], other=True))
        elif same:
            loaded = [_packed(work, "a2", first[1])]

        def make(paths):
            return shardpack.ShardDataset(paths if len(paths) > 1 else paths[0], batch_size=4,
                                          batched=batched, seed=7)
        whole = _keys(make(saved))
        state = json.loads(json.dumps(make(saved).state_dict(samples_seen=8)))
        fresh = make(loaded)
        kind, detail = call(lambda: fresh.load_state_dict(state),
                            accept=(shardpack.ShardpackError, ValueError))
        if same:
            if kind != "ok":
                return kind, f"refused the same dataset: {detail}"
            rest = _keys(fresh)
            return ("ok", "") if rest == whole[8:] else (
                "silent", f"resumed with {len(rest)} samples, {whole[8:11]} expected first, "
                          f"got {rest[:3]}")
        if kind == "ok":
            return "silent", f"the state was loaded ({len(_keys(fresh))} samples then read)"
        return kind, detail
    return fn


# -- links and owners in the cache's own folder ----------------------------------------------------

def _outside_cache(work: Path) -> dict:
    """Every path under ``work`` but its cache folder (links not followed): its kind and, for a
    file, its bytes."""
    out, cache = {}, str(work / "cache")
    for d, dirs, names in os.walk(work):
        dirs[:] = [n for n in dirs if os.path.join(d, n) != cache]
        for n in dirs + names:
            p = os.path.join(d, n)
            if p != cache:
                out[p] = (os.readlink(p) if os.path.islink(p) else
                          "folder" if os.path.isdir(p) else Path(p).read_bytes())
    return out


def _outside_changed(work: Path, before: dict) -> str:
    """What changed under ``work`` outside its cache folder since ``before``."""
    now = _outside_cache(work)
    changed = sorted(p for p in set(now) | set(before) if now.get(p) != before.get(p))
    return ", ".join(changed[:3])


LINKS = {"to a folder outside": "folder", "to a file outside": "file",
         "dangling, to a name outside": "dangling"}
LOCK_USES = ("per sample", "batched", "cache info", "cache prune", "cache clear")
MODES = (0o777, 0o1777, 0o775)


def cache_link_tries(served: dict, timeout: float) -> list[Try]:
    """A link planted at CACHE/<url hash> (the dataset's folder), a dangling link at
    CACHE/.lock, a cache folder others can write: never followed, nothing written outside the
    cache; served, or one line."""
    tries = []
    for shard_format, (url, _, truth) in served.items():
        for link, kind in LINKS.items():
            for batched in (False, True):
                tries.append(Try(CACHE, "a link planted at CACHE/<url hash> (right: served, "
                                 "nothing written outside the cache)",
                                 dict(format=shard_format, link=link, reader="batched"
                                      if batched else "per sample"),
                                 _folder_link_fn(url, truth, kind, batched), timeout))
    url, _, truth = served["tar"]
    tries += [Try(CACHE, "a dangling link at CACHE/.lock (right: one line, its target not made)",
                  dict(use=use), _lock_link_fn(url, truth, use), timeout) for use in LOCK_USES]
    tries += [Try(CACHE, "a cache folder others can write (right: one line, nothing written)",
                  dict(mode=f"{mode:04o}", use=use), _open_folder_fn(url, truth, mode, use),
                  timeout) for mode in MODES for use in ("per sample", "cache info")]
    return tries


def _read(url, truth, cache, batched) -> tuple[str, str]:
    from .local import epoch_items

    def epochs():
        yield epoch_items(shardpack.ShardDataset(url, shuffle=False, batch_size=4,
                                                 batched=batched, cache_dir=cache))
    return read_epochs(epochs(), truth)


def _outside(work: Path) -> Path:
    """A folder outside the cache with a file in it."""
    outside = work / "outside"
    (outside / "folder").mkdir(parents=True)
    (outside / "folder" / "inside").write_bytes(b"precious")
    (outside / "precious").write_bytes(b"precious")
    return outside


def _folder_link_fn(url, truth, link, batched):
    def fn(work: Path):
        from shardpack.storage.cache import ShardCache

        outside = _outside(work)
        reader = shardpack.open_reader(url)
        probe = ShardCache(work / "probe", 1 << 30)
        folder = Path(probe.entry_path(reader.storage.url, reader.shards[0])).parent.name
        (work / "cache").mkdir(mode=0o755)
        target = {"folder": outside / "folder", "file": outside / "precious",
                  "dangling": outside / "made"}[link]
        os.symlink(target, work / "cache" / folder)
        before = _outside_cache(work)
        kind, detail = _read(url, truth, work / "cache", batched)
        changed = _outside_changed(work, before)
        if changed:
            return "silent", f"written outside the cache: {changed} ({kind}: {detail})"
        made = set(os.listdir(work / "cache")) - {".lock"}
        if kind == "ok" and made != {folder}:  # (the try's own check: the link was in the way)
            return "other exception", f"the cache made {sorted(made)}, not {folder}"
        return kind, detail
    return fn


def _lock_link_fn(url, truth, use):
    def fn(work: Path):
        _outside(work)
        (work / "cache").mkdir(mode=0o755)
        os.symlink(work / "outside" / "made-by-the-cache", work / "cache" / ".lock")
        before = _outside_cache(work)
        if use.startswith("cache "):
            kind, detail, _ = cli("cache", use.split()[1], "--cache-dir", work / "cache")
        else:
            kind, detail = _read(url, truth, work / "cache", use == "batched")
        changed = _outside_changed(work, before)
        if changed:
            return "silent", f"written outside the cache: {changed} ({kind}: {detail})"
        if kind == "ok" and use != "cache info":
            return "silent", "used the cache through a dangling link at its lock file"
        return kind, detail
    return fn


def _open_folder_fn(url, truth, mode, use):
    def fn(work: Path):
        cache = work / "cache"
        cache.mkdir()
        os.chmod(cache, mode)
        if use == "cache info":
            kind, detail, _ = cli("cache", "info", "--cache-dir", cache)
        else:
            kind, detail = _read(url, truth, cache, False)
        if os.listdir(cache):
            return "silent", f"written into the open cache folder: {os.listdir(cache)[:3]}"
        if kind == "ok":
            return "silent", f"a cache folder of mode {mode:04o} was used"
        return kind, detail
    return fn


# -- two exports into one OUT ----------------------------------------------------------------------

# an export that stops right after it takes OUT's lock until the other has run
PAUSED, RACING = "the second starts while the first holds OUT's lock", "both started together"
EXPORTS = [(PAUSED, 0.0, False), (PAUSED, 0.0, True)] + [
    (RACING, delay, overwrite) for delay in (0.0, 0.005, 0.02) for overwrite in (False, True)]


def export_tries(timeout: float) -> list[Try]:
    """Two ``export --to webdataset`` into one OUT at once (the second with or without
    --overwrite): one completes and OUT is what it writes alone; the other is refused in one
    line, or (started after the first ended, with --overwrite) completes too."""
    return [Try(EXPORT, "two export --to webdataset into one OUT at once (right: one "
                "completes intact, the other one line)",
                dict(how=how, second_after=f"{delay * 1000:g} ms", overwrite=overwrite),
                _export_fn(how, delay, overwrite), timeout)
            for how, delay, overwrite in EXPORTS]


def _small_dataset(work: Path) -> Path:
    from benchmarks.testbed import make_tree

    make_tree(work / "src", {f"c{i % 2}/{i:03d}.bin": os.urandom(700 + i) for i in range(12)})
    shardpack.pack(work / "src", work / "ds", shard_size="3KB", workers=1)
    return work / "ds"


def _export_fn(how, delay, overwrite):
    def fn(work: Path):
        from benchmarks.testbed import read_tree

        ds, out = _small_dataset(work), work / "out"
        ready, go = work / "ready", work / "go"

        def first():
            if how == PAUSED:
                _pause_after_lock(ready, go)
            return cli("export", ds, out, "--to", "webdataset")[:2]

        def second():
            if how == PAUSED:
                _wait_for(ready)
            time.sleep(delay)
            try:
                return cli("export", ds, out, "--to", "webdataset",
                           *(["--overwrite"] if overwrite else []))[:2]
            finally:
                go.touch()

        got = fork_all([first, second], 60)
        kind, detail = worst(got)
        if kind not in ("ok", "clear error"):
            return kind, detail
        done = [k for k, _ in got if k == "ok"]
        if not done:
            return "silent", f"neither export completed: {got}"
        if len(done) == 2 and not overwrite:
            return "silent", "both exports completed into one OUT without --overwrite"
        cli("export", ds, work / "alone", "--to", "webdataset")
        if read_tree(out) != read_tree(work / "alone"):
            return "silent", f"OUT is not what one export writes ({got})"
        return kind, detail
    return fn


def _pause_after_lock(ready: Path, go: Path) -> None:
    """In the first export's process: once it holds OUT's lock, say so and wait for ``go``."""
    from shardpack.write import outdir

    enter = outdir.OutLock.__enter__

    def paused(self):
        held = enter(self)
        ready.touch()
        _wait_for(go)
        return held

    outdir.OutLock.__enter__ = paused


def _wait_for(path: Path, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
