"""The checks of a dataset reader: a sample's stored bytes against its index hash, every time it
is read, once per process and copy of its shard, or never (docs/reading.md, "Integrity")."""

from __future__ import annotations

import numpy as np

from shardpack import format as fmt
from shardpack.core.errors import IntegrityError


class SampleChecks:
    """The sample checks of :class:`~shardpack.read.reader.DatasetReader` (a mixin: it uses the
    reader's ``index()``, ``shard_path()``, ``check`` mode and its per-process memo
    ``checked``: shard -> samples found good in the copy of the shard mapped now)."""

    def unchecked(self, shard: int, rows: np.ndarray) -> np.ndarray:
        """The rows of ``rows`` the next :meth:`check_rows` would hash: all of them unless
        ``check="once"`` (then those not yet checked in this process), none with "none"."""
        if self.check == "none":
            return rows[:0]
        seen = self.checked.get(shard) if self.check == "once" else None
        return rows if seen is None else rows[~seen[rows]]

    def _seen(self, shard: int) -> np.ndarray:
        seen = self.checked.get(shard)
        if seen is None:
            seen = self.checked[shard] = np.zeros(self.index(shard).num_samples, dtype=bool)
        return seen

    def _check_identity(self, shard: int, view) -> None:
        """A shard just mapped must be the one its index describes: its first, middle and last
        samples are hashed now (three samples, whatever the shard's size).  All of them wrong is
        a swapped or replaced shard, refused before any of its bytes are used; a single wrong
        one is a corrupt sample, left for :meth:`check_rows` to name when it is read (so
        ``on_error="skip"`` can skip it).  docs/reading.md, "Integrity"."""
        index = self.index(shard)
        n = index.num_samples
        if not n:
            return
        probes = sorted({0, n // 2, n - 1})
        h, good = fmt.sample_hash, []
        for row in probes:
            a, b = index.span(row)
            if b <= len(view) and h(view[a:b]) == int(index.sample_hashes[row]):
                good.append(row)
        if not good and len(probes) > 1:  # (one sample: a corrupt sample, named when read)
            a = index.span(probes[0])[0]
            raise IntegrityError(f"the shard does not match its index (all {len(probes)} "
                                 "samples checked when it was mapped differ): replaced, "
                                 "swapped with another shard, or changed since the index was "
                                 "written",
                                 path=self.shard_path(shard), offset=a,
                                 hint="run 'shardpack verify' on the dataset")
        self._seen(shard)[good] = True

    def check_rows(self, shard: int, rows: np.ndarray, buf, base: int = 0,
                   fresh: bool = False) -> None:
        """Check the stored bytes of samples ``rows`` of shard ``shard`` against the index's
        sample hashes: every time (``check="every"``, and whatever the mode for a ``fresh``
        read of the bytes), each sample once per process and copy of the shard ("once":
        ``checked``), or not at all ("none").  ``buf`` holds the shard's bytes from offset
        ``base`` on.  Raises :class:`IntegrityError` naming the shard and the first bad
        sample."""
        if self.check == "none":
            return
        index = self.index(shard)
        seen = self._seen(shard) if self.check == "once" and not fresh else None
        todo = rows if seen is None else rows[~seen[rows]]
        if not len(todo):
            return
        starts = index.starts[todo].astype(np.int64) - base
        ends = index.starts[todo + 1].astype(np.int64) - base
        # hashes computed in one call (the GIL released where the extension is built: other
        # threads run meanwhile), compared as arrays: per-sample Python work was most of the
        # cost for small samples
        outside = (starts < 0) | (ends > len(buf)) | (ends < starts)
        if outside.any():
            inside = np.flatnonzero(~outside)
            starts_in, ends_in = starts[inside], ends[inside]
        else:  # (the usual case: no fancy-indexed copies)
            inside, starts_in, ends_in = slice(None), starts, ends
        got = np.zeros(len(todo), dtype=np.uint64)
        got[inside] = fmt.sample_hashes(buf, starts_in, ends_in)
        bad = outside | (got != index.sample_hashes[todo])
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise self._mismatch(shard, index, int(todo[k]), int(starts[k]) + base)
        if seen is not None:
            seen[todo] = True

    def _check_one(self, shard: int, index: fmt.ShardIndex, row: int, piece, offset: int,
                   fresh: bool = False) -> None:
        """:meth:`check_rows` for one sample whose stored bytes are ``piece`` (at ``offset``
        of the shard), without its array work: 10 us a sample of the per-sample path's 45
        went to it."""
        if self.check == "none":
            return
        seen = self._seen(shard) if self.check == "once" and not fresh else None
        if seen is not None and seen[row]:
            return
        end = int(index.starts[row + 1])
        if offset + len(piece) != end or fmt.sample_hash(piece) != int(index.sample_hashes[row]):
            raise self._mismatch(shard, index, row, offset)
        if seen is not None:
            seen[row] = True

    def _mismatch(self, shard: int, index: fmt.ShardIndex, row: int,
                  offset: int) -> IntegrityError:
        return mismatch(self.shard_path(shard), index, row, offset)


def mismatch(path: str, index: fmt.ShardIndex, row: int, offset: int) -> IntegrityError:
    """The error for sample ``row`` (at ``offset`` of shard ``path``) whose stored bytes do not
    match its index hash."""
    return IntegrityError("sample bytes do not match the index hash (corrupt shard)",
                          path=path, offset=offset, key=index.key(row),
                          hint="run 'shardpack verify' on the dataset")
