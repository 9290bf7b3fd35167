"""Checkpoints: a transformers folder (save_pretrained) per step, loadable with
AutoModelForCausalLM.from_pretrained, plus dora_state.json {step, version, ...}.

Layout: <run_dir>/checkpoints/step_<N>/. Written to a temporary folder and renamed, so a
crash never leaves a half checkpoint under the final name. The tokenizer is saved alongside
when it has save_pretrained (HF tokenizers and dora's CharTokenizer both do).
Optimizer state is not saved: resuming training from a checkpoint is not implemented yet.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any


def checkpoint_dir(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, "checkpoints", f"step_{int(step)}")


def save_checkpoint(model, tokenizer, run_dir: str, step: int, extra: dict[str, Any] | None = None) -> str:
    """Save model (+ tokenizer) for `step`; returns the folder."""
    final = checkpoint_dir(run_dir, step)
    tmp = f"{final}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    model.save_pretrained(tmp)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(tmp)
    with open(os.path.join(tmp, "dora_state.json"), "w") as f:
        json.dump({"step": int(step), **(extra or {})}, f)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final
