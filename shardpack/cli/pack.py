"""``shardpack pack``, ``convert`` and ``merge``: thin commands over :func:`shardpack.pack`,
:func:`shardpack.convert` and :func:`shardpack.merge`.

The options of ``pack`` and ``convert`` are the fields of
:class:`~shardpack.write.options.PackOptions` (:func:`~shardpack.cli.options.click_options`), with
their help text; only what is the command line's own (``-q``, ``-o``, ``--from``, ...) is written
here.  The Python functions are looked up when a command runs, so the command line starts without
importing the packer.
"""

from __future__ import annotations

import click

from shardpack.cli.common import (
    echo_summary, parse_storage_options, quiet_option, show_progress, storage_option,
)
from shardpack.cli.options import click_options
from shardpack.interop.convert import FORMATS
from shardpack.write.options import PackOptions


@click.command()
@click.argument("src", type=click.Path(path_type=str))
@click.argument("out", type=str)
@click_options(PackOptions, "pack")
@quiet_option
@storage_option
def pack(src, out, quiet, storage_options, **options):
    """Pack the files under SRC into shards at OUT.

    SRC is a folder (local, or a URL such as s3://bucket/tree) or a .csv/.jsonl listing with a
    `path` column; OUT a folder or URL. In an ImageFolder tree
    (class folders) every image file is one sample (`cat/IMG_2019.01.05.JPEG` -> key
    `cat/IMG_2019.01.05`, field `JPEG`, plus `cls`), with sidecars such as
    `cat/IMG_2019.01.05.json`. Other trees group WebDataset-style: `a/0001.jpg` +
    `a/0001.json` = one sample with key `a/0001`. OUT must be empty unless --resume or
    --overwrite; OUT inside SRC is left out of the walk. Broken images stop the pack
    (see --check, --skip-bad) and nothing is published.
    """
    from shardpack.write.pack import pack as run_pack

    summary = run_pack(src, out, **options, progress=show_progress(quiet),
                       storage_options=parse_storage_options(storage_options))
    echo_summary(summary)


@click.command()
@click.argument("src", type=str)
@click.argument("out", type=str)
@click.option("--from", "from_", type=click.Choice(("auto",) + FORMATS), default="auto",
              show_default=True,
              help="Format of SRC. auto: a .tar/.tgz file or folder of them = webdataset; "
                   "index.json = MDS or LitData (read from it); .parquet file or folder = "
                   "parquet; .csv/.jsonl = listing; a folder of class folders = imagefolder.")
@click.option("--allow-pickle", is_flag=True,
              help="Accept pickle-encoded columns (MDS `pkl`, LitData `pickle`) and carry their "
                   "bytes unchanged. Refused by default: unpickling them later runs code from "
                   "the file.")
@click_options(PackOptions, "convert")
@quiet_option
@storage_option
def convert(src, out, from_, allow_pickle, quiet, storage_options, **options):
    """Convert a WebDataset, MDS, LitData, Parquet/Hugging Face, ImageFolder or CSV/JSONL
    dataset at SRC into a shardpack dataset at OUT.

    Field bytes and labels are kept exactly; source metadata the manifest cannot hold is
    reported as `note:` lines and recorded in the manifest. SRC may be local or remote
    (s3://, https://; -o options apply to SRC and OUT). Same shard options as `pack`.

    \b
    Examples:
      shardpack convert /data/wds-shards out/            # a folder of .tar shards
      shardpack convert s3://bucket/mds-train out/ -o client_kwargs.endpoint_url=http://host:9000
      shardpack convert train.parquet out/ --format msgpack
    """
    from shardpack.interop.convert import convert as run_convert

    summary = run_convert(src, out, from_=from_, allow_pickle=allow_pickle,
                          **options, progress=show_progress(quiet),
                          storage_options=parse_storage_options(storage_options))
    echo_summary(summary)


@click.command()
@click.argument("parts", nargs=-1, required=True, metavar="PART...")
@click.argument("out", type=str)
@click.option("--overwrite", is_flag=True,
              help="Replace the dataset already in OUT (what a previous pack or merge wrote).")
@quiet_option
@storage_option
def merge(parts, out, overwrite, quiet, storage_options):
    """Merge the finished datasets PART... into one dataset at OUT.

    Each PART must be a finished shardpack dataset (its manifest present). All parts must agree
    on format version, --format, --compression, layout, grouping, --resize/--quality and the
    class list (cls values index into it), and no sample key may be in two parts. Parts made
    by `pack --part I/N` must be the whole split, 0 to N-1, and are merged in part order
    whatever order they are given in; other parts are merged in the order given.

    OUT gets every shard and index of the parts, renumbered shard-00000... in merge order, and
    a manifest written last. Files are hard-linked when the part and OUT are local and on one
    file system (no bytes copied); copied server-side when both are on one object store
    (s3://, ...); otherwise copied through this machine and hashed on the way. The parts are
    left untouched (only read). OUT must be empty unless --overwrite; on an error nothing is
    published and what the merge put into OUT is removed.

    \b
    Examples:
      shardpack pack data/ p0 --part 0/2 && shardpack pack data/ p1 --part 1/2
      shardpack merge p0 p1 /fast/ds
      shardpack merge s3://bucket/p0 s3://bucket/p1 s3://bucket/ds
    """
    from shardpack.write.merge import merge as run_merge

    summary = run_merge(parts, out, storage_options=parse_storage_options(storage_options),
                        overwrite=overwrite, progress=show_progress(quiet))
    for line in summary.notes:
        click.echo(f"note: {line}", err=True)
    click.echo(summary.line())


COMMANDS = (pack, convert, merge)
