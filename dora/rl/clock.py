"""Time for control code: read it and wait on it only through a Clock.

The rollout orchestrator (dora/rl/rollout) never calls time.* itself, so the same code runs
against wall time in the real runtime (`RealClock`) and against a discrete-event virtual clock in
the simulator (`dora.sim.virtual_clock.VirtualClock`).
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Seconds on this clock's own time line (monotonic; the origin is arbitrary)."""

    def sleep_until(self, t: float) -> None:
        """Block until now() >= t (a virtual clock advances to t instead of blocking)."""


class RealClock:
    """Wall time: time.monotonic()."""

    def now(self) -> float:
        return time.monotonic()

    def sleep_until(self, t: float) -> None:
        delay = t - time.monotonic()
        if delay > 0:
            time.sleep(delay)


class RunClock(RealClock):
    """Wall time since the run started: the trace and the control code share this origin."""

    def __init__(self):
        self.origin = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.origin

    def sleep_until(self, t: float) -> None:
        super().sleep_until(t + self.origin)
