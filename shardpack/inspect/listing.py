"""What a dataset holds, for people: ``shardpack info``, ``ls`` and ``cat`` as Python functions.

* :func:`dataset_info`: the manifest's counts, sizes, fields and classes (and, with ``stats``, the
  report of :mod:`shardpack.inspect.stats`), as the lines ``info`` prints or as JSON.
* :func:`list_keys`: the keys in stored order, with their shard and field sizes on request, as the
  lines ``ls`` prints; names that would break a line are shown in the shell's ``$'...'`` quoting
  (:func:`shell_quote`).
* :func:`read_field`: the bytes of one field of one sample, as ``cat`` writes them.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Iterator

from shardpack.core.errors import ShardpackError
from shardpack.core.sizes import plural
from shardpack.inspect.stats import DatasetStats, StatsOptions, dataset_stats
from shardpack.read.reader import DatasetReader


@dataclass
class DatasetInfo:
    """What ``shardpack info`` shows of a dataset: its manifest, its index size, and with
    ``stats`` the :class:`~shardpack.inspect.stats.DatasetStats` report."""

    dataset: str
    manifest: object          # shardpack.format's Manifest
    index_bytes: int
    stats: DatasetStats | None = None

    def to_json(self) -> dict:
        """The manifest as written (newer keys included, shards left out), with the dataset,
        the index bytes, and the stats report when there is one."""
        samples = self.manifest.num_samples or 0
        out = {k: v for k, v in self.manifest.raw.items() if k != "shards"}
        out["dataset"] = self.dataset
        out["index_bytes"] = self.index_bytes
        out["index_bytes_per_sample"] = self.index_bytes / max(1, samples)
        if self.stats is not None:
            out["stats"] = self.stats.to_json()
        return out

    def lines(self) -> list[str]:
        """The lines ``shardpack info`` prints: a name column, then the value; then the stats
        report's lines."""
        m = self.manifest
        samples = m.num_samples or 0
        classes = m.classes
        num_bytes = m.num_bytes or 0
        rows = [
            ("dataset", f"{self.dataset} (shardpack format v{m.version})"),
            ("format", f"{m.shard_format}, compression {m.compression}"),
            ("samples", f"{samples:,} in {plural(m.num_shards or len(m.shards), 'shard')}"),
            ("bytes", f"{num_bytes:,} ({num_bytes / 1e6:,.1f} MB)"),
            ("fields", ", ".join(m.fields)),
            ("classes", f"{len(classes)}: " + ", ".join(classes[:20]) +
             (", ..." if len(classes) > 20 else "") if classes else "none"),
            ("index", f"{self.index_bytes / max(1, samples):,.1f} bytes per sample "
                      f"({self.index_bytes / 1e6:,.1f} MB)"),
        ]
        if m.skipped:
            named = (f" (each named in {m.skip_report['name']})" if m.skip_report
                     and sum(m.skipped.values()) else "")
            rows.append(("skipped", ", ".join(f"{v} {k}" for k, v in m.skipped.items()) + named))
        if m.ignored:
            rows.append(("ignored", f"{m.ignored:,} files neither images nor sidecars"))
        if m.preprocessing:
            rows.append(("images", preprocessing_line(m.preprocessing)))
        out = [f"{name:<9} {value}" for name, value in rows]
        return out + (self.stats.lines() if self.stats is not None else [])


def preprocessing_line(done) -> str:
    """What the pack did to the images (the manifest's ``preprocessing``), in words."""
    parts = []
    if done.get("resize"):
        parts.append(f"resized to a shorter side of {done['resize']} px (quality "
                     f"{done.get('quality')})")
    pixels = done.get("pixels")
    if pixels == "raw":
        parts.append("stored as raw RGB pixels (rgb.npy)")
    elif pixels:
        parts.append(f"stored as raw RGB pixels (rgb.npy) where at most "
                     f"{int(pixels[5:]):,} bytes, else as they came")
    return "; ".join(parts)


def dataset_info(dataset, *, storage_options: dict | None = None, stats: bool = False,
                 sample: int = 2000) -> DatasetInfo:
    """What the dataset at ``dataset`` holds (``shardpack info``).

    Args:
        dataset: the dataset's folder or URL.
        storage_options: fsspec options for a remote dataset.
        stats: also the class histogram, field sizes, image sizes and imbalance warnings
            (:func:`~shardpack.inspect.stats.dataset_stats`).
        sample: with ``stats``: images whose headers are read, and samples whose labels are
            read when the keys do not carry the class.
    """
    reader = DatasetReader(dataset, storage_options=storage_options)
    m = reader.manifest
    report = (dataset_stats(reader, StatsOptions(sample=sample), name=str(dataset)) if stats
              else None)
    return DatasetInfo(str(dataset), m, sum(s.index_bytes for s in m.shards), report)


def list_keys(dataset, *, storage_options: dict | None = None,
              long: bool = False) -> Iterator[str]:
    """The keys of the dataset in stored order, one line each, as ``shardpack ls`` prints them
    (no newline).  With ``long``: key, shard name and ``field:size`` pairs, tab-separated.
    Names are shown by :func:`shell_quote`.

    Args:
        dataset: the dataset's folder or URL.
        storage_options: fsspec options for a remote dataset.
        long: also the shard and the fields with their sizes.
    """
    reader = DatasetReader(dataset, storage_options=storage_options)
    for shard, entry in enumerate(reader.shards):
        index = reader.index(shard)
        for row in range(index.num_samples):
            key = shell_quote(index.key(row))
            if long:
                fields = " ".join(f"{shell_quote(n)}:{s}" for n, _, s in index.sample_fields(row))
                yield f"{key}\t{entry.name}\t{fields}"
            else:
                yield key


_SHELL_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\", "'": "\\'"}
_BREAKING = ("Cc", "Zl", "Zp", "Cs")  # control, line and paragraph separators, surrogates


def shell_quote(name: str) -> str:
    """``name`` on one line of ``ls``: as it is, or in the shell's $'...' quoting where it holds a
    character that would break the line or the terminal (Unicode categories Cc, Zl, Zp; Cs: the
    surrogate escapes of bytes that are not UTF-8), or starts with $' itself (so a quoted form is
    never also a plain key).  Pasted into bash or zsh the quoted form is the name again.

    Args:
        name: a key or field name.
    """
    if name.isprintable() and not name.startswith("$'"):
        return name  # the common case (str.isprintable is false for every character escaped)
    if not name.startswith("$'") and not any(unicodedata.category(c) in _BREAKING
                                             for c in name):
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
        elif unicodedata.category(c) in _BREAKING:
            parts.append(f"\\u{code:04x}")
        else:
            parts.append(c)
    return "$'" + "".join(parts) + "'"


def read_field(dataset, key: str, field: str | None = None, *,
               storage_options: dict | None = None) -> bytes:
    """The bytes of one field of the sample ``key`` (``shardpack cat``), checked against the
    index hash as every read is.

    Raises a :class:`ShardpackError` when there is no such sample or field, or when ``field``
    is None and the sample has more than one.

    Args:
        dataset: the dataset's folder or URL.
        key: the sample's key.
        field: the field; may be left out when the sample has one.
        storage_options: fsspec options for a remote dataset.
    """
    reader = DatasetReader(dataset, storage_options=storage_options)
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
            return bytes(sample[name])
    raise ShardpackError(f"no sample with key {key!r}", path=dataset,
                         hint="'shardpack ls' lists the keys")
