"""The trainer's checkpoint folder, as the update op writes it into the folder it is given:

    config.json, model.safetensors, ...   a transformers folder of the full weights (save_pretrained),
    tokenizer files                        loadable with AutoModelForCausalLM.from_pretrained
    dora_state.json                        {step, version, ranks, precision, sharded_state: "sharded"}
    sharded/                               the training state as torch.distributed.checkpoint wrote it:
                                           {"model": ..., "optimizer": ...} (AdamW moments, step counts),
                                           one .distcp file per rank plus .metadata; a later load may use
                                           any rank count (DCP reshards)

Every rank of a sharded trainer writes its shards into the same folder (a multi-node trainer needs
the run directory on shared storage); rank 0 gathers and writes the full weights. Where the folder
lives, and how a crash never leaves half of one under its final name, is the caller's: the run's
checkpoint (dora/rl/checkpoint.py) or checkpoints/step_N written as .tmp and renamed.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

SHARDED_DIR = "sharded"
STATE_FILE = "dora_state.json"


def checkpoint_dir(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, "checkpoints", f"step_{int(step)}")


def save_training_checkpoint(sharded, optimizer, tokenizer, folder: str, extra: dict[str, Any]) -> None:
    """Every rank of a trainer (dora.ops.sharding.fsdp_model.ShardedModel) calls it, once `folder`
    exists: the full weights and the sharded model + optimizer state."""
    group = sharded.group
    if group is not None:
        group.barrier()   # the folder exists before any rank writes into it
    full = sharded.full_state_dict()
    sharded.save_sharded(optimizer, os.path.join(folder, SHARDED_DIR))   # returns on rank 0 once every rank wrote
    if group is not None and not group.leader:
        return
    sharded.module.save_pretrained(folder, state_dict=full)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(folder)
    with open(os.path.join(folder, STATE_FILE), "w") as f:
        json.dump({**extra, "sharded_state": SHARDED_DIR}, f)


def load_training_checkpoint(sharded, optimizer, folder: str) -> None:
    """Every rank: model and optimizer state from a folder save_training_checkpoint wrote, resharded to
    this trainer's rank count."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = os.path.join(folder, SHARDED_DIR)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint {folder} has no {SHARDED_DIR}/ training state")
    model_sd, optim_sd = get_state_dict(sharded.module, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    with warnings.catch_warnings():   # one rank: DCP says it assumes a single process, which is the point
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=path, no_dist=sharded.group is None)
    set_state_dict(sharded.module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
