"""Saved resume states, checked: what a ShardDataset state must hold before anything is computed
from it (the epoch, its resume history, a worker's position), and the helpers that compare and
show a state's values whatever their type.

A state comes from a file a user points at, so its values can be anything: every check here is
O(len(history)), bounded by MAX_RESUMES, and says in one line what is wrong.
"""

from __future__ import annotations

import warnings

import numpy as np

MAX_RESUMES = 10_000  # steps a resume history may hold: one per resume within one epoch
MAX_WORLD = 1 << 18   # ranks a saved step or worker position may name (262,144 processes)
# A step after which the world size changes re-cuts what is left of the epoch for every rank,
# at a cost that follows the ranks and the ranges cut so far (partition's resume ranges, about
# 1-3 us each): a history may cost this many such units, a few seconds at most, where real
# elastic runs (a 100,000-rank job resized five times: 1.5 million) stay under it
MAX_RESUME_WORK = 1 << 21


def check_position(state: dict, samples: int) -> None:
    """Refuse a state that cannot belong to a dataset of ``samples`` samples an epoch: wrong
    types, a negative epoch or count, more samples seen than a rank's share holds, a history
    longer than any run makes.  O(len(history)), at most MAX_RESUMES steps, and checked before
    anything loops over it, so a crafted state (a history of 10^9 steps) fails at once.

    Args:
        state: the saved state (a dict); its ``epoch``, ``history`` and ``worker`` are checked.
        samples: samples in one epoch of the dataset that loads it.
    """
    def bad(what: str) -> ValueError:
        return ValueError(f"not a state of this dataset ({samples:,} samples an epoch): {what}")

    for key in ("epoch", "history"):
        if key not in state:
            raise bad(f"it has no {key!r}")
    epoch, history = state["epoch"], state["history"]
    if not is_int(epoch) or not 0 <= epoch < 1 << 63:
        raise bad(f"epoch must be an integer >= 0, found {short(epoch)}")
    if not isinstance(history, (list, tuple)):
        raise bad(f"history must be a list of [world, samples_seen] steps, found "
                  f"{type(history).__name__}")
    if len(history) > MAX_RESUMES:
        raise bad(f"its history has {len(history):,} resume steps, more than the "
                  f"{MAX_RESUMES:,} one epoch may record")
    _check_history(history, samples, bad)
    _check_worker(state.get("worker"), samples, bad)


def _check_history(history: list, samples: int, bad) -> None:
    """Each step ``[world, samples_seen]``: integers, a world of 1 to MAX_WORLD ranks, and no
    more samples seen since the world size last changed than a rank's share holds; the work of
    resuming it bounded by MAX_RESUME_WORK."""
    run_world, run_seen, ranges, work = None, 0, 1, 0

    def recut(world: int) -> None:  # the steps of ``world`` ranks end: the rest is cut anew
        nonlocal ranges, work
        work += ranges + world
        ranges = min(ranges + world, samples + world)  # consumed samples cut the ranges
        if work > MAX_RESUME_WORK:
            raise bad(f"its history changes the world size so often, on so many ranks, that "
                      f"resuming it would cut the epoch {work:,} times over (at most "
                      f"{MAX_RESUME_WORK:,})")

    for i, step in enumerate(history):
        if not isinstance(step, (list, tuple)) or len(step) != 2 or \
                not all(is_int(v) for v in step):
            raise bad(f"history step {i} must be [world, samples_seen] integers, found "
                      f"{short(step)}")
        world, seen = int(step[0]), int(step[1])
        if not 1 <= world <= MAX_WORLD:
            raise bad(f"history step {i} has world size {world:,} (1 to {MAX_WORLD:,})")
        if world != run_world:
            if run_world is not None:
                recut(run_world)
            run_world, run_seen = world, 0
        run_seen += seen
        share = -(-samples // world)  # the most samples one rank's share of an epoch holds
        if seen < 0 or run_seen > share:
            raise bad(f"history step {i} says each of {world:,} ranks saw {seen:,} samples"
                      + (f" ({run_seen:,} since the world size last changed)"
                         if run_seen != seen else "")
                      + f"; a rank's share holds 0 to {share:,}")
    if run_world is not None:
        recut(run_world)  # the world it resumes on may differ too


def _check_worker(saved, samples: int, bad) -> None:
    """A worker-level position (``state_dict()`` inside a DataLoader worker), or None."""
    if saved is None:
        return
    names = ("world", "rank", "num_workers", "worker", "batch_size", "yielded")
    if not isinstance(saved, dict) or any(not is_int(saved.get(n)) for n in names):
        raise bad(f"worker must be null or {{{', '.join(names)}: integers}}, found "
                  f"{short(saved)}")
    world, rank, workers, worker, batch, yielded = (int(saved[n]) for n in names)
    if not (1 <= world <= MAX_WORLD and 0 <= rank < world and 1 <= workers <= MAX_WORLD
            and 0 <= worker < workers and batch >= 1 and 0 <= yielded <= samples):
        raise bad(f"worker position {short(saved)} is not a place in an epoch of this "
                  f"dataset")


def check_dataset(state: dict, mine: str | list[str], paths: list[str]) -> None:
    """Refuse, in one line naming both identities, a state saved on another dataset: its
    ``dataset`` (a dataset's :attr:`~shardpack.format.manifest.Manifest.identity`; a mixture's,
    one a source) must be this one's.  The same samples packed into other shards are another
    dataset: their epochs order them otherwise, so resuming would repeat some and skip others.
    A state saved before states recorded it loads, with a warning (docs/reading.md, "Resume").

    Args:
        state: a saved state (any values), its ``epoch`` already checked.
        mine: this dataset's identity, or a list of each source's for a mixture.
        paths: the dataset's path, or each source's.
    """
    saved = state.get("dataset")
    if saved is None:
        warnings.warn("shardpack: this resume state has no dataset identity (saved by an "
                      "older shardpack), so it resumes exactly only on the very packing it was "
                      "saved on: the same samples packed otherwise repeat some and skip others",
                      stacklevel=3)
        return
    if same(saved, mine):
        return
    epoch = int(state["epoch"])
    if not isinstance(mine, list):
        what = f"dataset {short(saved)}, this one ({paths[0]}) is {mine!r}"
    elif isinstance(saved, (list, tuple)) and len(saved) == len(mine):
        i = next((i for i, (s, m) in enumerate(zip(saved, mine, strict=True))
                  if not same(s, m)), None)
        if i is None:  # (a tuple of the same identities)
            return
        what = (f"source {i} on dataset {short(saved[i])}, this mixture's source {i} "
                f"({paths[i]}) is {mine[i]!r}")
    else:
        what = f"sources on datasets {short(saved)}, this mixture's are {short(mine)}"
    raise ValueError(f"state was saved with {what}: the same samples packed otherwise are "
                     f"another dataset, whose order differs; resume on the dataset the state "
                     f"was saved on, or start epoch {epoch} afresh (set_epoch({epoch}), "
                     f"without load_state_dict)")


def is_int(value) -> bool:
    """Whether ``value`` is an integer (Python's or NumPy's), not a bool.

    Args:
        value: any value read from a state.
    """
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def same(saved, mine) -> bool:
    """``saved == mine``, False where the comparison is not a plain truth value (an array).

    Args:
        saved: a value read from a state (any type).
        mine: the value it must equal.
    """
    try:
        return bool(saved == mine)
    except (TypeError, ValueError):
        return False


def short(value) -> str:
    """``repr(value)``, cut short: a state's values can be anything.

    Args:
        value: the value to show in a one-line message.
    """
    import reprlib

    shown = reprlib.Repr()
    shown.maxstring = shown.maxother = 80
    shown.maxlist = shown.maxtuple = shown.maxdict = 6
    return shown.repr(value)

