"""What a ``ShardDataset`` reads: one packed dataset or a mixture of several, opened and checked
against the fields and the decode stage asked for, before any DataLoader starts.
"""

from __future__ import annotations

from typing import Sequence

from shardpack.order import partition
from shardpack.order.spec import Order
from shardpack.read.access import Burst
from shardpack.read.mix import MixReader, Source, sources_of
from shardpack.read.reader import DatasetReader


def is_mixture(path) -> bool:
    """Whether ``path`` names several datasets (a list or tuple) or a :class:`Source`.

    Args:
        path: what ``ShardDataset`` was given.
    """
    return isinstance(path, (list, tuple, Source))


def read_burst(order: Order) -> Burst:
    """What the access mode keeps at once: a shuffle window is read together, from up to
    ``window / block_size`` places (cached shards open, chunks in memory; docs/remote.md).

    Args:
        order: the dataset's order.
    """
    if not order.shuffle:
        return Burst()
    return Burst(order.window, -(-order.window // max(1, order.block_size)))


def open_reader(path, *, weights: Sequence[float] | None, epoch_size: int | None,
                **options) -> tuple[DatasetReader | MixReader, tuple | None]:
    """The reader of ``path`` and, for a mixture, ``(shard sizes of each source, samples each
    gives an epoch)`` (:func:`shardpack.order.partition.allot`; docs/mixing.md).

    Args:
        path: a dataset, or a list of datasets / :class:`Source` for a mixture.
        weights: a mixture's shares (None: each source by its size).
        epoch_size: a mixture's samples an epoch (None: the sum of its parts).
        **options: the readers' own (storage_options, cache_dir, cache_limit, prefetch,
            trust_storage, burst, check).
    """
    if not is_mixture(path):
        if weights is not None or epoch_size is not None:
            raise ValueError("weights and epoch_size are for a mixture: pass a list of datasets")
        return DatasetReader(path, **options), None
    sources = sources_of([path] if isinstance(path, Source) else path, weights)
    reader = MixReader(sources, **options)
    sizes = reader.source_sizes()
    totals = [sum(x) for x in sizes]
    counts = partition.allot(totals, [src.weight for src in sources],
                             [src.fixed(n) for src, n in zip(sources, totals, strict=True)],
                             epoch_size)
    return reader, (tuple(tuple(x) for x in sizes), tuple(counts))


def describe(path, reader) -> str:
    """``path`` as text: the dataset's, or a mixture's sources' joined by commas.

    Args:
        path: what ``ShardDataset`` was given.
        reader: its reader.
    """
    if not is_mixture(path):
        return str(path)
    return ", ".join(str(src.path) for src in reader.sources)


def identity(reader, path: str) -> tuple[str | list[str], list[str]]:
    """What a resume state records of the data it was saved on (its ``dataset``): the dataset's
    :attr:`~shardpack.format.manifest.Manifest.identity`, or a list of each source's for a
    mixture; and the dataset's path (a list of one), or each source's, for messages.

    Args:
        reader: the dataset's reader.
        path: the dataset's path as text.
    """
    if isinstance(reader, MixReader):
        return ([r.manifest.identity for r in reader.readers],
                [str(src.path) for src in reader.sources])
    return reader.manifest.identity, [path]


def check_fields(reader, fields: Sequence[str] | None, decode) -> None:
    """Refuse, in one line, ``fields`` the dataset lacks and, in a mixture, a source without
    what the decode stage or ``fields`` need.

    Args:
        reader: the dataset's reader.
        fields: the fields asked for (None: all).
        decode: the decode stage (its ``field`` attribute names the image field it reads).
    """
    unknown = sorted(set(fields or ()) - set(reader.fields))
    if unknown:
        raise ValueError(f"unknown fields {unknown}: the dataset has {reader.fields}")
    if isinstance(reader, MixReader):
        _check_sources(reader, decode, fields)


def _check_sources(reader: MixReader, decode, fields) -> None:
    """Each source of a mixture has what the decode stage and ``fields`` need: one line naming
    the source otherwise."""
    from shardpack.images.content import is_image_field

    from shardpack.loader.batches import LABEL_FIELDS

    wanted = getattr(decode, "field", False)  # False: the stage reads no image field
    for i, (source, own) in enumerate(zip(reader.sources, reader.readers, strict=True)):
        have = [f for f in own.fields if fields is None or f in fields]
        if wanted is None and not any(is_image_field(f) for f in have):
            raise ValueError(f"source {i} ({source.path}) has no image field (fields: "
                             f"{', '.join(have)}), which decode needs")
        if wanted and wanted not in have:
            raise ValueError(f"source {i} ({source.path}) has no field {wanted!r} (fields: "
                             f"{', '.join(have)}), which decode needs")
        for label in LABEL_FIELDS:  # a label is a number in every sample or in none
            used = fields is None or label in fields
            if used and label in reader.fields and label not in own.fields:
                raise ValueError(f"source {i} ({source.path}) has no label field {label!r}, "
                                 f"which other sources have: pass fields=[...] without "
                                 f"{label!r}, or mix sources that all have it")
