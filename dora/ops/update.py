"""Update op: the trainer. Trains one step whenever it can take exactly train_batch trajectories in
whole groups (oldest policy_version first), publishes each new version on the weights edge, keeps
the trained.jsonl ledger, and checkpoints when the driver asks. `replicas: N` makes one trainer of
N ranks (FSDP2, dora/ops/sharding): rank 0 chooses, splits and reports; ranks 1.. follow its
commands. Contract: docs/architecture.md, "Training ops" and "Sharded ops"."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from typing import Any, Callable, Iterable

import pyarrow as pa
import torch

from dora.algos import losses, off_policy
from dora.algos.schedule import lr_at
from dora.ops.base import OpContext
from dora.ops.batching import collate, micro_batches, pad_lists, response_mask
from dora.ops.arrow_rows import concat_rows, require_columns
from dora.ops.logprobs import response_logprobs
from dora.ops.sharding.fsdp_model import ShardedModel
from dora.ops.sharding.sharded_op import ShardedOp
from dora.ops.weights import pretrained, versions as weights
from dora.ops.weights.broadcast import WeightBroadcaster

NEEDS = ["uid", "prompt_ids", "response_ids", "behavior_logprobs", "advantages", "policy_version", "group_id"]
OPTIONAL = ["reward", "ref_logprobs"]
TRAIN_COLUMNS = ["prompt_ids", "response_ids", "behavior_logprobs", "advantages", "ref_logprobs"]  # what ranks 1.. get

TRAINER_STATE = "trainer_state.pt"   # in a checkpoint folder: step, version, RNG (rank 0's)

ModelFactory = Callable[[dict, str, int], tuple[Any, Any]]


def loss_params(p: dict[str, Any]) -> dict[str, Any]:
    """The update params that go to the policy loss function itself."""
    out = {"clip_eps": p["clip_eps"], "clip_eps_high": p["clip_eps_high"]}
    if p["dual_clip"] is not None:
        out["dual_clip"] = p["dual_clip"]
    return out


def off_policy_of(spec: Any) -> tuple[str, dict[str, Any]]:
    """(name, params) of the `off_policy` param {name: ..., <that correction's params>}; ValueError
    naming what is wrong, after a dry run on one token (so a bad value fails at validate)."""
    names = ", ".join(off_policy.OFF_POLICY.names())
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"off_policy must be a mapping {{name: <{names}>, <its params>}}, got {spec!r}")
    name, params = spec["name"], {k: v for k, v in spec.items() if k != "name"}
    try:
        one = torch.zeros(1, 1)
        off_policy.compute(name, prox_logprobs=one, behavior_logprobs=one, mask=torch.ones(1, 1), **params)
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"off_policy: {str(e).strip(chr(39))}") from None
    return name, params


def check_params(p: dict[str, Any]) -> list[tuple[str, str]]:
    """Rules across update's params (dora validate runs them; see OpSpec.check)."""
    try:
        off_policy_of(p["off_policy"])
    except ValueError as e:
        return [("off_policy", str(e))]
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


class UpdateOp(ShardedOp):
    control_methods = ("train_ready", "stats", "save_checkpoint")

    def __init__(self, model_factory: ModelFactory | None = None):
        self.model_factory = model_factory or default_model_factory

    # ------------------------------------------------------------------ setup
    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        p = self.p = ctx.params
        label = ctx.label
        self.loss_params = loss_params(p)
        try:
            self.correction, self.correction_params = off_policy_of(p["off_policy"])
        except ValueError as e:
            raise ValueError(f"{label}: {e}") from None
        self.train_batch = ctx.async_.train_batch
        if not ctx.run_dir:
            raise ValueError(f"{label}: update needs a run_dir for weights and checkpoints")
        # keep the versions the rollout window can still be loading, plus one being written
        self.keep_versions = ctx.async_.max_staleness + 2
        self.join_group(ctx)     # replicas: N = one trainer of N ranks
        torch.manual_seed(ctx.seed)
        model, self.tokenizer = self.model_factory(ctx.model, ctx.device, ctx.seed)
        model.train()
        self.sharded = ShardedModel(model, self.group, ctx.device, precision=p["precision"],
                                    activation_checkpointing=p["activation_checkpointing"])
        self.model = self.sharded.module
        self.params = self.sharded.params()
        self.optimizer = torch.optim.AdamW(self.params, lr=p["lr"], weight_decay=p["weight_decay"])
        self.temperature = p["temperature"]   # null in the YAML: resolved to the generate node's
        self.pad_id = int(getattr(self.tokenizer, "pad_token_id", 0) or 0)
        self.buffer: pa.Table | None = None
        self.step = 0
        self.version = 0
        self.done = False
        self.dropped_rows = 0
        self.last_saved_step = -1
        self.ledger = None
        self.broadcaster: WeightBroadcaster | None = None
        self.last_broadcast: dict[str, float] = {}
        if ctx.restore:   # every rank: its shards of the model and optimizer (collective)
            self._restore(ctx.restore["checkpoint"])
        if self.leader:
            os.makedirs(ctx.run_dir, exist_ok=True)
            # The trainer's own ledger; a resumed run appends, marking where it rolled back to: steps after
            # the checkpoint that a dead run had trained are superseded by the lines that follow the mark.
            self.ledger = open(os.path.join(ctx.run_dir, "trained.jsonl"), "a" if ctx.restore else "w", encoding="utf-8")
            if ctx.restore:
                self.ledger.write(json.dumps({"resumed_from_step": self.step, "version": self.version}) + "\n")
                self.ledger.flush()
            if p["weight_sync"] == "broadcast":
                # blocks until every generate replica joined (or raises after the rendezvous deadline)
                self.broadcaster = WeightBroadcaster(ctx.run_dir, p["broadcast_to"], ctx.device, label=label)
        self._publish(seconds_train=None)

    # ------------------------------------------------------------------ data in (rank 0)
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
        self.end_group()
        return ()

    def save_checkpoint(self, folder: str | None = None) -> dict:
        """Rank 0 (a control call, or at the end): every rank writes the step just trained.

        `folder`: the run's staged checkpoint, to which the driver adds the rest of the run state
        (dora/runtime/checkpoint.py); None: checkpoints/step_N on its own (temp folder + rename).
        """
        if self.step == 0 or (folder is None and self.last_saved_step == self.step):
            return {"step": self.step, "folder": None}
        final = folder or pretrained.checkpoint_dir(self.ctx.run_dir, self.step)
        target = folder or f"{final}.tmp"
        if folder is None:
            shutil.rmtree(target, ignore_errors=True)
        os.makedirs(target, exist_ok=True)   # before any rank writes into it
        if self.group is not None:
            self.group.post("checkpoint", {"folder": target})
        self._checkpoint(target)
        if folder is None:
            shutil.rmtree(final, ignore_errors=True)
            os.replace(target, final)
        return {"step": self.step, "folder": final}

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

    # ------------------------------------------------------------------ ranks 1..: rank 0's commands
    def on_train(self, header: dict[str, Any], cols: dict[str, list]) -> None:
        self._run_step(cols, header, time.perf_counter())

    def on_checkpoint(self, header: dict[str, Any], cols: dict[str, list]) -> None:
        self._checkpoint(header["folder"])

    # ------------------------------------------------------------------ training
    def _train_step(self, chosen: list[int]) -> None:
        """Rank 0: take the chosen rows, send each rank its share, train on our own."""
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
        header = {
            "lr": lr_at(self.step, lr=p["lr"], warmup_steps=p["warmup_steps"], total_steps=p["total_steps"],
                        min_lr_ratio=p["min_lr_ratio"]),
            "total_tokens": float(sum(lengths)), "total_seqs": float(sum(1 for n in lengths if n)),
            "use_ref": p["kl_coef"] > 0 and "ref_logprobs" in cols,
        }
        _, header, mine = self.spread("train", header, rows.select([c for c in TRAIN_COLUMNS if c in cols]),
                                      [len(a) + len(b) for a, b in zip(prompts, resps)], p["micro_batch_tokens"])
        self._run_step(mine, header, t0, batch=cols)

    def _run_step(self, cols: dict[str, list], header: dict[str, Any], t0: float, batch: dict[str, list] | None = None) -> None:
        """Every rank: one optimizer step on its rows (collectives inside), then the version's
        publication and the checkpoint, in the same order on every rank. `batch`: rank 0's whole batch."""
        p = self.p
        metrics = self._forward_backward(cols, header)
        seconds_train = time.perf_counter() - t0
        self.step += 1
        self.version += 1
        if self.leader:
            staleness = [self.version - 1 - v for v in batch["policy_version"]]
            total_tokens = header["total_tokens"]
            metrics.update({
                "staleness_max": max(staleness), "staleness_mean": sum(staleness) / len(staleness),
                "tokens": int(total_tokens), "trajectories": len(batch["uid"]),
                "response_len_mean": total_tokens / len(batch["uid"]), "train_ranks": self.ranks,
            })
            if "reward" in batch and all(r is not None for r in batch["reward"]):
                metrics["reward_mean"] = sum(batch["reward"]) / len(batch["reward"])
            self.ledger.write(json.dumps({"step": self.step, "version": self.version, "uids": batch["uid"],
                                          "policy_versions": batch["policy_version"]}) + "\n")
            self.ledger.flush()   # before the step is announced: a reader that saw train_step finds its line
        self._publish(seconds_train)
        if self.leader:
            metrics.update(self.last_broadcast)
            self.ctx.report({"kind": "train_step", "node": self.ctx.node, "step": self.step, "version": self.version,
                             "uids": batch["uid"], "metrics": metrics, "seconds": seconds_train})
        if self.step >= p["steps"]:
            self.done = True
            if self.leader:
                self.ctx.report({"kind": "done", "node": self.ctx.node, "step": self.step, "version": self.version})

    def _empty_pass(self) -> dict[str, list]:
        """One row whose loss is exactly zero: a rank with fewer micro-batches than another runs
        these, so every rank takes part in every parameter gather and gradient reduction."""
        return {"prompt_ids": [[self.pad_id]], "response_ids": [[self.pad_id]], "behavior_logprobs": [[0.0]],
                "advantages": [[0.0]], "ref_logprobs": [[0.0]]}

    def _forward_backward(self, cols: dict[str, list], header: dict[str, Any]) -> dict[str, float]:
        """The step's passes over this rank's rows and the optimizer step; metrics of the whole batch."""
        p = self.p
        prompts, resps = cols["prompt_ids"], cols["response_ids"]
        mbs: list[Any] = micro_batches([len(a) + len(b) for a, b in zip(prompts, resps)], p["micro_batch_tokens"]) if prompts else []
        if len(mbs) > header["micro_batches"]:
            raise RuntimeError(f"{self.ctx.label}: {len(mbs)} micro-batches here, rank 0 planned {header['micro_batches']}")
        mbs += [None] * (header["micro_batches"] - len(mbs))
        dev = self.ctx.device
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
        sums: dict[str, float] = {}
        weight_sum = loss_total = 0.0
        ratio_max = 0.0
        grad_norms: list[float] = []
        lr = header["lr"]
        kw = dict(agg=p["agg"], entropy_coef=p["entropy_coef"], total_tokens=header["total_tokens"],
                  total_seqs=header["total_seqs"], **self.loss_params)
        for epoch in range(p["ppo_epochs"]):
            self.optimizer.zero_grad(set_to_none=True)
            for k, mb in enumerate(mbs):
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
                    mask=pb.response_mask, token_weights=token_w[k], entropy=ent, **kw, **extra)
                loss.backward()
                loss_total += m["loss"]
                w = m["tokens"]
                weight_sum += w
                ratio_max = max(ratio_max, m.get("ratio_max", 0.0))
                for key, val in m.items():
                    if key not in ("loss", "pg_loss", "tokens", "ratio_max"):
                        sums[key] = sums.get(key, 0.0) + val * w
            if step_corr is None:   # every micro-batch's pi_prox is known once the first pass is over
                step_corr, _ = self._correct_step(cols, mbs, old)
            clip = p["grad_clip"] if p["grad_clip"] and p["grad_clip"] > 0 else float("inf")
            grad_norm = self.sharded.clip_grad_norm_(clip)   # of the whole model: the same on every rank
            grad_norms.append(grad_norm)
            for group in self.optimizer.param_groups:
                group["lr"] = lr * step_corr.lr_scale
            if math.isfinite(grad_norm):
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        keys = sorted(sums)
        if self.group is not None:   # the whole batch's sums: every rank has the same keys (same loss config)
            loss_total, weight_sum, *vals = self.group.sum([loss_total, weight_sum] + [sums[k] for k in keys])
            sums = dict(zip(keys, vals))
            ratio_max = self.group.max([ratio_max])[0]
        metrics = {key: val / max(weight_sum, 1.0) for key, val in sums.items()}
        metrics.update(step_corr.metrics)
        metrics.update({
            "loss": loss_total / p["ppo_epochs"], "lr": lr * step_corr.lr_scale, "ratio_max": ratio_max,
            "grad_norm": sum(grad_norms) / len(grad_norms),  # before clipping, mean over ppo_epochs
            "micro_batches": header["micro_batches"],
            "skipped_nonfinite_grad": sum(not math.isfinite(g) for g in grad_norms),
        })
        return metrics

    def _rows(self, cols: dict[str, list], mb: list[int] | None) -> dict[str, list]:
        return self._empty_pass() if mb is None else {c: [v[i] for i in mb] for c, v in cols.items()}

    def _collate(self, rows: dict[str, list], empty: bool):
        pb = collate(rows["prompt_ids"], rows["response_ids"], self.pad_id).to(self.ctx.device)
        if empty:   # a padding pass (_empty_pass): it takes part in the collectives, its loss is zero
            pb.response_mask.zero_()
        return pb

    def _correct_step(self, cols: dict[str, list], mbs: list[Any], old: dict[int, torch.Tensor]
                      ) -> tuple[off_policy.Correction, dict[int, torch.Tensor]]:
        """The correction over the whole step, every rank's rows (gathered: lr_scale and batch-wide
        thresholds must not depend on how rows were split), and this rank's token weights per micro-batch."""
        mine: list[torch.Tensor] = []   # log pi_prox - log pi_behav of each of this rank's rows, micro-batch order
        for k, mb in enumerate(mbs):
            for j, i in enumerate(mb or ()):
                behav = torch.tensor(cols["behavior_logprobs"][i], dtype=torch.float64)
                mine.append(old[k][j, :len(behav)].double().cpu() - behav)
        every, offset = (mine, 0) if self.group is None else self.group.all_gather_rows(mine)
        log_r = torch.nn.utils.rnn.pad_sequence(every, batch_first=True) if every else torch.zeros(0, 0, dtype=torch.float64)
        mask = response_mask([len(r) for r in every], log_r.shape[1])
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

    def _publish(self, seconds_train: float | None) -> None:
        """Every rank (the weights are gathered); rank 0 writes the version and reports it."""
        t0 = time.perf_counter()
        state = self.sharded.full_state_dict()
        if not self.leader:
            return
        gathered = time.perf_counter() - t0
        path, nbytes = weights.save_version(state, self.ctx.run_dir, self.version)
        weights.prune_versions(self.ctx.run_dir, self.keep_versions)
        event = {"kind": "weights", "node": self.ctx.node, "version": self.version, "path": path,
                 "bytes": nbytes, "seconds": time.perf_counter() - t0, "gather_s": gathered}
        if self.broadcaster is not None:
            seconds, sent = self.broadcaster.broadcast(self.version, state)
            self.last_broadcast = {"broadcast_s": seconds, "broadcast_bytes": sent}
            event.update(self.last_broadcast)
        self.ctx.report(event)

    def _checkpoint(self, folder: str) -> None:
        """Every rank: the training state of this step into `folder` (collective): the full weights
        (rank 0), every rank's shards of model and optimizer, and the trainer's step, version and RNG."""
        pretrained.save_training_checkpoint(self.sharded, self.optimizer, self.tokenizer, folder,
                                            {"step": self.step, "version": self.version, "ranks": self.ranks,
                                             "precision": self.p["precision"]})
        if self.leader:
            torch.save({"step": self.step, "version": self.version, "rng": torch.get_rng_state()},
                       os.path.join(folder, TRAINER_STATE))
        self.last_saved_step = self.step

    def _restore(self, folder: str) -> None:
        """Every rank: continue from a checkpoint written by _checkpoint (any rank count: DCP reshards)."""
        pretrained.load_training_checkpoint(self.sharded, self.optimizer, folder)
        state = torch.load(os.path.join(folder, TRAINER_STATE), weights_only=True)
        torch.set_rng_state(state["rng"])
        self.step = self.last_saved_step = int(state["step"])
        self.version = int(state["version"])
        self.done = self.step >= self.p["steps"]

    def teardown(self) -> None:
        broadcaster = getattr(self, "broadcaster", None)
        if broadcaster is not None:
            broadcaster.close()
        ledger = getattr(self, "ledger", None)
        if ledger is not None and not ledger.closed:
            ledger.close()
        super().teardown()

    # ------------------------------------------------------------------ control
    def stats(self) -> dict:
        return {"step": self.step, "version": self.version, "done": self.done, "train_batch": self.train_batch,
                "buffered_rows": 0 if self.buffer is None else self.buffer.num_rows, "dropped_rows": self.dropped_rows,
                "train_ranks": self.ranks, **self.sharded.local_bytes(self.optimizer)}
