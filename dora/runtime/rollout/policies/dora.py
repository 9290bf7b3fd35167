"""dora (multi-version streaming): several versions live at once, each trajectory finishes on
the version it started on. The Orchestrator (Algorithm 1) re-partitions instances across
versions after every step, at every publish, periodically and under pressure (triggers.py),
migrating same-version requests with their KV; older versions get new prompts only into idle
slots (legacy filling). Two rules beyond the paper that keep C1-C3: at a publish, groups still
queued unstarted on older versions move to the new version; an instance that drains while
hosting an old version loads the newest at once."""

from __future__ import annotations

from ..deadlines import Deadlines
from ..orchestrator import Orchestrator
from ..triggers import Triggers
from .base import RolloutPolicy


class DoraPolicy(RolloutPolicy):
    name, order = "dora", 3

    def __init__(self, controller):
        super().__init__(controller)
        c = controller
        self.orch = Orchestrator(c.manager, c.dispatch)
        self.triggers = Triggers(c.cfg, c.manager, c.clock)
        self.deadlines = Deadlines(c.ledger, c.queue, c.cfg.max_staleness, c.clock)
        self.urgent_batch = c.cfg.urgent_batch_tight     # until K steps tell (see _adapt_urgent_batch)

    def start(self, now: float) -> None:
        self.triggers.reset(now)

    def instance_drained(self, name: str) -> None:
        d = self.c.dispatch
        if self.c.manager.instances[name].version != d.newest:
            d.load(name, d.newest)                       # an idle old-version instance joins the newest

    def after_step(self) -> None:
        self._adapt_urgent_batch()
        self.rebalance()                                 # trigger 1: after every training step

    def on_published(self, version: int) -> None:
        self.c.dispatch.retag_unstarted(version)
        self.rebalance()

    def on_tick(self) -> None:
        if self.triggers.due():
            self.rebalance()                             # trigger 3 (periodic) / trigger 2 (pressure)

    def rebalance(self) -> bool:
        c, d = self.c, self.c.dispatch
        t0 = c.clock.now()
        self.triggers.last_rebalance = t0
        c.ledger.totals["rebalances"] += 1
        urgent = [v for v in c.manager.outstanding if v != d.newest and self.deadlines.at_risk(v)]
        moves = self.orch.rebalance(d.newest, d.room() + d.held(), urgent, self.urgent_batch)
        d.place_pending_retag()
        if moves:
            c.trace.instant("orchestrator", "rebalance", "rebalance", t0, moves=dict(moves))
        d.legacy_fill(self.deadlines.can_start)
        return True

    def _adapt_urgent_batch(self) -> None:
        """Straggler spreading trades pool throughput for drain speed. Speed is what counts once
        the long tail takes longer to generate than the staleness window lasts in wall time
        (max dispatch -> finish time over the last 2K steps >= K x the trainer's step time, waits
        excluded: they are what this avoids): then an urgent version is spread thin
        (urgent_batch_tight); otherwise throughput counts more (urgent_batch)."""
        cfg, k = self.c.cfg, max(1, self.c.cfg.max_staleness)
        recent = self.c.ledger.step_metrics[-k:]
        if len(recent) < k:
            return
        window = sum(m.step_time_s - m.rollout_only_s for m in recent)   # the trainer's own pace
        tail = max(self.c.ledger.gen_max)   # over the last 2K steps: one short tail must not relax it
        self.urgent_batch = cfg.urgent_batch_tight if tail >= window else cfg.urgent_batch
