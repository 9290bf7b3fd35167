"""Critic op (PPO): a value model adds `values` (one per response token) and learns from returns.

Value model = the policy architecture's backbone (load_policy(...).base_model, the LM head
dropped) + a linear scalar head initialised to zero. The value of response token t is read at
the position that predicts token t (the same position whose logits give its logprob).

process(batch): compute values under the current weights (no grad), emit the batch with
`values`, and queue the rows. poll() (called by the worker when no input is waiting;
busy() is true while rows are queued) then takes one training step on everything queued:
targets = GAE returns from the emitted values and the rewards (gamma, lam), loss =
0.5 * max((V - R)^2, (V_clipped - R)^2) with V_clipped = V_old + clamp(V - V_old, +-value_clip),
token mean over the step, micro-batches to micro_batch_tokens, AdamW, grad clipping.
Reports {"kind": "critic_step", "node", "step", "metrics": {...}, "seconds"}.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import pyarrow as pa
import torch
from torch import nn

from dora.algos.advantages import gae_returns
from dora.algos.losses import aggregate
from dora.ops.base import OpContext, Operator
from dora.ops.batching import collate, micro_batches, pad_lists, require_columns, response_mask, unpad, with_column
from dora.ops.logprobs import response_hidden
from dora.ops.update import default_model_factory

class ValueModel(nn.Module):
    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, pb) -> torch.Tensor:
        """[B, T] values of pb's response tokens, zero on padding."""
        return self.head(response_hidden(self.backbone, pb)).squeeze(-1).float() * pb.response_mask


class CriticOp(Operator):
    control_methods = ("stats",)

    def __init__(self, model_factory: Callable[[dict, str, int], tuple[Any, Any]] | None = None):
        self.model_factory = model_factory or default_model_factory

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self.p = ctx.params
        policy, tok = self.model_factory(ctx.model, ctx.device, ctx.seed)
        self.value_model = ValueModel(policy.base_model, policy.config.hidden_size).to(ctx.device)
        self.value_model.train()
        self.optimizer = torch.optim.AdamW(self.value_model.parameters(), lr=self.p["lr"])
        self.pad_id = int(getattr(tok, "pad_token_id", 0) or 0)
        self.queue: list[dict[str, list]] = []
        self.steps = 0

    def process(self, batch: pa.RecordBatch, port: str) -> Iterable[pa.RecordBatch]:
        require_columns(batch, ["prompt_ids", "response_ids", "reward"], self.ctx.label)
        prompts = batch.column("prompt_ids").to_pylist()
        resps = batch.column("response_ids").to_pylist()
        values = self._values(prompts, resps)
        self.queue.append({"prompts": prompts, "resps": resps, "values": values,
                           "rewards": [float(r) for r in batch.column("reward").to_pylist()]})
        return [with_column(batch, "values", values)]

    def busy(self) -> bool:
        return bool(self.queue)

    def poll(self) -> Iterable[pa.RecordBatch]:
        if self.queue:
            self.train()
        return ()

    def finish(self) -> Iterable[pa.RecordBatch]:
        if self.queue:
            self.train()
        return ()

    @torch.no_grad()
    def _values(self, prompts: list, resps: list) -> list[list[float]]:
        out: list[list[float]] = [[] for _ in prompts]
        for mb in micro_batches([len(a) + len(b) for a, b in zip(prompts, resps)], int(self.p["micro_batch_tokens"])):
            pb = collate([prompts[i] for i in mb], [resps[i] for i in mb], self.pad_id).to(self.ctx.device)
            for i, row in zip(mb, unpad(self.value_model(pb), [len(resps[i]) for i in mb])):
                out[i] = row
        return out

    def train(self) -> dict[str, float]:
        """One optimizer step on every queued row; returns (and reports) its metrics."""
        t0 = time.perf_counter()
        rows = {k: [x for q in self.queue for x in q[k]] for k in ("prompts", "resps", "values", "rewards")}
        self.queue = []
        lengths = [len(r) for r in rows["resps"]]
        total_tokens = float(sum(lengths))
        if total_tokens == 0:
            return {}
        # Targets from the values emitted for these rows (pre-update), like the advantages downstream.
        mask = response_mask(lengths)
        old_v = pad_lists(rows["values"], mask.shape[1])
        _, returns = gae_returns(rewards=torch.tensor(rows["rewards"]), mask=mask, values=old_v,
                                 gamma=self.p["gamma"], lam=self.p["lam"])
        clip = float(self.p["value_clip"])
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = clipped_sum = 0.0
        dev = self.ctx.device
        for mb in micro_batches([len(a) + len(b) for a, b in zip(rows["prompts"], rows["resps"])],
                                int(self.p["micro_batch_tokens"])):
            pb = collate([rows["prompts"][i] for i in mb], [rows["resps"][i] for i in mb], self.pad_id).to(dev)
            T = pb.response_ids.shape[1]
            v = self.value_model(pb)
            v_old, ret = old_v[mb, :T].to(dev), returns[mb, :T].to(dev)
            v_clipped = v_old + (v - v_old).clamp(-clip, clip)
            l1, l2 = (v - ret) ** 2, (v_clipped - ret) ** 2
            loss = 0.5 * aggregate(torch.maximum(l1, l2), pb.response_mask, "token_mean", total_tokens=total_tokens)
            loss.backward()
            loss_sum += float(loss.detach())
            clipped_sum += float(((l2 > l1).float() * pb.response_mask).sum())
        gc = self.p["grad_clip"] if self.p["grad_clip"] and self.p["grad_clip"] > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.value_model.parameters(), gc))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        metrics = {"value_loss": loss_sum, "value_clip_frac": clipped_sum / total_tokens, "grad_norm": grad_norm,
                   "values_mean": float((old_v * mask).sum()) / total_tokens,
                   "returns_mean": float((returns * mask).sum()) / total_tokens, "tokens": int(total_tokens)}
        self.ctx.report({"kind": "critic_step", "node": self.ctx.node, "step": self.steps, "metrics": metrics,
                         "seconds": time.perf_counter() - t0})
        return metrics

    def stats(self) -> dict:
        return {"steps": self.steps, "queued_batches": len(self.queue)}
