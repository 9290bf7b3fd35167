"""Advantage op: adds `advantages` (one float per response token) and, for gae, `returns`.

Group-relative estimators need a prompt's G responses together: rows wait in a GroupBuffer
(dora.ops.group_buffer) until their group has group_size rows; then every group completed by
that input batch is scored in one call of dora.algos.advantages.compute. Batch-level whitening
(reinforce_pp_baseline, gae with whiten) is over the tokens of that call.

kl_coef > 0 folds a KL penalty into the reward, token by token: token_rewards =
-kl_coef * kl(behavior_logprobs, ref_logprobs) with kl_estimator (the policy's logprobs here are
the engine's behaviour logprobs: the only ones this op has).

Multi-turn rows (a `response_mask` column) are scored on the model's tokens only: observation
tokens get advantage 0, are in no whitening statistic, and gae steps over them (dora/algos/advantages.py).
"""

from __future__ import annotations

from typing import Iterable

import pyarrow as pa
import torch

from dora.algos import advantages as adv_mod
from dora.algos import kl as kl_mod
from dora.ops.base import OpContext, Operator
from dora.ops.batching import pad_lists, response_mask, unpad
from dora.ops.arrow_rows import require_columns, with_column
from dora.ops.group_buffer import GroupBuffer

class AdvantageOp(Operator):
    control_methods = ("stats",)

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self.p = ctx.params
        self.estimator = self.p["estimator"]
        self.est_params = ({"gamma": self.p["gamma"], "lam": self.p["lam"], "whiten": self.p["whiten"]}
                           if self.estimator == "gae" else {})
        self.groups = GroupBuffer(ctx.async_.group_size, ctx.label)
        self.rows_out = 0
        self.incomplete_rows = 0

    def process(self, batch: pa.RecordBatch, port: str) -> Iterable[pa.RecordBatch]:
        require_columns(batch, ["group_id", "reward", "response_ids"], self.ctx.label)
        ready = self.groups.add(batch)
        return [self.score(ready)] if ready is not None else []

    def finish(self) -> Iterable[pa.RecordBatch]:
        rest = self.groups.drain()
        if rest is None:
            return []
        # End of stream with groups short of group_size (an upstream filter or a finite dataset):
        # score them as they are rather than drop data, and say so.
        self.incomplete_rows += rest.num_rows
        self.ctx.report({"kind": "incomplete_groups", "node": self.ctx.node, "rows": rest.num_rows})
        return [self.score(rest)]

    def score(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        label = self.ctx.label
        rewards_list = batch.column("reward").to_pylist()
        if any(r is None for r in rewards_list):
            uids = batch.column("uid").to_pylist() if "uid" in batch.schema.names else list(range(batch.num_rows))
            bad = [u for u, r in zip(uids, rewards_list) if r is None]
            raise ValueError(f"{label}: null reward for trajectories {bad[:5]}")
        resp = batch.column("response_ids").to_pylist()
        lengths = [len(r) for r in resp]
        T = max(lengths, default=0)
        mask = response_mask(lengths, T)
        if "response_mask" in batch.schema.names:
            mask = mask * pad_lists(batch.column("response_mask").to_pylist(), T)
        values = None
        if self.estimator == "gae":
            require_columns(batch, ["values"], f"{label} (estimator gae)")
            values = pad_lists(batch.column("values").to_pylist(), T)
        token_rewards = None
        if self.p["kl_coef"]:
            require_columns(batch, ["behavior_logprobs", "ref_logprobs"], f"{label} (kl_coef > 0)")
            kl = kl_mod.compute(self.p["kl_estimator"], logprobs=pad_lists(batch.column("behavior_logprobs").to_pylist(), T),
                                ref_logprobs=pad_lists(batch.column("ref_logprobs").to_pylist(), T))
            token_rewards = -self.p["kl_coef"] * kl * mask
        rewards = torch.tensor(rewards_list, dtype=torch.float32)
        gids = torch.tensor(batch.column("group_id").to_pylist(), dtype=torch.int64)
        adv = adv_mod.compute(self.estimator, rewards=rewards, group_ids=gids, mask=mask, values=values,
                              token_rewards=token_rewards, **self.est_params)
        out = with_column(batch, "advantages", unpad(adv, lengths))
        if self.estimator == "gae":
            _, returns = adv_mod.gae_returns(rewards=rewards, mask=mask, values=values, token_rewards=token_rewards,
                                             gamma=self.p["gamma"], lam=self.p["lam"])
            out = with_column(out, "returns", unpad(returns, lengths))
        self.rows_out += out.num_rows
        return out

    def stats(self) -> dict:
        return {"rows_out": self.rows_out, "pending_rows": self.groups.pending_rows, "incomplete_rows": self.incomplete_rows}
