"""The suite registry: ``@suite(...)`` registers a function that runs one benchmark suite.

A suite function takes a :class:`benchmarks.results.Run` (its options, repetitions, data folder)
and returns a :class:`benchmarks.results.Outcome` (its figures). The decorator records what the
generated page says about the suite: what it measures and what bounds its figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from typing import Callable

# the suite modules, in the order of docs/benchmarks.md
MODULES = ("pack", "convert", "read", "decode", "peers", "trees", "stages", "checks", "remote",
           "fastlink", "mix", "scale", "engines", "checkpoint", "faults", "pixels")


@dataclasses.dataclass
class Suite:
    """One registered suite: its name, title, the page's prose, its options and its function."""

    name: str
    title: str
    measures: str
    bounds: str
    run: Callable
    options: Callable[[argparse.ArgumentParser], None] | None = None
    quick: dict = dataclasses.field(default_factory=dict)


SUITES: dict[str, Suite] = {}


def suite(name: str, *, title: str, measures: str, bounds: str,
          options: Callable[[argparse.ArgumentParser], None] | None = None,
          quick: dict | None = None):
    """Register the decorated function as the suite ``name``.

    Args:
        name: what ``python -m benchmarks NAME`` runs.
        title: the section heading in docs/benchmarks.md.
        measures: what the suite measures (a paragraph of the page).
        bounds: what bounds its figures (a paragraph of the page).
        options: adds the suite's own options to an ``argparse`` parser.
        quick: option values ``--quick`` sets (tiny data: proves the suite runs, measures
            nothing worth keeping).
    """
    def register(fn):
        SUITES[name] = Suite(name, title, " ".join(measures.split()), " ".join(bounds.split()),
                             fn, options, dict(quick or {}))
        return fn
    return register


def load_all() -> dict[str, Suite]:
    """Import every suite module (each registers itself); the registry, in page order."""
    for module in MODULES:
        importlib.import_module(f"benchmarks.suites.{module}")
    return {name: SUITES[name] for name in sorted(SUITES, key=_page_order)}


def _page_order(name: str) -> int:
    return MODULES.index(name) if name in MODULES else len(MODULES)
