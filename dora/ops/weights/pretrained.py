"""The trainer's checkpoint folder, as the update op writes it into the folder it is given:

    config.json, model.safetensors, ...   a transformers folder of the full weights (save_pretrained),
    tokenizer files                        loadable with AutoModelForCausalLM.from_pretrained
    dora_state.json                        {step, version, ranks, precision, sharded_state: "sharded"}
    sharded/                               the optimizer state as torch.distributed.checkpoint wrote it:
                                           {"optimizer": ...} (AdamW moments, step counts), one .distcp
                                           file per rank plus .metadata; a later load may use any rank
                                           count (DCP reshards)

The full weights are stored once, in the transformers folder: a restore reads them from there
(every rank, then keeps its shard), so a checkpoint is the fp32 weights plus the optimizer's
state (with AdamW about 3x the fp32 model, not 4x).

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
    exists: the full weights (rank 0, once) and every rank's shards of the optimizer state."""
    group = sharded.group
    if group is not None:
        group.barrier()   # the folder exists before any rank writes into it
    full = sharded.full_state_dict()
    sharded.save_sharded(optimizer, os.path.join(folder, SHARDED_DIR), with_model=False)   # returns on rank 0 once every rank wrote
    if group is not None and not group.leader:
        return
    sharded.module.save_pretrained(folder, state_dict=full)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(folder)
    with open(os.path.join(folder, STATE_FILE), "w") as f:
        json.dump({**extra, "sharded_state": SHARDED_DIR}, f)


def load_training_checkpoint(sharded, optimizer, folder: str) -> None:
    """Every rank: the optimizer state (resharded to this trainer's rank count), then the full weights
    of the transformers folder, of which each rank keeps its shard."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    path = os.path.join(folder, SHARDED_DIR)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint {folder} has no {SHARDED_DIR}/ training state")
    # (the optimizer's state is made by a zero-lr step when it has none: before the weights are loaded)
    state = {"optimizer": get_optimizer_state_dict(sharded.module, optimizer)}
    with warnings.catch_warnings():   # one rank: DCP says it assumes a single process, which is the point
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=path, no_dist=sharded.group is None)
    set_optimizer_state_dict(sharded.module, optimizer, state["optimizer"])
    sharded.load_full_state_dict(full_weights(folder, sharded.module))


def full_weights(folder: str, module) -> dict[str, Any]:
    """The weights of a transformers folder (model.safetensors, or its shards), with the tied
    parameters save_pretrained leaves out (lm_head = embedding) filled in from their twin."""
    import glob

    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(folder, "model*.safetensors")))
    if not files:
        raise FileNotFoundError(f"checkpoint {folder} has no model*.safetensors (the full weights)")
    full: dict[str, Any] = {}
    for f in files:
        full.update(load_file(f))
    first: dict[int, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if name not in full and id(param) in first and first[id(param)] in full:
            full[name] = full[first[id(param)]]
        first.setdefault(id(param), name)
    return full
