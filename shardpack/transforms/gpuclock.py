"""The consumer's idle time between training steps (``DeviceLoader.idle()``): from CUDA events on
the consumer's stream where batches go to a CUDA device (:class:`GpuClock`), else from the host's
clock (:class:`HostClock`), so that the same figure exists, labelled, on a CPU-only machine."""

from __future__ import annotations

import time

from shardpack.loader.torchenv import torch


class GpuClock:
    """CUDA events on the consumer's stream, read once they have completed (never blocking the
    loop).  Per batch: ``asked`` when the consumer asks for it (after everything it queued for
    the previous step), ``before`` and ``after`` around the stream's wait on the batch's copy and
    decode.  Then

    * ``device_wait_s`` += before -> after: the stream stalled on the batch's copy and decode;
    * ``gpu_idle_s`` += asked -> after: the stream had nothing to do, from finishing the previous
      step's work until the batch was there and the host had queued the wait (a late host counts:
      the event completes only once recorded); an iteration's first batch goes to
      ``gpu_start_idle_s`` instead (an epoch start), counted in ``epoch_starts``;
    * ``gpu_busy_s`` += after -> the next asked: the step's work.

    ``events`` makes the timing events (tests pass stand-ins)."""

    timing = "cuda-events"  # how the figures were taken, as ``DeviceLoader.idle()`` labels them
    prefix = "gpu"          # the stats keys: gpu_idle_s, gpu_busy_s, gpu_start_idle_s

    def __init__(self, stats: dict, events=None):
        self.stats, self.pending = stats, []
        self._event = events or (lambda: torch.cuda.Event(enable_timing=True))
        self._asked = self._after = None

    def asked(self, stream) -> None:
        """The consumer asks for a batch, after queueing its step's work on ``stream``."""
        self._asked = self._event()
        self._asked.record(stream)
        if self._after is not None:  # the previous batch's step, up to this ask
            self.pending.append((f"{self.prefix}_busy_s", self._after, self._asked))
            self._after = None

    def handed(self, stream, event, first: bool) -> None:
        """The batch (ready at ``event``; None: nothing to wait on) is handed over: ``stream``
        waits for it; ``first``: an iteration's first batch."""
        before, after = self._event(), self._event()
        before.record(stream)
        if event is not None:
            stream.wait_event(event)
        after.record(stream)
        if event is not None:
            self.pending.append(("device_wait_s", before, after))
        if self._asked is not None:
            name = "start_idle_s" if first else "idle_s"
            self.pending.append((f"{self.prefix}_{name}", self._asked, after))
            if first:
                self.stats["epoch_starts"] += 1
        self._after, self._asked = after, None
        self.settle()

    def forget(self) -> None:
        """A reset: intervals begun before it are not counted after it."""
        self.pending.clear()
        self._asked = self._after = None

    def settle(self, wait: bool = False) -> None:
        """Add the completed intervals to the stats (all of them, waiting, with ``wait``)."""
        while self.pending and (wait or self.pending[0][2].query()):
            name, start, end = self.pending.pop(0)
            end.synchronize()
            self.stats[name] += start.elapsed_time(end) / 1000


class HostEvent:
    """A CUDA event's interface over the host's clock: complete when recorded."""

    __slots__ = ("t",)

    def __init__(self):
        self.t = 0.0

    def record(self, stream=None) -> None:
        """Take the host's time now (``stream`` is ignored: the host has none)."""
        self.t = time.perf_counter()

    def query(self) -> bool:
        """Complete: a host event is complete once recorded."""
        return True

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def elapsed_time(self, end: "HostEvent") -> float:
        """Milliseconds from this event to ``end``, as CUDA events give them."""
        return (end.t - self.t) * 1000


class HostClock(GpuClock):
    """The same intervals timed on the host: where batches stay on the CPU there is no stream, and
    the consumer's step runs on the host, so the time from asking for a batch to having it is
    the time the step's device (the CPU here) had nothing to do.  Keys ``host_idle_s``,
    ``host_busy_s``, ``host_start_idle_s``."""

    timing = "host"
    prefix = "host"

    def __init__(self, stats: dict):
        super().__init__(stats, events=HostEvent)
