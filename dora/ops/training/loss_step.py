"""One optimizer step of the trainer on one rank's rows: micro-batches, the off-policy correction,
the policy loss (with KL and entropy terms), gradient clipping and AdamW. Every rank runs the same
number of passes (a rank with fewer micro-batches runs zero-loss padding passes), so each parameter
gather and gradient reduction of a sharded model is a collective every rank joins.

Loss denominators are the whole batch's (header total_tokens / total_seqs), so the gradients
accumulated over micro-batches and ranks equal one full-batch loss."""

from __future__ import annotations

import math
from typing import Any

import torch

from dora.algos import losses, off_policy
from dora.ops.batching import collate, micro_batches, pad_lists
from dora.ops.logprobs import response_logprobs

SUMMED_APART = ("loss", "pg_loss", "tokens", "ratio_max")   # loss metrics not averaged token-weighted


class LossStep:
    def __init__(self, *, params: dict[str, Any], ctx, sharded, optimizer, group, ranks: int, correction: str,
                 correction_params: dict[str, Any], loss_params: dict[str, Any], pad_id: int):
        self.p, self.ctx, self.sharded, self.optimizer = params, ctx, sharded, optimizer
        self.model = sharded.module
        self.group, self.ranks, self.pad_id = group, ranks, pad_id
        self.correction, self.correction_params, self.loss_params = correction, correction_params, loss_params
        self.temperature = params["temperature"]   # null in the YAML: resolved to the generate node's

    def run(self, cols: dict[str, list], header: dict[str, Any]) -> dict[str, float]:
        """The step's passes over this rank's rows and the optimizer step; metrics of the whole batch."""
        p = self.p
        prompts, resps = cols["prompt_ids"], cols["response_ids"]
        mbs: list[Any] = micro_batches([len(a) + len(b) for a, b in zip(prompts, resps)], p["micro_batch_tokens"]) if prompts else []
        if len(mbs) > header["micro_batches"]:
            raise RuntimeError(f"{self.ctx.label}: {len(mbs)} micro-batches here, rank 0 planned {header['micro_batches']}")
        mbs += [None] * (header["micro_batches"] - len(mbs))
        old: dict[int, torch.Tensor] = {}
        token_w: dict[int, torch.Tensor] = {}
        step_corr: off_policy.Correction | None = None    # over the whole step (every rank's rows): lr_scale, metrics
        # a batch-wide correction's weights depend on every token of the step: pi_prox of all of it
        # first (the same count of passes on every rank: each is a collective when sharded)
        if off_policy.is_batch_wide(self.correction) and (len(mbs) > 1 or self.ranks > 1):
            with torch.no_grad():
                for k, mb in enumerate(mbs):
                    with self.sharded.compute():
                        pb = self._collate(self._rows(cols, mb), mb is None)
                        old[k] = response_logprobs(self.model, pb, temperature=self.temperature)[0]
            step_corr, token_w = self._correct_step(cols, mbs, old)
        acc = _Sums()
        grad_norms: list[float] = []
        for _ in range(p["ppo_epochs"]):
            self.optimizer.zero_grad(set_to_none=True)
            for k, mb in enumerate(mbs):
                self._micro_batch(cols, mb, k, header, old, token_w, acc)
            if step_corr is None:   # every micro-batch's pi_prox is known once the first pass is over
                step_corr, _ = self._correct_step(cols, mbs, old)
            grad_norms.append(self._optimizer_step(header["lr"] * step_corr.lr_scale))
        return self._metrics(acc, step_corr, grad_norms, header)

    def _micro_batch(self, cols, mb, k: int, header: dict[str, Any], old: dict[int, torch.Tensor],
                     token_w: dict[int, torch.Tensor], acc: "_Sums") -> None:
        """Forward and backward of one micro-batch (k); pi_prox and token weights are kept per k."""
        p, dev = self.p, self.ctx.device
        self.ctx.progress()   # a long step is still work: the stall watchdog sees each micro-batch
        rows = self._rows(cols, mb)
        pb = self._collate(rows, mb is None)
        T = pb.response_ids.shape[1]
        with self.sharded.compute():
            logp, ent = response_logprobs(self.model, pb, temperature=self.temperature, with_entropy=True,
                                          entropy_grad=p["entropy_coef"] != 0)
        if k not in old:
            old[k] = logp.detach()
        if k not in token_w:   # token by token: this micro-batch's rows alone decide them
            behav = pad_lists(rows["behavior_logprobs"], T).to(dev)
            token_w[k] = off_policy.compute(self.correction, prox_logprobs=old[k], mask=pb.response_mask,
                                            behavior_logprobs=behav, **self.correction_params).weight
        extra = {}
        if header["use_ref"]:
            extra = {"ref_logprobs": pad_lists(rows["ref_logprobs"], T).to(dev), "kl_coef": p["kl_coef"],
                     "kl_estimator": p["kl_estimator"]}
        loss, m = losses.compute(
            p["loss"], logprobs=logp, old_logprobs=old[k], advantages=pad_lists(rows["advantages"], T).to(dev),
            mask=pb.response_mask, token_weights=token_w[k], entropy=ent, agg=p["agg"],
            entropy_coef=p["entropy_coef"], total_tokens=header["total_tokens"], total_seqs=header["total_seqs"],
            **self.loss_params, **extra)
        loss.backward()
        acc.add(m)

    def _optimizer_step(self, lr: float) -> float:
        """Clip (the whole model's norm: the same on every rank) and step; the norm before clipping.
        A non-finite gradient skips the step."""
        clip = self.p["grad_clip"] if self.p["grad_clip"] and self.p["grad_clip"] > 0 else float("inf")
        grad_norm = self.sharded.clip_grad_norm_(clip)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _metrics(self, acc: "_Sums", step_corr: off_policy.Correction, grad_norms: list[float],
                 header: dict[str, Any]) -> dict[str, float]:
        keys = sorted(acc.sums)
        loss_total, weight_sum, ratio_max, sums = acc.loss_total, acc.weight_sum, acc.ratio_max, acc.sums
        if self.group is not None:   # the whole batch's sums: every rank has the same keys (same loss config)
            loss_total, weight_sum, *vals = self.group.sum([loss_total, weight_sum] + [sums[k] for k in keys])
            sums = dict(zip(keys, vals))
            ratio_max = self.group.max([ratio_max])[0]
        metrics = {key: val / max(weight_sum, 1.0) for key, val in sums.items()}
        metrics.update(step_corr.metrics)
        metrics.update({
            "loss": loss_total / self.p["ppo_epochs"], "lr": header["lr"] * step_corr.lr_scale, "ratio_max": ratio_max,
            "grad_norm": sum(grad_norms) / len(grad_norms),  # before clipping, mean over ppo_epochs
            "micro_batches": header["micro_batches"],
            "skipped_nonfinite_grad": sum(not math.isfinite(g) for g in grad_norms),
        })
        return metrics

    def _empty_pass(self) -> dict[str, list]:
        """One row whose loss is exactly zero: a rank with fewer micro-batches than another runs
        these, so every rank takes part in every parameter gather and gradient reduction."""
        return {"prompt_ids": [[self.pad_id]], "response_ids": [[self.pad_id]], "behavior_logprobs": [[0.0]],
                "advantages": [[0.0]], "ref_logprobs": [[0.0]]}

    def _rows(self, cols: dict[str, list], mb: list[int] | None) -> dict[str, list]:
        return self._empty_pass() if mb is None else {c: [v[i] for i in mb] for c, v in cols.items()}

    def _collate(self, rows: dict[str, list], empty: bool):
        pb = collate(rows["prompt_ids"], rows["response_ids"], self.pad_id).to(self.ctx.device)
        if empty:   # a padding pass (_empty_pass): it takes part in the collectives, its loss is zero
            pb.response_mask.zero_()
        elif "response_mask" in rows:   # multi-turn: tool observations are in no loss term (policy, KL, entropy)
            pb.response_mask.mul_(pad_lists(rows["response_mask"], pb.response_mask.shape[1]).to(pb.response_mask.device))
        return pb

    def _correct_step(self, cols: dict[str, list], mbs: list[Any], old: dict[int, torch.Tensor]
                      ) -> tuple[off_policy.Correction, dict[int, torch.Tensor]]:
        """The correction over the whole step, every rank's rows (gathered: lr_scale and batch-wide
        thresholds must not depend on how rows were split), and this rank's token weights per micro-batch."""
        # per row: log pi_prox - log pi_behav, then the row's token mask (1s, or its response_mask), one
        # vector of twice the row's length so that one gather brings both; micro-batch order
        mine: list[torch.Tensor] = []
        for k, mb in enumerate(mbs):
            for j, i in enumerate(mb or ()):
                behav = torch.tensor(cols["behavior_logprobs"][i], dtype=torch.float64)
                trained = (torch.tensor(cols["response_mask"][i], dtype=torch.float64) if "response_mask" in cols
                           else torch.ones_like(behav))
                mine.append(torch.cat([old[k][j, :len(behav)].double().cpu() - behav, trained]))
        every, offset = (mine, 0) if self.group is None else self.group.all_gather_rows(mine)
        halves = [r.view(2, -1) for r in every]
        log_r = (torch.nn.utils.rnn.pad_sequence([h[0] for h in halves], batch_first=True) if every
                 else torch.zeros(0, 0, dtype=torch.float64))
        mask = (torch.nn.utils.rnn.pad_sequence([h[1] for h in halves], batch_first=True).float() if every
                else torch.zeros(0, 0))
        corr = off_policy.compute(self.correction, prox_logprobs=log_r, behavior_logprobs=torch.zeros_like(log_r),
                                  mask=mask, **self.correction_params)
        token_w, row = {}, offset
        for k, mb in enumerate(mbs):   # this rank's rows sit at rows_before.. of the gathered step, in order
            t = old[k].shape[1]
            b = len(mb or ())
            w = corr.weight[row: row + b, :t] if b else torch.zeros(old[k].shape)
            token_w[k] = w.to(old[k].dtype).to(self.ctx.device)
            row += b
        return corr, token_w


class _Sums:
    """Loss metrics accumulated over micro-batches (and epochs): token-weighted sums of the rest."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.weight_sum = self.loss_total = self.ratio_max = 0.0

    def add(self, m: dict[str, float]) -> None:
        self.loss_total += m["loss"]
        w = m["tokens"]
        self.weight_sum += w
        self.ratio_max = max(self.ratio_max, m.get("ratio_max", 0.0))
        for key, val in m.items():
            if key not in SUMMED_APART:
                self.sums[key] = self.sums.get(key, 0.0) + val * w
