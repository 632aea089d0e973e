"""The cache folder is trusted only as far as the cache made it: links planted where its
files, folders, lock file or temp files go are never followed (nothing outside the cache is
read, written or created), and a cache folder another user owns or can write is refused in
one line."""

import os
import stat
import subprocess
import time

import pytest

from shardpack import format as fmt
from shardpack.core.errors import CacheError
from shardpack.storage import cachefiles
from shardpack.storage.cache import LOCK_NAME, CacheItem, ShardCache

from testbed.helpers import run_cli

OLD = 1_000_000_000_000_000_000  # an access/modify time in 2001: any touch moves it


def _item(size: int = 50_000, name: str = "shard-00000.tar") -> tuple[CacheItem, bytes]:
    blob = os.urandom(size)
    return CacheItem(name, fmt.content_hash(blob), size), blob


def _download(blob: bytes, calls: list | None = None):
    def download(path):
        if calls is not None:
            calls.append(path)
        with open(path, "wb") as f:
            f.write(blob)
    return download


def _outside(tmp_path, kind: str):
    """A file (or a folder with a file in it) outside the cache, its times set far back."""
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "precious" if kind == "file" else outside / "folder"
    if kind == "file":
        target.write_bytes(b"precious")
    else:
        target.mkdir()
        (target / "inside").write_bytes(b"precious")
    for path in (target, outside):
        os.utime(path, ns=(OLD, OLD))
    return target


def _untouched(target) -> None:
    st = os.stat(target)
    assert (st.st_atime_ns, st.st_mtime_ns) == (OLD, OLD)
    if target.is_dir():
        assert sorted(os.listdir(target)) == ["inside"]
    else:
        assert target.read_bytes() == b"precious"
    assert sorted(os.listdir(target.parent)) == [target.name]
    os.utime(target, ns=(OLD, OLD))  # (looking moved its access time)


def _read(cache: ShardCache, item: CacheItem, blob: bytes, dataset: str = "dataset") -> str:
    entry = cache.open(dataset, item, _download(blob))
    try:
        assert os.pread(entry.fd, item.bytes + 1, 0) == blob
        assert stat.S_ISREG(os.lstat(entry.path).st_mode)
        return entry.path
    finally:
        entry.close()


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_link_where_a_cached_file_goes_is_replaced_never_followed(tmp_path, kind):
    """A link at the cached file's name (to a file or a folder outside): removed and the shard
    fetched; the target is not read, written nor touched (no access time)."""
    cache = ShardCache(tmp_path / "cache", 10**9)
    item, blob = _item()
    target = _outside(tmp_path, kind)
    path = cache.entry_path("dataset", item)
    os.makedirs(os.path.dirname(path), mode=0o755)
    os.symlink(target, path)
    assert _read(cache, item, blob) == path
    assert cache.stats["downloads"] == 1
    _untouched(target)


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_link_where_a_datasets_folder_goes_is_replaced_never_followed(tmp_path, kind):
    """A link at CACHE/<url hash> to a folder outside: the download does not go there (nor is
    the folder made through a dangling one); a real folder replaces the link."""
    cache = ShardCache(tmp_path / "cache", 10**9)
    item, blob = _item()
    target = _outside(tmp_path, kind)
    folder = os.path.dirname(cache.entry_path("dataset", item))
    os.symlink(target, folder)
    dangling = tmp_path / "cache" / "dangling"
    os.symlink(tmp_path / "outside" / "made", dangling)
    _read(cache, item, blob)
    assert not os.path.islink(folder) and os.path.isdir(folder)
    _untouched(target)
    cache.prune(limit=0)  # the other link goes too (removed itself, never followed)
    assert not os.path.lexists(dangling)
    _untouched(target)


def test_a_dangling_link_at_the_lock_file_is_refused_in_one_line(tmp_path):
    """The lock file's target is never created: a one-line CacheError naming it and how to fix
    it, from a reader and from the CLI; removing the link mends it."""
    root = tmp_path / "cache"
    cache = ShardCache(root, 10**9)
    item, blob = _item()
    target = tmp_path / "made-by-the-cache"
    lock = root / LOCK_NAME
    os.symlink(target, lock)
    with pytest.raises(CacheError) as err:
        cache.open("dataset", item, _download(blob))
    assert str(err.value) == (
        f"{lock}: the cache's lock file is not a regular file (a symbolic link?), which the "
        f"cache never makes: not followed (remove it (rm {lock}): the cache makes a new one)")
    for command in ("prune", "clear"):
        result = run_cli("cache", command, "--cache-dir", root, ok=False)
        assert result.exit_code == 2 and result.output == f"shardpack: error: {err.value}\n"
    assert not os.path.lexists(target) and os.path.islink(lock)
    os.unlink(lock)
    _read(cache, item, blob)


def test_a_link_at_the_next_temp_file_name_is_never_followed(tmp_path, monkeypatch):
    """A link planted at the temp name a download would take (pid and clock guessed): the
    look-up finds it at a temp name and removes it (nobody's download); made between the look-up
    and the temp file, it is skipped for another name.  The target is untouched either way."""
    cache = ShardCache(tmp_path / "cache", 10**9)
    item, blob = _item()
    target = _outside(tmp_path, "file")
    real = time.monotonic_ns
    path = cache.entry_path("dataset", item)
    os.makedirs(os.path.dirname(path), mode=0o755)
    planted = os.path.join(os.path.dirname(path),
                           f".{os.path.basename(path)}.tmp-{os.getpid()}-7")
    os.symlink(target, planted)
    guessed = iter([7])
    monkeypatch.setattr(cachefiles.time, "monotonic_ns", lambda: next(guessed, None) or real())
    calls = []
    cache.open("dataset", item, _download(blob, calls)).close()
    assert calls == [planted] and not os.path.lexists(planted)
    _untouched(target)

    os.symlink(target, planted)
    guessed = iter([7])
    folder = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        name, fd = cachefiles.make_temp(folder, os.path.basename(path))
        os.close(fd)
    finally:
        os.close(folder)
    assert name != os.path.basename(planted) and os.path.islink(planted)
    assert stat.S_ISREG(os.lstat(os.path.join(os.path.dirname(path), name)).st_mode)
    _untouched(target)


def test_links_are_removed_by_prune_and_clear_and_never_counted(tmp_path):
    cache = ShardCache(tmp_path / "cache", 10**9)
    item, blob = _item()
    path = _read(cache, item, blob)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 10**6)
    links = [os.path.join(os.path.dirname(path), "0" * 32 + "-shard-00001.tar"),
             str(tmp_path / "cache" / "1234567890abcdef")]
    for link in links:
        os.symlink(big, link)
    assert cache.usage()["bytes"] == item.bytes
    assert sorted(cache.prune()["removed"]) == sorted((link, 0) for link in links)
    assert big.stat().st_size == 10**6 and os.path.exists(path)
    os.symlink(big, links[0])
    assert cache.clear() == 2  # the link and the cached file
    assert big.stat().st_size == 10**6 and os.listdir(tmp_path / "cache") == [LOCK_NAME]


# -- who may write the cache folder --------------------------------------------------------------

def test_a_datasets_folder_others_can_write_stops_only_that_dataset(tmp_path):
    """A dataset's folder made group-writable (an older release under umask 002) is refused
    for that dataset, and left alone by every other: eviction, info and their reads go on."""
    root = tmp_path / "cache"
    cache = ShardCache(root, 150_000)
    item, blob = _item()
    kept = _read(cache, item, blob)
    old = os.path.dirname(kept)
    os.chmod(old, 0o775)
    with pytest.raises(CacheError, match="writable by other users"):
        cache.open("dataset", item, _download(blob))
    for n in range(4):  # more than the budget: eviction runs, and skips the refused folder
        other, other_blob = _item(50_000)
        _read(cache, other, other_blob, dataset=f"other-{n}")
    assert run_cli("cache", "info", "--cache-dir", root).exit_code == 0
    assert os.path.exists(kept)  # never evicted, never touched


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_a_cache_folder_others_can_write_is_refused_in_one_line(tmp_path, mode):
    """Others could plant links in it: refused, sticky bit or not (it keeps others from
    removing the cache's files, not from making the names first)."""
    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, mode)
    message = (f"{root}: the cache folder is writable by other users (mode {mode:04o}), who "
               f"could plant links in it: not used (chmod go-w {root}, or give a cache_dir of "
               f"your own)")
    with pytest.raises(CacheError) as err:
        ShardCache(root, 10**9)
    assert str(err.value) == message
    result = run_cli("cache", "info", "--cache-dir", root, ok=False)
    assert result.exit_code == 2 and result.output == f"shardpack: error: {message}\n"
    assert os.listdir(root) == []
    os.chmod(root, 0o755)
    ShardCache(root, 10**9)


def test_made_with_a_loose_umask_the_cache_still_trusts_its_own_folders(tmp_path):
    old = os.umask(0o002)
    try:
        cache = ShardCache(tmp_path / "cache", 10**9)
        item, blob = _item()
        path = _read(cache, item, blob)
    finally:
        os.umask(old)
    for folder in (tmp_path / "cache", os.path.dirname(path)):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o755
    _read(ShardCache(tmp_path / "cache", 10**9), item, blob)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_cache_folder_of_another_user_is_refused_in_one_line(tmp_path):
    root = tmp_path / "cache"
    cache = ShardCache(root, 10**9)
    item, blob = _item()
    path = _read(cache, item, blob)
    os.chown(os.path.dirname(path), 65534, 65534)  # a dataset's folder
    with pytest.raises(CacheError) as err:
        cache.open("dataset", item, _download(blob))
    assert str(err.value) == (
        f"{os.path.dirname(path)}: a folder of the cache belongs to another user (uid 65534), "
        f"who could plant links in it: not used (give a cache_dir of your own: cache_dir=, "
        f"--cache-dir or $SHARDPACK_CACHE)")
    # left alone by the others: info counts the rest, another dataset still reads and writes
    assert run_cli("cache", "info", "--cache-dir", root).exit_code == 0
    other, other_blob = _item(60_000)
    _read(cache, other, other_blob, dataset="other-dataset")
    os.chown(root, 65534, 65534)  # the cache folder
    message = (f"{root}: the cache folder belongs to another user (uid 65534), who could plant "
               f"links in it: not used (give a cache_dir of your own: cache_dir=, --cache-dir or "
               f"$SHARDPACK_CACHE)")
    for attempt in (lambda: ShardCache(root, 10**9), lambda: cache.open("dataset", item, None)):
        with pytest.raises(CacheError) as err:
            attempt()
        assert str(err.value) == message
    result = run_cli("cache", "prune", "--cache-dir", root, ok=False)
    assert result.exit_code == 2 and result.output == f"shardpack: error: {message}\n"


@pytest.fixture
def read_only_copy(tmp_path):
    """A read-only bind mount of a folder (skipped where mounting is not allowed)."""
    views = []

    def make(folder):
        view = tmp_path / "ro"
        view.mkdir()
        done = subprocess.run(["mount", "--bind", "-o", "ro", str(folder), str(view)],
                              capture_output=True, text=True)
        if done.returncode != 0 or os.access(view, os.W_OK):
            pytest.skip(f"cannot bind-mount a folder read-only here: {done.stderr.strip()}")
        views.append(view)
        return view

    yield make
    for view in views:
        subprocess.run(["umount", "-l", str(view)], capture_output=True)


def test_a_link_in_a_read_only_cache_is_refused_in_one_line(tmp_path, read_only_copy):
    root = tmp_path / "cache"
    item, blob = _item()
    path = _read(ShardCache(root, 10**9), item, blob)
    target = _outside(tmp_path, "file")
    os.unlink(path)
    os.symlink(target, path)
    view = read_only_copy(root)
    cache = ShardCache(view, 10**9)
    assert cache.read_only
    seen = os.path.join(view, os.path.relpath(path, root))
    with pytest.raises(CacheError) as err:
        cache.open("dataset", item, _download(blob))
    assert str(err.value) == (f"{seen}: a symbolic link is where the cache keeps a cached file: "
                              f"not followed, and the cache folder is read-only (remove it where "
                              f"the cache is writable)")
    _untouched(target)
