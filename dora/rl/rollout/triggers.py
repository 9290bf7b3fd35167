"""When the orchestrator re-partitions, besides the mandatory trigger after each training step
(Algorithm 1's triggers 2 and 3): periodically, so that orphan requests do not linger on old
versions, and under pressure (requests queued on one instance while a peer of its version has
free slots, or an instance's KV cache nearly full)."""

from __future__ import annotations

from ..clock import Clock
from .config import RolloutConfig
from .manager import RolloutManager


class Triggers:
    def __init__(self, cfg: RolloutConfig, manager: RolloutManager, clock: Clock):
        self.cfg, self.m, self.clock = cfg, manager, clock
        self.last_rebalance = self.last_kv_check = 0.0

    def reset(self, now: float) -> None:
        self.last_rebalance = self.last_kv_check = now

    def due(self) -> bool:
        """Trigger 3 (periodic) or trigger 2 (pressure)."""
        return self.clock.now() - self.last_rebalance >= self.cfg.rebalance_period_s or self.pressure()

    def pressure(self) -> bool:
        """Utilisation: an instance holds more than (1 + queue_pressure) x its slots while another
        instance of its version has free slots (from our own counts, no RPC). KV: an instance's
        kv_used_fraction > kv_pressure (stats() RPCs, at most every kv_check_s)."""
        m, cfg = self.m, self.cfg
        hot: set[int | None] = set()
        cold: set[int | None] = set()
        for n, inst in m.instances.items():
            load, slots = len(m.on_instance[n]), m.slots_of(n)
            if load > (1 + cfg.queue_pressure) * slots:
                hot.add(inst.version)
            elif load < slots:
                cold.add(inst.version)
        if hot & cold:
            return True
        now = self.clock.now()
        if now - self.last_kv_check >= cfg.kv_check_s:
            self.last_kv_check = now
            if any(i.stats().kv_used_fraction > cfg.kv_pressure for i in m.instances.values()):
                return True
        return False
