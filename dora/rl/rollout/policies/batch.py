"""Batch-barrier modes (sync, one_step_off): a whole batch is dispatched once nothing is in
flight, with the newest weights; instances that are idle when weights are published load them."""

from __future__ import annotations

from .rollout_policy import RolloutPolicy


class BatchPolicy(RolloutPolicy):
    def dispatch(self) -> None:
        self.c.dispatch.whole_batch()

    def on_published(self, version: int) -> None:
        m = self.c.manager
        for name, inst in m.instances.items():
            if m.load(name) == 0 and inst.version != version:
                self.c.dispatch.load(name, version)
