"""Deadlines: when each version's data must be complete, in clock time, from what was measured.

Version v's data may be trained up to step v+K (C3), so every trajectory of v must be finished
when step v+K starts. That start is estimated from the trainer's own pace (the mean of its last
K step times without the waits for data: training plus publishing) and from where the trainer is
now (training step N-1 since it took that batch, or idle and waiting for step N's). A version's
data is at risk when the time left is shorter than the longest generation (dispatch to finish)
measured over the last 2K steps: a request of that version could still be such a one.
Before the first step there is no pace, and no deadline is known (infinite).
"""

from __future__ import annotations

import math

from ..clock import Clock
from .ledger import Ledger
from .transfer_queue import TransferQueue


class Deadlines:
    def __init__(self, ledger: Ledger, queue: TransferQueue, max_staleness: int, clock: Clock):
        self.ledger, self.queue, self.k, self.clock = ledger, queue, max_staleness, clock

    def pace(self) -> float | None:
        """The trainer's own step time (training + publish, waits excluded), mean of the last K steps."""
        recent = self.ledger.step_metrics[-max(1, self.k):]
        if not recent:
            return None
        return sum(m.step_time_s - m.rollout_only_s for m in recent) / len(recent)

    def next_step_start(self, pace: float) -> float:
        now = self.clock.now()
        taken = self.ledger.taken
        if not taken:
            return now                               # the trainer is waiting for the next batch
        taken_at = self.ledger.batches[max(taken)][2]
        return max(now, taken_at + pace)

    def deadline(self, version: int) -> float:
        """Clock time by which every trajectory of `version` must be finished."""
        pace = self.pace()
        if pace is None:
            return math.inf
        steps_left = version + self.k - self.queue.next_step
        return self.next_step_start(pace) + steps_left * pace

    def longest_generation(self) -> float:
        return max(self.ledger.gen_max)

    def can_start(self, version: int) -> bool:
        """Would a request started now on `version` finish in time, even if it is as slow as the
        slowest measured?"""
        return self.clock.now() + self.longest_generation() <= self.deadline(version)
