"""The to_prompts op: one policy's finished trajectories become another policy's prompts.

Each trajectory row (a challenger's proposal) becomes one prompt group of `group_size` rows for the
policy it feeds (a solver): the task's `propose(response_text, source_prompt, **task_params)` rule
turns the text into {prompt, answer}; the prompt is tokenized with this node's model section (give
the node the model of the policy it feeds when that policy has its own). Every trajectory makes a
group: a propose rule is total (any text is some problem), so the policy whose trajectories these are
can always be scored on the answers (dora/ops/frontier.py).

Rows: uid, group_id, prompt, prompt_ids, answer, task (as a dataset's), `source_uid` (the
trajectory's uid) and `<version_column>` (its policy_version: the version of the policy that wrote
the problem; the param defaults to `<that policy's update node>_version`, derived at resolve).
group_id is a hash of source_uid (63 bits, never negative: reissued groups take negative ids), so a
respawned replica makes the same ids and a group is recognised wherever it comes from.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable

import pyarrow as pa

from dora.graph.columns import COLUMNS
from dora.ops.arrow_rows import require_columns
from dora.ops.base import OpContext, Operator
from dora.ops.dataset import render

DEFAULT_VERSION_COLUMN = "source_version"   # when no generate node upstream names the source policy


def group_of(source_uid: str) -> int:
    """The prompt group id of a source trajectory: a stable non-negative 63-bit hash."""
    return int(hashlib.sha1(source_uid.encode()).hexdigest()[:15], 16)


def propose_problem(task: str) -> str | None:
    """Why `task` cannot turn trajectories into problems (None: it can). The op's param check."""
    from dora.ops.tasks import TASKS, get_task

    name = task.split(":", 1)[1] if task.startswith("synthetic:") else task
    if name not in TASKS:
        from dora.graph.opspec import did_you_mean
        return f"unknown synthetic task {name!r} ({did_you_mean(name, sorted(TASKS)) or 'tasks: ' + ', '.join(sorted(TASKS))})"
    if not hasattr(get_task(name), "propose"):
        with_rule = sorted(n for n in TASKS if hasattr(get_task(n), "propose"))
        return f"task {name!r} has no propose rule (tasks with one: {', '.join(with_rule) or 'none'})"
    return None


class ToPromptsOp(Operator):
    control_methods = ("stats",)

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        from dora.ops.models import load_tokenizer
        from dora.ops.tasks import get_task

        p = ctx.params
        self.task_name = p["task"] if p["task"].startswith("synthetic:") else f"synthetic:{p['task']}"
        self.task = get_task(self.task_name)
        self.task_params = dict(p["task_params"])
        self.group_size, self.chat_template = p["group_size"], p["chat_template"]
        self.version_column = p["version_column"] or DEFAULT_VERSION_COLUMN
        self.tokenizer = load_tokenizer(ctx.model)
        self.groups = 0

    def process(self, batch: pa.RecordBatch, port: str) -> Iterable[pa.RecordBatch]:
        require_columns(batch, ["uid", "response_text", "policy_version"], self.ctx.label)
        prompt_col = "prompt" if "prompt" in batch.schema.names else None
        cols: dict[str, list[Any]] = {c: [] for c in ("uid", "group_id", "prompt", "prompt_ids", "answer", "task",
                                                     "source_uid", self.version_column)}
        for row in batch.to_pylist():
            problem = self.task.propose(row["response_text"], row[prompt_col] if prompt_col else "", **self.task_params)
            rec = render({"prompt": problem["prompt"], "answer": str(problem["answer"]), "task": self.task_name},
                         self.tokenizer, self.chat_template)
            gid = group_of(str(row["uid"]))
            for i in range(self.group_size):
                cols["uid"].append(f"{gid}-{i}")
                cols["group_id"].append(gid)
                for c in ("prompt", "prompt_ids", "answer", "task"):
                    cols[c].append(rec[c])
                cols["source_uid"].append(str(row["uid"]))
                cols[self.version_column].append(int(row["policy_version"]))
            self.groups += 1
        if not cols["uid"]:
            return ()
        types = {**COLUMNS, "source_uid": pa.string(), self.version_column: pa.int64()}
        return [pa.RecordBatch.from_arrays([pa.array(v, type=types.get(c, pa.string())) for c, v in cols.items()],
                                           names=list(cols))]

    def stats(self) -> dict[str, Any]:
        return {"groups": self.groups}
