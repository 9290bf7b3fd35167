"""Ledger: where every dispatched trajectory is, and what each training step measured.

Nothing is lost or counted twice: a uid is dispatched once, then trained, dropped by a filter
(with a reason), finished-but-untrained, in flight, or in a batch being trained; `account()`
checks that these add up. The ledger also keeps what the policies measure to decide (the
longest dispatch -> finish time per step interval, the trainer's waits) and the per-step
metrics (`StepMetrics`).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Sequence

from dora.graph.builtin_ops import ENGINE_COUNTERS, ENGINE_GAUGES
from dora.observe.trace import TraceWriter
from .transfer_queue import TransferQueue
from .types import Request, Trajectory


@dataclasses.dataclass
class StepMetrics:
    step: int
    policy_version: int            # version produced by this step
    trajectories: int
    tokens: int                    # prompt + response tokens trained
    response_tokens: int           # of which generated (what rollout instances had to decode)
    step_time_s: float             # since the previous step ended (or start)
    rollout_only_s: float          # trainer idle, waiting for data, before this step
    staleness_max: int
    staleness_mean: float
    c1_violations: int
    c2_violations: int
    c3_violations: int
    versions_live: int             # versions with requests in flight at step end
    migrated_requests: int         # during this step's interval
    reprefill_tokens: int
    weight_loads: int
    idle_fraction: dict[str, float]  # per pool: rollout (sampled at ticks), trainer
    dropped: int = 0               # trajectories dropped by filters during this step's interval
    wait_staleness_s: float = 0.0  # of rollout_only_s (sampled at ticks): TBS were complete, but taking
                                   # them would have stranded an older group (C3): the trainer waited for stragglers
    wait_count_s: float = 0.0      # ... fewer than TBS complete: the trainer waited for throughput
    fast_lane_requests: int = 0    # of migrated_requests: moved into fast lanes (an old version's stragglers sped up)
    parked_dropped: int = 0        # multi-turn: parked KV dropped for memory during the interval
    continuation_reprefill_tokens: int = 0   # ... and the context prefilled again because of it
    prefill_tokens: int = 0        # the engines' tokens prefilled during the interval (prefix hits not included)
    prefix_hit_tokens: int = 0     # ... and prompt tokens found in their prefix caches instead
    kv_blocks_used: int = 0        # the engines' KV blocks, summed over replicas (each as last reported)
    kv_blocks_free: int = 0
    graph_captures: int = 0        # decode graphs the engines captured so far (flat once warm)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Ledger:
    def __init__(self, train_batch: int, max_staleness: int, queue: TransferQueue, trace: TraceWriter):
        self.tbs, self.k, self.queue, self.trace = train_batch, max_staleness, queue, trace
        self.dispatched = self.trained = 0
        self.c2_extra = 0                                # unknown / double completions, trained twice
        self.members: dict[str, list[str]] = {}         # group id -> uids, until trained (kept if dropped)
        self.group_of: dict[str, str] = {}              # uid -> group id, until trained (kept if dropped)
        self.dropped_groups: dict[str, str] = {}        # group id -> reason (members may still be generating)
        self.dropped: collections.Counter[str] = collections.Counter()   # reason -> trajectories dropped
        self.taken: dict[int, set[str]] = {}            # step -> uids handed to the trainer
        self.batches: dict[int, tuple[list[Trajectory], float, float]] = {}  # step -> (batch, wait, taken at)
        self.dispatched_at: dict[str, float] = {}       # group id -> dispatch (or retag) time
        self.gen_max: list[float] = [0.0]               # per step interval: longest dispatch -> finish
        self.trainer_idle_since: float | None = None
        self.last_step_end = 0.0
        self.waits = {"staleness": 0.0, "count": 0.0}  # this wait, by cause (sampled at ticks)
        self.last_waits = dict(self.waits)               # the previous wait's, once its batch was taken
        self._wait_sampled: float | None = None
        self.step_metrics: list[StepMetrics] = []
        # interval counters (reset at each step end)
        self.migrated = self.reprefill = self.loads = self.dropped_interval = self.lane_moves = 0
        self.idle_samples = self.idle_hits = 0
        self.engine = dict.fromkeys(ENGINE_COUNTERS, 0)         # interval sums of the engines' counters
        self.gauges: dict[str, dict[str, int]] = {}             # replica -> its engine's gauges, as last reported
        self.totals = {"migrated_requests": 0, "migrated_kv_bytes": 0, "fast_lane_requests": 0, "reprefill_tokens": 0,
                       "weight_loads": 0, "rebalances": 0, "retagged_requests": 0, "rollout_only_s": 0.0,
                       "dropped_unknown": 0, "siblings_started_newest": 0}

    # -- dispatch and completion ---------------------------------------------------------------
    def sent(self, grp: list[Request], version: int, now: float) -> None:
        gid = grp[0].group_id
        self.queue.on_dispatched(gid, version, len(grp))
        self.dispatched += len(grp)
        self.members[gid] = [r.uid for r in grp]
        self.dispatched_at[gid] = now
        for r in grp:
            self.group_of[r.uid] = gid

    def restored(self, gid: str, version: int, uids: list[str]) -> None:
        """A group finished before a resume, put back untrained: dispatched (once, in this run's
        books), never in flight, so no dispatch time."""
        self.queue.on_dispatched(gid, version, len(uids))
        self.dispatched += len(uids)
        self.members[gid] = list(uids)
        for u in uids:
            self.group_of[u] = gid

    def finished(self, group_id: str, now: float) -> str | None:
        """A member of `group_id` finished: measure its dispatch -> finish time. Returns the drop
        reason if its group was dropped (the member is then discarded and counted here)."""
        t0 = self.dispatched_at.get(group_id)
        if t0 is not None and now - t0 > self.gen_max[-1]:
            self.gen_max[-1] = now - t0
        reason = self.dropped_groups.get(group_id)
        if reason is not None:
            self.count_dropped(reason, 1)
        return reason

    # -- trainer side -----------------------------------------------------------------------------
    def sample_wait(self, now: float) -> None:
        """Called at ticks: while the trainer waits, book the time since the last sample to why."""
        if self.trainer_idle_since is None:
            self._wait_sampled = None
            return
        since = self._wait_sampled if self._wait_sampled is not None else self.trainer_idle_since
        self.waits["staleness" if self.queue.blocked_by_staleness() else "count"] += now - since
        self._wait_sampled = now

    def taken_batch(self, step: int, batch: list[Trajectory], now: float) -> None:
        waited = now - self.trainer_idle_since if self.trainer_idle_since is not None else 0.0
        self.totals["rollout_only_s"] += waited
        self.trainer_idle_since = None
        self.last_waits, self.waits = self.waits, {"staleness": 0.0, "count": 0.0}
        self._wait_sampled = None
        self.taken[step] = {t.uid for t in batch}
        self.batches[step] = (batch, waited, now)

    def trained_step(self, step: int, version_after: int, consumed_uids: Sequence[str], now: float,
                     versions_live: int) -> StepMetrics:
        taken = self.taken.pop(step, None)
        c2 = 0
        if taken is None:
            c2 += 1
            taken = set()
        consumed = list(consumed_uids)
        if len(set(consumed)) != len(consumed) or set(consumed) != taken:
            c2 += 1
        self.c2_extra += c2
        self.trained += len(consumed)
        for u in consumed:
            self._forget_uid(u)
        batch, waited, _ = self.batches.pop(step, ([], 0.0, now))
        stal = [step - t.version for t in batch] or [0]
        m = StepMetrics(
            step=step, policy_version=version_after, trajectories=len(batch),
            tokens=sum(t.prompt_tokens + t.response_tokens for t in batch),
            response_tokens=sum(t.response_tokens for t in batch),
            step_time_s=now - self.last_step_end, rollout_only_s=waited,
            staleness_max=max(stal), staleness_mean=sum(stal) / len(stal),
            c1_violations=sum(1 for t in batch if len(t.versions) > 1),
            c2_violations=c2 + (0 if len(batch) == self.tbs else 1),
            c3_violations=sum(1 for s in stal if s > self.k or s < 0),
            versions_live=versions_live,
            migrated_requests=self.migrated, reprefill_tokens=self.reprefill, weight_loads=self.loads,
            idle_fraction={"rollout": self.idle_hits / self.idle_samples if self.idle_samples else 0.0,
                           "trainer": waited / max(1e-9, now - self.last_step_end)},
            dropped=self.dropped_interval, fast_lane_requests=self.lane_moves, wait_staleness_s=self.last_waits["staleness"],
            wait_count_s=self.last_waits["count"], **self.engine,
            **{k: sum(g.get(k, 0) for g in self.gauges.values()) for k in ENGINE_GAUGES})
        self.step_metrics.append(m)
        self.migrated = self.reprefill = self.loads = self.idle_samples = self.idle_hits = self.lane_moves = 0
        self.engine = dict.fromkeys(ENGINE_COUNTERS, 0)
        self.dropped_interval = 0
        self.last_step_end = now
        self.gen_max.append(0.0)
        del self.gen_max[:-2 * self.k - 2]
        self.trainer_idle_since = now
        return m

    def revoke(self, step: int, now: float) -> None:
        """A taken, untrained batch goes back to the queue (a filter dropped one of its groups)."""
        batch, waited, taken_at = self.batches.pop(step)
        del self.taken[step]
        self.queue.untake(batch, step)
        self.totals["rollout_only_s"] -= waited
        self.trainer_idle_since = taken_at - waited
        self.trace.instant("trainer", "filter", f"revoke batch of step {step}", now)

    def _forget_uid(self, uid: str) -> None:
        """A trained uid: its group is trained whole, so the group's entry goes too."""
        gid = self.group_of.pop(uid, None)
        if gid is not None:
            self.members.pop(gid, None)
            self.dispatched_at.pop(gid, None)

    # -- counters ---------------------------------------------------------------------------------
    def count_dropped(self, reason: str, n: int) -> None:
        if n:
            self.dropped[reason] += n
            self.dropped_interval += n

    def count_migration(self, n: int, kv_bytes: int, lane: bool = False) -> None:
        self.migrated += n
        self.totals["migrated_requests"] += n
        self.totals["migrated_kv_bytes"] += kv_bytes
        if lane:
            self.lane_moves += n
            self.totals["fast_lane_requests"] += n

    def count_reprefill(self, tokens: int) -> None:
        self.reprefill += tokens
        self.totals["reprefill_tokens"] += tokens

    def count_engine(self, replica: str, ev: dict[str, Any]) -> None:
        """A generate replica's `finished` event: its engine's counter deltas and gauges."""
        for k in ENGINE_COUNTERS:
            self.engine[k] += int(ev.get(k) or 0)
            self.totals[k] = self.totals.get(k, 0) + int(ev.get(k) or 0)
        self.gauges.setdefault(replica, {}).update({k: int(ev[k]) for k in ENGINE_GAUGES if ev.get(k) is not None})

    def count_load(self) -> None:
        self.loads += 1
        self.totals["weight_loads"] += 1

    def sample_idle(self, instances: int, idle: int) -> None:
        self.idle_samples += instances
        self.idle_hits += idle

    # -- end of run ---------------------------------------------------------------------------------
    def account(self, in_flight: int) -> dict[str, Any]:
        """Every dispatched trajectory: trained, finished-but-untrained, in flight, being trained,
        or dropped; `lost` is what none of these explains (must be 0)."""
        waiting = self.queue.waiting()
        in_training = sum(len(u) for u in self.taken.values())
        dropped = sum(self.dropped.values())
        lost = self.dispatched - self.trained - waiting - in_flight - in_training - dropped
        return {"dispatched": self.dispatched, "trained": self.trained, "in_training_at_end": in_training,
                "finished_untrained": waiting, "in_flight_at_end": in_flight, "lost": lost,
                "dropped": dropped, "dropped_by_reason": dict(self.dropped),
                "c1_violations": self.queue.c1_violations,
                "c2_violations": self.queue.c2_violations + self.c2_extra + max(0, lost),
                "c3_violations": self.queue.c3_violations, **self.totals}
