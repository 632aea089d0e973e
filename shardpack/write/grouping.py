"""Files of one folder -> samples: the two ways ``pack`` groups them (``group``; docs/packing.md has
every rule).

* ``image`` (the default for ImageFolder trees): every image file (extension in
  :data:`shardpack.images.content.IMAGE_EXTENSIONS`, any case) is exactly one sample, whatever dots
  its name holds: key = its path without the final extension, field = that extension as written
  (``cat/IMG_2019.01.05.JPEG`` -> key ``cat/IMG_2019.01.05``, field ``JPEG``).  A non-image file
  whose name is an image's stem (or whole name) plus one extension is a sidecar and joins that
  image (``IMG_2019.01.05.json`` or ``IMG_2019.01.05.JPEG.json`` -> field ``json``).  Anything
  else (``Thumbs.db``, ``desktop.ini``, a README) is no sample: it is ignored and counted.
* ``webdataset`` (the default for other trees): key = path up to the first dot of the file name,
  field = the rest (``0001.seg.png`` -> key ``0001``, field ``seg.png``).

A folder's files come as (stem, field, path, size, mtime_ns), the stem cut where the grouping
cuts it (shardpack/write/walk.py); samples come out as (stem, fields), sorted by stem.
"""

from __future__ import annotations

import os
from typing import Iterator

from shardpack.images.content import IMAGE_EXTENSIONS
from shardpack.write.samples import SourceField, SourceReport


def group_webdataset(files: list, reader) -> Iterator[tuple[str, list[SourceField]]]:
    """(stem, fields) of each sample: consecutive files of one stem (key up to the first dot).

    Args:
        files: the folder's files as (stem, field, path, size, mtime_ns); sorted here.
        reader: the :class:`~shardpack.write.fields.FieldReader` class of the files.
    """
    files.sort()
    group_stem, group = None, []
    for stem, fname, path, size, mtime in files:
        if stem != group_stem and group:
            yield group_stem, group
            group = []
        group_stem = stem
        group.append(SourceField(fname, path, size, mtime, None, None, None, reader))
    if group:
        yield group_stem, group


def group_images(files: list, prefix: str, reader, report: SourceReport,
                 bad) -> list[tuple[str, list[SourceField]]]:
    """(stem, fields) of each image file with its sidecars, sorted by stem; the rest is counted
    in ``report`` as ignored.

    Args:
        files: the folder's files as (stem at the last dot, extension, path, size, mtime_ns).
        prefix: the folder's path in the tree ("" or ending in "/"), for messages.
        reader: the :class:`~shardpack.write.fields.FieldReader` class of the files.
        report: where images and ignored files are counted.
        bad: ``bad(path, reason, kind)``: raises, or counts a bad entry (two images with one
            key).
    """
    images, names, others = _images(files, prefix, report, bad)
    _attach_sidecars(images, names, others, report)
    out = []
    for stem in sorted(images):
        group, seen = [], set()
        for _, ext, path, size, mtime in images[stem]:
            if ext in seen:  # cannot happen: one folder holds one file of each name
                bad(path, f"a second file for field {ext!r} of sample {prefix + stem!r}",
                    "duplicate")
                continue
            seen.add(ext)
            group.append(SourceField(ext, path, size, mtime, None, None, None, reader))
        group.sort()
        out.append((stem, group))
    return out


def _images(files: list, prefix: str, report: SourceReport, bad) -> tuple[dict, dict, list]:
    """(stem -> [image file], an image's whole file name -> its stem, the other files)."""
    images: dict[str, list] = {}
    names: dict[str, str] = {}
    others = []
    for item in sorted(files):
        stem, ext, path = item[0], item[1], item[2]
        if ext.lower() not in IMAGE_EXTENSIONS:
            others.append(item)
            continue
        report.images += 1
        if stem in images:
            first = images[stem][0][2]
            bad(path, f"two images with one key {prefix + stem!r} (also "
                      f"{os.path.basename(first)!r}); rename one of them", "duplicate-key")
            continue
        images[stem] = [item]
        names[f"{stem}.{ext}"] = stem
    return images, names, others


def _attach_sidecars(images: dict, names: dict, others: list, report: SourceReport) -> None:
    """Each non-image file joins the image it is a sidecar of, or is counted as ignored."""
    for item in others:
        stem, ext, path = item[0], item[1], item[2]
        owner = None
        if ext:  # a file without extension has no field name: never a sidecar
            if stem in images:
                owner = stem
            elif stem in names:  # x.jpg.json: field jpg.json, so unpack writes it back
                owner = names[stem]
                item = (owner, stem[len(owner) + 1:] + "." + ext) + item[2:]
        if owner is None:  # no image of that name here: not a sample (Thumbs.db, ...)
            report.ignored += 1
            if len(report.first_ignored) < 5:
                report.first_ignored.append(path)
            continue
        images[owner].append(item)
