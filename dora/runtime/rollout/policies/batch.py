"""Batch-barrier modes (sync, one_step_off): a whole batch is dispatched once nothing is in
flight, with the newest weights; instances that are idle when weights are published load them."""

from __future__ import annotations

from .base import RolloutPolicy


class BatchPolicy(RolloutPolicy):
    forced_staleness = 0            # K is not a choice: the barrier fixes how old a batch can be

    @classmethod
    def resolve(cls, cfg) -> None:
        cfg.max_staleness, cfg.rollout_batch = cls.forced_staleness, cfg.train_batch

    def dispatch(self) -> None:
        self.c.dispatch.whole_batch()

    def on_published(self, version: int) -> None:
        m = self.c.manager
        for name, inst in m.instances.items():
            if m.load(name) == 0 and inst.version != version:
                self.c.dispatch.load(name, version)
