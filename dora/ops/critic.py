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

Multi-turn rows (a `response_mask` column): values are trained on the model's tokens only, and the
GAE targets step over tool observations as the advantage op's do.

`replicas: N` is one critic of N ranks (dora/ops/sharding): the value model is sharded with FSDP2;
rank 0 takes the data and sends every rank its rows (split by tokens) both for the values and for
the training step, whose gradients are summed across ranks (token-mean over the whole step).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import pyarrow as pa
import torch
from torch import nn

from dora.algos.advantages import gae_returns
from dora.algos.losses import aggregate
from dora.ops.base import OpContext
from dora.ops.batching import collate, micro_batches, pad_lists, response_mask, unpad
from dora.ops.arrow_rows import require_columns, with_column
from dora.ops.logprobs import response_hidden
from dora.ops.sharding.fsdp_model import ShardedModel
from dora.ops.sharding.sharded_op import ShardedOp
from dora.ops.models import default_model_factory

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


class CriticOp(ShardedOp):
    control_methods = ("stats",)

    def __init__(self, model_factory: Callable[[dict, str, int], tuple[Any, Any]] | None = None):
        self.model_factory = model_factory or default_model_factory

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self.p = ctx.params
        self.join_group(ctx)
        policy, tok = self.model_factory(ctx.model, ctx.device, ctx.seed)
        value_model = ValueModel(policy.base_model, policy.config.hidden_size)
        value_model.train()
        self.sharded = ShardedModel(value_model, self.group, ctx.device, precision=self.p["precision"],
                                    activation_checkpointing=self.p["activation_checkpointing"])
        self.value_model = self.sharded.module
        self.optimizer = torch.optim.AdamW(self.sharded.params(), lr=self.p["lr"])
        self.pad_id = int(getattr(tok, "pad_token_id", 0) or 0)
        self.queue: list[dict[str, list]] = []
        self.steps = 0

    def process(self, batch: pa.RecordBatch, port: str) -> Iterable[pa.RecordBatch]:
        require_columns(batch, ["prompt_ids", "response_ids", "reward"], self.ctx.label)
        table = pa.Table.from_batches([batch]).select(["prompt_ids", "response_ids"])
        prompts, resps = (table.column(c).to_pylist() for c in ("prompt_ids", "response_ids"))
        shards, header, mine = self.spread("values", {}, table, [len(a) + len(b) for a, b in zip(prompts, resps)],
                                           int(self.p["micro_batch_tokens"]))
        values = self.collect(shards, self._values(header, mine))
        masks = (batch.column("response_mask").to_pylist() if "response_mask" in batch.schema.names
                 else [[1] * len(r) for r in resps])
        self.queue.append({"prompts": prompts, "resps": resps, "values": values, "masks": masks,
                           "rewards": [float(r) for r in batch.column("reward").to_pylist()]})
        return [with_column(batch, "values", values)]

    def on_values(self, header: dict[str, Any], cols: dict[str, list]) -> None:
        self.collect([], self._values(header, cols))

    def busy(self) -> bool:
        return bool(self.queue) if self.leader else super().busy()

    def poll(self) -> Iterable[pa.RecordBatch]:
        if not self.leader:
            return super().poll()
        if self.queue:
            self.train()
        return ()

    def finish(self) -> Iterable[pa.RecordBatch]:
        if self.queue:
            self.train()
        self.end_group()
        return ()

    @torch.no_grad()
    def _values(self, header: dict[str, Any], cols: dict[str, list]) -> list[list[float]]:
        prompts, resps = cols["prompt_ids"], cols["response_ids"]
        out: list[list[float]] = [[] for _ in prompts]
        mbs: list[Any] = micro_batches([len(a) + len(b) for a, b in zip(prompts, resps)], int(self.p["micro_batch_tokens"])) if prompts else []
        mbs += [None] * (header["micro_batches"] - len(mbs))   # every rank runs as many passes
        for mb in mbs:
            pb = collate([prompts[i] for i in mb] if mb else [[self.pad_id]], [resps[i] for i in mb] if mb else [[self.pad_id]],
                         self.pad_id).to(self.ctx.device)
            with self.sharded.compute():
                v = self.value_model(pb)
            for i, row in zip(mb or (), unpad(v, [len(resps[i]) for i in mb or ()])):
                out[i] = row
        return out

    def train(self) -> dict[str, float]:
        """Rank 0: one optimizer step on every queued row, every rank taking its share; returns (and
        reports) its metrics."""
        t0 = time.perf_counter()
        rows = {k: [x for q in self.queue for x in q[k]] for k in ("prompts", "resps", "values", "masks", "rewards")}
        self.queue = []
        total_tokens = float(sum(sum(m) for m in rows["masks"]))
        if total_tokens == 0:
            return {}
        table = pa.table({"prompt_ids": pa.array(rows["prompts"], pa.list_(pa.int32())),
                          "response_ids": pa.array(rows["resps"], pa.list_(pa.int32())),
                          "values": pa.array(rows["values"], pa.list_(pa.float32())),
                          "response_mask": pa.array(rows["masks"], pa.list_(pa.int8())),
                          "reward": pa.array(rows["rewards"], pa.float32())})
        _, header, mine = self.spread("train", {"total_tokens": total_tokens}, table,
                                      [len(a) + len(b) for a, b in zip(rows["prompts"], rows["resps"])],
                                      int(self.p["micro_batch_tokens"]))
        metrics = self._train_rows(header, mine)
        self.ctx.report({"kind": "critic_step", "node": self.ctx.node, "step": self.steps, "metrics": metrics,
                         "seconds": time.perf_counter() - t0})
        return metrics

    def on_train(self, header: dict[str, Any], cols: dict[str, list]) -> None:
        self._train_rows(header, cols)

    def _train_rows(self, header: dict[str, Any], cols: dict[str, list]) -> dict[str, float]:
        """Every rank: its rows' share of the step (token mean over the whole step's tokens), then the
        optimizer step on the summed gradients; metrics of the whole step."""
        prompts, resps = cols["prompt_ids"], cols["response_ids"]
        total_tokens = header["total_tokens"]
        lengths = [len(r) for r in resps]
        # Targets from the values emitted for these rows (pre-update), like the advantages downstream.
        mask = response_mask(lengths)
        mask = mask * pad_lists(cols["response_mask"], mask.shape[1])   # 0 on tool observations
        old_v = returns = pad_lists(cols["values"], mask.shape[1])
        if prompts:   # (a rank may get no rows when a step has fewer rows than ranks)
            _, returns = gae_returns(rewards=torch.tensor(cols["reward"], dtype=torch.float32), mask=mask, values=old_v,
                                     gamma=self.p["gamma"], lam=self.p["lam"])
        clip = float(self.p["value_clip"])
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = clipped_sum = 0.0
        dev = self.ctx.device
        mbs: list[Any] = micro_batches([len(a) + len(b) for a, b in zip(prompts, resps)], int(self.p["micro_batch_tokens"])) if prompts else []
        mbs += [None] * (header["micro_batches"] - len(mbs))
        for mb in mbs:
            if mb is None:   # a pass with zero loss, so every rank joins every gather and reduction
                pb = collate([[self.pad_id]], [[self.pad_id]], self.pad_id).to(dev)
                pb.response_mask.zero_()
                v_old = ret = torch.zeros(1, 1, device=dev)
            else:
                pb = collate([prompts[i] for i in mb], [resps[i] for i in mb], self.pad_id).to(dev)
                T = pb.response_ids.shape[1]
                pb.response_mask.mul_(mask[mb, :T].to(dev))
                v_old, ret = old_v[mb, :T].to(dev), returns[mb, :T].to(dev)
            with self.sharded.compute():
                v = self.value_model(pb)
            v_clipped = v_old + (v - v_old).clamp(-clip, clip)
            l1, l2 = (v - ret) ** 2, (v_clipped - ret) ** 2
            loss = 0.5 * aggregate(torch.maximum(l1, l2), pb.response_mask, "token_mean", total_tokens=total_tokens)
            loss.backward()
            loss_sum += float(loss.detach())
            clipped_sum += float(((l2 > l1).float() * pb.response_mask).sum())
        gc = self.p["grad_clip"] if self.p["grad_clip"] and self.p["grad_clip"] > 0 else float("inf")
        grad_norm = self.sharded.clip_grad_norm_(gc)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        values_sum, returns_sum = float((old_v * mask).sum()), float((returns * mask).sum())
        if self.group is not None:
            loss_sum, clipped_sum, values_sum, returns_sum = self.group.sum([loss_sum, clipped_sum, values_sum, returns_sum])
        return {"value_loss": loss_sum, "value_clip_frac": clipped_sum / total_tokens, "grad_norm": grad_norm,
                "values_mean": values_sum / total_tokens, "returns_mean": returns_sum / total_tokens,
                "tokens": int(total_tokens), "ranks": self.ranks}

    def stats(self) -> dict:
        return {"steps": self.steps, "queued_batches": len(self.queue), "ranks": self.ranks}
