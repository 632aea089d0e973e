"""The options of ``pack`` and ``convert``, written down once (docs/packing.md, "Options").

:class:`PackOptions` is the one source: each field holds its type, default, help text, checks and
command-line spelling (:func:`shardpack.core.options.option`).  ``shardpack.pack()`` spells the
same keywords out (for readers and IDEs; :func:`~shardpack.core.options.check_keywords` fails at
import if they drift) and checks them into a PackOptions; ``shardpack.convert()`` takes the fields
its command takes as keywords (:func:`takes_options`); the ``pack`` and ``convert`` commands build
their click options from the fields (``shardpack.cli.options``).  Adding an option is one field
here and its use.

Fields with ``recorded=True`` decide the bytes of the output: :meth:`PackOptions.as_dict` gives
them as the pack state and each shard task's digest record them, so that ``--resume`` refuses a
run with other options.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

from shardpack.core.deprecation import renamed
from shardpack.core.errors import ShardpackError, SourceError
from shardpack.core.options import check_fields, flag_of, from_keywords, keyword_signature, option
from shardpack.core.sizes import parse_size
from shardpack.format import COMPRESSIONS, SHARD_FORMATS, codec_for
from shardpack.write.engine import ENGINES, check_engine
from shardpack.write.pixels import parse_pixels
from shardpack.write.samples import GROUPS, LAYOUTS

DEFAULT_MAX_SAMPLES = 100_000
# image checks at pack time (writer.py, shardpack.images.content)
CHECKS = ("none", "quick", "full")
ON_ERROR = ("raise", "skip")


def skip_bad_to_on_error(skip_bad) -> str:
    """The ``on_error`` of the old ``skip_bad=`` keyword: True -> ``"skip"``, else ``"raise"``.

    Args:
        skip_bad: the old keyword's value.
    """
    return "skip" if skip_bad else "raise"


# the spellings of earlier releases, kept as deprecated aliases (core.deprecation.renamed)
OLD_KEYWORDS = {"format": "shard_format", "skip_bad": ("on_error", skip_bad_to_on_error)}


def check_part(part) -> tuple[int, int]:
    """``(index, count)`` or ``"I/N"`` -> (I, N) with 0 <= I < N; a SourceError otherwise.

    Args:
        part: the part, as a pair or as the CLI's ``I/N``.
    """
    try:
        index, count = (map(int, part.split("/")) if isinstance(part, str) else part)
    except (TypeError, ValueError):
        raise SourceError(f"--part must be I/N (part I of N, counted from 0), found "
                          f"{part!r}") from None
    if not 0 <= index < count:
        raise SourceError(f"--part {index}/{count}: I must be at least 0 and less than N")
    return index, count


PACK = ("pack",)  # options of the file walk: ``pack`` only, not ``convert``


@dataclasses.dataclass(frozen=True)
class PackOptions:
    """Every option of a pack or a conversion, checked on construction (a one-line
    :class:`~shardpack.core.errors.ShardpackError` naming the option).  Two packs of one source
    with equal recorded options give byte-identical shards and manifest."""

    layout: str = option(
        "auto", "imagefolder: class subfolders add an integer field `cls`; auto picks it when "
        "every top-level entry is a folder.", choices=LAYOUTS, strict=False, commands=PACK,
        recorded=True)  # not strict: a conversion records its source format here
    group: str = option(
        "auto", "How files make samples. image: each image file is one sample, key = its path "
        "without the last extension (dots kept), same-stem files join it as fields, other files "
        "are ignored and counted; webdataset: key = path up to the first dot of the name "
        "(0001.jpg + 0001.seg.png). auto: image for ImageFolder trees of images, webdataset "
        "otherwise.", choices=GROUPS, noun="grouping", commands=PACK, recorded=True)
    follow_links: bool = option(
        False, "Read what links leading outside SRC point to, files and folders alike (counted "
        "in the summary). Without it such a link is an error naming it, or skipped and counted "
        "as link-outside with --skip-bad. Links inside SRC always work; a link loop is an error "
        "naming it (link-loop with --skip-bad).", commands=("pack", "convert"))
    allow_empty_classes: bool = option(
        False, "Keep a class folder that holds no sample as a class (its label is taken, as "
        "torchvision's ImageFolder(allow_empty=True)). Without it such a folder is an error "
        "naming it.", commands=PACK)
    label_column: str | None = option(
        None, "CSV/JSONL listings and Parquet sources: the column NAME becomes the class label "
        "field `cls` (integers as they are; names as their index among the sorted distinct "
        "names, which become the manifest's classes, as ImageFolder's folders do).",
        metavar="NAME", commands=("pack", "convert"), recorded=True)
    part: tuple[int, int] | None = option(
        None, "Pack only part I of N (counted from 0): the samples whose key hashes to I. Run "
        "the N parts anywhere (one job per node), then `shardpack merge`.", parse=check_part,
        metavar="I/N", commands=PACK)
    shard_format: str = option(
        "tar", "tar: plain POSIX tar that WebDataset and `tar` read; msgpack: shardpack's own "
        "records, cheaper to parse, CRC32C per record.", flag="--format", choices=SHARD_FORMATS,
        noun="shard format", recorded=True)
    shard_size: int = option(
        256 * 10**6, "Target shard size (B, KB, MB, GB, KiB, MiB, GiB). A sample larger than "
        "this goes alone into its own shard.", parse=parse_size, cli_default="256MB",
        recorded=True)
    max_samples: int | None = option(
        None, f"Also end a shard after this many samples [default: {DEFAULT_MAX_SAMPLES:,}].",
        minimum=1, recorded=True)
    compression: str = option("none", "Per-record zstd (msgpack shards only).",
                              choices=COMPRESSIONS, noun="compression", recorded=True)
    zstd_level: int = option(3, "The zstd level of --compression zstd.", minimum=1, maximum=22,
                             recorded=True)
    workers: int | None = option(
        None, "Processes writing shards in parallel [default: all cores]. With --engine "
        "dask/ray and no --address: the size of the local cluster started for this run.",
        minimum=1)
    engine: str = option(
        "local", "Where the walk and the shard tasks run. local: processes on this machine; "
        "dask: a Dask cluster (pip install 'shardpack[dask]'); ray: a Ray cluster (pip install "
        "'shardpack[ray]'). Workers read SRC and write OUT themselves: use paths every worker "
        "sees, or URLs.", choices=ENGINES, noun="engine")
    address: str | None = option(
        None, "The cluster to use: a Dask scheduler (tcp://host:8786) or a Ray address (auto, "
        "ray://host:10001). Without it dask and ray start a local cluster for this run and stop "
        "it after.", metavar="ADDR")
    resize: int | None = option(
        None, "Shrink JPEG/PNG/WebP images so the shorter side is SHORT_SIDE (never upscales), "
        "once, at pack time.", minimum=1, metavar="SHORT_SIDE", recorded=True)
    pixels: str = option(
        "keep", "How images are stored. keep: as they came; raw: decoded once to uint8 RGB "
        "pixels in an `rgb.npy` field (numpy and WebDataset read it; no decode while training, "
        "more bytes); auto: raw for PNG/GIF/BMP/TIFF images whose raw bytes are at most 48KiB "
        "(icons, CIFAR, 64 px tiles), JPEG/WebP and larger images as they came; auto:SIZE sets "
        "the limit "
        "(docs/images.md, \"Raw pixels\").", parse=parse_pixels, metavar="keep|raw|auto[:SIZE]",
        recorded=True)
    quality: int = option(90, "JPEG/WebP quality when --resize re-encodes.", minimum=1,
                          maximum=100, recorded=True)
    check: str = option(
        "quick", "Image check while packing. quick: headers and end markers, no decode (empty "
        "files, HTML saved as .png, truncated images); full: also decode every image in full, "
        "as training does (about 0.8 ms an image); none: no check.", choices=CHECKS,
        recorded=True)
    on_error: str = option(
        "raise", "Skip and count bad entries (special files, broken or outside links, "
        "unreadable or changing files, broken images, two images with one key, bad samples of "
        "a converted source) instead of stopping at the first.", flag="--skip-bad",
        flag_value="skip", choices=ON_ERROR, noun="on_error", recorded=True)
    resume: bool = option(False, "Continue an interrupted run into OUT: keeps complete shards, "
                                 "redoes the rest.")
    overwrite: bool = option(False, "Replace the dataset already in OUT.")
    progress: bool = option(False, "A progress bar on stderr.", cli=False)

    def __post_init__(self):
        check_fields(self)
        refusal = codec_for(self.shard_format).options_problem(self.compression)
        if refusal:
            raise ShardpackError(refusal)
        if self.resume and self.overwrite:
            raise ShardpackError("--resume and --overwrite exclude each other")
        check_engine(self.engine, self.address)

    @property
    def skip_bad(self) -> bool:
        """Whether bad entries are skipped and counted (``on_error="skip"``)."""
        return self.on_error == "skip"

    def as_dict(self) -> dict:
        """The recorded options (those that decide the bytes) as the pack state and the shard
        tasks' digests record them: the names and values of earlier releases (``skip_bad`` a
        bool), so that a state written before still resumes."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.metadata.get("recorded")}
        out["skip_bad"] = out.pop("on_error") == "skip"
        if out["label_column"] is None:  # as before the option existed: older states resume
            del out["label_column"]
        return out


# PackOptions(skip_bad=True) as before on_error=
PackOptions.__init__ = renamed(skip_bad=OLD_KEYWORDS["skip_bad"])(PackOptions.__init__)


def option_flag(name: str) -> str:
    """The CLI flag of a recorded option or an origin key of the pack state, for messages
    (``shard_format`` -> ``--format``, ``skip_bad`` -> ``--skip-bad``).

    Args:
        name: a PackOptions field or a state key.
    """
    for field in dataclasses.fields(PackOptions):
        if field.name == name:
            return flag_of(field)
    return "--" + name.replace("_", "-")


def takes_options(command: str):
    """Decorator: the function takes the PackOptions fields ``command`` takes as keyword
    arguments (old spellings as deprecated aliases), or a ready ``options=PackOptions(...)``,
    and gets them checked as its ``options`` argument.  Its signature (``help()``,
    ``inspect.signature``) lists the fields.

    Args:
        command: the command whose fields the function takes (the fields' ``commands``).
    """
    def wrap(func):
        own = set(inspect.signature(func).parameters) - {"options"}

        @renamed(**OLD_KEYWORDS)
        @functools.wraps(func)
        def call(*args, options: PackOptions | None = None, **keywords):
            given = {k: keywords.pop(k) for k in list(keywords) if k not in own}
            if options is not None and given:
                raise TypeError(f"{func.__qualname__}() takes options= or option keywords "
                                f"({', '.join(sorted(given))}), not both")
            if options is None:
                options = from_keywords(PackOptions, given, command=command,
                                        caller=func.__qualname__, strict=True)
            return func(*args, options=options, **keywords)

        call.__signature__ = keyword_signature(func, PackOptions, command)
        return call
    return wrap
