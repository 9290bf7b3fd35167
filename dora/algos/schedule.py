"""Learning-rate schedule: linear warmup, then cosine decay to min_lr_ratio * lr over total_steps."""

from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, warmup_steps: int = 0, total_steps: int = 0, min_lr_ratio: float = 0.1) -> float:
    """The learning rate for optimizer step `step` (0-based).

    Warmup: lr * (step + 1) / warmup_steps for step < warmup_steps. Then constant if total_steps
    is 0, else cosine from lr down to lr * min_lr_ratio at step total_steps (and flat after).
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if total_steps <= 0:
        return lr
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))
