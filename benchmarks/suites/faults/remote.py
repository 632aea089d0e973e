"""The faults suite's remote families: a misbehaving HTTP server, and
the shard cache (damaged cached copies, a file as cache_dir, a read-only cache, one corrupt cached
file read by several processes).  Servers are testbed/servers.py's, on 127.0.0.1 only: the
project's FaultServer (started inside each try's own process, so its state is the try's) and
nginx (one for the cache family, started by the benchmark)."""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path

import shardpack
from shardpack import storage as storage_module

from .local import check_kwargs, damage_grid, epoch_items, two_epochs
from .run import Try, cli, fork_all, read_epochs, worst

FAST_RETRY = storage_module.RetryPolicy(attempts=5, base_delay=0.01, max_delay=0.05)


def fast_retries() -> None:
    """In a try's process: the default policy's 5 attempts and 30 s per-read timeout, with 10-50
    ms between attempts instead of 0.2 s doubling (the waits only make a run slower)."""
    init = storage_module.Storage.__init__

    def patched(self, url, storage_options=None, retry=None):
        init(self, url, storage_options, retry or FAST_RETRY)

    storage_module.Storage.__init__ = patched


# -- a misbehaving HTTP server ------------------------------------------------------------------

def big_dataset(root: Path) -> tuple[Path, dict]:
    """Two shards of ~9.6 MB (24 samples of 400 KB): a reader without a cache reads each in
    ranged chunks of about 8 MiB (shardpack.read.access.CHUNK_BYTES), so a range starts inside a
    shard, as a 206 for another range needs to show."""
    from benchmarks.testbed import fake_jpeg, make_tree

    src = make_tree(root / "src-big", {f"c{i % 2}/{i:03d}.jpg": fake_jpeg(400_000, seed=i)
                                       for i in range(48)})
    out = root / "ds-big"
    shardpack.pack(src, out, workers=1, max_samples=24)
    return out, {s["__key__"]: bytes(s["jpg"]) for s in shardpack.open_reader(out)}


TARGETS = ("manifest", "index", "index (cache)", "shard (ranges)", "shard (cache)")
WHOLE = ("manifest", "index", "index (cache)", "shard (cache)")  # read by whole-file GETs
PATTERN = {"manifest": "shardpack.json", "index": "*.idx", "index (cache)": "*.idx",
           "shard (ranges)": "shard-*.tar", "shard (cache)": "shard-*.tar"}

# fault name -> (FaultMode fields, what a right answer is, targets it applies to).  Targets:
# "manifest", "index", "shard" (read in ranges without a cache, downloaded whole with one)
FAULTS = {
    "whole-file body short twice, then whole": (dict(short_body=100, times=2), "ok",
                                                WHOLE),
    "whole-file body always short": (dict(short_body=100), "clear", WHOLE),
    "206 from the start asked to the end of the file": (dict(content_range="to_end"), "ok",
                                                        ("shard (ranges)",)),
    "206 from byte 0 to the end asked": (dict(content_range="from_zero"), "ok",
                                         ("shard (ranges)",)),
    "206 with the first half of the range asked": (dict(content_range="short"), "clear",
                                                   ("shard (ranges)",)),
    "endless body, chunked": (dict(endless="chunked"), "clear", None),
    "endless body, Content-Length 1 TiB": (dict(endless="length"), "clear", None),
    "drip (1 byte / 5 s), request_deadline=0.5": (dict(drip_bps=0.2), "clear", None),
    "redirect to another host": (dict(redirect_to="OTHER"), "clear", None),
    "redirect to another host, follow_redirects_to_other_hosts": (
        dict(redirect_to="OTHER"), "ok", None),
    "503 twice, then served": (dict(status=503, times=2), "ok", None),
    "503 always": (dict(status=503), "clear", None),
    "connection reset mid-body twice, then served": (dict(reset_after=50, times=2), "ok",
                                                     None),
    "connection reset mid-body always": (dict(reset_after=50), "clear", None),
}


def remote_tries(small, big, timeout: float) -> list[Try]:
    """Each fault on each target it applies to, with and without trust_storage, per sample and
    batched (the manifest's faults once per trust setting: nothing after it differs)."""
    tries = []
    for fault, (mode, right, targets) in FAULTS.items():
        for target in targets or TARGETS:
            clean, truth = big if mode.get("content_range") else small
            readers = (False,) if target == "manifest" or "drip" in fault else (False, True)
            for trust in (False, True):
                for batched in readers:
                    params = dict(target=target, trust_storage=trust,
                                  reader="batched" if batched else "per sample")
                    row = f"{fault} (right: {'served' if right == 'ok' else 'one line'})"
                    tries.append(Try("remote (HTTP)", row, params, _remote_fn(
                        clean, truth, fault, mode, target, trust, batched), timeout))
    return tries


def _remote_fn(clean, truth, fault, mode, target, trust, batched):
    def fn(work: Path):
        from benchmarks.testbed import servers
        FaultServer = servers().FaultServer

        fast_retries()
        options = {}
        if "drip" in fault:
            options["request_deadline"] = 0.5
        if "follow_redirects" in fault:
            options["follow_redirects_to_other_hosts"] = True
        started = []
        try:
            given = dict(mode, only=[PATTERN[target]])
            if given.get("redirect_to") == "OTHER":
                started.append(FaultServer(clean).start())
                given["redirect_to"] = started[-1].url
            started.append(FaultServer(clean, **given).start())
            url = started[-1].url
            cache = work / "cache" if target.endswith("(cache)") else None

            def epochs():
                ds = shardpack.ShardDataset(url, shuffle=False, batch_size=4, batched=batched,
                                            trust_storage=trust, cache_dir=cache,
                                            storage_options=options)
                yield epoch_items(ds)
            return read_epochs(epochs(), truth)
        finally:
            for server in reversed(started):
                server.stop()
    return fn


# -- the cache --------------------------------------------------------------------------------

def cache_damage_tries(urls: dict, flips: int, seed: int, timeout: float) -> list[Try]:
    """The cached copy of shard 0 damaged between two epochs of one ShardDataset, or during the
    second: as the in-place family, on the copy in cache_dir of a dataset served by nginx."""
    tries = []
    rng = random.Random(seed)
    for shard_format, (url, clean, truth) in urls.items():
        size = (clean / shardpack.open_reader(clean).shards[0].name).stat().st_size
        for case, params, when, check, batched, damage in damage_grid(size, rng, flips):
            tries.append(Try("cache dir", f"cached copy {case}",
                             dict(format=shard_format, **params),
                             _cache_damage_fn(url, truth, check, batched, when, damage), timeout))
    return tries


def _cached_paths(reader) -> list[str]:
    cache = reader.access.cache
    return [cache.entry_path(reader.storage.url, s) for s in reader.shards]


def _cache_damage_fn(url, truth, check, batched, when, damage):
    def fn(work: Path):
        ds = shardpack.ShardDataset(url, shuffle=False, batch_size=4, batched=batched,
                                    prefetch_shards=0, cache_dir=work / "cache",
                                    **check_kwargs(check))
        return read_epochs(two_epochs(ds, lambda: damage(*_cached_paths(ds.reader)[:2]), when),
                           truth)
    return fn


def file_as_cache_tries(url: str, truth: dict, timeout: float) -> list[Try]:
    """A regular file where cache_dir should be (and a folder under it): each reader and each
    `shardpack cache` command; the file must be left alone."""
    tries = []
    for sub in (False, True):
        for how in ("per sample", "batched", "cache info", "cache prune", "cache clear"):
            params = dict(cache_dir="FILE/sub" if sub else "FILE", how=how)
            tries.append(Try("cache dir", "a regular file as cache_dir (right: one line)",
                             params, _file_as_cache_fn(url, truth, sub, how), timeout))
    return tries


def _file_as_cache_fn(url, truth, sub, how):
    def fn(work: Path):
        file = work / "not-a-folder"
        file.write_bytes(b"x")
        where = file / "sub" if sub else file
        if how.startswith("cache "):
            kind, detail, _ = cli("cache", how.split()[1], "--cache-dir", where)
        else:
            def epochs():
                yield epoch_items(shardpack.ShardDataset(
                    url, shuffle=False, batch_size=4, batched=how == "batched",
                    cache_dir=where))
            kind, detail = read_epochs(epochs(), truth)
        if file.read_bytes() != b"x":
            return "silent", f"the file at cache_dir was changed ({kind}: {detail})"
        if kind == "ok":
            return "silent", "read through a file as cache_dir without an error"
        return kind, detail
    return fn


def read_only_possible(scratch: Path) -> bool:
    """Whether this machine lets us bind-mount a folder read-only (root, and mounts allowed)."""
    a, view = scratch / "ro-probe", scratch / "ro-probe-view"
    a.mkdir(parents=True, exist_ok=True)
    view.mkdir(exist_ok=True)
    if subprocess.run(["mount", "--bind", "-o", "ro", str(a), str(view)],
                      capture_output=True).returncode != 0:
        return False
    try:
        return not os.access(view, os.W_OK)
    finally:
        subprocess.run(["umount", "-l", str(view)], capture_output=True)


READ_ONLY = {"warm (every shard cached)": "ok", "cold (empty)": "clear",
             "warm, shard 1 missing": "clear", "warm, shard 1 corrupt": "clear"}


def read_only_tries(urls: dict, timeout: float) -> list[Try]:
    """A cache folder filled ahead, then bind-mounted read-only and read through: served when
    warm, one line when cold or when a shard is missing or corrupt there (as root, chmod stops
    nothing: the mount is what makes it read-only)."""
    tries = []
    for shard_format, (url, _, truth) in urls.items():
        for state, right in READ_ONLY.items():
            for check in ("every", "once"):
                for batched in (False, True):
                    params = dict(format=shard_format, reader="batched" if batched
                                  else "per sample", check=check)
                    tries.append(Try(
                        "cache dir", f"read-only cache dir, {state} (right: "
                        f"{'served' if right == 'ok' else 'one line'})", params,
                        _read_only_fn(url, truth, state, check, batched), timeout))
    return tries


def _read_only_fn(url, truth, state, check, batched):
    def fn(work: Path):
        cache = work / "cache"
        if state.startswith("warm"):
            kind, detail = fork_all([lambda: read_epochs(
                [epoch_items(shardpack.ShardDataset(url, shuffle=False, cache_dir=cache))],
                truth)], 60)[0]
            if kind != "ok":
                return "other exception", f"filling the cache: {kind}: {detail}"
            if state.endswith("missing"):
                os.unlink(_cached_shard(cache, 1))
            elif state.endswith("corrupt"):
                flip_plain(_cached_shard(cache, 1), 100)
        else:
            cache.mkdir()
        view = work / "view"
        view.mkdir()
        if subprocess.run(["mount", "--bind", "-o", "ro", str(cache), str(view)],
                          capture_output=True).returncode != 0:
            return "other exception", "could not bind-mount the cache read-only"
        try:
            def epochs():
                yield epoch_items(shardpack.ShardDataset(
                    url, shuffle=False, batch_size=4, batched=batched, prefetch_shards=0,
                    cache_dir=view, **check_kwargs(check)))
            return read_epochs(epochs(), truth)
        finally:
            subprocess.run(["umount", "-l", str(view)], capture_output=True)
    return fn


def _cached_shard(cache: Path, n: int) -> str:
    """The cached copy of shard ``n`` (``<hash>-shard-0000n.tar`` or ``.spk``)."""
    [path] = [os.path.join(d, name) for d, _, names in os.walk(cache) for name in names
              if name.endswith((f"-shard-{n:05d}.tar", f"-shard-{n:05d}.spk"))]
    return path


def flip_plain(path, at: int) -> None:
    """One byte flipped in place (its mtime moves)."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


def shared_corrupt_tries(urls: dict, count: int, seed: int, timeout: float) -> list[Try]:
    """The cached copy of one shard flipped (its mtime moves, so its stamp fails), then several
    processes read the dataset through that cache at once: each must get every sample right,
    none may die of the file vanishing under it while another reader fetches it again."""
    tries = []
    rng = random.Random(seed)
    for shard_format, (url, clean, truth) in urls.items():
        size = (clean / shardpack.open_reader(clean).shards[0].name).stat().st_size
        for n in range(count):
            shard, at, procs = n % 2, rng.randrange(size), 2 + n % 3
            params = dict(format=shard_format, shard=shard, byte=at, processes=procs)
            tries.append(Try("cache dir", "one corrupt cached file read by several processes "
                             "at once (right: served)", params,
                             _shared_corrupt_fn(url, truth, shard, at, procs), timeout))
    return tries


def _shared_corrupt_fn(url, truth, shard, at, procs):
    def fn(work: Path):
        cache = work / "cache"
        kind, detail = fork_all([lambda: read_epochs(
            [epoch_items(shardpack.ShardDataset(url, shuffle=False, cache_dir=cache))],
            truth)], 60)[0]
        if kind != "ok":
            return "other exception", f"filling the cache: {kind}: {detail}"
        flip_plain(_cached_shard(cache, shard), at)
        start_at = time.time() + 0.3  # all readers start together

        def reader(i):
            def run():
                time.sleep(max(0.0, start_at - time.time()))
                ds = shardpack.ShardDataset(url, shuffle=False, batch_size=4, batched=i % 2 == 1,
                                            cache_dir=cache, prefetch_shards=i % 2)
                return read_epochs([epoch_items(ds)], truth)
            return run

        return worst(fork_all([reader(i) for i in range(procs)], 60))
    return fn
