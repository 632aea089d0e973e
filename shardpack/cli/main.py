"""The ``shardpack`` command line."""

from __future__ import annotations

import json
import sys

import click

from shardpack.core.version import __version__
from shardpack import format as fmt
from shardpack.write.engine import ENGINES
from shardpack.core.errors import ShardpackError
from shardpack.core.sizes import plural
from shardpack.write.plan import CHECKS
from shardpack.write.samples import GROUPS


class _Group(click.Group):
    """Turns every ShardpackError into one line on stderr and exit status 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ShardpackError as exc:
            click.echo(f"shardpack: error: {exc}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo(f"shardpack: interrupted{self._resume_hint(ctx)}", err=True)
            sys.exit(130)

    def _resume_hint(self, ctx) -> str:
        """For a command that can finish an interrupted run (pack, convert): how to, since the
        complete shards it wrote are kept for that."""
        name = ctx.invoked_subcommand
        command = self.get_command(ctx, name) if name else None
        if command is None or not any(p.name == "resume" for p in command.params):
            return ""
        return f"; to finish it, run the same `shardpack {name}` command again with --resume"


def _parse_options(pairs) -> dict:
    """``-o key=value`` pairs -> fsspec storage_options; dotted keys nest
    (``client_kwargs.endpoint_url=http://127.0.0.1:8333``); values are JSON when they parse."""
    options: dict = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ShardpackError(f"storage option {pair!r} is not KEY=VALUE")
        try:
            value = json.loads(value)
        except ValueError:
            pass
        node = options
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return options


storage_option = click.option(
    "-o", "--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
    help="fsspec storage option for remote paths, repeatable; dotted keys nest, e.g. "
         "-o client_kwargs.endpoint_url=http://127.0.0.1:8333 -o key=ID -o secret=KEY. "
         "S3 credentials and endpoint also come from the usual AWS_* variables.")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="shardpack")
def main():
    """Pack small files into large indexed shards and stream them into PyTorch training.

    \b
    Typical use:
      shardpack pack ~/data/train /fast/train-shards     # files -> shards + manifest
      shardpack info /fast/train-shards                  # what is in it
      shardpack verify /fast/train-shards                # re-hash and check every record
    """


def _shard_options(fn):
    """The options ``pack`` and ``convert`` share (what the shards look like, how to run)."""
    options = [
        click.option("--format", "shard_format", type=click.Choice(fmt.SHARD_FORMATS),
                     default="tar", show_default=True,
                     help="tar: plain POSIX tar that WebDataset and `tar` read; msgpack: "
                          "shardpack's own records, cheaper to parse, CRC32C per record."),
        click.option("--shard-size", default="256MB", show_default=True,
                     help="Target shard size (B, KB, MB, GB, KiB, MiB, GiB). A sample larger "
                          "than this goes alone into its own shard."),
        click.option("--max-samples", type=click.IntRange(min=1), default=None,
                     help="Also end a shard after this many samples [default: 100,000]."),
        click.option("--compression", type=click.Choice(fmt.COMPRESSIONS), default="none",
                     show_default=True, help="Per-record zstd (msgpack shards only)."),
        click.option("--zstd-level", type=click.IntRange(1, 22), default=3, show_default=True),
        click.option("--workers", type=click.IntRange(min=1), default=None,
                     help="Processes writing shards in parallel [default: all cores]. With "
                          "--engine dask/ray and no --address: the size of the local cluster "
                          "started for this run."),
        click.option("--engine", type=click.Choice(ENGINES), default="local",
                     show_default=True,
                     help="Where the walk and the shard tasks run. local: processes on this "
                          "machine; dask: a Dask cluster (pip install 'shardpack[dask]'); ray: "
                          "a Ray cluster (pip install 'shardpack[ray]'). Workers read SRC and "
                          "write OUT themselves: use paths every worker sees, or URLs."),
        click.option("--address", default=None, metavar="ADDR",
                     help="The cluster to use: a Dask scheduler (tcp://host:8786) or a Ray "
                          "address (auto, ray://host:10001). Without it dask and ray start a "
                          "local cluster for this run and stop it after."),
        click.option("--resize", type=click.IntRange(min=1), default=None,
                     metavar="SHORT_SIDE",
                     help="Shrink JPEG/PNG/WebP images so the shorter side is SHORT_SIDE "
                          "(never upscales), once, at pack time."),
        click.option("--quality", type=click.IntRange(1, 100), default=90, show_default=True,
                     help="JPEG/WebP quality when --resize re-encodes."),
        click.option("--check", type=click.Choice(CHECKS), default="quick",
                     show_default=True,
                     help="Image check while packing. quick: headers and end markers, no "
                          "decode (empty files, HTML saved as .png, truncated images); full: "
                          "also decode every image in full, as training does (about 0.8 ms an "
                          "image); none: no check."),
        click.option("--skip-bad", is_flag=True,
                     help="Skip and count bad entries (special files, broken or outside links, "
                          "unreadable or changing files, broken images, two images with one "
                          "key, bad samples of a converted source) instead of stopping at the "
                          "first."),
        click.option("--resume", is_flag=True,
                     help="Continue an interrupted run into OUT: keeps complete shards, redoes "
                          "the rest."),
        click.option("--overwrite", is_flag=True, help="Replace the dataset already in OUT."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bar."),
        storage_option,
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _report(summary) -> None:
    if hasattr(summary, "report_lines"):
        lines = summary.report_lines()
    else:
        lines = ([f"skipped: {line}" for line in summary.first_skips[:10]]
                 + [f"note: {line}" for line in getattr(summary, "notes", [])])
    for line in lines:
        click.echo(line, err=True)
    click.echo(summary.line())


@main.command()
@click.argument("src", type=click.Path(path_type=str))
@click.argument("out", type=str)
@click.option("--layout", type=click.Choice(["auto", "imagefolder", "files"]), default="auto",
              show_default=True, help="imagefolder: class subfolders add an integer field `cls`; "
              "auto picks it when every top-level entry is a folder.")
@click.option("--group", type=click.Choice(GROUPS), default="auto",
              show_default=True,
              help="How files make samples. image: each image file is one sample, key = its "
                   "path without the last extension (dots kept), same-stem files join it as "
                   "fields, other files are ignored and counted; webdataset: key = path up to "
                   "the first dot of the name (0001.jpg + 0001.seg.png). auto: image for "
                   "ImageFolder trees of images, webdataset otherwise.")
@click.option("--follow-links", is_flag=True,
              help="Pack what links leading outside SRC point to, files and folders alike "
                   "(counted in the summary). Without it such a link is an error naming it, "
                   "or skipped and counted as link-outside with --skip-bad. Links inside SRC "
                   "always work; a link loop is an error naming it (link-loop with --skip-bad).")
@click.option("--allow-empty-classes", is_flag=True,
              help="Keep a class folder that holds no sample as a class (its label is taken, "
                   "as torchvision's ImageFolder(allow_empty=True)). Without it such a folder "
                   "is an error naming it.")
@click.option("--part", default=None, metavar="I/N",
              help="Pack only part I of N (counted from 0): the samples whose key hashes to "
                   "I. Run the N parts anywhere (one job per node), then `shardpack merge`.")
@_shard_options
def pack(src, out, storage_options, shard_format, shard_size, max_samples, compression,
         zstd_level, workers, engine, address, resize, quality, layout, group, check, part,
         follow_links, allow_empty_classes, skip_bad, resume, overwrite, quiet):
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

    summary = run_pack(src, out, format=shard_format, shard_size=shard_size,
                       max_samples=max_samples, compression=compression, zstd_level=zstd_level,
                       resize=resize, quality=quality, skip_bad=skip_bad, layout=layout,
                       group=group, check=check, follow_links=follow_links,
                       allow_empty_classes=allow_empty_classes, workers=workers, engine=engine,
                       address=address, part=part, resume=resume, overwrite=overwrite,
                       progress=not quiet and sys.stderr.isatty(),
                       storage_options=_parse_options(storage_options))
    _report(summary)


CONVERT_FROM = ["auto", "webdataset", "mds", "litdata", "parquet", "imagefolder", "csv", "jsonl"]


@main.command()
@click.argument("src", type=str)
@click.argument("out", type=str)
@click.option("--from", "from_", type=click.Choice(CONVERT_FROM), default="auto",
              show_default=True,
              help="Format of SRC. auto: a .tar/.tgz file or folder of them = webdataset; "
                   "index.json = MDS or LitData (read from it); .parquet file or folder = "
                   "parquet; .csv/.jsonl = listing; a folder of class folders = imagefolder.")
@click.option("--allow-pickle", is_flag=True,
              help="Accept pickle-encoded columns (MDS `pkl`, LitData `pickle`) and carry their "
                   "bytes unchanged. Refused by default: unpickling them later runs code from "
                   "the file.")
@click.option("--label-column", default=None, metavar="NAME",
              help="Parquet only: the column NAME becomes the class label field `cls` "
                   "(integers as they are; strings as their index among the sorted distinct "
                   "values, which become the manifest's classes).")
@_shard_options
def convert(src, out, from_, allow_pickle, label_column, storage_options, shard_format,
            shard_size, max_samples, compression, zstd_level, workers, engine, address, resize,
            quality, check, skip_bad, resume, overwrite, quiet):
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
                          label_column=label_column, format=shard_format,
                          shard_size=shard_size, max_samples=max_samples,
                          compression=compression, zstd_level=zstd_level, resize=resize,
                          quality=quality, skip_bad=skip_bad, check=check, workers=workers,
                          engine=engine, address=address, resume=resume, overwrite=overwrite,
                          progress=not quiet and sys.stderr.isatty(),
                          storage_options=_parse_options(storage_options))
    _report(summary)


@main.command()
@click.argument("parts", nargs=-1, required=True, metavar="PART...")
@click.argument("out", type=str)
@click.option("--overwrite", is_flag=True,
              help="Replace the dataset already in OUT (what a previous pack or merge wrote).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
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

    summary = run_merge(parts, out, storage_options=_parse_options(storage_options),
                        overwrite=overwrite, progress=not quiet and sys.stderr.isatty())
    for line in summary.notes:
        click.echo(f"note: {line}", err=True)
    click.echo(summary.line())


@main.command()
@click.argument("dataset")
@click.argument("out", type=str)
@click.option("--to", "to", type=click.Choice(["webdataset", "files", "parquet"]), required=True,
              help="webdataset: tar shards the webdataset library reads (<key>.<field> members); "
                   "files: a file tree OUT/<key>.<field> (like unpack); parquet: one column "
                   "per field, images as binary.")
@click.option("--shard-size", default="256MB", show_default=True,
              help="Target size of each output tar or Parquet file.")
@click.option("--overwrite", is_flag=True, help="Replace what OUT holds.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@storage_option
def export(dataset, out, to, shard_size, overwrite, quiet, storage_options):
    """Write DATASET out in another format: WebDataset tar shards, plain files or Parquet."""
    from shardpack.interop.export import export as run_export

    summary = run_export(dataset, out, to=to, storage_options=_parse_options(storage_options),
                         shard_size=shard_size, overwrite=overwrite,
                         progress=not quiet and sys.stderr.isatty())
    _report(summary)


@main.command()
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
    from shardpack.read.reader import DatasetReader

    if plot is not None:
        from shardpack.inspect.stats import require_plot

        require_plot()  # before any work
    reader = DatasetReader(dataset, _parse_options(storage_options))
    m = reader.manifest
    index_bytes = sum(s.index_bytes for s in m.shards)
    samples = m.num_samples or 0
    report = _stats(reader, dataset, sample) if stats or plot is not None else None
    if plot is not None:
        report.plot(plot)
    if as_json:  # the manifest as written, newer keys included
        summary = {k: v for k, v in m.raw.items() if k != "shards"}
        summary["dataset"] = dataset
        summary["index_bytes"] = index_bytes
        summary["index_bytes_per_sample"] = index_bytes / max(1, samples)
        if report is not None:
            summary["stats"] = report.to_json()
        click.echo(json.dumps(summary, indent=1, sort_keys=True, ensure_ascii=False))
        return
    classes = m.classes
    num_bytes = m.num_bytes or 0
    rows = [
        ("dataset", f"{dataset} (shardpack format v{m.version})"),
        ("format", f"{m.shard_format}, compression {m.compression}"),
        ("samples", f"{samples:,} in {plural(m.num_shards or len(m.shards), 'shard')}"),
        ("bytes", f"{num_bytes:,} ({num_bytes / 1e6:,.1f} MB)"),
        ("fields", ", ".join(m.fields)),
        ("classes", f"{len(classes)}: " + ", ".join(classes[:20]) +
         (", ..." if len(classes) > 20 else "") if classes else "none"),
    ]
    rows.append(("index", f"{index_bytes / max(1, samples):,.1f} bytes per sample "
                          f"({index_bytes / 1e6:,.1f} MB)"))
    if m.skipped:
        named = (f" (each named in {m.skip_report['name']})" if m.skip_report
                 and sum(m.skipped.values()) else "")
        rows.append(("skipped", ", ".join(f"{v} {k}" for k, v in m.skipped.items()) + named))
    if m.ignored:
        rows.append(("ignored", f"{m.ignored:,} files neither images nor sidecars"))
    for name, value in rows:
        click.echo(f"{name:<9} {value}")
    if report is not None:
        for line in report.lines():
            click.echo(line)
        if plot is not None:
            click.echo(f"plot      {plot}")


def _stats(reader, dataset: str, sample: int):
    from shardpack.inspect.stats import StatsOptions, dataset_stats

    return dataset_stats(reader, StatsOptions(sample=sample), name=dataset)


@main.command()
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
    summary = run_preview(dataset, out, opts, _parse_options(storage_options))
    for line in summary.notes:
        click.echo(f"note: {line}", err=True)
    for line in summary.reasons[:10]:
        click.echo(f"marked: {line}", err=True)
    if summary.marked > 10:
        click.echo(f"marked: ... and {summary.marked - 10:,} more", err=True)
    click.echo(summary.line())


@main.command()
@click.argument("dataset")
@click.option("--decode", is_flag=True,
              help="Also decode every image field in full (Pillow): names images that are "
                   "complete files but corrupt inside. Slower: a few ms per image.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@storage_option
def verify(dataset, decode, quiet, storage_options):
    """Re-hash every shard and index and check every record of DATASET.

    Exits 0 when all is well, 1 after listing each bad shard or sample."""
    from shardpack.inspect.verify import verify as run_verify

    report = run_verify(dataset, _parse_options(storage_options),
                        progress=not quiet and sys.stderr.isatty(), decode=decode)
    for problem in report.problems:
        click.echo(f"BAD {problem}")
    status = "OK" if report.ok else f"FAILED ({plural(len(report.problems), 'problem')})"
    click.echo(f"{status}: {plural(report.shards, 'shard')}, "
               f"{plural(report.samples, 'sample')}, {report.bytes / 1e6:,.1f} MB checked")
    sys.exit(0 if report.ok else 1)


@main.command(name="ls")
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
    from shardpack.read.reader import DatasetReader

    reader = DatasetReader(dataset, _parse_options(storage_options))
    out = sys.stdout
    for shard, entry in enumerate(reader.shards):
        index = reader.index(shard)
        for row in range(index.num_samples):
            key = _shown_name(index.key(row))
            if long_:
                fields = " ".join(f"{_shown_name(n)}:{s}"
                                  for n, _, s in index.sample_fields(row))
                out.write(f"{key}\t{entry.name}\t{fields}\n")
            else:
                out.write(key + "\n")


_SHELL_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\", "'": "\\'"}


def _shown_name(name: str) -> str:
    """``name`` on one line of ``ls``: as it is, or in $'...' quoting where it holds a
    character that would break the line or the terminal (Unicode categories Cc, Zl, Zp; Cs:
    the surrogate escapes of bytes that are not UTF-8), or starts with $' itself (so a quoted
    form is never also a plain key)."""
    if name.isprintable() and not name.startswith("$'"):
        return name  # the common case (str.isprintable is false for every character escaped)
    import unicodedata

    if not name.startswith("$'") and not any(
            unicodedata.category(c) in ("Cc", "Zl", "Zp", "Cs") for c in name):
        return name  # not printable for other reasons (a zero-width joiner): harmless
    parts = []
    for c in name:
        code = ord(c)
        if c in _SHELL_ESCAPES:
            parts.append(_SHELL_ESCAPES[c])
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
            parts.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x80 and unicodedata.category(c) == "Cc":
            parts.append(f"\\x{code:02x}")
        elif unicodedata.category(c) in ("Cc", "Zl", "Zp", "Cs"):
            parts.append(f"\\u{code:04x}")
        else:
            parts.append(c)
    return "$'" + "".join(parts) + "'"


@main.command()
@click.argument("dataset")
@click.argument("key")
@click.option("--field", "-f", default=None, help="Field to print (required when the sample "
              "has more than one).")
@storage_option
def cat(dataset, key, field, storage_options):
    """Write the bytes of one field of sample KEY to stdout."""
    from shardpack.read.reader import DatasetReader

    reader = DatasetReader(dataset, _parse_options(storage_options))
    for shard in range(len(reader.shards)):
        index = reader.index(shard)
        for row in range(index.num_samples):
            if index.key(row) != key:
                continue
            sample = reader.read_sample(int(reader.offsets[shard]) + row)
            names = [n for n in sample if n != "__key__"]
            if field is None and len(names) != 1:
                raise ShardpackError(f"sample {key!r} has fields {names}: choose one with --field")
            name = field or names[0]
            if name not in sample:
                raise ShardpackError(f"sample {key!r} has no field {name!r} (it has {names})")
            sys.stdout.buffer.write(sample[name])
            sys.stdout.buffer.flush()
            return
    raise ShardpackError(f"no sample with key {key!r}", path=dataset,
                         hint="'shardpack ls' lists the keys")


@main.command()
@click.argument("dataset")
@click.argument("out", type=click.Path(path_type=str))
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@storage_option
def unpack(dataset, out, quiet, storage_options):
    """Write DATASET back to files, OUT/<key>.<field>. OUT must not exist or be empty.

    Never writes outside OUT: absolute names, '..', links and devices are refused."""
    from shardpack.interop.unpack import unpack as run_unpack

    count = run_unpack(dataset, out, _parse_options(storage_options),
                       progress=not quiet and sys.stderr.isatty())
    click.echo(f"unpacked {count:,} files into {out}")


@main.command()
@click.argument("datasets", metavar="DATASET...", nargs=-1)
@click.option("--files", "files", type=click.Path(exists=True, file_okay=False), default=None,
              help="Run the same pipeline over an unpacked file tree instead (ImageFolder or any "
                   "files), to compare with the packed DATASET.")
@click.option("--weights", default=None, metavar="W1,W2,...",
              help="Several DATASETs are read as one mixture (docs/mixing.md): their relative "
                   "shares [default: each dataset once].")
@click.option("--epoch-size", type=click.IntRange(min=1), default=None,
              help="Samples in a mixture's epoch [default: the datasets' sum].")
@click.option("--decode", type=click.Choice(["none", "cpu", "gpu"]), default="none",
              show_default=True, help="none: bytes only; cpu: decode + crop in the workers; "
              "gpu: nvJPEG on the device (needs CUDA and torchvision).")
@click.option("--workers", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--size", type=click.IntRange(min=8), default=224, show_default=True,
              help="Output image side when decoding.")
@click.option("--step-ms", type=click.FloatRange(min=0), default=0.0,
              help="Simulate a training step of this many ms per batch and report the fraction "
                   "of wall time spent waiting for data.")
@click.option("--batches", type=click.IntRange(min=1), default=None,
              help="Stop after this many batches [default: one epoch].")
@click.option("--device", default=None, help="cpu or cuda [default: cuda if available].")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=str), default=None,
              metavar="FILE", help="Write samples/s over time and the wait per step as a PNG, "
                                   "first batch marked (needs matplotlib: pip install "
                                   "'shardpack[plot]').")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def bench(datasets, files, weights, epoch_size, decode, workers, batch_size, size, step_ms,
          batches, device, plot, quiet):
    """Measure the real loading pipeline on DATASET: samples/s, MB/s, time to first batch, and
    with --step-ms how long a training step would wait for data.  Several DATASETs: a mixture
    (--weights, --epoch-size)."""
    from shardpack.inspect.bench import BenchOptions, run

    if bool(datasets) == (files is not None):
        raise ShardpackError("give a DATASET (or several) or --files SRC_DIR (one of them)")
    if (weights or epoch_size) and len(datasets) < 2:
        raise ShardpackError("--weights and --epoch-size are for a mixture: give several "
                             "DATASETs")
    shares = None
    if weights:
        try:
            shares = tuple(float(w) for w in weights.split(","))
        except ValueError:
            raise ShardpackError(f"--weights {weights!r}: give numbers, e.g. 3,1") from None
        if len(shares) != len(datasets):
            raise ShardpackError(f"--weights has {len(shares)} values for {len(datasets)} "
                                 "datasets")
    dataset = list(datasets) if len(datasets) > 1 else (datasets[0] if datasets else None)
    if plot is not None:
        from shardpack.inspect.stats import require_plot

        require_plot()  # before the run, not after it
    from shardpack.loader.torchenv import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if decode == "gpu" and not device.startswith("cuda"):
        raise ShardpackError("--decode gpu needs a CUDA device; this machine has none",
                             hint="use --decode cpu")
    opts = BenchOptions(decode=decode, workers=workers, batch_size=batch_size, size=size,
                        step_ms=step_ms, batches=batches, device=device, weights=shares,
                        epoch_size=epoch_size)
    result = run(dataset, opts, files=files, progress=not quiet and sys.stderr.isatty())
    for line in result.lines():
        click.echo(line)
    if plot is not None:
        result.timeline.plot(plot, f"{result.source}: decode {decode}, {workers} workers, "
                                   f"batch {batch_size}", step_ms)
        click.echo(f"plot          {plot}")


@main.group()
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

