"""Scored trajectories on their way to the trainer: the managed X -> update edge.

Rows arrive scored (reward, advantages) after their trajectory finished generating; the rollout
controller's TransferQueue decides which TBS trajectories make the next batch (`take`: whole
groups, oldest version first) as soon as they finish, and the batch goes to the trainer once every
one of its rows has arrived. One batch is in training at a time (`sent`).

A generate replica reports a trajectory finished (a control event) before its row has left the
process (data rows wait there for the edge's credits), so a replica that dies can take rows of
trajectories the controller already counts as finished with it. `in_transit` remembers where each
finished trajectory was generated until its row arrives: `lost_with(replica)` names the rows a
dead replica may have taken along (its groups are then dropped and reissued; a row that does
arrive later is a late row)."""

from __future__ import annotations

import time
from typing import Any, Callable

import pyarrow as pa

from dora.rl.step_record import batch_summary, sample_rows


class TrainerFeed:
    def __init__(self, samples_per_step: int = 0):
        self.scored: dict[str, dict[str, Any]] = {}        # uid -> scored row waiting for the trainer
        self.schema: pa.Schema | None = None
        self.pending: list[str] | None = None              # uids taken from the TransferQueue, not yet sent
        self.sent: dict[str, Any] | None = None            # what the trainer is training on now (batch_summary)
        self.batches_sent = 0
        self.late_rows = 0                                 # scored rows of a retired attempt, dropped on arrival
        self.in_transit: dict[str, str] = {}               # uid -> generate replica it finished on, row not here yet
        self._waiting: tuple[int, float] | None = None     # (rows the pending batch misses, since when that many)
        self.samples_per_step = samples_per_step           # rows of each batch kept for samples.jsonl

    def add(self, batch: pa.RecordBatch, is_open: Callable[[str], bool]) -> None:
        if self.schema is None:
            self.schema = batch.schema
        for row in batch.to_pylist():
            uid = str(row["uid"])
            self.in_transit.pop(uid, None)
            if not is_open(uid):   # an attempt that was reissued (its replica died): not ours any more
                self.late_rows += 1
                continue
            self.scored[uid] = row

    def finished_on(self, replica: str, uids: list[str]) -> None:
        """These trajectories finished generating on `replica`; their rows are on their way."""
        for u in uids:
            if u not in self.scored:
                self.in_transit[u] = replica

    def forget(self, uids: list[str]) -> None:
        """Rows that will never come (a filter dropped them)."""
        for u in uids:
            self.in_transit.pop(u, None)

    def lost_with(self, replica: str, is_open: Callable[[str], bool]) -> list[str]:
        """uids of open trajectories that finished on `replica` (now dead) and whose rows have not
        arrived: they may have died with it. Forgets every entry of closed trajectories too."""
        lost = [u for u, r in self.in_transit.items() if r == replica and is_open(u)]
        self.in_transit = {u: r for u, r in self.in_transit.items() if r != replica and is_open(u)}
        return lost

    def overdue(self, now: float, limit_s: float) -> str | None:
        """Why the run cannot go on, once the pending batch has missed rows, none of them arriving,
        for longer than `limit_s` (a row that nothing will deliver any more must not hang the run)."""
        missing = [u for u in self.pending or () if u not in self.scored]
        if not missing or self.sent is not None:
            self._waiting = None
            return None
        if self._waiting is None or self._waiting[0] != len(missing):
            self._waiting = (len(missing), now)
            return None
        waited = now - self._waiting[1]
        if waited <= limit_s:
            return None
        where = sorted({self.in_transit.get(u, "?") for u in missing})
        return (f"the trainer's next batch waited {waited:.0f} s (stall timeout {limit_s:.0f} s) for the scored rows "
                f"of {len(missing)} trajectories that finished generating (e.g. {', '.join(missing[:4])}; finished on "
                f"{', '.join(where)}): nothing between generate and the trainer delivered them")

    def complete_batch(self) -> pa.RecordBatch | None:
        """The pending batch once every row of it has arrived (it becomes the batch sent), else None.
        Trajectories are taken when they finish generating; their scored rows trail by the
        reward/advantage hop."""
        if self.pending is None or any(u not in self.scored for u in self.pending):
            return None
        rows = [self.scored.pop(u) for u in self.pending]
        self.sent = batch_summary(self.pending, rows, time.monotonic())
        self.sent["samples"] = sample_rows(rows, self.samples_per_step)
        self.pending = None
        self.batches_sent += 1
        return pa.RecordBatch.from_pylist(rows, schema=self.schema)

    def trained(self, ev_uids: list[str]) -> dict[str, Any]:
        """The trainer reported its step: what was sent for it (rebuilt from the event if nothing was)."""
        sent = self.sent or {"uids": ev_uids, "reward_mean": None, "tokens": 0, "response_tokens": []}
        self.sent = None
        return sent
