"""partial_colocated: the DORA paper's partial-rollout baseline, Kimi k1.5 style. Rollout and
training take turns on the same devices (colocated): rollout streams prompts up to RBS on the
newest version until the trainer can take a batch; then every instance stops (the training
barrier: its in-flight requests are interrupted, their tokens kept, their KV dropped, since the
trainer needs the memory) and nothing is generated while the trainer steps. At the publish every
instance loads the new weights and the interrupted requests resume under them with a re-prefill of
prompt + generated tokens (once the step is over: a run's trainer publishes before it reports
its step, the simulator's after; if the trainer takes its next batch before the publish, rollout
stays stopped until that step's). Held-out evaluation requests stop at the barrier too: taken off
every instance (started again from their prompt) and placed nowhere until it lifts. C1 is broken
as in partial (counted); the staleness cap is partial's."""

from __future__ import annotations

from ..types import Request, RequestState
from .partial import PartialPolicy


class PartialColocatedPolicy(PartialPolicy):
    name = "partial_colocated"
    listing_order = 4
    colocated = True

    def __init__(self, controller):
        super().__init__(controller)
        self.training = False               # the trainer steps (between a take and the step's end)
        self.stopped = False                # rollout waits for the publish of the step's weights
        self.published_meanwhile = False    # that publish came while the trainer still stepped
        self.paused: dict[str, tuple[dict[str, Request], list[RequestState]]] = {}   # instance -> interrupted there

    def batch_taken(self) -> None:
        self.training = self.stopped = True
        for name, inst in list(self.c.manager.instances.items()):
            reqs, states = self.interrupt(name)
            if states:
                self.paused[name] = (reqs, states)
            evals = self.c.evals.withdraw(name)   # (held-out evaluations wait too: generated again after the step)
            if evals:
                inst.abort(evals)

    def evaluations_wait(self) -> bool:
        return self.stopped

    def held(self) -> int:
        return sum(len(states) for _, states in self.paused.values())

    def dispatch(self) -> None:
        if not self.stopped:
            super().dispatch()

    def after_step(self) -> None:
        self.training = False
        if self.published_meanwhile:          # (a run's trainer publishes before it reports its step)
            self.resume_all(self.c.dispatch.newest)
            self.dispatch()

    def on_published(self, version: int) -> None:
        if self.training:                    # resume once the step is over
            self.published_meanwhile = True
            return
        self.resume_all(version)

    def resume_all(self, version: int) -> None:
        """The barrier lifts: every instance loads `version` and the interrupted requests (with any
        still running on an older version) resume under it."""
        self.stopped = self.published_meanwhile = False
        paused, self.paused = self.paused, {}
        m = self.c.manager
        for name in list(m.instances):
            reqs, states = self.interrupt(name)
            more_reqs, more = paused.pop(name, ({}, []))
            if m.instances[name].version != version:
                self.c.dispatch.load(name, version)
            self.resume(name, {**reqs, **more_reqs}, states + more, version)
        for reqs, states in paused.values():     # instances that left the pool: resume elsewhere
            self.resume(min(m.instances, key=m.load), reqs, states, version)
