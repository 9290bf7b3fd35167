"""Reference op: a frozen copy of the initial policy; adds `ref_logprobs` (one per response token).

The model is load_policy(ctx.model, ctx.device, seed=ctx.seed): the same call, hence the same
initial weights, as the update op's (tiny models are seeded deterministically; real models are
read from the same folder). Forward passes run without grad in micro-batches of
micro_batch_tokens padded tokens.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import pyarrow as pa
import torch

from dora.ops.base import OpContext, Operator
from dora.ops.batching import collate, micro_batches, require_columns, unpad, with_column
from dora.ops.logprobs import response_logprobs
from dora.ops.update import default_model_factory

@torch.no_grad()
def batch_logprobs(model, prompts: list, resps: list, budget: int, *, pad_id: int = 0, device: str = "cpu",
                   temperature: float = 1.0) -> list[list[float]]:
    """Per-token logprobs of each row's response, computed in micro-batches; Python lists, row order kept."""
    out: list[list[float]] = [[] for _ in prompts]
    for mb in micro_batches([len(a) + len(b) for a, b in zip(prompts, resps)], budget):
        pb = collate([prompts[i] for i in mb], [resps[i] for i in mb], pad_id).to(device)
        logp, _ = response_logprobs(model, pb, temperature=temperature)
        for i, row in zip(mb, unpad(logp, [len(resps[i]) for i in mb])):
            out[i] = row
    return out


class ReferenceOp(Operator):
    control_methods = ("stats",)

    def __init__(self, model_factory: Callable[[dict, str, int], tuple[Any, Any]] | None = None):
        self.model_factory = model_factory or default_model_factory

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self.p = ctx.params
        self.model, tok = self.model_factory(ctx.model, ctx.device, ctx.seed)
        self.model.to(ctx.device)
        self.model.eval()
        self.model.requires_grad_(False)
        self.pad_id = int(getattr(tok, "pad_token_id", 0) or 0)
        self.rows = 0

    def process(self, batch: pa.RecordBatch, port: str) -> Iterable[pa.RecordBatch]:
        require_columns(batch, ["prompt_ids", "response_ids"], self.ctx.label)
        ref = batch_logprobs(self.model, batch.column("prompt_ids").to_pylist(), batch.column("response_ids").to_pylist(),
                             self.p["micro_batch_tokens"], pad_id=self.pad_id, device=self.ctx.device,
                             temperature=self.p["temperature"])
        self.rows += batch.num_rows
        return [with_column(batch, "ref_logprobs", ref)]

    def stats(self) -> dict:
        return {"rows": self.rows}
