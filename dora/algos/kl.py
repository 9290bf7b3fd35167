"""KL estimators between the policy and a reference, per token (Schulman's k1, k2, k3).

    compute(name, *, logprobs, ref_logprobs) -> Tensor[B, T]

k1 = logp - ref; k2 = 0.5 (logp - ref)^2; k3 = exp(ref - logp) - (ref - logp) - 1 (unbiased,
always >= 0, low variance). Unmasked: callers multiply by the response mask. Used as a reward
penalty (token_rewards = -kl_coef * kl, see dora.ops.advantage) or a loss term (dora.algos.losses).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dora.algos.lazy import torch
from dora.algos.registry import Registry

if TYPE_CHECKING:   # (annotations only: torch itself is imported at first use, dora/algos/lazy.py)
    from torch import Tensor

KL_ESTIMATORS = Registry("kl estimator")

# exp() of a log-ratio beyond this overflows float32 into inf and poisons a whole step's gradient;
# a token that far from the reference is clipped (its k3 is then ~e^20, still a huge penalty).
_MAX_LOG_RATIO = 20.0


def compute(name: str, *, logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} differ in shape")
    return KL_ESTIMATORS.get(name)(logprobs, ref_logprobs)


@KL_ESTIMATORS.register("k1")
def k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    d = (ref_logprobs - logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.exp(d) - d - 1
