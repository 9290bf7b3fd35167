"""The generate op's held-out evaluation requests: prompt rows with an `eval_set` column.

The RL driver submits them like prompt rows (dora/rl/evaluation.py), tagged with the version to
evaluate and the set's sampling (`eval_temperature`, `eval_top_p`, `eval_max_tokens`). They differ
from training requests in four ways:
- they never reach the data edges: a finished one is reported in an `eval_finished` event (its text,
  finish reason, token versions and the prompt row's task columns), which the driver scores;
- they run only on their own version's weights: one whose version is not hosted here when it
  arrives is not started, and is reported in an `eval_aborted` event (the driver places it again);
- one the engine refuses (a prompt over its context, where the run could not hold the set's rows to
  it at the start: dora/rl/evaluation.py) is reported in an `eval_refused` event, and the driver
  abandons that evaluation;
- they never stand in the way: interrupt_all takes the training requests only, and with a weight
  slot to spare an older version's evaluation requests go on decoding beside a newly loaded version
  (as its training stragglers do); a load_version that needs their slot (a multi-turn one: any
  load) and sleep first abort the evaluation requests of every other version (reported in
  `eval_aborted`), so what the orchestrator does to training requests goes on exactly as without
  evaluation.
"""

from __future__ import annotations

from typing import Any

from dora.ops.engines.engine import Completion, SamplingRequest
from dora.ops.eval_data import eval_sampling
from dora.ops.multiturn.agent_loop import trajectory_columns

# the prompt row's columns an eval_finished sample carries (the reward function's row, samples.jsonl)
ROW_FIELDS = ("prompt", "answer", "task", "task_meta", "eval_set")


class EvalRequests:
    """The evaluation requests in flight on one generate replica."""

    def __init__(self, op):
        self.op = op
        self.version_of: dict[str, int] = {}    # uid -> the version it evaluates

    def start(self, uid: str, prompt_ids: list[int], version: int, row: dict[str, Any]) -> None:
        op = self.op
        if version not in op.engine.hosted_versions():   # it would run on other weights: not started
            op.ctx.report({"kind": "eval_aborted", "uids": [uid], "reason": f"version {version} not hosted"})
            return
        try:
            if op.agent is not None:
                op.agent.start(uid, prompt_ids, version, row)
            else:
                op.engine.submit(SamplingRequest(uid=uid, prompt_ids=prompt_ids, version=version, stop_ids=op.stop_ids,
                                                 meta={"row": row}, **eval_sampling(row, op.sampling)))
        except ValueError as e:   # (the engine refuses it, e.g. over its context: the evaluation, not the run, ends)
            op.ctx.report({"kind": "eval_refused", "uids": [uid], "reason": str(e)})
            return
        self.version_of[uid] = version

    def take_finished(self, done: list[Completion]) -> list[Completion]:
        """Report the finished evaluation requests; returns the training ones."""
        evals = [c for c in done if c.uid in self.version_of]
        if not evals:
            return done
        samples = []
        for c in evals:
            del self.version_of[c.uid]
            row = c.meta.get("row", {})
            sample = {k: row.get(k) for k in ROW_FIELDS}
            sample.update(uid=c.uid, version=int(c.version), token_versions=sorted(set(int(v) for v in c.token_versions)),
                          response_tokens=len(c.response_ids), finish_reason=c.finish_reason,
                          response_text=self.op.tokenizer.decode(c.response_ids, skip_special_tokens=True))
            if self.op.agent is not None:   # scored on the model's final turn, as training rows are
                cols = trajectory_columns(c, self.op.tokenizer)
                sample.update(final_turn_text=cols["final_turn_text"], turns=cols["turns"], tool_calls=cols["tool_calls"])
            samples.append(sample)
        self.op.ctx.report({"kind": "eval_finished", "samples": samples})
        return [c for c in done if c.uid not in {e.uid for e in evals}]

    def abort_others(self, keep: int | None, why: str) -> list[str]:
        """Abort the evaluation requests of every version but `keep` (None: all of them); the uids."""
        uids = self.abort([u for u, v in self.version_of.items() if v != keep])
        if uids:
            self.op.ctx.report({"kind": "eval_aborted", "uids": uids, "reason": why})
        return uids

    def load_weights(self, version: int, weights) -> None:
        """The engine loads `version`: an older version's evaluation requests go on decoding on its
        weights while a slot allows, and never hold up a load (the weight slots it needs are theirs)."""
        try:
            self.op.engine.load_weights(version, weights)
        except RuntimeError:
            if not self.abort_others(version, f"version {version} loaded"):
                raise
            self.op.engine.load_weights(version, weights)

    def abort(self, uids: list[str]) -> list[str]:
        """Drop these evaluation requests here (the driver's abort of an abandoned evaluation is not
        reported back); returns those that were here."""
        gone = [u for u in uids if u in self.version_of]
        for u in gone:
            del self.version_of[u]
            if self.op.agent is not None:
                self.op.agent.abort(u)
            else:
                self.op.engine.abort(u)
        return gone
