"""One generic save/load-state check, reused for every stage that has state.

``make()`` builds a fresh stage (an iterable), ``save(stage, consumed)`` returns its state after
``consumed`` items were taken, ``load(stage, state)`` restores it into a fresh one, ``ident(item)``
turns an item into comparable values.  The check: for several interruption points, the items
before plus the items after the restore equal one uninterrupted pass."""

from __future__ import annotations

import json


def assert_resumes(make, save, load, ident, points=(0, 1, 3)):
    full = [v for item in make() for v in ident(item)]
    assert full, "the stage yielded nothing"
    for point in points:
        stage = make()
        seen, consumed = [], 0
        iterator = iter(stage)
        for _ in range(point):
            item = next(iterator, None)
            if item is None:
                break
            seen += ident(item)
            consumed += 1
        state = json.loads(json.dumps(save(stage, consumed, len(seen))))  # must be plain data
        del iterator
        fresh = make()
        load(fresh, state)
        rest = [v for item in fresh for v in ident(item)]
        assert seen + rest == full, f"resume after {point} items differs"
