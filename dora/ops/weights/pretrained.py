"""The trainer's checkpoint folder, as the update op writes it into the folder it is given:

    config.json, model.safetensors, ...   a transformers folder of the full weights (save_pretrained),
    tokenizer files                        loadable with AutoModelForCausalLM.from_pretrained
    dora_state.json                        {step, version, ranks, precision, sharded_state: "sharded" | null,
                                            weights_dtype: "float32" | "bfloat16"}
    sharded/                               the optimizer state as torch.distributed.checkpoint wrote it:
                                           {"optimizer": ...} (AdamW moments, step counts), one .distcp
                                           file per rank plus .metadata; a later load may use any rank
                                           count (DCP reshards)

The full weights are stored once, in the transformers folder: a restore reads them from there
(every rank, then keeps its shard), so a checkpoint is the fp32 weights plus the optimizer's
state (with AdamW about 3x the fp32 model, not 4x). Sized as the run asks (run.save_optimizer,
run.save_dtype): without the optimizer (sharded/ absent, sharded_state null) a restore starts AdamW's
moments afresh; weights saved in bfloat16 (half the bytes) are loaded back into the fp32 master
weights (a resume then differs from the uninterrupted run by that rounding).

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


WEIGHTS_DTYPES = ("training", "bfloat16")   # run.save_dtype: as the trainer holds them (fp32 master), or bf16


def save_training_checkpoint(sharded, optimizer, tokenizer, folder: str, extra: dict[str, Any], *,
                             with_optimizer: bool = True, dtype: str = "training") -> None:
    """Every rank of a trainer (dora.ops.sharding.fsdp_model.ShardedModel) calls it, once `folder`
    exists: the full weights (rank 0, once; in bfloat16 if `dtype` says so) and, with_optimizer,
    every rank's shards of the optimizer state."""
    group = sharded.group
    if group is not None:
        group.barrier()   # the folder exists before any rank writes into it
    full = sharded.full_state_dict()
    if with_optimizer:   # returns on rank 0 once every rank wrote
        sharded.save_sharded(optimizer, os.path.join(folder, SHARDED_DIR), with_model=False)
    elif group is not None:
        group.barrier()   # (as save_sharded would: rank 0 renames the folder once every rank is done)
    if group is not None and not group.leader:
        return
    full = _as_dtype(full, dtype)
    sharded.module.save_pretrained(folder, state_dict=full)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(folder)
    weights_dtype = str(next(iter(full.values())).dtype).removeprefix("torch.") if full else None
    with open(os.path.join(folder, STATE_FILE), "w") as f:
        json.dump({**extra, "sharded_state": SHARDED_DIR if with_optimizer else None, "weights_dtype": weights_dtype}, f)


def _as_dtype(full: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The full weights in the checkpoint's dtype; floating tensors only, tied ones kept one tensor."""
    if dtype == "training":
        return full
    import torch

    want = getattr(torch, dtype)
    cast: dict[int, Any] = {}
    out = {}
    for name, t in full.items():
        if t.is_floating_point():
            out[name] = cast.setdefault(t.data_ptr(), t.to(want))
        else:
            out[name] = t
    return out


def holds_optimizer(folder: str) -> bool:
    """Does this trainer checkpoint hold the optimizer state (run.save_optimizer)?"""
    return os.path.isdir(os.path.join(folder, SHARDED_DIR))


def load_training_checkpoint(sharded, optimizer, folder: str) -> bool:
    """Every rank: the optimizer state (resharded to this trainer's rank count) if the checkpoint holds
    it, then the full weights of the transformers folder, of which each rank keeps its shard (cast to
    the trainer's dtype). Returns whether the optimizer state was there (else AdamW starts afresh)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    path = os.path.join(folder, SHARDED_DIR)
    with_optimizer = holds_optimizer(folder)
    if with_optimizer:
        # (the optimizer's state is made by a zero-lr step when it has none: before the weights are loaded)
        state = {"optimizer": get_optimizer_state_dict(sharded.module, optimizer)}
        with warnings.catch_warnings():   # one rank: DCP says it assumes a single process, which is the point
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, checkpoint_id=path, no_dist=sharded.group is None)
        set_optimizer_state_dict(sharded.module, optimizer, state["optimizer"])
    dtypes = {p.dtype for p in sharded.module.parameters()}
    full = full_weights(folder, sharded.module)
    if len(dtypes) == 1:
        want = dtypes.pop()
        full = {k: v.to(want) if v.is_floating_point() else v for k, v in full.items()}
    sharded.load_full_state_dict(full)
    return with_optimizer


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
