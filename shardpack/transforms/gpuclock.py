"""The GPU's idle time between training steps, from CUDA events on the consumer's stream
(``DeviceLoader.gpu_idle_fraction``)."""

from __future__ import annotations

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

    def __init__(self, stats: dict, events=None):
        self.stats, self.pending = stats, []
        self._event = events or (lambda: torch.cuda.Event(enable_timing=True))
        self._asked = self._after = None

    def asked(self, stream) -> None:
        """The consumer asks for a batch, after queueing its step's work on ``stream``."""
        self._asked = self._event()
        self._asked.record(stream)
        if self._after is not None:  # the previous batch's step, up to this ask
            self.pending.append(("gpu_busy_s", self._after, self._asked))
            self._after = None

    def handed(self, stream, event, first: bool) -> None:
        """The batch (ready at ``event``) is handed over: ``stream`` waits for it; ``first``:
        an iteration's first batch."""
        before, after = self._event(), self._event()
        before.record(stream)
        stream.wait_event(event)
        after.record(stream)
        self.pending.append(("device_wait_s", before, after))
        if self._asked is not None:
            self.pending.append(("gpu_start_idle_s" if first else "gpu_idle_s", self._asked, after))
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
