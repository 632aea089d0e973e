"""``shardpack unpack`` and ``export``: thin commands over :func:`shardpack.interop.unpack.unpack`
and :func:`shardpack.export`."""

from __future__ import annotations

import click

from shardpack.cli.common import (
    echo_summary, parse_storage_options, quiet_option, show_progress, storage_option,
)
from shardpack.interop.export import EXPORT_FORMATS
from shardpack.interop.pixelsout import PIXELS_AS


PIXELS_AS_OPTION = click.option(
    "--pixels-as", "pixels_as", type=click.Choice(PIXELS_AS), default="npy", show_default=True,
    help="Raw-pixel fields (pack --pixels): npy, as stored (numpy reads them); png, encoded "
         "again as lossless PNG files (x.rgb.npy becomes x.png).")


@click.command()
@click.argument("dataset")
@click.argument("out", type=click.Path(path_type=str))
@PIXELS_AS_OPTION
@quiet_option
@storage_option
def unpack(dataset, out, pixels_as, quiet, storage_options):
    """Write DATASET back to files, OUT/<key>.<field>. OUT must not exist or be empty.

    Never writes outside OUT: absolute names, '..', links and devices are refused."""
    from shardpack.interop.unpack import unpack as run_unpack

    count = run_unpack(dataset, out, storage_options=parse_storage_options(storage_options),
                       progress=show_progress(quiet), pixels_as=pixels_as)
    click.echo(f"unpacked {count:,} files into {out}")


@click.command()
@click.argument("dataset")
@click.argument("out", type=str)
@click.option("--to", "to", type=click.Choice(EXPORT_FORMATS), required=True,
              help="webdataset: tar shards the webdataset library reads (<key>.<field> members); "
                   "files: a file tree OUT/<key>.<field> (like unpack); parquet: one column "
                   "per field, images as binary.")
@click.option("--shard-size", default="256MB", show_default=True,
              help="Target size of each output tar or Parquet file.")
@click.option("--overwrite", is_flag=True, help="Replace what OUT holds.")
@PIXELS_AS_OPTION
@quiet_option
@storage_option
def export(dataset, out, to, shard_size, overwrite, pixels_as, quiet, storage_options):
    """Write DATASET out in another format: WebDataset tar shards, plain files or Parquet."""
    from shardpack.interop.export import export as run_export

    summary = run_export(dataset, out, to=to,
                         storage_options=parse_storage_options(storage_options),
                         shard_size=shard_size, overwrite=overwrite,
                         progress=show_progress(quiet), pixels_as=pixels_as)
    echo_summary(summary)


COMMANDS = (unpack, export)
