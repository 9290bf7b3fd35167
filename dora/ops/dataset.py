"""The dataset op: the source of prompts, each repeated group_size times under one group_id.

Sources (param `source`):
  synthetic:NAME      procedural tasks in dora.ops.tasks (task_params go to the generator)
  reasoning_gym:NAME  reasoning-gym procedural datasets (task_params go to create_dataset);
                      each row also carries `task_meta`, the JSON of the reasoning-gym entry,
                      so the reward op can call that dataset's own scorer
  PATH.jsonl / PATH.parquet  verl-style rows (dora/ops/data_files.py, docs/data.md): `prompt` (text,
                      or chat messages [{role, content}, ...]), answer in `reward_model.ground_truth`
                      or `answer`, optional `data_source` (becomes `task`)
`size` is the number of prompts generated, or for files the first `size` good rows (0 = all).
A row that cannot be used (malformed, or a prompt over `max_prompt_tokens` as resolved: see
dora/ops/prompt_rows.py) fails the run naming file:line (exit 2), or with on_error: skip is skipped
and counted (a `dataset_skipped` report: summary.json accounting.dataset_skipped_rows).
`holdout` (a share) leaves out the prompts a hash of their text puts in the held-out share
(dora/ops/holdout.py): held-out sets with `split: holdout` evaluate on exactly those.

Rows: uid, group_id, prompt (text as fed to the model: chat template applied for chat models),
question (the prompt as written: the last user message, before any template; what a judge reads),
prompt_ids, answer, task. The stream runs epoch after epoch (epochs=0: endless), reshuffled
each epoch from (seed, epoch); group_id = epoch * n_prompts + position, so ids never repeat,
and uid = f"{group_id}-{i}" for i in range(group_size). Batches hold batch_prompts prompts
(x group_size rows) and run across epoch boundaries, so every batch is full except the last
of a finite run. With several replicas, replica r takes every r-th prompt of the stream.
"""

from __future__ import annotations

import itertools
import json
import random
from typing import Any, Iterator

import pyarrow as pa

from dora.graph.columns import COLUMNS
from dora.ops.base import OpContext, Operator
from dora.ops.data_files import DatasetError, raw_rows
from dora.ops.dataset_settings import is_file_source, source_problem   # (the declarations name them there)
from dora.ops.holdout import held_out
from dora.ops.prompt_rows import collect, parse_file_row, parsed, prepared, render

__all__ = ["DatasetError", "DatasetOp", "load_records", "render", "source_problem"]

ROW_COLUMNS = ("uid", "group_id", "prompt", "question", "prompt_ids", "answer", "task")


class DatasetOp(Operator):
    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        p = ctx.params
        self.group_size, self.batch_prompts, self.epochs = p["group_size"], p["batch_prompts"], p["epochs"]
        self.shuffle, self.seed = p["shuffle"], p["seed"]
        from dora.ops.models import load_tokenizer

        self.tokenizer = load_tokenizer(ctx.model)
        source, limit, share = p["source"], p["max_prompt_tokens"], p["holdout"]
        # the held-out share never trains (held-out sets with split: holdout take it)
        keep = (lambda r: not held_out(r, share)) if share > 0 else None
        if is_file_source(source):
            rows = prepared(raw_rows(source), self.tokenizer, p["chat_template"], limit, parse_file_row(source), keep=keep)
        else:
            generated = load_records(source, p["size"], self.seed, dict(p["task_params"]))
            rows = prepared(((f"{source}[{i}]", r) for i, r in enumerate(generated)), self.tokenizer, p["chat_template"],
                            limit, keep=keep)
        loaded = collect(rows, p["on_error"], p["size"], source)
        self.records, self.skipped = loaded.records, (loaded.skipped, loaded.skipped_where)
        self.has_meta = any("task_meta" in r for r in self.records)

    def source(self) -> Iterator[pa.RecordBatch]:
        if self.skipped[0] and self.ctx.replica == 0:   # (every replica reads the same file: one report)
            self.ctx.report({"kind": "dataset_skipped", "node": self.ctx.node, "rows": self.skipped[0],
                             "first": self.skipped[1]})
        # replica r of R takes every R-th prompt; a resumed run skips the prompts it had consumed
        consumed = int((self.ctx.restore or {}).get("consumed", 0))
        start = self.ctx.replica + consumed * self.ctx.replicas
        picked = itertools.islice(self.stream(), start, None, self.ctx.replicas)
        while True:
            chunk = list(itertools.islice(picked, self.batch_prompts))
            if not chunk:
                return
            yield self.batch(chunk)

    def stream(self) -> Iterator[tuple[int, dict]]:
        """(group_id, record) for every prompt of every epoch, in order."""
        n = len(self.records)
        for epoch in itertools.count() if self.epochs == 0 else range(self.epochs):
            order = list(range(n))
            if self.shuffle:
                random.Random(f"{self.seed}:{epoch}").shuffle(order)
            for pos, idx in enumerate(order):
                yield epoch * n + pos, self.records[idx]

    def batch(self, chunk: list[tuple[int, dict]]) -> pa.RecordBatch:
        cols: dict[str, list] = {c: [] for c in ROW_COLUMNS + (("task_meta",) if self.has_meta else ())}
        for gid, rec in chunk:
            for i in range(self.group_size):
                cols["uid"].append(f"{gid}-{i}")
                cols["group_id"].append(gid)
                for c in ("prompt", "question", "prompt_ids", "answer", "task"):
                    cols[c].append(rec[c])
                if self.has_meta:
                    cols["task_meta"].append(rec.get("task_meta"))
        return pa.RecordBatch.from_arrays([pa.array(v, type=COLUMNS.get(c, pa.string())) for c, v in cols.items()],
                                          names=list(cols))


# -- loading ---------------------------------------------------------------------------------


def load_records(source: str, size: int, seed: int, task_params: dict[str, Any]) -> list[dict]:
    """Raw records {prompt: str | messages, answer: str, task: str[, task_meta: str]} for a source."""
    if source.startswith("synthetic:"):
        from dora.ops.tasks import get_task

        task = get_task(source)
        try:
            rows = task.make(size, seed, **task_params)
        except (TypeError, ValueError) as e:
            raise DatasetError(f"{source}: bad task_params {task_params}: {e}") from None
        return [{"prompt": r["prompt"], "answer": str(r["answer"]), "task": source} for r in rows]
    if source.startswith("reasoning_gym:"):
        return reasoning_gym_records(source.split(":", 1)[1], size, seed, task_params)
    if is_file_source(source):
        return collect(parsed(raw_rows(source), parse_file_row(source)), "fail", size, source).records
    raise DatasetError(f"dataset source {source!r}: expected synthetic:NAME, reasoning_gym:NAME, "
                       "or a path ending in .jsonl or .parquet")


def reasoning_gym_records(name: str, size: int, seed: int, task_params: dict[str, Any]) -> list[dict]:
    try:
        import reasoning_gym
    except ImportError:
        raise DatasetError(f"source reasoning_gym:{name} needs reasoning-gym: pip install reasoning-gym") from None
    try:
        ds = reasoning_gym.create_dataset(name, size=size, seed=seed, **task_params)
    except Exception as e:  # unknown name or bad config: reasoning-gym's own message says which
        raise DatasetError(f"source reasoning_gym:{name}: {type(e).__name__}: {e}") from None
    out = []
    for entry in ds:
        meta = {"question": entry["question"], "answer": entry["answer"], "metadata": entry.get("metadata", {})}
        out.append({"prompt": entry["question"], "answer": str(entry["answer"]), "task": f"reasoning_gym:{name}",
                    "task_meta": json.dumps(meta, default=str)})
    return out
