"""The trainer's part of a checkpoint: every rank writes (and reads back) its shards of the model
and optimizer, rank 0 the full weights and the trainer's step, version and RNG. Collective: every
rank of the process group calls these in the same order."""

from __future__ import annotations

import os
from typing import Any

import torch

from dora.ops.weights import pretrained

TRAINER_STATE = "trainer_state.pt"   # in a checkpoint folder: step, version, RNG (rank 0's)


def save(sharded, optimizer, tokenizer, folder: str, *, step: int, version: int, ranks: int, precision: str,
         leader: bool, with_optimizer: bool = True, dtype: str = "training") -> None:
    """with_optimizer, dtype: what the run keeps (run.save_optimizer, run.save_dtype)."""
    pretrained.save_training_checkpoint(sharded, optimizer, tokenizer, folder,
                                        {"step": step, "version": version, "ranks": ranks, "precision": precision},
                                        with_optimizer=with_optimizer, dtype=dtype)
    if leader:
        torch.save({"step": step, "version": version, "rng": torch.get_rng_state()}, os.path.join(folder, TRAINER_STATE))


def restore(sharded, optimizer, folder: str) -> dict[str, Any]:
    """Load a checkpoint written by `save` (any rank count: DCP reshards) and the RNG state;
    returns {"step", "version", "optimizer": whether it held the optimizer state}."""
    with_optimizer = pretrained.load_training_checkpoint(sharded, optimizer, folder)
    state = torch.load(os.path.join(folder, TRAINER_STATE), weights_only=True)
    torch.set_rng_state(state["rng"])
    return {"step": int(state["step"]), "version": int(state["version"]), "optimizer": with_optimizer}
