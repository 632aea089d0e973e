"""``shardpack info``, ``ls``, ``cat``, ``verify`` and ``preview``: thin commands over
:mod:`shardpack.inspect.listing`, :func:`shardpack.inspect.verify.verify` and
:func:`shardpack.inspect.preview.preview`."""

from __future__ import annotations

import json
import sys

import click

from shardpack.cli.common import parse_storage_options, quiet_option, show_progress, storage_option
from shardpack.core.sizes import plural


@click.command()
@click.argument("dataset")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--stats", is_flag=True,
              help="Also: samples per class (text bars), per-field size percentiles (from the "
                   "indexes), image sizes (from the headers of a random --sample of images) "
                   "and imbalance warnings.")
@click.option("--sample", type=click.IntRange(min=1), default=2000, show_default=True,
              help="With --stats: images whose headers are read; also samples whose labels "
                   "are read when the keys do not carry the class (not an ImageFolder pack).")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=str), default=None,
              metavar="FILE", help="Write the class histogram as a PNG (implies --stats; "
                                   "needs matplotlib: pip install 'shardpack[plot]').")
@storage_option
def info(dataset, as_json, stats, sample, plot, storage_options):
    """Samples, shards, bytes, fields, classes, format and compression of DATASET."""
    from shardpack.inspect.listing import dataset_info
    from shardpack.inspect.sampling import require_plot

    if plot is not None:
        require_plot()  # before any work
    found = dataset_info(dataset, storage_options=parse_storage_options(storage_options),
                         stats=stats or plot is not None, sample=sample)
    if as_json:  # the manifest as written, newer keys included
        click.echo(json.dumps(found.to_json(), indent=1, sort_keys=True, ensure_ascii=False))
    else:
        for line in found.lines():
            click.echo(line)
    if plot is not None:  # after the figures: a plot it cannot draw does not hide them
        found.stats.plot(plot)
        if not as_json:
            click.echo(f"plot      {plot}")


@click.command(name="ls")
@click.argument("dataset")
@click.option("--long", "-l", "long_", is_flag=True, help="Also shard, fields and sizes.")
@storage_option
def ls_(dataset, long_, storage_options):
    """List the keys of DATASET in stored order, one a line.

    A key (or, with --long, a field name) holding a control character (newline, tab, ...), a
    line separator or bytes that are not UTF-8, or starting with $', is printed in the shell's
    $'...' quoting: \\n \\r \\t \\\\ \\' as such, other control characters and
    non-UTF-8 bytes as \\xHH, C1 controls and line separators as \\uHHHH.  Pasted into bash
    or zsh it is the key again (shardpack cat DATASET $'a\\nb')."""
    from shardpack.inspect.listing import list_keys

    out = sys.stdout
    for line in list_keys(dataset, storage_options=parse_storage_options(storage_options),
                          long=long_):
        out.write(line + "\n")


@click.command()
@click.argument("dataset")
@click.argument("key")
@click.option("--field", "-f", default=None, help="Field to print (required when the sample "
              "has more than one).")
@storage_option
def cat(dataset, key, field, storage_options):
    """Write the bytes of one field of sample KEY to stdout."""
    from shardpack.inspect.listing import read_field

    data = read_field(dataset, key, field,
                      storage_options=parse_storage_options(storage_options))
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


@click.command()
@click.argument("dataset")
@click.option("--decode", is_flag=True,
              help="Also decode every image field in full (Pillow): names images that are "
                   "complete files but corrupt inside. Slower: a few ms per image.")
@quiet_option
@storage_option
def verify(dataset, decode, quiet, storage_options):
    """Re-hash every shard and index and check every record of DATASET.

    Exits 0 when all is well, 1 after listing each bad shard or sample."""
    from shardpack.inspect.verify import verify as run_verify

    report = run_verify(dataset, storage_options=parse_storage_options(storage_options),
                        progress=show_progress(quiet), decode=decode)
    for problem in report.problems:
        click.echo(f"BAD {problem}")
    status = "OK" if report.ok else f"FAILED ({plural(len(report.problems), 'problem')})"
    click.echo(f"{status}: {plural(report.shards, 'shard')}, "
               f"{plural(report.samples, 'sample')}, {report.bytes / 1e6:,.1f} MB checked")
    sys.exit(0 if report.ok else 1)


@click.command()
@click.argument("dataset")
@click.option("--out", default=None, type=click.Path(dir_okay=False, path_type=str),
              help="File to write [default: preview.png, or preview.html with --html].")
@click.option("-n", "--n", "n", type=click.IntRange(1, 10000), default=64, show_default=True,
              help="Samples on the sheet.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Which random samples (same seed, same sheet).")
@click.option("--first", is_flag=True, help="The first samples in stored order, not random.")
@click.option("--class", "class_name", default=None, metavar="NAME",
              help="Only samples of class NAME (a class of the manifest; without classes, "
                   "the label's value).")
@click.option("--key", "key_prefix", default=None, metavar="PREFIX",
              help="Only samples whose key starts with PREFIX.")
@click.option("--cell", type=click.IntRange(32, 1024), default=128, show_default=True,
              help="Side of each image cell in pixels.")
@click.option("--columns", type=click.IntRange(min=1), default=None,
              help="Cells per row [default: square-ish].")
@click.option("--field", "-f", default=None,
              help="The image field [default: as the decode finds it: the one image field, "
                   "or the one named by an extension alone].")
@click.option("--html", "as_html", is_flag=True,
              help="Write a self-contained HTML page (images inline) instead of a PNG.")
@storage_option
def preview(dataset, out, n, seed, first, class_name, key_prefix, cell, columns, field,
            as_html, storage_options):
    """Draw N samples of DATASET on a contact sheet: each image with its key and label.

    Local or remote datasets: only the samples shown are read (one ranged read each, checked
    against the index hash), never whole shards. A sample whose image does not decode gets a
    cell marked in red with the reason.

    \b
    Examples:
      shardpack preview /fast/train --out sheet.png
      shardpack preview /fast/train --class n01440764 --n 32 --seed 3
      shardpack preview https://host/ds --key val/ --first --html --out val.html
    """
    from shardpack.inspect.preview import PreviewOptions
    from shardpack.inspect.preview import preview as run_preview

    opts = PreviewOptions(n=n, seed=seed, first=first, class_name=class_name,
                          key_prefix=key_prefix, cell=cell, columns=columns, field=field,
                          html=as_html)
    out = out or ("preview.html" if as_html else "preview.png")
    summary = run_preview(dataset, out, opts,
                          storage_options=parse_storage_options(storage_options))
    for line in summary.notes:
        click.echo(f"note: {line}", err=True)
    for line in summary.reasons[:10]:
        click.echo(f"marked: {line}", err=True)
    if summary.marked > 10:
        click.echo(f"marked: ... and {summary.marked - 10:,} more", err=True)
    click.echo(summary.line())


COMMANDS = (info, ls_, cat, verify, preview)
