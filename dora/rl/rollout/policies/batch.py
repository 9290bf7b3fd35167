"""Batch-barrier modes (sync, one_step_off): a whole batch is dispatched once nothing is in
flight, with the newest weights; instances that are idle when weights are published load them."""

from __future__ import annotations

from .rollout_policy import RolloutPolicy


class BatchPolicy(RolloutPolicy):
    eval_barrier = False   # sync: held-out evaluations run between steps, before the next batch

    def dispatch(self) -> None:
        if self.eval_barrier and self.c.evals.busy():
            return
        self.c.dispatch.whole_batch()

    def spare(self, name: str) -> bool:
        """An instance with no request while the batch is out (or cannot go out yet, or waits for
        the evaluations: the barrier) has nothing to do before the next barrier."""
        c = self.c
        m, q = c.manager, c.queue
        return not m.on_instance[name] and (m.r_sum > 0 or m.exhausted or (self.eval_barrier and c.evals.busy())
                                            or q.dispatch_room(c.dispatch.newest) < c.cfg.train_batch)

    def on_published(self, version: int) -> None:
        m = self.c.manager
        for name, inst in m.instances.items():
            if m.load(name) == 0 and inst.version != version:
                self.c.dispatch.load(name, version)
