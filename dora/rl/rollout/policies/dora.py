"""dora (multi-version streaming): several versions live at once, each trajectory finishes on
the version it started on. The Orchestrator (Algorithm 1) re-partitions instances across
versions after every step, at every publish, periodically and under pressure (triggers.py),
migrating same-version requests with their KV; older versions get new prompts only into idle
slots (legacy filling). Two rules beyond the paper that keep C1-C3: at a publish, groups still
queued unstarted on older versions move to the new version; an instance that drains while
hosting an old version loads the newest at once. With versions_per_instance M > 1 the
VersionPacker (packing.py) replaces the partition: old versions' stragglers are packed onto few
instances that take the newest version beside them."""

from __future__ import annotations

import math

from ..deadlines import Deadlines
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
        self.orch = Orchestrator(c.manager, c.dispatch, c.cfg.versions_per_instance, c.evals.claimed)
        m = c.cfg.versions_per_instance
        self.packer = VersionPacker(c.manager, c.dispatch, m, c.cfg.kv_pressure, c.evals.claimed) if m > 1 else None
        self.triggers = Triggers(c.cfg, c.manager, c.clock)
        self.deadlines = Deadlines(c.ledger, c.queue, c.cfg.max_staleness, c.clock)
        self.speed = SpeedModel()

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
        spread, floor = self.spread()
        moves = self.orch.rebalance(d.newest, d.room() + d.held(), spread, floor)
        if self.packer is not None:
            moves.update(self.packer.rebalance(d.newest, spread))
        d.place_pending_retag()
        if moves:
            c.trace.instant("orchestrator", "rebalance", "rebalance", t0, moves=dict(moves))
        d.legacy_fill(self.deadlines.can_start)
        return True

    def spread(self) -> tuple[dict[int, int], int]:
        """Old versions whose stragglers could miss their deadline, how thin to spread them, and
        how many instances the newest version keeps whatever the stragglers need.
        A request is at risk when it could need as long as the longest generation measured
        (dispatch to finish): the latest-dispatched request in flight of version v then needs
        until t0 + longest, against v's deadline. If that is `sigma` times the time left, v's
        requests must decode sigma times faster: the SpeedModel turns that into requests per
        instance from the iteration times v's instances report now.
        The newest version keeps the instances that decode what the trainer consumes: the last
        step's generated tokens per trainer step time, over the tokens per second its instances
        decode now (running requests / iteration time)."""
        c, m, dl = self.c, self.c.manager, self.deadlines
        longest = dl.longest_generation()
        if longest <= 0:
            return {}, 1
        now, newest, sent = c.clock.now(), c.dispatch.newest, c.ledger.dispatched_at
        latest: dict[int, float] = {}
        hosts: dict[int, list] = {}
        rates: list[float] = []
        for n, inst in m.instances.items():
            st = inst.stats()
            self.speed.observe(st)
            if inst.version == newest and st.active and st.step_s > 0 and n not in m.lent:
                rates.append(st.active / st.step_s)
            for v in m.versions_on[n]:                   # M = 1: the instance's own version
                if v == newest:
                    continue
                hosts.setdefault(v, []).append(st)
                t0 = max(sent.get(r.group_id, 0.0) for r in m.on_instance[n].values() if r.version == v)
                latest[v] = max(latest.get(v, 0.0), t0)
        out: dict[int, int] = {}
        for v, t0 in latest.items():
            left, need = dl.deadline(v) - now, t0 + longest - now
            if need <= left:
                continue
            sigma = need / left if left > 0 else float("inf")
            busy = [st for st in hosts[v] if st.active]
            if not busy:
                continue
            batch = sum(st.active for st in busy) / len(busy)
            step = sum(st.step_s for st in busy) / len(busy)
            out[v] = self.speed.batch_for(batch, step if step > 0 else 1.0, sigma)
        pace, last = dl.pace(), c.ledger.step_metrics[-1:]
        floor = 1
        if out and rates and pace and last:
            floor = math.ceil(last[0].response_tokens / pace / (sum(rates) / len(rates)))
        return out, floor
