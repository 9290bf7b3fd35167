"""Scored trajectories on their way to the trainer: the managed X -> update edge.

Rows arrive scored (reward, advantages) after their trajectory finished generating; the rollout
controller's TransferQueue decides which TBS trajectories make the next batch (`take`: whole
groups, oldest version first) as soon as they finish, and the batch goes to the trainer once every
one of its rows has arrived. One batch is in training at a time (`sent`)."""

from __future__ import annotations

import time
from typing import Any, Callable

import pyarrow as pa

from dora.rl.step_record import batch_summary


class TrainerFeed:
    def __init__(self):
        self.scored: dict[str, dict[str, Any]] = {}        # uid -> scored row waiting for the trainer
        self.schema: pa.Schema | None = None
        self.pending: list[str] | None = None              # uids taken from the TransferQueue, not yet sent
        self.sent: dict[str, Any] | None = None            # what the trainer is training on now (batch_summary)
        self.batches_sent = 0
        self.late_rows = 0                                 # scored rows of a retired attempt, dropped on arrival

    def add(self, batch: pa.RecordBatch, is_open: Callable[[str], bool]) -> None:
        if self.schema is None:
            self.schema = batch.schema
        for row in batch.to_pylist():
            uid = str(row["uid"])
            if not is_open(uid):   # an attempt that was reissued (its replica died): not ours any more
                self.late_rows += 1
                continue
            self.scored[uid] = row

    def complete_batch(self) -> pa.RecordBatch | None:
        """The pending batch once every row of it has arrived (it becomes the batch sent), else None.
        Trajectories are taken when they finish generating; their scored rows trail by the
        reward/advantage hop."""
        if self.pending is None or any(u not in self.scored for u in self.pending):
            return None
        rows = [self.scored.pop(u) for u in self.pending]
        self.sent = batch_summary(self.pending, rows, time.monotonic())
        self.pending = None
        self.batches_sent += 1
        return pa.RecordBatch.from_pylist(rows, schema=self.schema)

    def trained(self, ev_uids: list[str]) -> dict[str, Any]:
        """The trainer reported its step: what was sent for it (rebuilt from the event if nothing was)."""
        sent = self.sent or {"uids": ev_uids, "reward_mean": None, "tokens": 0, "response_tokens": []}
        self.sent = None
        return sent
