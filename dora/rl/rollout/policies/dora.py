"""dora (multi-version streaming): several versions live at once, each trajectory finishes on
the version it started on. The Orchestrator (Algorithm 1) re-partitions instances across
versions after every step, at every publish, periodically and under pressure (triggers.py),
migrating same-version requests with their KV; older versions get new prompts only into idle
slots (legacy filling). Rules beyond the paper that keep C1-C3: at a publish, groups still
queued unstarted on older versions move to the new version; an instance that drains while
hosting an old version loads the newest at once; a version whose stragglers could miss their
deadline gets fast lanes (fast_lanes.py). With versions_per_instance M > 1 the VersionPacker
(packing.py) packs old versions' stragglers onto few instances that take the newest version beside
them (not those in fast lanes)."""

from __future__ import annotations

from ..deadlines import Deadlines
from ..fast_lanes import FastLanes
from ..length_aware import start_siblings_on_newest
from ..orchestrator import Orchestrator
from ..packing import VersionPacker
from ..speed import SpeedModel
from ..triggers import Triggers
from .rollout_policy import RolloutPolicy


class DoraPolicy(RolloutPolicy):
    name = "dora"
    listing_order = 3

    def __init__(self, controller):
        super().__init__(controller)
        c = controller
        self.orch = Orchestrator(c.manager, c.dispatch, c.cfg.versions_per_instance, c.cfg.kv_pressure, c.evals.claimed)
        m = c.cfg.versions_per_instance
        self.packer = VersionPacker(c.manager, c.dispatch, m, c.cfg.kv_pressure, c.evals.claimed) if m > 1 else None
        self.triggers = Triggers(c.cfg, c.manager, c.clock)
        self.deadlines = Deadlines(c.ledger, c.queue, c.cfg.max_staleness, c.clock)
        self.speed = SpeedModel()
        self.lanes = FastLanes(c, self.deadlines, self.speed, c.cfg.fast_lanes)

    def start(self, now: float) -> None:
        self.triggers.reset(now)

    def instance_drained(self, name: str) -> None:
        d = self.c.dispatch
        if self.c.manager.instances[name].version != d.newest:
            d.load(name, d.newest)                       # an idle old-version instance joins the newest

    def after_step(self) -> None:
        self.rebalance()                                 # trigger 1: after every training step

    def on_published(self, version: int) -> None:
        self.c.dispatch.retag_unstarted(version)
        self.rebalance()

    def dispatch(self) -> None:
        if self.packer is not None:
            self.packer.mix(self.c.dispatch.newest)      # an old version no longer fills an instance
        super().dispatch()

    def on_tick(self) -> None:
        if self.triggers.due():
            self.rebalance()                             # trigger 3 (periodic) / trigger 2 (pressure)

    def rebalance(self) -> bool:
        c, d = self.c, self.c.dispatch
        t0 = c.clock.now()
        self.triggers.last_rebalance = t0
        c.ledger.totals["rebalances"] += 1
        spread, floor, cap = self.lanes.plan()
        if c.cfg.length_aware:
            start_siblings_on_newest(d, set(spread))
        moves = self.orch.rebalance(d.newest, d.room() + d.held(), spread, floor, cap)
        if self.packer is not None:
            moves.update(self.packer.rebalance(d.newest, spread))
        d.place_pending_retag()
        if moves:
            c.trace.instant("orchestrator", "rebalance", "rebalance", t0, moves=dict(moves))
        d.legacy_fill(self.deadlines.can_start)
        return True
