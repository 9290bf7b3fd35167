"""Update op: the trainer. Buffers trajectories, trains one step per train_batch, publishes weights.

A step (train_step) is taken as soon as the buffer can supply EXACTLY train_batch trajectories
(ctx.async_cfg["train_batch"]) made of whole prompt groups, groups taken oldest policy_version
first (then arrival order); anything left waits for the next step. Per step:

1. rows -> micro-batches whose padded prompt+response size fits micro_batch_tokens;
2. for each of ppo_epochs passes over the micro-batches: forward under the current weights,
   loss from dora.algos.losses (ratio vs the proximal policy, each token weighted by the
   off-policy correction `off_policy` from dora.algos.off_policy, which compares the proximal
   policy with the engine's behavior_logprobs; KL to ref_logprobs when kl_coef > 0 and the column
   is present, entropy bonus), backward with batch-wide denominators, so accumulated gradients
   equal those of one full-batch loss; then grad-norm clipping, the step's lr (warmup + cosine,
   times the correction's lr_scale), one AdamW step.
   old_logprobs (pi_prox) are the logprobs of pass 1, detached: the weights do not change
   before pass 1's optimizer step, so they equal a separate no-grad pass and save a forward.
   The correction's lr_scale and metrics are over the whole step, from every micro-batch's pi_prox
   after pass 1; its token weights are computed micro-batch by micro-batch, except for a
   batch-wide correction (weights that depend on a threshold over the whole step), which gets
   pi_prox of every micro-batch from a no-grad pass before the first backward;
3. version v -> v + 1: weights saved with dora.ops.weights.versions.save_version and reported as
   {"kind": "weights", "version", "path", "bytes", "seconds"}; then
   {"kind": "train_step", "step", "version", "uids", "metrics": {...}, "seconds"};
4. checkpoint every save_every steps and at the last step; after `steps` steps,
   {"kind": "done", "step", "version"}; later input is counted and dropped.

Every step also appends one line to <run_dir>/trained.jsonl: {"step", "version", "uids",
"policy_versions"} (the version each trajectory was dispatched with), the trainer's own record
of what it trained, so a run can be audited for lost, duplicated or too-stale trajectories.

With `weight_sync: broadcast` (and `broadcast_to` = the generate replica count) each version is
also sent to the replicas by torch.distributed broadcast (dora/ops/weights/broadcast.py) right
after its file is written; the weights event then carries broadcast_s and broadcast_bytes, and
train_step metrics do too. The file is still written, so any version can be loaded from it.

Version 0 (the initial weights) is published at setup, so every generate replica can start
from the trainer's exact weights. The model comes from dora.ops.models.load_policy(ctx.model,
ctx.device, seed=ctx.seed) unless a model_factory is given (tests, custom models).
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable, Iterable

import pyarrow as pa
import torch

from dora.algos import kl as kl_mod
from dora.algos import losses, off_policy
from dora.algos.schedule import lr_at
from dora.ops.weights import pretrained, versions as weights
from dora.ops.base import OpContext, Operator
from dora.ops.batching import collate, concat_rows, micro_batches, pad_lists, require_columns, response_mask
from dora.ops.logprobs import response_logprobs
from dora.ops.weights.broadcast import WeightBroadcaster

DEFAULTS: dict[str, Any] = {
    "loss": "ppo_clip", "lr": 1e-5, "weight_decay": 0.0, "warmup_steps": 0, "total_steps": 0, "min_lr_ratio": 0.1,
    "grad_clip": 1.0, "micro_batch_tokens": 4096, "clip_eps": 0.2, "clip_eps_high": None, "dual_clip": None,
    "agg": "token_mean", "off_policy": {"name": "ess_lr", "cap": 2.0, "power": 0.5}, "kl_coef": 0.0, "kl_estimator": "k3", "entropy_coef": 0.0, "ppo_epochs": 1,
    "steps": 20, "save_every": 0, "weight_sync": "file", "broadcast_to": 0,
}
NEEDS = ["uid", "prompt_ids", "response_ids", "behavior_logprobs", "advantages", "policy_version", "group_id"]
OPTIONAL = ["reward", "ref_logprobs"]

ModelFactory = Callable[[dict, str, int], tuple[Any, Any]]


def _parse_off_policy(spec: Any, label: str) -> tuple[str, dict[str, Any]]:
    """(name, params) from the `off_policy` param {name: ..., <that correction's params>}; checked
    here, at setup, with a dry run on one token so that a bad value fails before any training."""
    names = ", ".join(off_policy.OFF_POLICY.names())
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"{label}: off_policy must be a mapping {{name: <{names}>, <its params>}}, got {spec!r}")
    name, params = spec["name"], {k: v for k, v in spec.items() if k != "name"}
    try:
        one = torch.zeros(1, 1)
        off_policy.compute(name, prox_logprobs=one, behavior_logprobs=one, mask=torch.ones(1, 1), **params)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{label}: off_policy: {e}") from None
    return name, params


def _whole_batch(old: dict[int, torch.Tensor], behav: dict[int, torch.Tensor], mbs: list[list[int]],
                 lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pi_prox, pi_behav and the response mask of every micro-batch, stacked in micro-batch order
    ([B, T] with T the longest response), for corrections and metrics over the whole step."""
    width = max(lengths, default=0)
    pad = lambda x: torch.nn.functional.pad(x, (0, width - x.shape[1]))
    prox = torch.cat([pad(old[k].detach()) for k in range(len(mbs))])
    beh = torch.cat([pad(behav[k]) for k in range(len(mbs))])
    mask = response_mask([lengths[i] for mb in mbs for i in mb], width)
    return prox, beh, mask


def _split_rows(x: torch.Tensor, like: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Inverse of _whole_batch: rows and widths of each micro-batch."""
    out, row = {}, 0
    for k in range(len(like)):
        b, t = like[k].shape
        out[k] = x[row: row + b, :t]
        row += b
    return out


def default_model_factory(model_cfg: dict, device: str, seed: int):
    """(model, tokenizer) from the pipeline's model section (dora.ops.models.load_policy)."""
    from dora.ops.models import load_policy
    return load_policy(model_cfg, device, seed=seed)


class UpdateOp(Operator):
    control_methods = ("train_ready", "stats")

    def __init__(self, model_factory: ModelFactory | None = None):
        self.model_factory = model_factory or default_model_factory

    # ------------------------------------------------------------------ setup
    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        p = self.p = {**DEFAULTS, **ctx.params}
        label = ctx.label
        losses.LOSSES.get(p["loss"])
        kl_mod.KL_ESTIMATORS.get(p["kl_estimator"])
        self.loss_params = {"clip_eps": p["clip_eps"], "clip_eps_high": p["clip_eps_high"]}
        if p["dual_clip"] is not None:
            self.loss_params["dual_clip"] = p["dual_clip"]
        losses.LOSSES.check_params(p["loss"], self.loss_params)
        self.correction, self.correction_params = _parse_off_policy(p["off_policy"], label)
        if p["agg"] not in losses.AGGS:
            raise ValueError(f"{label}: unknown agg {p['agg']!r}; valid: {', '.join(losses.AGGS)}")
        tb = ctx.async_cfg.get("train_batch")
        if not isinstance(tb, int) or isinstance(tb, bool) or tb <= 0:
            raise ValueError(f"{label}: async.train_batch must be a positive integer, got {tb!r}")
        self.train_batch = tb
        if not ctx.run_dir:
            raise ValueError(f"{label}: update needs a run_dir for weights and checkpoints")
        # keep the versions the rollout window can still be loading, plus one being written
        self.keep_versions = int(ctx.async_cfg.get("max_staleness", 1)) + 2
        torch.manual_seed(ctx.seed)
        self.model, self.tokenizer = self.model_factory(ctx.model, ctx.device, ctx.seed)
        self.model.to(ctx.device)
        self.model.train()
        self.params = [q for q in self.model.parameters() if q.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=p["lr"], weight_decay=p["weight_decay"])
        self.temperature = float(p.get("temperature") or 1.0)   # null: launch fills in the generate node's
        self.pad_id = int(getattr(self.tokenizer, "pad_token_id", 0) or 0)
        self.buffer: pa.Table | None = None
        self.step = 0
        self.version = 0
        self.done = False
        self.dropped_rows = 0
        self.last_saved_step = -1
        os.makedirs(ctx.run_dir, exist_ok=True)
        self.ledger = open(os.path.join(ctx.run_dir, "trained.jsonl"), "w", encoding="utf-8")
        if p["weight_sync"] not in ("file", "broadcast"):
            raise ValueError(f"{label}: unknown weight_sync {p['weight_sync']!r}; use 'file' or 'broadcast'")
        self.broadcaster: WeightBroadcaster | None = None
        self.last_broadcast: dict[str, float] = {}
        if p["weight_sync"] == "broadcast":
            # blocks until every generate replica joined (or raises after the rendezvous deadline)
            self.broadcaster = WeightBroadcaster(ctx.run_dir, p["broadcast_to"], ctx.device, label=label)
        self._publish(seconds_train=None)

    # ------------------------------------------------------------------ data in
    def process(self, batch: pa.RecordBatch, port: str) -> Iterable[pa.RecordBatch]:
        if self.done:
            self.dropped_rows += batch.num_rows
            return ()
        require_columns(batch, NEEDS, self.ctx.label)
        keep = NEEDS + [c for c in OPTIONAL if c in batch.schema.names]
        table = pa.Table.from_batches([batch]).select(keep)
        self.buffer = table if self.buffer is None else concat_rows([self.buffer, table])
        while not self.done:
            chosen = self._select()
            if chosen is None:
                break
            self._train_step(chosen)
        return ()

    def finish(self) -> Iterable[pa.RecordBatch]:
        if self.step > 0 and self.last_saved_step != self.step:
            pretrained.save_checkpoint(self.model, self.tokenizer, self.ctx.run_dir, self.step, {"version": self.version})
            self.last_saved_step = self.step
        return ()

    def _select(self) -> list[int] | None:
        """Row indices of exactly train_batch rows in whole groups, preferring the oldest policy_version; or None."""
        if self.buffer is None or self.buffer.num_rows < self.train_batch:
            return None
        gids = self.buffer.column("group_id").to_pylist()
        vers = self.buffer.column("policy_version").to_pylist()
        groups: dict[int, list[int]] = {}
        for i, g in enumerate(gids):
            groups.setdefault(g, []).append(i)
        order = sorted(groups, key=lambda g: (min(vers[i] for i in groups[g]), groups[g][0]))
        sizes = [len(groups[g]) for g in order]
        # reach[k] = the row counts that groups order[k:] can make up: a group is taken, oldest first,
        # only if the rest can still complete exactly train_batch (greedy first-fit could block forever
        # on an old group that never fits, and could skip a selection that exists).
        target = self.train_batch
        reach = [set() for _ in range(len(order) + 1)]
        reach[-1] = {0}
        for k in range(len(order) - 1, -1, -1):
            reach[k] = reach[k + 1] | {s + sizes[k] for s in reach[k + 1] if s + sizes[k] <= target}
        if target not in reach[0]:
            return None
        chosen: list[int] = []
        need = target
        for k, g in enumerate(order):
            if need - sizes[k] >= 0 and (need - sizes[k]) in reach[k + 1]:
                chosen += groups[g]
                need -= sizes[k]
            if need == 0:
                break
        return sorted(chosen)

    def train_ready(self) -> bool:
        return not self.done and self._select() is not None

    # ------------------------------------------------------------------ training
    def _train_step(self, chosen: list[int]) -> None:
        t0 = time.perf_counter()
        p = self.p
        rows = self.buffer.take(chosen)
        left = sorted(set(range(self.buffer.num_rows)) - set(chosen))
        self.buffer = self.buffer.take(left) if left else None
        cols = {c: rows.column(c).to_pylist() for c in rows.schema.names}
        prompts, resps = cols["prompt_ids"], cols["response_ids"]
        lengths = [len(r) for r in resps]
        for name in ("behavior_logprobs", "advantages") + (("ref_logprobs",) if "ref_logprobs" in cols else ()):
            bad = [u for u, r, x in zip(cols["uid"], resps, cols[name]) if x is None or len(x) != len(r)]
            if bad:
                raise ValueError(f"{self.ctx.label}: column {name} does not have one value per response token "
                                 f"for trajectories {bad[:5]}")
        if any(v is None for v in cols["policy_version"]):
            raise ValueError(f"{self.ctx.label}: null policy_version in trajectories "
                             f"{[u for u, v in zip(cols['uid'], cols['policy_version']) if v is None][:5]}")
        use_ref = p["kl_coef"] > 0 and "ref_logprobs" in cols
        total_tokens = float(sum(lengths))
        total_seqs = float(sum(1 for n in lengths if n))
        mbs = micro_batches([len(a) + len(b) for a, b in zip(prompts, resps)], int(p["micro_batch_tokens"]))
        old: dict[int, torch.Tensor] = {}
        weights: dict[int, torch.Tensor] = {}
        step_corr: off_policy.Correction | None = None    # over the whole step: lr_scale and metrics
        sums: dict[str, float] = {}
        weight_sum = 0.0
        loss_total = 0.0
        lr = lr_at(self.step, lr=p["lr"], warmup_steps=p["warmup_steps"], total_steps=p["total_steps"],
                   min_lr_ratio=p["min_lr_ratio"])
        grad_norms: list[float] = []
        dev = self.ctx.device
        behav = {k: pad_lists([cols["behavior_logprobs"][i] for i in mb]) for k, mb in enumerate(mbs)}
        if off_policy.is_batch_wide(self.correction) and len(mbs) > 1:
            with torch.no_grad():
                for k, mb in enumerate(mbs):
                    pb = collate([prompts[i] for i in mb], [resps[i] for i in mb], self.pad_id).to(dev)
                    old[k] = response_logprobs(self.model, pb, temperature=self.temperature)[0]
            step_corr = self._correct_step(old, behav, mbs, lengths)
            weights = _split_rows(step_corr.weight, old)
        for epoch in range(int(p["ppo_epochs"])):
            self.optimizer.zero_grad(set_to_none=True)
            for k, mb in enumerate(mbs):
                pb = collate([prompts[i] for i in mb], [resps[i] for i in mb], self.pad_id).to(dev)
                T = pb.response_ids.shape[1]
                logp, ent = response_logprobs(self.model, pb, temperature=self.temperature, with_entropy=True,
                                              entropy_grad=p["entropy_coef"] != 0)
                if k not in old:
                    old[k] = logp.detach()
                if k not in weights:   # token by token (or the only micro-batch): the same as the whole step's rows
                    weights[k] = off_policy.compute(self.correction, prox_logprobs=old[k], mask=pb.response_mask,
                                                    behavior_logprobs=behav[k].to(dev), **self.correction_params).weight
                extra = {}
                if use_ref:
                    extra = {"ref_logprobs": pad_lists([cols["ref_logprobs"][i] for i in mb], T).to(dev),
                             "kl_coef": p["kl_coef"], "kl_estimator": p["kl_estimator"]}
                loss, m = losses.compute(
                    p["loss"], logprobs=logp, old_logprobs=old[k],
                    advantages=pad_lists([cols["advantages"][i] for i in mb], T).to(dev), mask=pb.response_mask,
                    agg=p["agg"], token_weights=weights[k], entropy=ent, entropy_coef=p["entropy_coef"],
                    total_tokens=total_tokens, total_seqs=total_seqs, **extra, **self.loss_params)
                loss.backward()
                loss_total += m["loss"]
                w = m["tokens"]
                weight_sum += w
                for key, val in m.items():
                    if key not in ("loss", "pg_loss", "tokens"):
                        sums[key] = max(sums.get(key, 0.0), val) if key == "ratio_max" else sums.get(key, 0.0) + val * w
            if step_corr is None:   # every micro-batch's pi_prox is known once the first pass is over
                step_corr = self._correct_step(old, behav, mbs, lengths)
            clip = p["grad_clip"] if p["grad_clip"] and p["grad_clip"] > 0 else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip))
            grad_norms.append(grad_norm)
            for group in self.optimizer.param_groups:
                group["lr"] = lr * step_corr.lr_scale
            if math.isfinite(grad_norm):
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        seconds_train = time.perf_counter() - t0

        staleness = [self.version - v for v in cols["policy_version"]]
        metrics = {key: (val if key == "ratio_max" else val / max(weight_sum, 1.0)) for key, val in sums.items()}
        metrics.update(step_corr.metrics)
        metrics.update({
            "loss": loss_total / int(p["ppo_epochs"]), "lr": lr * step_corr.lr_scale,
            "grad_norm": sum(grad_norms) / len(grad_norms),  # before clipping, mean over ppo_epochs
            "staleness_max": max(staleness), "staleness_mean": sum(staleness) / len(staleness),
            "tokens": int(total_tokens), "trajectories": len(chosen), "micro_batches": len(mbs),
            "response_len_mean": total_tokens / len(chosen),
            "skipped_nonfinite_grad": sum(not math.isfinite(g) for g in grad_norms),
        })
        if "reward" in cols and all(r is not None for r in cols["reward"]):
            metrics["reward_mean"] = sum(cols["reward"]) / len(cols["reward"])
        self.step += 1
        self.version += 1
        self.ledger.write(json.dumps({"step": self.step, "version": self.version, "uids": cols["uid"],
                                      "policy_versions": cols["policy_version"]}) + "\n")
        self.ledger.flush()   # before the step is announced: a reader that saw train_step finds its line
        self._publish(seconds_train)
        metrics.update(self.last_broadcast)
        self.ctx.report({"kind": "train_step", "node": self.ctx.node, "step": self.step, "version": self.version,
                         "uids": cols["uid"], "metrics": metrics, "seconds": seconds_train})
        save_every = int(p["save_every"])
        if self.step >= int(p["steps"]) or (save_every > 0 and self.step % save_every == 0):
            pretrained.save_checkpoint(self.model, self.tokenizer, self.ctx.run_dir, self.step, {"version": self.version})
            self.last_saved_step = self.step
        if self.step >= int(p["steps"]):
            self.done = True
            self.ctx.report({"kind": "done", "node": self.ctx.node, "step": self.step, "version": self.version})

    def _correct_step(self, old: dict[int, torch.Tensor], behav: dict[int, torch.Tensor], mbs: list[list[int]],
                      lengths: list[int]) -> off_policy.Correction:
        prox_all, behav_all, mask_all = _whole_batch(old, behav, mbs, lengths)
        dev = self.ctx.device
        return off_policy.compute(self.correction, prox_logprobs=prox_all, behavior_logprobs=behav_all.to(dev),
                                  mask=mask_all.to(dev), **self.correction_params)

    def _publish(self, seconds_train: float | None) -> None:
        t0 = time.perf_counter()
        path, nbytes = weights.save_version(self.model.state_dict(), self.ctx.run_dir, self.version)
        weights.prune_versions(self.ctx.run_dir, self.keep_versions)
        event = {"kind": "weights", "node": self.ctx.node, "version": self.version, "path": path,
                 "bytes": nbytes, "seconds": time.perf_counter() - t0}
        if self.broadcaster is not None:
            seconds, sent = self.broadcaster.broadcast(self.version, self.model.state_dict())
            self.last_broadcast = {"broadcast_s": seconds, "broadcast_bytes": sent}
            event.update(self.last_broadcast)
        self.ctx.report(event)

    def teardown(self) -> None:
        broadcaster = getattr(self, "broadcaster", None)
        if broadcaster is not None:
            broadcaster.close()
        ledger = getattr(self, "ledger", None)
        if ledger is not None and not ledger.closed:
            ledger.close()

    # ------------------------------------------------------------------ control
    def stats(self) -> dict:
        return {"step": self.step, "version": self.version, "done": self.done, "train_batch": self.train_batch,
                "buffered_rows": 0 if self.buffer is None else self.buffer.num_rows, "dropped_rows": self.dropped_rows}
