"""The skip report: every entry a pack or convert skipped (``--skip-bad``), named with its reason,
in a JSON-lines file inside OUT that the manifest points to (docs/format.md, "Skip report").

The summary prints the first few and the manifest keeps counts by reason; the report keeps every
one, however many: it is collected in local temporary files (a line a skip, never a list in
memory) and published into OUT before the manifest, like a shard.
"""

from __future__ import annotations

import json
import shutil
import tempfile

from shardpack import format as fmt

FIRST = 10  # skips the command line prints; the rest are in the report


class SkipLog:
    """Collects skips as (reason, path, message).  Walk skips and writer skips go to two files,
    joined walk first on publishing, so the report's order is the walk's and the plan's
    whatever the timing of the workers (two packs of one source give the same report)."""

    def __init__(self):
        self._files = {"walk": tempfile.TemporaryFile(), "write": tempfile.TemporaryFile()}
        self.entries = 0

    def add(self, skips, where: str = "write") -> None:
        """Record skips.

        Args:
            skips: (reason, path, message) each.
            where: ``"walk"`` (the source walk's) or ``"write"`` (the shard writers').
        """
        f = self._files[where]
        for reason, path, message in skips:
            # ensure_ascii: a name that is not UTF-8 (a surrogate escape) stays valid JSON
            f.write(json.dumps({"reason": reason, "path": path, "message": message}).encode()
                    + b"\n")
            self.entries += 1

    def publish(self, storage) -> dict | None:
        """Write the report into OUT (atomically) and return its manifest record, or None when
        nothing was skipped (then no report file is left in OUT)."""
        if not self.entries:
            storage.remove(fmt.SKIPS_NAME)  # one from an older run of this OUT
            return None
        size = 0
        with storage.open_atomic(fmt.SKIPS_NAME) as out:
            for f in self._files.values():
                f.seek(0)
                shutil.copyfileobj(f, out)
                size += f.tell()
        return {"name": fmt.SKIPS_NAME, "entries": self.entries, "bytes": size}

    def close(self) -> None:
        """Drop the temporary files."""
        for f in self._files.values():
            f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_skips(storage, record: dict | None, limit: int | None = None) -> list[dict]:
    """The skip report a manifest's ``skip_report`` record points to, as dicts (at most
    ``limit``), bounded by the size the record gives."""
    if not record:
        return []
    data = storage.read_bytes(record["name"], 0, record["bytes"]) if record["bytes"] else b""
    out = []
    for line in data.splitlines():
        if limit is not None and len(out) >= limit:
            break
        out.append(json.loads(line))
    return out
