"""WebDataset tar shards -> samples.

Members are grouped the way the ``webdataset`` library groups them: consecutive members whose
names share the part before the first dot of the file name form one sample (``a/b.jpg`` and
``a/b.cls`` -> key ``a/b``, fields ``jpg`` and ``cls``).  Plain ``.tar`` members become byte ranges
of the tar file (workers read them with a few large reads); ``.tar.gz`` / ``.tgz`` shards are
decompressed as a stream and their bytes carried inline.  Directory entries carry no data and are
counted in the notes; links and devices are bad entries (an error, or skipped with
``--skip-bad``); hidden members (file name starting with '.') are counted like ``pack`` counts
hidden files.
"""

from __future__ import annotations

import tarfile
from typing import Iterator

from ..errors import SourceError
from ..samples import SourceField
from .base import ContainerSource, inline

SUFFIXES = (".tar", ".tar.gz", ".tgz")


class WebDatasetSource(ContainerSource):
    format = "webdataset"
    suffixes = SUFFIXES

    def samples(self) -> Iterator[tuple[str | None, list[SourceField], str]]:
        directories = 0
        for name in self.files():
            shown = self.storage.display(name)
            compressed = not name.endswith(".tar")
            url, mtime = self.url(name), self.mtime_ns(name)
            key, fields, where = None, [], shown
            with self.storage.open(name) as f:
                try:
                    tf = tarfile.open(fileobj=f, mode="r|gz" if compressed else "r:")
                except (tarfile.TarError, OSError, EOFError) as exc:
                    raise SourceError(f"not a readable tar file: {exc}", path=shown) from None
                while True:
                    try:
                        m = tf.next()
                    except (tarfile.TarError, OSError, EOFError) as exc:
                        raise SourceError(f"corrupt tar after {len(tf.members)} members: {exc}",
                                          path=shown) from None
                    if m is None:
                        break
                    tf.members.clear()  # tarfile keeps every member it saw: bounded memory
                    member_where = f"{shown}: member {m.name!r}"
                    if m.isdir():
                        directories += 1
                        continue
                    if not m.isreg():
                        self.bad(member_where, "tar member is a link or special file, not a "
                                               "regular file", "special")
                        continue
                    base = m.name.rsplit("/", 1)[-1]
                    if base.startswith("."):
                        self.report.hidden += 1
                        continue
                    stem, dot, field = base.partition(".")
                    if not dot or not field:
                        self.bad(member_where, "member name has no extension (no field name)",
                                 "bad-name")
                        continue
                    member_key = m.name[:len(m.name) - len(base)] + stem
                    if member_key != key:
                        if fields:
                            yield key, fields, where
                        key, fields, where = member_key, [], member_where
                    if compressed:
                        fields.append(inline(field, tf.extractfile(m).read()))
                    else:
                        fields.append(SourceField(field, url, m.size, mtime, None,
                                                  m.offset_data))
                if fields:
                    yield key, fields, where
        if directories:
            self.note(f"{directories} directory entries in the tar files were ignored (they "
                      "hold no data)")
