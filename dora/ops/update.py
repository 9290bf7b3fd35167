"""Update op: the trainer. Trains one step whenever it can take exactly train_batch trajectories in
whole groups (oldest policy_version first), publishes each new version on the weights edge, keeps
the trained.jsonl ledger, and checkpoints when asked. Contract: docs/architecture.md, "Training ops"."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from typing import Any, Callable, Iterable

import pyarrow as pa
import torch

from dora.algos import losses
from dora.algos.schedule import lr_at
from dora.ops.weights import pretrained, versions as weights
from dora.ops.base import OpContext, Operator
from dora.ops.batching import collate, concat_rows, micro_batches, pad_lists, require_columns
from dora.ops.logprobs import response_logprobs
from dora.ops.weights.broadcast import WeightBroadcaster

NEEDS = ["uid", "prompt_ids", "response_ids", "behavior_logprobs", "advantages", "policy_version", "group_id"]
OPTIONAL = ["reward", "ref_logprobs"]

ModelFactory = Callable[[dict, str, int], tuple[Any, Any]]


def loss_params(p: dict[str, Any]) -> dict[str, Any]:
    """The update params that go to the policy loss function itself."""
    out = {"clip_eps": p["clip_eps"], "clip_eps_high": p["clip_eps_high"]}
    if p["dual_clip"] is not None:
        out["dual_clip"] = p["dual_clip"]
    return out


def check_params(p: dict[str, Any]) -> list[tuple[str, str]]:
    """Rules across update's params (dora validate runs them; see OpSpec.check)."""
    try:
        losses.LOSSES.check_params(p["loss"], loss_params(p))
    except ValueError as e:
        return [("dual_clip" if p["dual_clip"] is not None else "loss", str(e))]
    fixed = getattr(losses.LOSSES.get(p["loss"]), "fixed_agg", None)
    if fixed is not None and p["agg"] != fixed:
        return [("agg", f"loss {p['loss']!r} aggregates by {fixed}, got agg {p['agg']!r} (use ppo_clip for other aggregations)")]
    return []


def default_model_factory(model_cfg: dict, device: str, seed: int):
    """(model, tokenizer) from the pipeline's model section (dora.ops.models.load_policy)."""
    from dora.ops.models import load_policy
    return load_policy(model_cfg, device, seed=seed)


class UpdateOp(Operator):
    control_methods = ("train_ready", "stats", "save_checkpoint")

    def __init__(self, model_factory: ModelFactory | None = None):
        self.model_factory = model_factory or default_model_factory

    # ------------------------------------------------------------------ setup
    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        p = self.p = ctx.params
        label = ctx.label
        self.loss_params = loss_params(p)
        self.train_batch = ctx.async_.train_batch
        if not ctx.run_dir:
            raise ValueError(f"{label}: update needs a run_dir for weights and checkpoints")
        # keep the versions the rollout window can still be loading, plus one being written
        self.keep_versions = ctx.async_.max_staleness + 2
        torch.manual_seed(ctx.seed)
        self.model, self.tokenizer = self.model_factory(ctx.model, ctx.device, ctx.seed)
        self.model.to(ctx.device)
        self.model.train()
        self.params = [q for q in self.model.parameters() if q.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=p["lr"], weight_decay=p["weight_decay"])
        self.temperature = p["temperature"]   # null in the YAML: resolved to the generate node's
        self.pad_id = int(getattr(self.tokenizer, "pad_token_id", 0) or 0)
        self.buffer: pa.Table | None = None
        self.step = 0
        self.version = 0
        self.done = False
        self.dropped_rows = 0
        self.last_saved_step = -1
        os.makedirs(ctx.run_dir, exist_ok=True)
        if ctx.restore:
            self._restore(ctx.restore["checkpoint"])
        # The trainer's own ledger; a resumed run appends, marking where it rolled back to: steps after
        # the checkpoint that a dead run had trained are superseded by the lines that follow the mark.
        self.ledger = open(os.path.join(ctx.run_dir, "trained.jsonl"), "a" if ctx.restore else "w", encoding="utf-8")
        if ctx.restore:
            self.ledger.write(json.dumps({"resumed_from_step": self.step, "version": self.version}) + "\n")
            self.ledger.flush()
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
        self.save_checkpoint()
        return ()

    def save_checkpoint(self, folder: str | None = None) -> dict:
        """Write the step just trained: a transformers folder plus trainer/ (optimizer, lr step, RNG).

        `folder`: the run's staged checkpoint, to which the driver adds the rest of the run state
        (dora/runtime/checkpoint.py); None: checkpoints/step_N on its own (temp folder + rename).
        """
        if self.step == 0 or (folder is None and self.last_saved_step == self.step):
            return {"step": self.step, "folder": None}
        final = folder or pretrained.checkpoint_dir(self.ctx.run_dir, self.step)
        target = folder or f"{final}.tmp{os.getpid()}"
        os.makedirs(target, exist_ok=True)
        pretrained.write_pretrained(self.model, self.tokenizer, target, {"step": self.step, "version": self.version})
        os.makedirs(os.path.join(target, "trainer"), exist_ok=True)
        torch.save({"optimizer": self.optimizer.state_dict(), "step": self.step, "version": self.version,
                    "rng": torch.get_rng_state()}, os.path.join(target, "trainer", "state.pt"))
        if folder is None:
            shutil.rmtree(final, ignore_errors=True)
            os.replace(target, final)
        self.last_saved_step = self.step
        return {"step": self.step, "folder": final}

    def _restore(self, folder: str) -> None:
        """Continue from a checkpoint written by save_checkpoint: weights, optimizer, lr step, RNG."""
        pretrained.load_pretrained_weights(self.model, folder)
        state = torch.load(os.path.join(folder, "trainer", "state.pt"), weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        self.step = self.last_saved_step = int(state["step"])
        self.version = int(state["version"])
        self.done = self.step >= self.p["steps"]

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
        mbs = micro_batches([len(a) + len(b) for a, b in zip(prompts, resps)], p["micro_batch_tokens"])
        old: dict[int, torch.Tensor] = {}
        sums: dict[str, float] = {}
        weight_sum = 0.0
        loss_total = 0.0
        lr = lr_at(self.step, lr=p["lr"], warmup_steps=p["warmup_steps"], total_steps=p["total_steps"],
                   min_lr_ratio=p["min_lr_ratio"])
        grad_norms: list[float] = []
        dev = self.ctx.device
        for epoch in range(p["ppo_epochs"]):
            self.optimizer.zero_grad(set_to_none=True)
            for k, mb in enumerate(mbs):
                self.ctx.progress()   # a long step is still work: the stall watchdog sees each micro-batch
                pb = collate([prompts[i] for i in mb], [resps[i] for i in mb], self.pad_id).to(dev)
                T = pb.response_ids.shape[1]
                logp, ent = response_logprobs(self.model, pb, temperature=self.temperature, with_entropy=True,
                                              entropy_grad=p["entropy_coef"] != 0)
                if epoch == 0:
                    old[k] = logp.detach()
                extra = {}
                if use_ref:
                    extra = {"ref_logprobs": pad_lists([cols["ref_logprobs"][i] for i in mb], T).to(dev),
                             "kl_coef": p["kl_coef"], "kl_estimator": p["kl_estimator"]}
                loss, m = losses.compute(
                    p["loss"], logprobs=logp, old_logprobs=old[k],
                    advantages=pad_lists([cols["advantages"][i] for i in mb], T).to(dev), mask=pb.response_mask,
                    agg=p["agg"], behavior_logprobs=pad_lists([cols["behavior_logprobs"][i] for i in mb], T).to(dev),
                    tis_cap=p["tis_cap"], entropy=ent, entropy_coef=p["entropy_coef"],
                    total_tokens=total_tokens, total_seqs=total_seqs, **extra, **self.loss_params)
                loss.backward()
                loss_total += m["loss"]
                w = m["tokens"]
                weight_sum += w
                for key, val in m.items():
                    if key not in ("loss", "pg_loss", "tokens"):
                        sums[key] = max(sums.get(key, 0.0), val) if key == "ratio_max" else sums.get(key, 0.0) + val * w
            clip = p["grad_clip"] if p["grad_clip"] and p["grad_clip"] > 0 else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip))
            grad_norms.append(grad_norm)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            if math.isfinite(grad_norm):
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        seconds_train = time.perf_counter() - t0

        staleness = [self.version - v for v in cols["policy_version"]]
        metrics = {key: (val if key == "ratio_max" else val / max(weight_sum, 1.0)) for key, val in sums.items()}
        metrics.update({
            "loss": loss_total / p["ppo_epochs"], "lr": lr,
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
        if self.step >= p["steps"]:
            self.done = True
            self.ctx.report({"kind": "done", "node": self.ctx.node, "step": self.step, "version": self.version})

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
    def live_stats(self) -> dict:
        return {"version": self.version, "step": self.step}

    def stats(self) -> dict:
        return {"step": self.step, "version": self.version, "done": self.done, "train_batch": self.train_batch,
                "buffered_rows": 0 if self.buffer is None else self.buffer.num_rows, "dropped_rows": self.dropped_rows}
