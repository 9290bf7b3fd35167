"""Off-policy corrections: how much each token of stale data counts, and how big the step may be.

    compute(name, *, prox_logprobs, behavior_logprobs, mask, **params) -> Correction

Tensors are [B, T] over response tokens, mask 1 on real tokens. Of the three policies in the loss
(dora/algos/losses.py), a correction sees two: pi_prox (`prox_logprobs`: the trainer's weights
before this step) and pi_behav (`behavior_logprobs`: the engine's policy version that sampled each
token, up to K versions older). Per token r_t = pi_prox(y_t) / pi_behav(y_t). A correction turns r
into

- weight [B, T], detached: multiplies the token's surrogate loss (0 drops the token);
- lr_scale: a factor on this step's learning rate;
- metrics: means over the masked tokens (and the batch's sequence-level ESS).

On-policy data (sync mode) have r = 1 up to numerics, so every correction leaves them as they are;
they differ only on stale data. The update op calls compute() on the whole training step for
lr_scale and metrics. A correction marked `batch_wide` has token weights that depend on every
token of the step (a threshold over the whole batch): the update op then computes pi_prox for the
whole step before the first backward pass; the others' weights are token by token, so it computes
them micro-batch by micro-batch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from dora.algos.lazy import torch
from dora.algos.registry import Registry

if TYPE_CHECKING:   # (annotations only: torch itself is imported at first use, dora/algos/lazy.py)
    from torch import Tensor

OFF_POLICY = Registry("off-policy correction")
LOG_RATIO_BOUND = 20.0   # exp(20) ~ 5e8: beyond it a ratio is "infinite" for every correction here


@dataclasses.dataclass
class Correction:
    weight: Tensor            # [B, T], detached; 0 on masked-out and padding tokens
    lr_scale: float
    metrics: dict[str, float]


def compute(name: str, *, prox_logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor, **params: Any) -> Correction:
    fn = OFF_POLICY.get(name)
    OFF_POLICY.check_params(name, params)
    if behavior_logprobs.shape != prox_logprobs.shape or mask.shape != prox_logprobs.shape:
        raise ValueError(f"prox_logprobs {tuple(prox_logprobs.shape)}, behavior_logprobs {tuple(behavior_logprobs.shape)} "
                         f"and mask {tuple(mask.shape)} must have the same shape")
    mask = mask.to(prox_logprobs.dtype)
    log_r = ((prox_logprobs.detach() - behavior_logprobs.detach()) * mask).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    weight, lr_scale = fn(log_r, mask, **params)
    weight = weight.detach() * mask
    n = mask.sum().clamp(min=1)
    r = torch.exp(log_r)
    metrics = {
        "is_ratio_mean": float((r * mask).sum() / n),
        "is_log_ratio_m2": float((log_r ** 2 * mask).sum() / n),        # second moment of log r (M2PO's statistic)
        "is_weight_mean": float(weight.sum() / n),
        "is_dropped_frac": float(((weight == 0) & (mask > 0)).sum() / n),
        "is_changed_frac": float((((weight - r).abs() > 1e-6 * r.clamp(min=1)) & (weight != 0) & (mask > 0)).sum() / n),
        "is_seq_ess": sequence_ess(log_r, mask),
        "lr_scale": float(lr_scale),
    }
    return Correction(weight=weight, lr_scale=float(lr_scale), metrics=metrics)


def sequence_ess(log_r: Tensor, mask: Tensor) -> float:
    """Normalised effective sample size (sum rho)^2 / (N sum rho^2) in (0, 1] of the sequence weights
    rho_i = prod_t r_it over the N non-empty sequences: 1 when the sampler and the trainer agree on every
    sequence, 1/N when one sequence carries all the weight."""
    nonempty = mask.sum(-1) > 0
    if not bool(nonempty.any()):
        return 1.0
    log_rho = (log_r * mask).sum(-1)[nonempty].double()
    log_rho = log_rho - log_rho.max()        # the ratio is scale-free: subtract the max before exp
    rho = torch.exp(log_rho)
    return float(rho.sum() ** 2 / (rho.numel() * (rho ** 2).sum()))


@OFF_POLICY.register("none")
def none(log_r: Tensor, mask: Tensor) -> tuple[Tensor, float]:
    """No correction: every token counts once, as if the data were on-policy."""
    return torch.ones_like(log_r), 1.0


def _cap_rules(*, cap: float) -> None:
    _positive("cap", cap)


@OFF_POLICY.register("tis", rules=_cap_rules)
def tis(log_r: Tensor, mask: Tensor, *, cap: float = 2.0) -> tuple[Tensor, float]:
    """Truncated importance sampling: w = min(r, cap). Biased where r > cap, variance bounded by cap^2."""
    return torch.exp(log_r).clamp(max=cap), 1.0


def _icepop_rules(*, low: float, high: float) -> None:
    _positive("low", low)
    _positive("high", high)
    if high <= low:
        raise ValueError(f"icepop: high ({high}) must be > low ({low})")


@OFF_POLICY.register("icepop", rules=_icepop_rules)
def icepop(log_r: Tensor, mask: Tensor, *, low: float = 0.5, high: float = 2.0) -> tuple[Tensor, float]:
    """Masked importance sampling (IcePop): w = r inside [low, high], 0 outside: a token the two
    policies disagree on that much is dropped instead of kept at a truncated weight."""
    r = torch.exp(log_r)
    return torch.where((r >= low) & (r <= high), r, torch.zeros_like(r)), 1.0


@OFF_POLICY.register("m2po", rules=lambda *, m2_max: _positive("m2_max", m2_max))
def m2po(log_r: Tensor, mask: Tensor, *, m2_max: float = 0.04) -> tuple[Tensor, float]:
    """M2PO-style second-moment bound: drop the tokens with the largest (log r)^2, largest first, until
    the mean of (log r)^2 over the tokens kept is <= m2_max; w = r (untruncated) on the tokens kept.
    Only extreme outliers go, and only as many as the bound needs: a batch already inside it is
    untouched."""
    sq = (log_r ** 2) * mask
    valid = mask > 0
    vals = sq[valid]
    weight = torch.exp(log_r)
    if vals.numel() == 0:
        return weight, 1.0
    desc, _ = torch.sort(vals.double(), descending=True)
    n = desc.numel()
    # mean of the rest after dropping the k largest, for k = 0 .. n-1
    rest_sum = desc.sum() - torch.cat([desc.new_zeros(1), torch.cumsum(desc, 0)[:-1]])
    rest_mean = rest_sum / torch.arange(n, 0, -1, dtype=desc.dtype)
    ok = torch.nonzero(rest_mean <= m2_max)
    k = int(ok[0]) if ok.numel() else n        # no k meets the bound: only the empty set does
    if k == 0:
        return weight, 1.0
    threshold = desc[k - 1]                      # drop everything at or above the k-th largest
    drop = valid & (sq.double() >= threshold)
    return torch.where(drop, torch.zeros_like(weight), weight), 1.0


m2po.batch_wide = True


def _ess_lr_rules(*, cap: float, power: float) -> None:
    _positive("cap", cap)
    if not (isinstance(power, (int, float)) and math.isfinite(power) and power >= 0):
        raise ValueError(f"ess_lr: power must be >= 0, got {power!r}")


@OFF_POLICY.register("ess_lr", rules=_ess_lr_rules)
def ess_lr(log_r: Tensor, mask: Tensor, *, cap: float = 2.0, power: float = 0.5) -> tuple[Tensor, float]:
    """Truncated IS weights (as tis) and a smaller step when the batch carries less information
    (VCPO-style): lr_scale = ESS ** power, ESS the normalised effective sample size of the sequence
    weights (sequence_ess). power 0.5 is the square-root rule for Adam (the update's optimizer):
    the step size that matches a batch of ESS * N independent samples."""
    return torch.exp(log_r).clamp(max=cap), sequence_ess(log_r, mask) ** power


@OFF_POLICY.register("decoupled", rules=_cap_rules)
def decoupled(log_r: Tensor, mask: Tensor, *, cap: float = 5.0) -> tuple[Tensor, float]:
    """Decoupled PPO's behaviour weight as AReaL applies it: w = r = pi_prox / pi_behav, tokens with
    r > cap dropped (not truncated). The PPO ratio and its clip are against pi_prox (the loss's
    old_logprobs), so the trust region is around the trainer's own weights, not the sampler's."""
    r = torch.exp(log_r)
    return torch.where(r <= cap, r, torch.zeros_like(r)), 1.0


def is_batch_wide(name: str) -> bool:
    return bool(getattr(OFF_POLICY.get(name), "batch_wide", False))


def _positive(label: str, x: float) -> None:
    if not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0):
        raise ValueError(f"{label} must be a positive number, got {x!r}")
