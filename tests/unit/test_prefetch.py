"""The Prefetcher on its own: distinct units in order of first need, started lazily, bounded by
what the reader reports (plus `ahead` positions and `depth` units)."""

import threading
import time

from shardpack.read.prefetch import Prefetcher


class Recorder:
    """Stands in for a DatasetReader: records the units warmed."""

    def __init__(self):
        self.warmed = []
        self.lock = threading.Lock()

    def warm(self, unit):
        with self.lock:
            self.warmed.append(unit)


def _settle(rec, count, timeout=10.0):
    deadline = time.monotonic() + timeout
    while len(rec.warmed) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # would anything more come?
    return sorted(rec.warmed)


def test_nothing_before_the_first_report_then_needed_plus_depth():
    rec = Recorder()
    units, needs = [7, 3, 9, 1, 5], [0, 0, 40, 80, 200]
    fetcher = Prefetcher(rec, units, needs, depth=1)
    try:
        time.sleep(0.2)
        assert rec.warmed == []  # threads start with the first report
        fetcher.reading(10)      # positions < 10 need units 7 and 3; depth 1 adds 9
        assert _settle(rec, 3) == [3, 7, 9]
        fetcher.reading(81)      # now 7, 3, 9, 1 needed; depth 1 adds 5
        assert _settle(rec, 5) == [1, 3, 5, 7, 9]
    finally:
        fetcher.close()


def test_ahead_counts_positions_past_the_report():
    rec = Recorder()
    units, needs = ["a", "b", "c", "d"], [0, 100, 300, 1000]
    fetcher = Prefetcher(rec, units, needs, depth=1, ahead=250)
    try:
        fetcher.reading(60)  # needed through 60 + 250 = 310: a, b, c; depth 1 adds d
        assert _settle(rec, 4) == ["a", "b", "c", "d"]
    finally:
        fetcher.close()
    rec = Recorder()
    fetcher = Prefetcher(rec, units, needs, depth=1, ahead=0)
    try:
        fetcher.reading(60)  # needed: a; depth 1 adds b
        assert _settle(rec, 2) == ["a", "b"]
    finally:
        fetcher.close()


def test_a_failing_unit_does_not_stop_the_others():
    class Failing(Recorder):
        def warm(self, unit):
            super().warm(unit)
            if unit == 2:
                raise OSError("boom")

    rec = Failing()
    fetcher = Prefetcher(rec, [1, 2, 3], [0, 0, 0], depth=1)
    try:
        fetcher.reading(1)
        assert _settle(rec, 3) == [1, 2, 3]
    finally:
        fetcher.close()
