"""The reward_model op: a sequence classifier with one label scores prompt + response.

Each row's input is `template` filled from the row ({prompt} {response} {answer}, as a judge's
rubric: dora/ops/judge/rubric.py; default "{prompt}{response}"), tokenized by the reward model's
own tokenizer (never the policy's ids: the two may differ). An input longer than `max_length`
keeps its last max_length tokens (the response's end) and is counted as `truncated`. Rows are
scored in micro-batches of at most `token_budget` padded tokens (rows x longest row, rows of
similar length together: dora/ops/batching.py), right-padded, the score read at each row's last
token; the score goes to `column` (reward by default: it feeds advantage directly; or
reward/<name> for a reward node's sources). The model (dora/ops/classifier_models.py) is frozen,
in `dtype`, on the replica's device; a declared memory share caps the replica's allocator there.
process() scores the whole batch before it returns, so a slow reward model back-pressures its
input edge by itself.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

import pyarrow as pa

from dora.ops.arrow_rows import require_columns, with_column
from dora.ops.base import OpContext, Operator
from dora.ops.judge.rubric import fill, row_fields


class RewardModelOp(Operator):
    control_methods = ("stats",)

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        from dora.ops.classifier_models import load_classifier

        p = ctx.params
        self.model, self.tok = load_classifier(p["model"], ctx.device, seed=ctx.seed, dtype=p["dtype"])
        self.template, self.column, self.budget = p["template"], p["column"], p["token_budget"]
        limit = getattr(self.model.config, "max_position_embeddings", None)
        self.max_length = p["max_length"] or limit or 4096
        self.pad_id = int(self.model.config.pad_token_id)
        self.counts = {"scored": 0, "truncated": 0, "forward_passes": 0, "padded_tokens": 0, "tokens": 0}
        self.seconds = 0.0

    def process(self, batch: pa.RecordBatch, port: str) -> Iterable[pa.RecordBatch]:
        require_columns(batch, ["response_text"], self.ctx.label)
        ids = [self._ids(row) for row in batch.to_pylist()]
        return [with_column(batch, self.column, self.score(ids))]

    def _ids(self, row: dict[str, Any]) -> list[int]:
        ids = [int(i) for i in self.tok.encode(fill(self.template, row_fields(row)), add_special_tokens=True)]
        if len(ids) > self.max_length:
            self.counts["truncated"] += 1
            ids = ids[-self.max_length:]
        return ids or [self.pad_id]

    def score(self, ids: list[list[int]]) -> list[float]:
        """One score per token list, by micro-batches of at most token_budget padded tokens."""
        import torch

        from dora.ops.batching import micro_batches

        t0 = time.perf_counter()
        scores = [0.0] * len(ids)
        for part in micro_batches([len(x) for x in ids], self.budget):
            width = max(len(ids[i]) for i in part)
            tokens = torch.full((len(part), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(part), width), dtype=torch.long)
            for row, i in enumerate(part):
                tokens[row, :len(ids[i])] = torch.as_tensor(ids[i])
                mask[row, :len(ids[i])] = 1
            with torch.no_grad():
                logits = self.model(input_ids=tokens.to(self.model.device), attention_mask=mask.to(self.model.device)).logits
            for row, i in enumerate(part):
                scores[i] = float(logits[row, 0].float())
            self.counts["forward_passes"] += 1
            self.counts["padded_tokens"] += len(part) * width
            self.ctx.progress()
        self.counts["scored"] += len(ids)
        self.counts["tokens"] += sum(len(x) for x in ids)
        self.seconds += time.perf_counter() - t0
        return scores

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "seconds": round(self.seconds, 3)}

    def live_stats(self) -> dict[str, Any]:
        return self.stats()


def check_params(p: dict[str, Any]) -> list[tuple[str, str]]:
    """What `dora validate` checks of a reward_model node: a one-label classifier section (read, not
    loaded) and a template with {response} (the column: reward_sources.column_problem)."""
    from dora.ops.classifier_models import classifier_problems
    from dora.ops.judge.rubric import template_problem

    problems = [(f"model.{key}" if key else "model", msg) for key, msg in classifier_problems(p["model"])]
    if template_problem(p["template"], "template"):
        problems.append(("template", template_problem(p["template"], "template")))
    return problems
