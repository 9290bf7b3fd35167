"""Reference op: a frozen copy of the initial policy; adds `ref_logprobs` (one per response token).

The model is load_policy(ctx.model, ctx.device, seed=ctx.seed): the same call, hence the same
initial weights, as the update op's (tiny models are seeded deterministically; real models are
read from the same folder). Forward passes run without grad in micro-batches of
micro_batch_tokens padded tokens.

`replicas: N` is one reference of N ranks (dora/ops/sharding): the frozen model is sharded with
FSDP2 (a model larger than one device fits), rank 0 takes each batch, sends every rank its rows
(split by tokens), every rank computes its rows' logprobs and rank 0 emits the batch.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable

import pyarrow as pa
import torch

from dora.ops.base import OpContext
from dora.ops.batching import collate, micro_batches, unpad
from dora.ops.arrow_rows import require_columns, with_column
from dora.ops.logprobs import response_logprobs
from dora.ops.sharding.fsdp_model import ShardedModel
from dora.ops.sharding.sharded_op import ShardedOp
from dora.ops.models import default_model_factory


@torch.no_grad()
def batch_logprobs(model, prompts: list, resps: list, budget: int, *, pad_id: int = 0, device: str = "cpu",
                   temperature: float = 1.0, passes: int | None = None,
                   compute: Callable[[], Any] = contextlib.nullcontext) -> list[list[float]]:
    """Per-token logprobs of each row's response, computed in micro-batches; Python lists, row order kept.
    `passes`: run exactly that many forward passes (extra ones on a one-token dummy), as every rank
    of a sharded model must."""
    out: list[list[float]] = [[] for _ in prompts]
    mbs: list[Any] = micro_batches([len(a) + len(b) for a, b in zip(prompts, resps)], budget) if prompts else []
    mbs += [None] * ((passes or 0) - len(mbs))
    for mb in mbs:
        if mb is None:
            pb = collate([[pad_id]], [[pad_id]], pad_id).to(device)
        else:
            pb = collate([prompts[i] for i in mb], [resps[i] for i in mb], pad_id).to(device)
        with compute():
            logp, _ = response_logprobs(model, pb, temperature=temperature)
        for i, row in zip(mb or (), unpad(logp, [len(resps[i]) for i in mb or ()])):
            out[i] = row
    return out


class ReferenceOp(ShardedOp):
    control_methods = ("stats",)

    def __init__(self, model_factory: Callable[[dict, str, int], tuple[Any, Any]] | None = None):
        self.model_factory = model_factory or default_model_factory

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self.p = ctx.params
        self.join_group(ctx)
        model, tok = self.model_factory(ctx.model, ctx.device, ctx.seed)
        model.eval()
        model.requires_grad_(False)
        self.sharded = ShardedModel(model, self.group, ctx.device, precision=self.p["precision"])
        self.model = self.sharded.module
        self.pad_id = int(getattr(tok, "pad_token_id", 0) or 0)
        self.rows = 0

    def process(self, batch: pa.RecordBatch, port: str) -> Iterable[pa.RecordBatch]:
        require_columns(batch, ["prompt_ids", "response_ids"], self.ctx.label)
        table = pa.Table.from_batches([batch]).select(["prompt_ids", "response_ids"])
        tokens = [len(a) + len(b) for a, b in zip(*(table.column(c).to_pylist() for c in table.schema.names))]
        shards, header, mine = self.spread("logprobs", {}, table, tokens, self.p["micro_batch_tokens"])
        ref = self.collect(shards, self._logprobs(header, mine))
        self.rows += batch.num_rows
        return [with_column(batch, "ref_logprobs", ref)]

    def on_logprobs(self, header: dict[str, Any], cols: dict[str, list]) -> None:
        self.collect([], self._logprobs(header, cols))

    def _logprobs(self, header: dict[str, Any], cols: dict[str, list]) -> list[list[float]]:
        return batch_logprobs(self.model, cols["prompt_ids"], cols["response_ids"], self.p["micro_batch_tokens"],
                              pad_id=self.pad_id, device=self.ctx.device, temperature=self.p["temperature"],
                              passes=header["micro_batches"], compute=self.sharded.compute)

    def finish(self) -> Iterable[pa.RecordBatch]:
        self.end_group()
        return ()

    def stats(self) -> dict:
        return {"rows": self.rows, "ranks": self.ranks}
