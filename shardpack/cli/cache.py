"""``shardpack cache info|clear|prune``: thin commands over
:class:`shardpack.storage.cache.ShardCache`."""

from __future__ import annotations

import click

from shardpack.core.sizes import plural


@click.group()
def cache():
    """Inspect, prune or clear the local shard cache used for remote datasets."""


cache_dir_option = click.option("--cache-dir", default=None,
                                 help="Cache folder [default: $SHARDPACK_CACHE or "
                                      "~/.cache/shardpack].")


@cache.command(name="info")
@cache_dir_option
def cache_info(cache_dir):
    """Shards and indexes held in the cache, and their bytes."""
    from shardpack.storage.cache import ShardCache, default_cache_dir

    usage = ShardCache(cache_dir or default_cache_dir(), 0).usage()
    click.echo(f"{usage['dir']}: {plural(usage['shards'], 'shard')} "
               f"({usage['shard_bytes'] / 1e6:,.1f} MB), "
               f"{plural(usage['indexes'], 'index', 'indexes')} "
               f"({usage['index_bytes'] / 1e6:,.1f} MB), {usage['bytes'] / 1e6:,.1f} MB in all")


@cache.command(name="clear")
@cache_dir_option
def cache_clear(cache_dir):
    """Delete every cached shard and index no process is reading right now."""
    from shardpack.storage.cache import ShardCache, default_cache_dir

    removed = ShardCache(cache_dir or default_cache_dir(), 0).clear()
    click.echo(f"removed {plural(removed, 'cached file')}")  # shards and indexes


@cache.command(name="prune")
@cache_dir_option
@click.option("--limit", default="50GB", show_default=True, metavar="SIZE",
              help="Bring the cache under this many bytes (e.g. 20GB, 500MiB); the default is "
                   "the default cache_limit of a dataset.")
def cache_prune(cache_dir, limit):
    """Evict the least recently used cached files no process is reading until the cache fits
    --limit, and delete what killed downloads left; print each file removed."""
    from shardpack.storage.cache import ShardCache, default_cache_dir
    from shardpack.core.sizes import parse_size

    cache = ShardCache(cache_dir or default_cache_dir(), parse_size(limit))
    result = cache.prune()
    for path, size in result["removed"]:
        click.echo(f"removed {path} ({size / 1e6:,.1f} MB)")
    left = (f"{plural(len(result['removed']), 'file')} removed "
            f"({sum(size for _, size in result['removed']) / 1e6:,.1f} MB); the cache holds "
            f"{plural(result['files'], 'file')}, {result['bytes'] / 1e6:,.1f} MB, limit "
            f"{cache.limit / 1e6:,.1f} MB")
    if result["bytes"] > cache.limit:  # what is left over it is in use: never evicted
        left += "; the files over the limit are in use by a reading process, try again later"
    click.echo(left)


COMMANDS = (cache,)
