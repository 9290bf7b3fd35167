"""Checkpoints: a transformers folder (save_pretrained) per step, loadable with
AutoModelForCausalLM.from_pretrained, plus dora_state.json {step, version, ...}.

Layout: <run_dir>/checkpoints/step_<N>/. Written to a temporary folder and renamed, so a
crash never leaves a half checkpoint under the final name. The tokenizer is saved alongside
when it has save_pretrained (HF tokenizers and dora's CharTokenizer both do).
The whole run's state around it (optimizer, data position, pending trajectories) is the runtime's
checkpoint (dora/runtime/checkpoint.py); this module only reads and writes the model folder.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any


def checkpoint_dir(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, "checkpoints", f"step_{int(step)}")


def write_pretrained(model, tokenizer, folder: str, extra: dict[str, Any] | None = None) -> None:
    """Model (+ tokenizer) into an existing folder, loadable with from_pretrained, plus dora_state.json."""
    model.save_pretrained(folder)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(folder)
    with open(os.path.join(folder, "dora_state.json"), "w") as f:
        json.dump(extra or {}, f)


def save_checkpoint(model, tokenizer, run_dir: str, step: int, extra: dict[str, Any] | None = None) -> str:
    """Save model (+ tokenizer) for `step` as checkpoints/step_N (temp folder + rename); returns the folder."""
    final = checkpoint_dir(run_dir, step)
    tmp = f"{final}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    write_pretrained(model, tokenizer, tmp, {"step": int(step), **(extra or {})})
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def load_pretrained_weights(model, folder: str) -> None:
    """Copy the weights of a folder written by write_pretrained into `model`, in place (tied weights,
    stored once by save_pretrained, come back through their shared storage)."""
    from safetensors.torch import load_model

    missing, unexpected = load_model(model, os.path.join(folder, "model.safetensors"), strict=False)
    tied = {name for name in missing if name.endswith("lm_head.weight")}
    if set(missing) - tied or unexpected:
        raise ValueError(f"checkpoint {folder} does not fit the model: missing {sorted(set(missing) - tied)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
