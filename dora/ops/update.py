"""Update op: the trainer. Trains one step whenever it can take exactly train_batch trajectories in
whole groups (oldest policy_version first), publishes each new version on the weights edge, keeps
the trained.jsonl ledger, and checkpoints when the driver asks. `replicas: N` makes one trainer of
N ranks (FSDP2, dora/ops/sharding): rank 0 chooses, splits and reports; ranks 1.. follow its
commands. The step itself, the row choice, the settings and the checkpoint I/O are in
dora/ops/training. Contract: docs/architecture.md, "Training ops" and "Sharded ops"."""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Callable, Iterable

import pyarrow as pa
import torch

from dora.algos.schedule import lr_at
from dora.ops.base import OpContext
from dora.ops.arrow_rows import concat_rows, require_columns
from dora.ops.models import default_model_factory
from dora.ops.sharding.fsdp_model import ShardedModel
from dora.ops.sharding.sharded_op import ShardedOp
from dora.ops.training import trainer_checkpoint
from dora.ops.training.batch_choice import choose_whole_groups
from dora.ops.training.loss_step import LossStep
from dora.ops.training.update_settings import loss_params, off_policy_of
from dora.ops.weights import pretrained, versions as weights
from dora.ops.weights.broadcast import WeightBroadcaster

NEEDS = ["uid", "prompt_ids", "response_ids", "behavior_logprobs", "advantages", "policy_version", "group_id"]
# response_mask (multi-turn): 0 on tool observation tokens, which no loss term sees; the multi-turn
# counters become step metrics (turns_mean, and tool_calls / tool_errors / tool_wait_s summed over the batch)
TOOL_COUNTERS = ["turns", "tool_calls", "tool_errors", "tool_wait_s"]
OPTIONAL = ["reward", "ref_logprobs", "response_mask"] + TOOL_COUNTERS
TRAIN_COLUMNS = ["prompt_ids", "response_ids", "behavior_logprobs", "advantages", "ref_logprobs",
                 "response_mask"]  # what ranks 1.. get

ModelFactory = Callable[[dict, str, int], tuple[Any, Any]]


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
        self.pad_id = int(getattr(self.tokenizer, "pad_token_id", 0) or 0)
        self.loss_step = LossStep(params=p, ctx=ctx, sharded=self.sharded, optimizer=self.optimizer, group=self.group,
                                  ranks=self.ranks, correction=self.correction, correction_params=self.correction_params,
                                  loss_params=self.loss_params, pad_id=self.pad_id)
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
            os.makedirs(ctx.files_dir, exist_ok=True)
            # The trainer's own ledger; a resumed run appends to steps 1..N (the controller moved the
            # lines of steps a dead run trained after its checkpoint to RUN_DIR/rolled_back, dora/rl/lineage.py)
            self.ledger = open(os.path.join(ctx.files_dir, "trained.jsonl"), "a" if ctx.restore else "w", encoding="utf-8")
            if p["weight_sync"] == "broadcast":
                # blocks until every generate replica joined (or raises after the rendezvous deadline)
                self.broadcaster = WeightBroadcaster(ctx.files_dir, p["broadcast_to"], ctx.device, label=label)
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

    def save_checkpoint(self, folder: str | None = None, optimizer: bool = True, dtype: str = "training") -> dict:
        """Rank 0 (a control call, or at the end): every rank writes the step just trained.

        `folder`: the run's staged checkpoint, to which the driver adds the rest of the run state
        (dora/rl/checkpoint.py); None: checkpoints/step_N on its own (temp folder + rename).
        `optimizer`, `dtype`: with the optimizer state or not, weights as trained or in bfloat16.
        """
        if self.step == 0 or (folder is None and self.last_saved_step == self.step):
            return {"step": self.step, "folder": None}
        final = folder or pretrained.checkpoint_dir(self.ctx.files_dir, self.step)
        target = folder or f"{final}.tmp"
        if folder is None:
            shutil.rmtree(target, ignore_errors=True)
        os.makedirs(target, exist_ok=True)   # before any rank writes into it
        options = {"optimizer": bool(optimizer), "dtype": str(dtype)}
        if self.group is not None:
            self.group.post("checkpoint", {"folder": target, **options})
        self._checkpoint(target, **options)
        if folder is None:
            shutil.rmtree(final, ignore_errors=True)
            os.replace(target, final)
        return {"step": self.step, "folder": final}

    def _select(self) -> list[int] | None:
        """Row indices of exactly train_batch rows in whole groups, preferring the oldest policy_version; or None."""
        if self.buffer is None:
            return None
        return choose_whole_groups(self.buffer.column("group_id").to_pylist(),
                                   self.buffer.column("policy_version").to_pylist(), self.train_batch)

    def train_ready(self) -> bool:
        return not self.done and self._select() is not None

    # ------------------------------------------------------------------ ranks 1..: rank 0's commands
    def on_train(self, header: dict[str, Any], cols: dict[str, list]) -> None:
        self._run_step(cols, header, time.perf_counter())

    def on_checkpoint(self, header: dict[str, Any], cols: dict[str, list]) -> None:
        self._checkpoint(header["folder"], bool(header.get("optimizer", True)), str(header.get("dtype", "training")))

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
        for name in ("behavior_logprobs", "advantages") + tuple(c for c in ("ref_logprobs", "response_mask") if c in cols):
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
            # the loss denominators count the tokens the loss sees: the model's, never an observation's
            "total_tokens": float(sum(trained_tokens(cols))), "total_seqs": float(sum(1 for n in trained_tokens(cols) if n)),
            "use_ref": p["kl_coef"] > 0 and "ref_logprobs" in cols,
        }
        _, header, mine = self.spread("train", header, rows.select([c for c in TRAIN_COLUMNS if c in cols]),
                                      [len(a) + len(b) for a, b in zip(prompts, resps)], p["micro_batch_tokens"])
        self._run_step(mine, header, t0, batch=cols)

    def _run_step(self, cols: dict[str, list], header: dict[str, Any], t0: float, batch: dict[str, list] | None = None) -> None:
        """Every rank: one optimizer step on its rows (collectives inside), then the version's
        publication and the checkpoint, in the same order on every rank. `batch`: rank 0's whole batch."""
        p = self.p
        metrics = self.loss_step.run(cols, header)
        if self.ctx.device.startswith("cuda"):
            torch.cuda.synchronize()   # the optimizer's kernels are part of the step's time
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
            if self.ctx.device.startswith("cuda"):   # the step's peak, to hold against a declared memory share
                metrics["cuda_peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2 ** 30
                torch.cuda.reset_peak_memory_stats()
            if "reward" in batch and all(r is not None for r in batch["reward"]):
                metrics["reward_mean"] = sum(batch["reward"]) / len(batch["reward"])
            metrics.update(tool_metrics(batch))
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

    def _publish(self, seconds_train: float | None) -> None:
        """Every rank (the weights are gathered); rank 0 writes the version and reports it."""
        t0 = time.perf_counter()
        state = self.sharded.full_state_dict()
        if not self.leader:
            return
        gathered = time.perf_counter() - t0
        path, nbytes = weights.save_version(state, self.ctx.files_dir, self.version)
        weights.prune_versions(self.ctx.files_dir, self.keep_versions)
        event = {"kind": "weights", "node": self.ctx.node, "version": self.version, "path": path,
                 "bytes": nbytes, "seconds": time.perf_counter() - t0, "gather_s": gathered}
        if self.broadcaster is not None:
            seconds, sent = self.broadcaster.broadcast(self.version, state)
            self.last_broadcast = {"broadcast_s": seconds, "broadcast_bytes": sent}
            event.update(self.last_broadcast)
        self.ctx.report(event)

    def _checkpoint(self, folder: str, optimizer: bool = True, dtype: str = "training") -> None:
        """Every rank: the training state of this step into `folder` (collective): the full weights
        (rank 0), every rank's shards of the optimizer (unless not asked), and the trainer's step,
        version and RNG."""
        trainer_checkpoint.save(self.sharded, self.optimizer, self.tokenizer, folder, step=self.step,
                                version=self.version, ranks=self.ranks, precision=self.p["precision"], leader=self.leader,
                                with_optimizer=optimizer, dtype=dtype)
        self.last_saved_step = self.step

    def _restore(self, folder: str) -> None:
        """Every rank: continue from a checkpoint written by _checkpoint (any rank count: DCP reshards)."""
        state = trainer_checkpoint.restore(self.sharded, self.optimizer, folder)
        self.step = self.last_saved_step = state["step"]
        self.version = state["version"]
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


def trained_tokens(cols: dict[str, list]) -> list[int]:
    """Per row, the response tokens the loss trains on (all of them, or the response_mask's ones)."""
    if "response_mask" in cols:
        return [int(sum(m)) for m in cols["response_mask"]]
    return [len(r) for r in cols["response_ids"]]


def tool_metrics(batch: dict[str, list]) -> dict[str, float]:
    """Multi-turn step metrics from the trained rows: turns_mean, and tool_calls, tool_errors and
    tool_wait_s summed over the batch (none without those columns)."""
    if not all(c in batch and None not in batch[c] for c in TOOL_COUNTERS):
        return {}
    n = len(batch["turns"])
    return {"turns_mean": sum(batch["turns"]) / n, "tool_calls": float(sum(batch["tool_calls"])),
            "tool_errors": float(sum(batch["tool_errors"])), "tool_wait_s": float(sum(batch["tool_wait_s"]))}
