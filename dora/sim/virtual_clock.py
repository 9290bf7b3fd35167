"""VirtualClock: a discrete-event queue. Time jumps from event to event; nothing sleeps."""

from __future__ import annotations

import heapq
import itertools
from typing import Callable


class VirtualClock:
    def __init__(self, start: float = 0.0):
        self._now = start
        self._q: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._q, (max(t, self._now), next(self._seq), fn))

    def call_later(self, dt: float, fn: Callable[[], None]) -> None:
        self.call_at(self._now + dt, fn)

    def step(self) -> bool:
        """Run the next event; False when the queue is empty."""
        if not self._q:
            return False
        t, _, fn = heapq.heappop(self._q)
        self._now = t
        fn()
        return True

    def sleep_until(self, t: float) -> None:
        """Run every event due before t, then move the clock to t."""
        while self._q and self._q[0][0] <= t:
            self.step()
        self._now = max(self._now, t)

    def pending(self) -> int:
        return len(self._q)
