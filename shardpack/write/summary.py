"""The summary of a pack or a conversion (:class:`PackSummary`), as ``pack()`` returns it and the
command line prints it."""

from __future__ import annotations

from dataclasses import dataclass, field

from shardpack import format as fmt
from shardpack.core.sizes import plural
from shardpack.write.skips import FIRST


@dataclass
class PackSummary:
    """What a pack or a conversion did: counts, sizes, time, skips and notes.  ``line()`` is the
    summary line the command line ends with, ``report_lines()`` what it prints before."""

    out: str
    samples: int = 0
    shards: int = 0
    bytes: int = 0
    source_bytes: int = 0
    files: int = 0
    seconds: float = 0.0
    reused_shards: int = 0
    hidden: int = 0
    skipped: dict = field(default_factory=dict)
    first_skips: list = field(default_factory=list)
    fields: list = field(default_factory=list)
    classes: list | None = None
    notes: list = field(default_factory=list)
    converted_from: str | None = None
    images: int | None = None  # image files found (one sample per image), else None
    ignored: int = 0           # files that are neither images nor sidecars of one
    index_bytes: int = 0
    engine: str = "local"
    engine_start: float = 0.0  # seconds to start or reach the engine (part of ``seconds``)
    skip_report: str | None = None  # where every skip is named (OUT/skipped.jsonl), if any
    followed: int = 0          # links leading outside SRC that --follow-links followed
    datasets: list = field(default_factory=list)  # shardpack datasets inside SRC, left out

    def line(self) -> str:
        """The one summary line: samples, files, bytes, shards, time and rates, then what was
        kept, skipped, ignored, followed or left out."""
        rate = self.source_bytes / self.seconds / 1e6 if self.seconds else 0.0
        seconds = self.seconds or float("inf")
        if self.converted_from:
            text = (f"converted {plural(self.samples, 'sample')} from {self.converted_from} "
                    f"({self.source_bytes / 1e6:,.1f} MB of fields) into "
                    f"{plural(self.shards, 'shard')} ({self.bytes / 1e6:,.1f} MB) in "
                    f"{self.seconds:.1f} s: {self.samples / seconds:,.0f} samples/s, "
                    f"{rate:,.1f} MB/s")
        else:
            found = (f"{plural(self.images, 'image file')} found, " if self.images is not None
                     else "")
            text = (f"packed {plural(self.samples, 'sample')} ({found}"
                    f"{plural(self.files, 'file')} read, {self.source_bytes / 1e6:,.1f} MB) into "
                    f"{plural(self.shards, 'shard')} ({self.bytes / 1e6:,.1f} MB) in "
                    f"{self.seconds:.1f} s: {self.files / seconds:,.0f} files/s, "
                    f"{rate:,.1f} MB/s")
        if self.reused_shards:
            text += (f"; {plural(self.reused_shards, 'complete shard')} kept from the "
                     "interrupted run")
        if self.skipped:
            text += "; skipped " + ", ".join(f"{v:,} {k}" for k, v in sorted(self.skipped.items()))
        if self.ignored:
            text += (f"; ignored {plural(self.ignored, 'file')} that "
                     f"{'is' if self.ignored == 1 else 'are'} neither an image nor a sidecar")
        if self.hidden:
            text += f"; ignored {plural(self.hidden, 'hidden entry', 'hidden entries')}"
        if self.followed:
            text += (f"; followed {plural(self.followed, 'link')} leading outside SRC "
                     "(--follow-links)")
        if self.datasets:
            text += f"; left out {plural(len(self.datasets), 'shardpack dataset')} inside SRC"
        return text

    def report_lines(self) -> list[str]:
        """What the command line prints before the summary line: the first skips, where the
        rest are named, and the notes."""
        lines = [f"skipped: {line}" for line in self.first_skips[:FIRST]]
        total = sum(self.skipped.values())
        if self.skip_report and total:
            more = (f"the first {FIRST} of {total:,} shown; " if total > FIRST else "")
            lines.append(f"skipped: {more}every skipped entry is named with its reason in "
                         f"{self.skip_report}")
        return lines + [f"note: {line}" for line in self.notes]

    def add_results(self, report, ordered: list, manifest: dict, skipped: dict) -> None:
        """Fill in what the run made and the notes on its source, once its manifest is written.

        Args:
            report: the source's report (a walk's or a converted source's).
            ordered: the shards' results, in shard order.
            manifest: the manifest written.
            skipped: skip counts by reason.
        """
        self.samples = manifest["num_samples"]
        self.shards = len(ordered)
        self.bytes = manifest["num_bytes"]
        self.source_bytes = sum(r.source_bytes for r in ordered)
        self.hidden = report.hidden
        self.images = report.images if getattr(report, "group", None) == "image" else None
        self.ignored = getattr(report, "ignored", 0)
        self.index_bytes = sum(r.entry.index_bytes for r in ordered)
        self.notes += _walk_notes(report)
        self.datasets = list(getattr(report, "datasets", None) or [])
        self.followed = getattr(report, "followed", 0)
        self.skipped = dict(skipped)
        self.fields = manifest["fields"]
        self.classes = report.classes
        self.notes += list(report.notes)


def _walk_notes(report) -> list[str]:
    """The notes on what a file walk left out: files that are no samples, OUT inside SRC,
    datasets inside SRC, hidden top-level folders."""
    notes = []
    if getattr(report, "first_ignored", None):
        notes.append(f"files that are neither images nor sidecars of one are not samples, e.g. "
                     f"{report.first_ignored[0]}")
    if getattr(report, "excluded", None):
        notes.append(f"left the output folder out of the walk: {report.excluded}")
    datasets = getattr(report, "datasets", None) or []
    if datasets:
        shown = ", ".join(datasets[:5]) + (f" and {len(datasets) - 5:,} more"
                                           if len(datasets) > 5 else "")
        notes.append(f"left out {plural(len(datasets), 'shardpack dataset')} inside SRC (a "
                     f"folder holding {fmt.MANIFEST_NAME} or a pack's state): {shown}")
    if report.layout == "imagefolder" and getattr(report, "hidden_folders", None):
        notes.append(f"hidden top-level folders are not classes (torchvision's ImageFolder "
                     f"would make them classes): {', '.join(report.hidden_folders[:5])}")
    return notes
