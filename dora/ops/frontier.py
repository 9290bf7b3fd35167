"""The frontier op: a policy's trajectories scored by how another policy fares on them.

A challenger's proposals (port `trajectories`) are joined with the solver's scored answers to them
(port `solved`: rows that carry `source_uid`, made by dora/ops/to_prompts.py). Once `answers` answers
of one solver group have arrived for a proposal, the proposal's reward is

    1 - |mean - target| / max(target, 1 - target)

of the answers' mean reward, or with `success` set of the share of answers whose reward reaches it (an
answer that solves the problem): 1 at the solver's frontier (with target 1/2, R-Zero's uncertainty
reward 1 - 2|mean - 1/2|), 0 where the solver always or never succeeds. With `repetition` > 0 a proposal
is also penalised for the proposals of its own group that pose the same problem (R-Zero's repetition
penalty, which keeps a challenger from collapsing onto one problem): reward = max(0, frontier -
repetition x (its group's proposals with its problem, itself included) / group size), so rows go out a
whole group at a time (the advantage op after it waits for whole groups anyway). The first whole group of answers to
a proposal scores it (a group the solver's run dispatched again, e.g. after a replica died, answers
the same problem); later groups for it are counted and ignored. Each row goes out with `reward`,
`answers_reward_mean` and `<version_column>`: the newest version of the answering policy among the
group (the param defaults to `<that policy's update node>_version`, derived at resolve), so a row that
crossed policies records every policy version that touched it.
"""

from __future__ import annotations

import collections
from typing import Any, Iterable

import pyarrow as pa

from dora.ops.arrow_rows import require_columns
from dora.ops.base import OpContext, Operator

DEFAULT_VERSION_COLUMN = "answer_version"


def frontier_reward(mean: float, target: float) -> float:
    return max(0.0, 1.0 - abs(mean - target) / max(target, 1.0 - target))


class FrontierOp(Operator):
    control_methods = ("stats",)

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        p = ctx.params
        if p["answers"] is None:
            raise ValueError(f"{ctx.label}: answers is unknown (no generate node upstream of its `solved` input); set it")
        self.answers, self.target, self.success, self.repetition = p["answers"], p["target"], p["success"], p["repetition"]
        self.group_size = ctx.async_.group_size   # (the proposing policy's G: None without a dataset)
        self.groups: dict[Any, list[dict[str, Any]]] = collections.defaultdict(list)   # scored rows, by their group
        self.version_column = p["version_column"] or DEFAULT_VERSION_COLUMN
        self.rows: dict[str, dict[str, Any]] = {}                # proposal uid -> its row, until scored
        self.scores: dict[str, tuple[float, float, int, str]] = {}   # proposal uid -> (reward, mean, version, problem)
        self.partial: dict[tuple[str, Any], list[tuple[float, int]]] = collections.defaultdict(list)
        self.done: set[str] = set()                               # proposals already sent on
        self.schema: pa.Schema | None = None                      # the proposals' own, plus what this op adds
        self.ignored_answers = 0                                  # answers to a proposal already scored

    def process(self, batch: pa.RecordBatch, port: str) -> Iterable[pa.RecordBatch]:
        if port == "trajectories":
            require_columns(batch, ["uid", "group_id"], self.ctx.label)
            if self.schema is None:
                self.schema = batch.schema
                for name, typ in (("reward", pa.float32()), ("answers_reward_mean", pa.float32()),
                                  (self.version_column, pa.int64())):
                    if name not in self.schema.names:
                        self.schema = self.schema.append(pa.field(name, typ))
            for row in batch.to_pylist():
                if str(row["uid"]) not in self.done:
                    self.rows[str(row["uid"])] = row
        else:
            require_columns(batch, ["source_uid", "group_id", "reward", "policy_version"], self.ctx.label)
            for row in batch.to_pylist():
                self._answer(row)
        return self._ready()

    def _answer(self, row: dict[str, Any]) -> None:
        src = str(row["source_uid"])
        if src in self.done or src in self.scores:
            self.ignored_answers += 1
            return
        members = self.partial[(src, row["group_id"])]
        reward = float(row["reward"])
        members.append((reward if self.success is None else float(reward >= self.success), int(row["policy_version"])))
        if len(members) == self.answers:
            for key in [k for k in self.partial if k[0] == src]:   # (other attempts at the same problem)
                self.ignored_answers += len(self.partial.pop(key)) if key[1] != row["group_id"] else 0
            del self.partial[(src, row["group_id"])]
            mean = sum(r for r, _ in members) / len(members)
            self.scores[src] = (frontier_reward(mean, self.target), mean, max(v for _, v in members), str(row.get("prompt")))

    def _ready(self) -> list[pa.RecordBatch]:
        out = []
        for uid in [u for u in self.scores if u in self.rows]:
            reward, mean, version, problem = self.scores.pop(uid)
            row = self.rows.pop(uid)
            scored = {**row, "reward": reward, "answers_reward_mean": mean, self.version_column: version}
            self.done.add(uid)
            if self.group_size is None:
                out.append(scored)
                continue
            group = self.groups[row["group_id"]]
            group.append((scored, problem))
            if len(group) == self.group_size:
                del self.groups[row["group_id"]]
                out += self._penalised(group)
        return [pa.RecordBatch.from_pylist(out, schema=self.schema)] if out else []

    def _penalised(self, group: list[tuple[dict[str, Any], str]]) -> list[dict[str, Any]]:
        """A whole group, each proposal's reward less its repetition penalty."""
        same = collections.Counter(problem for _, problem in group)
        return [{**row, "reward": max(0.0, row["reward"] - self.repetition * same[problem] / len(group))}
                for row, problem in group]

    def stats(self) -> dict[str, Any]:
        return {"waiting_rows": len(self.rows), "waiting_scores": len(self.scores), "waiting_groups": len(self.groups),
                "partial_groups": len(self.partial), "ignored_answers": self.ignored_answers}
