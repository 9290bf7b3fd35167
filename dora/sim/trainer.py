"""SimTrainer: starts a step as soon as the controller says TBS trajectories are ready, trains for
the cost model's time, reports the step, then publishes the new weights."""

from __future__ import annotations

from typing import Callable

from dora.rl.rollout.rollout_controller import RolloutController
from dora.observe.trace import TraceWriter

from .virtual_clock import VirtualClock
from .costmodel import CostModel


class SimTrainer:
    def __init__(self, controller: RolloutController, cost: CostModel, clock: VirtualClock, gpus: int,
                 trace: TraceWriter | None = None, before_step: Callable[[], None] | None = None):
        self.c, self.cost, self.clock, self.gpus = controller, cost, clock, gpus
        self.trace = trace or TraceWriter(enabled=False)
        self.before_step = before_step      # e.g. the colocation check
        self.busy = False
        self.publishing = False
        self.blocked: Callable[[], bool] = lambda: False     # elastic: devices lent out or coming back
        self.before_publish: Callable[[int], None] = lambda v: None   # held-out evaluations (sim_evals.py)
        self.step = 0
        self.version = 0
        self.train_s = 0.0
        self.tokens = 0
        self.step_ends: list[float] = []
        self.step_tokens: list[int] = []

    def maybe_start(self) -> None:
        if self.busy or self.blocked() or not self.c.trainer_ready():
            return
        batch = self.c.take_batch()          # (a colocated mode stops its rollout at the take)
        if self.before_step:
            self.before_step()
        tokens = sum(t.prompt_tokens + t.response_tokens for t in batch)
        dur = self.cost.train_s(tokens, self.gpus)
        self.busy = True
        start, step = self.clock.now(), self.step
        self.trace.span("trainer", "train", f"train step {step}", start, start + dur, trajectories=len(batch), tokens=tokens)
        uids = [t.uid for t in batch]
        self.clock.call_later(dur, lambda: self._done(step, uids, tokens, dur))

    def _done(self, step: int, uids: list[str], tokens: int, dur: float) -> None:
        self.busy = False
        self.train_s += dur
        self.tokens += tokens
        self.step += 1
        self.version = step + 1
        self.step_ends.append(self.clock.now())
        self.step_tokens.append(tokens)
        self.c.on_trained(step, self.version, uids)
        pub = self.cost.publish_s()
        now = self.clock.now()
        self.trace.span("trainer", "publish", f"publish v{self.version}", now, now + pub)
        v = self.version
        self.publishing = True
        self.clock.call_later(pub, lambda: self._published(v))

    def _published(self, v: int) -> None:
        self.publishing = False
        self.before_publish(v)
        self.c.on_published(v)
