"""Checkpoints under <run_dir>/checkpoints/step_<N>/:

    config.json, model.safetensors, ...   a transformers folder of the full weights (save_pretrained),
    tokenizer files                        loadable with AutoModelForCausalLM.from_pretrained
    dora_state.json                        {step, version, ranks, precision, sharded_state: "sharded"}
    sharded/                               the training state as torch.distributed.checkpoint wrote it:
                                           {"model": ..., "optimizer": ...} (AdamW moments, step counts),
                                           one .distcp file per rank plus .metadata; a later load may use
                                           any rank count (DCP reshards)

A checkpoint is written to `step_<N>.tmp` and renamed once complete, so a crash never leaves a half
checkpoint under the final name. With a sharded trainer every rank writes its shard of the state
into the same folder (a multi-node trainer needs the run directory on shared storage); rank 0
writes the full weights, gathered from the shards, and renames.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

SHARDED_DIR = "sharded"
STATE_FILE = "dora_state.json"


def checkpoint_dir(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, "checkpoints", f"step_{int(step)}")


def _finish(tmp: str, final: str, tokenizer, step: int, extra: dict[str, Any] | None) -> str:
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(tmp)
    with open(os.path.join(tmp, STATE_FILE), "w") as f:
        json.dump({"step": int(step), **(extra or {})}, f)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def save_checkpoint(model, tokenizer, run_dir: str, step: int, extra: dict[str, Any] | None = None) -> str:
    """The transformers folder of a plain model (+ tokenizer) for `step`; returns the folder."""
    final = checkpoint_dir(run_dir, step)
    tmp = f"{final}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    model.save_pretrained(tmp)
    return _finish(tmp, final, tokenizer, step, extra)


def save_training_checkpoint(sharded, optimizer, tokenizer, run_dir: str, step: int,
                             extra: dict[str, Any] | None = None) -> str | None:
    """Every rank of a trainer (dora.ops.sharding.fsdp_model.ShardedModel) calls it: the full weights
    and the sharded model + optimizer state of `step`. Returns the folder on rank 0, else None."""
    group = sharded.group
    leader = group is None or group.leader
    final = checkpoint_dir(run_dir, step)
    tmp = f"{final}.tmp"
    if leader:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    if group is not None:
        group.barrier()   # the folder exists (and holds nothing stale) before any rank writes into it
    full = sharded.full_state_dict()
    sharded.save_sharded(optimizer, os.path.join(tmp, SHARDED_DIR))   # returns on rank 0 once every rank wrote
    if not leader:
        return None
    sharded.module.save_pretrained(tmp, state_dict=full)
    return _finish(tmp, final, tokenizer, step, {**(extra or {}), "sharded_state": SHARDED_DIR})
