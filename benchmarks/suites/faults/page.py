"""docs/reliability.md, the faults suite's own page: every row of the fault campaign, the
corruption campaign and the manifest sweep, with the notes that explain the rows."""

from __future__ import annotations

import os
from collections import Counter

from .run import BAD, summary
from .run import KINDS as RUN_KINDS


KIND_ORDER = ("text", "number", "string", "null", "list", "key", "unknown", "object", "type",
              "shard")


def sweep_lines(done: list, names: list[str]) -> list[str]:
    """The sweep's table (per edit kind) and the list of every edit verify did not refuse."""
    kinds: dict[str, Counter] = {}
    for _, s in done:
        kinds.setdefault(s.edit.kind, Counter())[s.result] += 1
    order = sorted(kinds, key=lambda k: next(
        (i for i, p in enumerate(KIND_ORDER) if k.startswith(p)), len(KIND_ORDER)))
    lines = ["| edit | tries | refused | accepted | no effect | traceback |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {k} | {sum(c.values()):,} | {c['refused']:,} | **{c['accepted']:,}** | "
              f"{c['no effect']:,} | **{c['traceback']:,}** |"
              for k, c in ((k, kinds[k]) for k in order)]
    total = Counter(s.result for _, s in done)
    lines.append(f"| **all** | **{len(done):,}** | **{total['refused']:,}** | "
                 f"**{total['accepted']:,}** | **{total['no effect']:,}** | "
                 f"**{total['traceback']:,}** |")
    for result, title in (("accepted", "Accepted by verify (it said OK), by field"),
                          ("traceback", "Tracebacks"),
                          ("no effect", "No effect (accepted, nothing to refuse), by reason")):
        groups: dict[str, dict[str, dict]] = {}  # field or reason -> edit -> datasets
        for name, s in done:
            if s.result != result:
                continue
            if result == "no effect":
                what, edit = s.edit.no_effect, f"`{s.edit.where}` {s.edit.kind}"
            else:
                what = f"`{s.edit.where}`"
                edit = s.edit.kind + (f" ({s.edit.change})" if s.edit.change else "")
                edit += f": {s.said}" if result == "traceback" else ""
            groups.setdefault(what, {}).setdefault(edit, {})[name] = None  # ordered set
        if not groups:
            lines += ["", f"**{title}:** none."]
            continue
        lines += ["", f"**{title}** (on every dataset unless one is named):", ""]
        for what, edits in groups.items():
            lines.append(f"- {what}: " + "; ".join(
                edit + ("" if len(on) == len(names) else f" [{', '.join(on)} only]")
                for edit, on in edits.items()))
    return lines




# Why a row has silent, traceback, hang or crash outcomes, where the cause is known and is a
# documented property rather than a fault (matched against "family: row"; shown only for rows
# that have such outcomes).
NOTES = {
    'check="once"': 'check="once" keeps a memo of the samples it hashed, so it does not hash '
                    "them again: by design it misses a change that the shard's stat does not "
                    "show when it is looked at (docs/reading.md, \"Integrity\"). The stat is taken "
                    "at each epoch's start and when a shard is mapped, so a change during an "
                    "epoch is missed until the next epoch; a cached copy changed in place with "
                    "its mtime kept still carries the cache's stamp and is trusted.",
    "trust_storage=True": "trust_storage=True (check=\"none\") hashes nothing by design: a flipped "
                          "byte that leaves the record structure intact comes back as it is (the "
                          "msgpack per-sample path still checks its CRC32C). The shard identity "
                          "probe (three samples hashed when a shard is mapped) catches a local "
                          "shard copied over between epochs, not a change during an epoch; a "
                          "cached copy is not probed (the cache hashed it whole).",
}


def campaign_lines(tries: list, seconds: float, args) -> list[str]:
    rows = summary(tries)
    lines = ["## The fault campaign: in place, cache, HTTP, crafted datasets, converters, kills",
             "",
             f"First part of the same command ({seconds:.0f} s, {len(tries):,} tries). Each try "
             "is a script run in a process of its own, forked from the benchmark (shardpack, "
             "torch and the HTTP client already imported), in an empty folder, under a "
             f"wall-clock limit of {args.try_timeout:g} s (benchmarks/suites/faults/run.py); what "
             "it read is "
             "compared sample by sample with the packed truth. Its outcome: **ok** (every "
             "sample right, or the command did what a clean run does), **clear error** (a "
             "one-line `ShardpackError`, or for a command exit 2 with one `shardpack: error:` "
             "line, or verify's exit 1 with `BAD` lines; every sample returned before it right), "
             "**silent** (a wrong or missing sample, a refused input accepted, a file left "
             "behind or written elsewhere, with or without a later error), **traceback** "
             "(another exception), **hang** (no outcome within the limit: the try's process "
             "group is killed) or **crash** (the process died of a signal, SIGBUS or an "
             "out-of-memory kill, before reporting). Where the right answer is more than \"no "
             "wrong sample\", the row says it in brackets.", "",
             "| family | tries | ok | clear error | silent | other exception (traceback) | hang "
             "| crash (signal) |",
             "|---|---|---|---|---|---|---|---|"]
    families: dict[str, Counter] = {}
    for family, _, c in rows:
        families.setdefault(family, Counter()).update(c)
    for family, c in list(families.items()) + [("**all**", sum(families.values(), Counter()))]:
        lines.append(f"| {family} | {sum(c.values()):,} | {c['ok']:,} | {c['clear error']:,} | "
                     f"**{c['silent']:,}** | **{c['other exception']:,}** | **{c['hang']:,}** | "
                     f"**{c['crash']:,}** |")
    outside = Counter(x.kind for x in tries
                      if not any(key in f"{x.family}: {x.row}" for key in NOTES))
    lines += ["", "Outside the rows of `check=\"once\"` and `trust_storage=True` (which by "
              "design do not hash every read: below): silent "
              f"{outside['silent']:,}, traceback {outside['other exception']:,}, hang "
              f"{outside['hang']:,}, crash {outside['crash']:,}."]
    lines += ["", "By case:", "",
              "| family | case | tries | ok | clear error | silent | other exception (traceback) "
              "| hang | crash (signal) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for family, row, c in rows:
        lines.append(f"| {family} | {row} | {sum(c.values()):,} | " + " | ".join(
            f"**{c[k]:,}**" if k in BAD else f"{c[k]:,}" for k in RUN_KINDS) + " |")
    return lines + ["", *family_notes(args), ""] + bad_lines(tries, args)


def bad_lines(tries: list, args) -> list[str]:
    """The silent, traceback, hang and crash outcomes: those by design in one paragraph, every
    other one try by try."""
    lines = []
    by_row: dict[str, list] = {}
    for x in tries:
        by_row.setdefault(f"{x.family}: {x.row}", []).append(x)
    designed = {name: [note for key, note in NOTES.items() if key in name] for name in by_row}
    bad_rows = {name: [(n, x) for n, x in enumerate(row) if x.kind in BAD]
                for name, row in by_row.items()}
    bad_rows = {name: shown for name, shown in bad_rows.items() if shown}
    by_design = {name: shown for name, shown in bad_rows.items() if designed[name]
                 and all(x.kind == "silent" for _, x in shown)}
    rest = {name: shown for name, shown in bad_rows.items() if name not in by_design}
    how = ("Each try runs alone with `python -m benchmarks faults --only \"FAMILY: CASE\" "
           "--pick N` (N: its place in the row, from 0, shown in brackets; same options as "
           "above), which prints what it returned.")
    if by_design:
        lines += ["**Silent by design: `check=\"once\"` and `trust_storage=True`.** " +
                  " ".join(NOTES.values()) + " So those rows count wrong samples that the "
                  "default, `check=\"every\"`, turns into one-line errors (its rows above). "
                  "One try each, for the record:", ""]
        for name, shown in by_design.items():
            n, x = shown[0]
            params = ", ".join(f"{k}={v!r}" for k, v in x.params.items())
            lines.append(f"- {name}: {len(shown)} silent; e.g. [{n}] {params}: {x.detail}")
        lines.append("")
    if not rest:
        lines += ["**Other silent, traceback, hang or crash outcomes:** none.", ""]
        return lines
    lines += [f"**{'Other s' if by_design else 'S'}ilent, traceback, hang or crash outcomes, "
              "try by try** (what varies inside the row, and what the try reported). " + how, ""]
    for name, shown in rest.items():
        lines.append(f"- {name}:")
        for n, x in shown[:args.show]:
            params = ", ".join(f"{k}={v!r}" for k, v in x.params.items())
            lines.append(f"  - [{n}] {x.kind}: {params}: {x.detail}")
        if len(shown) > args.show:
            lines.append(f"  - ... and {len(shown) - args.show} more of the same row")
    lines.append("")
    return lines


def family_notes(args) -> list[str]:
    """What each family does, with its try counts' knobs."""
    return [
        "What each family does:", "",
        "- **in-place local damage**: a dataset of 24 samples of ~3 KB in two shards of 12 (the "
        "same size, each spanning several pages), tar and msgpack. One `ShardDataset` (per "
        "sample, and batched with batch_size 4, `prefetch=0`) reads an epoch; then shard 0 is "
        "damaged and the same object reads a second epoch (\"between epochs\"), or it is "
        "damaged after the first item of the second epoch (\"during an epoch\"). Damage: `cp "
        "shard-00001 shard-00000` (same size, same inode; also with the mtime put back, as `cp "
        f"-p`), {args.inplace_flips} single bytes flipped at random offsets with the mtime put "
        "back (`--inplace-flips`), truncation to 0 bytes, one page, the page boundary nearest "
        "half, 100 bytes short (inside the last page) and one byte short. Each under `check="
        "\"every\"` (the default, passed as nothing), `check=\"once\"` and `trust_storage=True`.",
        "- **cache dir**: the same two datasets served by nginx on 127.0.0.1 and read with "
        "`cache_dir`; the same damage, to the cached copy of shard 0 (offsets of "
        f"`--cache-flips` = {args.cache_flips} flips). A regular file as `cache_dir` (and a "
        "folder under it) through both readers and `shardpack cache info|prune|clear`. A cache "
        "filled ahead, then bind-mounted read-only (`mount --bind -o ro`; as root chmod stops "
        "nothing) and read through: warm, cold, with shard 1 missing, with shard 1 corrupt. One "
        "cached shard flipped (its mtime moves), then 2 to 4 processes read the dataset through "
        f"that cache at once ({args.shared} tries per format, `--shared`).",
        "- **cache folder links**: the same two datasets served by nginx, read through a cache "
        "folder in which a link was planted at CACHE/<url hash> (the dataset's folder) to a "
        "folder outside, to a file outside, or dangling to a name outside (right: served, the "
        "link replaced by a folder, nothing outside the cache written or made); a dangling link "
        "at CACHE/.lock, through both readers and `shardpack cache info|prune|clear` (right: one "
        "line, or for info its listing; its target never made); a cache folder of mode 0777, "
        "1777 or 0775 (right: one line, nothing written in it).",
        "- **remote (HTTP)**: testbed/servers.py's FaultServer, started inside each try, serving "
        "the tar dataset (and, for the 206 rows, one of two ~9.6 MB shards, so that ranged reads "
        "of about 8 MiB start inside a shard). Each fault applies to one target: the manifest, "
        "the indexes (read whole, or downloaded into a cache), the shards (read in ranges "
        "without a cache, or downloaded whole into one); with and without `trust_storage`, per "
        "sample and batched. Retries keep the default 5 attempts and 30 s read timeout with "
        "10-50 ms between attempts instead of 0.2 s doubling (only the waits differ). The "
        "manifest's size is recorded nowhere, so a short manifest body whose Content-Length "
        "agrees cannot be told from a short manifest: it does not parse, one line (the clear "
        "errors of \"short twice, then whole\"). An endless body to a ranged read of a shard is "
        "read up to the end of the range, which holds the right bytes: served.",
        "- **crafted datasets**: a FIFO, a folder or a link to /dev/zero in place of the "
        "manifest, an index or a shard, used by every reader and by cat, verify, ls, info, "
        "unpack and export (info reads only the manifest and ls only the indexes: served is "
        "right for them when a shard or index is replaced). Datasets written directly with "
        "every hash consistent (tests/robustness/test_crafted.py's `craft`): keys that unpack and "
        "export "
        "must refuse, and keys every command must take, through verify, unpack and export "
        "(`--to webdataset`, `--to files`; a file written outside OUT is silent); field names "
        "no pack writes. Labels outside int64 (and at its bounds) through the batched path (with "
        "`on_error=\"skip\"` too), per-sample + `collate`, and a DataLoader with `collate`. "
        "Resume states that cannot belong to the dataset (refused in one line within a second, "
        "or it is a traceback). tests/robustness/hostile/images/ (headers claiming 8,000 to "
        "13,000 pixels "
        "a side) through `pack --check full`, `verify --decode`, `CpuDecode` and `preview`, in a "
        "process whose address space may grow by 1 GiB only.",
        "- **resume identity**: 120 samples packed 40 and 30 a shard (and a mixture of them with "
        "30 other samples packed 10 and 15 a shard); a state saved after 8 samples, through "
        "JSON, loaded into the other packing (right: one line; the sample count alone cannot "
        "tell them apart) or into the same packing made again (right: the rest of the epoch, "
        "exactly), per sample and batched.",
        "- **convert: tar and Parquet**: `shardpack convert` of tars made by GNU tar "
        "`--sparse` (old GNU, pax 0.0, 0.1 and 1.0; .tar and .tar.gz), of BGZF-style "
        ".tar.gz (gzip members of about 64 KiB ending on tar member boundaries or inside "
        "members, and an empty last one) and of a base-256 size field: what it converted is "
        "compared sample by sample with what `tar -xf` extracts (right: the same bytes, or one "
        "line). Compressed tars named for another compression (right: one line). Gzip bombs "
        "(about 330 KB decompressing to 320 MiB: one member, a member per 16 MiB, a pax size, "
        "zeros after the end-of-archive blocks) and Parquet dictionary bombs (2,000 rows "
        "referring to one 1 MiB value: a plain column, without the Arrow schema, an image "
        "struct's bytes, list elements), each converted in a process whose address space may "
        "grow by 1 GiB only (right: one line; zeros past the end of the archive: GNU tar's "
        "bytes).",
        "- **convert: source files**: a FIFO in a source file's place, and a link to a good "
        "file outside SRC without `--follow-links`, in a WebDataset folder (a.tar, a.tar.gz), a "
        "Parquet source (data.parquet at the top and in a sub-folder), an MDS shard and a "
        "LitData chunk (right: one line naming the file, nothing published; a FIFO opened "
        "would be a hang).",
        "- **process faults**: unpack, export --to files (onto a new OUT, and with --overwrite "
        "onto an old one) and pack (1 and 2 workers) of a 40-sample dataset are killed with "
        "SIGKILL (their whole process group) at one file-system event of their run: an audit "
        "hook counts the opens, renames, removals, mkdirs, links and utimes of the command's "
        "process, and kills at the N-th, for every N of a clean run (at most `--kill-points` = "
        f"{args.kill_points}, spread). Then the same command runs again (pack with `--resume`): "
        "right is OUT as a clean run makes it, byte for byte, and no hidden work folder "
        "`.OUT.tmp-*` left beside it (a leftover is silent). With 2 workers only the main "
        "process's events are counted, so where the workers are at a kill varies from run to run.",
        "- **concurrent export**: two `export --to webdataset` of one small dataset into one "
        "OUT, each in a process of its own: the second started while the first holds OUT's "
        "lock (paused there until the second has run), or both started together (the second "
        "0, 5 or 20 ms later), the second with and without `--overwrite` (right: one completes "
        "and OUT is byte for byte what one export writes alone; the other is refused in one "
        "line, or, started after the first ended and with `--overwrite`, completes too).",
        "- **other**: a local path holding `::` (as a plain path and as `file://`), packed into "
        "and read by every reader and command; `ls` and `ls --long` of keys holding control "
        "characters (each key on one line); `collate` errors naming the sample.",
    ]



def page(command: str, date: str, seconds: dict, tries: list, rows: list, swept: list,
         names: list, args) -> str:
    """The whole of docs/reliability.md.

    Args:
        command: the command that made it.
        date: when.
        seconds: {"all", "campaign", "legacy"}: how long each part took.
        tries: the fault campaign's tries.
        rows: the corruption campaign's rows.
        swept: the manifest sweep's results, [(dataset, Swept)].
        names: the sweep's datasets.
        args: the suite's options.
    """
    lines = ["# Reliability: what readers return from damaged datasets", "",
             f"Made by `{command}` on {date}, in {seconds['all']:.0f} s on {os.cpu_count()} "
             f"CPUs: the fault campaign {seconds['campaign']:.0f} s, the corruption campaign "
             f"and the manifest sweep {seconds['legacy']:.0f} s. Three parts: the fault campaign "
             "(scripted tries, each in a process of its own), a corruption campaign (bit flips, "
             "truncations and swaps, read in this process) and a sweep of manifest edits "
             "through `shardpack verify`.", ""]
    lines += campaign_lines(tries, seconds["campaign"], args)
    lines += corruption_lines(rows, args)
    lines += sweep_intro()
    lines += sweep_lines(swept, names)
    lines.append("")
    return "\n".join(lines)


def corruption_lines(rows: list, args) -> list[str]:
    """The corruption campaign's section: what it does, its table, how to read it."""
    lines = ["## Bit flips, truncations and swaps", "",
             "Second part of the same command. Dataset: 40 samples (fake JPEGs of "
             "300-1,750 bytes), 4 shards of 10, tar and msgpack. After each damage every reader "
             "reads the whole dataset from a fresh process state; its outcome is **ok** (every "
             "sample right), **clear error** (a one-line `ShardpackError`, every sample returned "
             "before it right), **silent** (a wrong or missing sample, with or without a later "
             "error), **other exception** (anything else) or **hang** (no end within "
             f"`--timeout` = {args.timeout:g} s). How a hang is caught: each read runs in the "
             "tool's main thread under a `SIGALRM` timer (`setitimer`), whose handler raises an "
             "exception no reader catches (a `BaseException`); it breaks a wait in Python code, "
             "a sleep, a lock or a blocking read. A loop inside C code that never returns to "
             "the interpreter would not be broken: for that, `faulthandler` ends the whole run "
             f"with a traceback after {2 * args.timeout + 10:g} s, so a run that finished had "
             "none. WebDataset reads the same tar files; damage to our index or manifest does "
             "not concern it, so for those rows its outcome is about the shard files alone.", "",
             "| damage | reader | tries | ok | clear error | silent | other exception | hang |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {c} | {r} | {t:,} | {a:,} | {b:,} | **{s:,}** | {o:,} | **{h:,}** |"
              for c, r, t, a, b, s, o, h in rows]
    lines += ["", "How to read it: shardpack's silent column must be 0 for every damage "
              "(tests/robustness/test_integrity.py enforces it on every reader at a smaller "
              "size). A flip "
              "that lands in the tar end-of-archive blocks or in padding no sample covers "
              "changes nothing a reader returns: those count as ok. WebDataset has no index and "
              "no checksums: a flip in a member's data comes back as wrong bytes, a truncation "
              "as missing samples without an error.", ""]
    return lines


def sweep_intro() -> list[str]:
    """The manifest sweep's section up to its table."""
    return ["## Manifest edits through `shardpack verify`", "",
            "Third part of the same command. Each value of three valid manifests (the two "
            "ImageFolder datasets above, with classes `c0` and `c1`, and a `files`-layout "
            "msgpack + zstd dataset of 40 samples with `.cls` sidecars and no classes) is "
            "edited by its type: numbers +1, -1, 0, negative, 2**64, as a string, as a float, "
            "NaN, as bool, null or list; strings with one character changed, appended to, "
            "emptied, upper-cased, padded, set to another valid value, to a path, to a number, "
            "null or list; lists with each element dropped or duplicated, neighbours swapped "
            "(shard entries too), reversed, an element added, emptied, or as object or string; "
            "objects with each key removed, an unknown key added, emptied, or as null, list or "
            "string; a shard entry's value set to its neighbour's; and the file's text "
            "re-written (compact, other key order, BOM, trailing space, a key written twice, "
            "truncated, not UTF-8). After each edit `shardpack verify` runs in process "
            "(click's `CliRunner`) on the dataset: **refused** is exit 1 with a `BAD` line "
            "or exit 2 with one `shardpack: error` line, **accepted** is exit 0 (`OK`), "
            "**traceback** anything else. **No effect** counts an accepted edit that, by a "
            "rule fixed before the run (`_no_effect` in testbed/faults.py), leaves nothing "
            "verify could or should refuse: the same JSON content written differently, an "
            "unknown key (keys are added without a version bump), an optional key removed, "
            "or another valid value of a note nothing in the dataset records (`hidden`, "
            "`ignored`, `group`, `preprocessing`, `skipped` counts). Every other accepted edit "
            "is a gap in verify: it is listed below the table. tests/robustness/test_integrity.py "
            "runs "
            "the same sweep on its two datasets (about 600 edits each, under a second): a "
            "traceback, or an accepted edit outside the gaps listed here, fails it.", ""]
