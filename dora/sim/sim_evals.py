"""Held-out evaluations in the simulator, as the RL driver runs them (dora/rl/evaluation.py): for
version 0 and every `every`-th version, `prompts` requests (one sample each, prompt and response
lengths drawn from the workload with a seed of their own) are added to the rollout controller's
EvalWork before the mode hears of the version; a newer evaluation makes the older ones due, and the
end of training all of them. What it measures: what evaluating costs the trainer in each mode
(`dora simulate --eval-every N --eval-prompts P`), with the very placement code a run uses.

Like the generate op, a SimInstance aborts the evaluation requests of other versions when it loads a
version or is interrupted (SimInstance.eval_aborted), and they are placed again."""

from __future__ import annotations

import random

from dora.rl.rollout import Finished, Request, RolloutController

from .workloads import Workload


class SimEvals:
    def __init__(self, ctl: RolloutController, workload: Workload, every: int, prompts: int, seed: int):
        self.c, self.w, self.every, self.prompts = ctl, workload, every, prompts
        self.rng = random.Random(seed + 104729)
        self.sync = getattr(ctl.policy, "eval_barrier", False)
        self.added = self.finished = self.aborted = 0
        self.done_at: dict[int, float] = {}       # version -> when its last request finished

    def published(self, version: int) -> None:
        """Version `version` is about to reach the mode: start its evaluation if one is due."""
        if not self.every or version % self.every:
            return
        self.c.evals.make_due(version - 1)
        reqs = [Request(f"eval:sim:v{version}:{i}-0", f"eval:sim:v{version}:{i}", version, self.w.prompt_len(self.rng),
                        self.w.response(self.rng)) for i in range(self.prompts)]
        self.added += len(reqs)
        self.c.evals.add(version, reqs, due=self.sync)

    def on_finished(self, done: list[Finished]) -> list[Finished]:
        """Take the evaluation requests out of a completion report; the training ones are returned."""
        ev = [f.uid for f in done if f.uid.startswith("eval:")]
        if not ev:
            return done
        self.c.evals.finished(ev)
        self.finished += len(ev)
        for u in ev:
            v = int(u.split(":")[2][1:])
            if v not in self.c.evals.versions():
                self.done_at[v] = self.c.clock.now()
        return [f for f in done if not f.uid.startswith("eval:")]

    def on_aborted(self, uids: list[str]) -> None:
        self.aborted += len(uids)
        self.c.evals.aborted(uids)

    def results(self) -> dict[str, int]:
        return {"eval_requests": self.added, "eval_finished": self.finished, "eval_aborted": self.aborted,
                "eval_claims": self.c.evals.claims, "eval_versions_done": len(self.done_at)}
