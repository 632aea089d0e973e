"""OUT before a pack writes into it, and after it fails (docs/packing.md, "OUT, resume, overwrite").

:func:`prepare_out` refuses an OUT that holds a dataset or files of others (unless ``--overwrite``
or ``--resume`` allow it), removes what a failed pack left, checks that a ``--resume`` continues
the same source with the same options, and writes the pack state.  :func:`mark_failed` records in
that state that a run ended with an error, so a rerun may start afresh.
"""

from __future__ import annotations

import json

from shardpack import format as fmt
from shardpack.core.errors import OVERWRITE, RESUME, ShardpackError
from shardpack.core.sizes import plural
from shardpack.storage import Storage, is_temp_name
from shardpack.write.options import PackOptions, option_flag
from shardpack.write.outdir import LOCK_NAME, STATE_NAME, clear_out, is_ours


def prepare_out(storage: Storage, state: dict, *, resume: bool, overwrite: bool) -> list[str]:
    """Check and prepare OUT for a pack whose state is ``state``, and write that state.

    Returns note lines for the summary.  Raises a one-line ShardpackError saying why OUT is
    refused and what to do.

    Args:
        storage: OUT.
        state: the pack state to write: version, origin (source, ...) and ``options``.
        resume: ``--resume``: keep the complete shards of the same source and options.
        overwrite: ``--overwrite``: replace what OUT holds (only what shardpack wrote).
    """
    names = _names(storage)
    ours = [n for n in names if is_ours(n)]
    foreign = [n for n in names if not is_ours(n)]
    notes = []
    failed = (names and not overwrite and not foreign and fmt.MANIFEST_NAME not in names
              and _failed_run(storage, state))
    if failed and (not resume or failed == "other"):
        notes.append(_remove_failed(storage, ours, same=failed == "same"))
        names = ours = []
    _refuse_taken(storage, names, foreign, resume=resume, overwrite=overwrite)
    if resume:
        _check_resume(storage, names, ours, state)
    storage.makedirs()
    storage.remove_temp_files()
    if overwrite:
        clear_out(storage, ours)  # un-publish first, then clear
    storage.write_atomic(STATE_NAME, json.dumps(state, sort_keys=True).encode())
    return notes


def _names(storage: Storage) -> list[str]:
    """What OUT holds, temp files and the lock aside."""
    if storage.exists() and not storage.fs.isdir(storage.root):
        raise ShardpackError("output exists and is not a folder", path=storage.url)
    names = [n for n in storage.listdir() if not is_temp_name(n) and n != LOCK_NAME]
    if fmt.MANIFEST_NAME in names and STATE_NAME in names:
        # a pack killed between publishing its manifest and removing its state: the dataset is
        # whole, the state a leftover that no run would otherwise remove (we hold OUT's lock)
        storage.remove(STATE_NAME)
        names.remove(STATE_NAME)
    return names


def _remove_failed(storage: Storage, ours: list[str], same: bool) -> str:
    """Remove what a pack left when it failed with an error (bad input, disk full); its note.

    Nothing was published, so there is no dataset to lose.  A rerun, with the same or other
    options (--skip-bad, say), starts afresh instead of being refused; --resume keeps complete
    shards only for the same source and options.  An interrupted pack (killed, Ctrl-C) and a
    pack still running leave no failure mark: those stay refused, so that the work of an
    interrupted pack is never thrown away without --overwrite (docs/packing.md)."""
    shards = sum(1 for n in ours if n.endswith(fmt.SHARD_SUFFIXES))
    for name in ours:
        storage.remove(name)
    kept = "; --resume would have kept its complete shards" if same else ""
    return (f"removed what a failed pack left in OUT ({plural(shards, 'shard')}, never "
            f"published){kept}")


def _refuse_taken(storage: Storage, names: list[str], foreign: list[str], *, resume: bool,
                  overwrite: bool) -> None:
    """Refuse an OUT that holds something, unless --resume or --overwrite; never files of
    others."""
    if names and not (resume or overwrite):
        unfinished = fmt.MANIFEST_NAME not in names and STATE_NAME in names
        raise ShardpackError("output folder is not empty" + (
            ": an interrupted pack left its shards there" if unfinished else ""),
            path=storage.url,
            hint=f"rerun the same command with {RESUME} to finish it, or pass {OVERWRITE} to "
                 "start afresh" if unfinished else
                 f"choose an empty folder, or pass {OVERWRITE} to replace the dataset there")
    if foreign and (resume or overwrite):
        raise ShardpackError(f"output folder holds files shardpack did not write "
                             f"({foreign[0]!r}...); refusing to touch them", path=storage.url,
                             hint="choose an empty folder")


def _check_resume(storage: Storage, names: list[str], ours: list[str], state: dict) -> None:
    """A --resume continues an unfinished pack of the same source with the same options."""
    if fmt.MANIFEST_NAME in names:
        raise ShardpackError("output already holds a finished dataset; nothing to resume",
                             path=storage.url, hint=f"use {OVERWRITE} to pack it again")
    if not ours:
        return
    try:
        previous = json.loads(storage.read_bytes(STATE_NAME))
    except (FileNotFoundError, ValueError):
        raise ShardpackError("output has shards but no pack state to resume from",
                             path=storage.url, hint=f"use {OVERWRITE}") from None
    # every origin key (source, from, allow_pickle, label_column, ...), not options
    origin_keys = sorted((set(previous) | set(state)) - {"shardpack", "options", "failed"})
    for what in origin_keys:
        if previous.get(what) != state.get(what):
            name = what if what == "source" else option_flag(what)
            raise ShardpackError(f"--resume with a different {name} than the interrupted run: "
                                 f"was {previous.get(what)!r}, now {state.get(what)!r}",
                                 path=storage.url,
                                 hint=f"rerun with the same source, or use {OVERWRITE}")
    # a key an older release did not record had its default then
    was = {**PackOptions().as_dict(), **(previous.get("options") or {})}
    now = state["options"]
    differ = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
    if differ:
        said = ", ".join(f"{option_flag(k)} was {was.get(k)!r}, now {now.get(k)!r}"
                         for k in differ)
        raise ShardpackError(f"--resume with different options than the interrupted pack: "
                             f"{said}", path=storage.url,
                             hint=f"rerun with the same options, or use {OVERWRITE}")


def mark_failed(storage: Storage, state: dict, exc: BaseException) -> bool:
    """Record in the pack state that this run ended with an error (see :func:`prepare_out`);
    not once the manifest is written (the dataset is published, its state is gone).  Returns
    whether it did.

    Args:
        storage: OUT.
        state: the state the run wrote.
        exc: the error that ended the run (its line is recorded).
    """
    try:
        if storage.exists(fmt.MANIFEST_NAME):
            return False
        storage.write_atomic(STATE_NAME, json.dumps({**state, "failed": str(exc)},
                                                    sort_keys=True).encode())
        return True
    except (OSError, ShardpackError):  # a full disk, say: then the folder stays refused
        return False


def _failed_run(storage: Storage, state: dict) -> str | None:
    """Whether OUT's pack state says a run failed: "same" (this source and options), "other"
    (others), or None (no failed run: none, or one interrupted or still running)."""
    try:
        previous = json.loads(storage.read_bytes(STATE_NAME))
    except (FileNotFoundError, ValueError, ShardpackError):
        return None
    if not isinstance(previous, dict) or "failed" not in previous:
        return None
    return "same" if {k: v for k, v in previous.items() if k != "failed"} == state else "other"
