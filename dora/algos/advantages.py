"""Advantage estimators: rewards (and values) in, one advantage per response token out.

    compute(name, *, rewards, group_ids, mask, values=None, token_rewards=None, **params) -> Tensor[B, T]

rewards [B] float (the outcome reward of each trajectory), group_ids [B] int64 (the G responses of a
prompt share one), mask [B, T] (1 on the response tokens the policy sampled; 0 on padding and on
tool observations inside a multi-turn response), values [B, T] (critic values, gae only),
token_rewards [B, T] (per-token rewards such as a KL penalty; optional).

Outcome estimators (grpo, dr_grpo, rloo, reinforce_pp_baseline) score a whole sequence: when
token_rewards is given, its masked sum is added to the trajectory's reward first. gae places the
outcome reward on the last response token and adds token_rewards token by token.
Every result is zero where mask is 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dora.algos.lazy import torch
from dora.algos.registry import Registry

if TYPE_CHECKING:   # (annotations only: torch itself is imported at first use, dora/algos/lazy.py)
    from torch import Tensor

ADVANTAGE_ESTIMATORS = Registry("advantage estimator")
register = ADVANTAGE_ESTIMATORS.register


def compute(name: str, *, rewards: Tensor, group_ids: Tensor, mask: Tensor, values: Tensor | None = None,
            token_rewards: Tensor | None = None, **params) -> Tensor:
    fn = ADVANTAGE_ESTIMATORS.get(name)
    ADVANTAGE_ESTIMATORS.check_params(name, params)
    mask = mask.to(torch.float32)
    rewards = rewards.to(torch.float32)
    if rewards.dim() != 1 or group_ids.shape != rewards.shape or mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"shapes: rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be [B], "
                         f"mask {tuple(mask.shape)} must be [B, T]")
    for label, t in (("values", values), ("token_rewards", token_rewards)):
        if t is not None and t.shape != mask.shape:
            raise ValueError(f"{label} has shape {tuple(t.shape)}, mask has {tuple(mask.shape)}: they must match")
    return fn(rewards, group_ids, mask, values, token_rewards, **params)


# ---- helpers -------------------------------------------------------------------------------------

def sequence_rewards(rewards: Tensor, mask: Tensor, token_rewards: Tensor | None) -> Tensor:
    """The outcome reward plus the masked sum of any per-token rewards: one scalar per trajectory."""
    if token_rewards is None:
        return rewards
    return rewards + (token_rewards.to(torch.float32) * mask).sum(-1)


def group_stats(x: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row (group mean, group unbiased std, group size). A group of one has std 0."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    k = int(inv.max()) + 1 if inv.numel() else 0
    n = x.new_zeros(k).index_add_(0, inv, torch.ones_like(x))
    mean = x.new_zeros(k).index_add_(0, inv, x) / n
    sq = x.new_zeros(k).index_add_(0, inv, (x - mean[inv]) ** 2)
    std = torch.where(n > 1, sq / (n - 1).clamp(min=1), torch.zeros_like(sq)).sqrt()
    return mean[inv], std[inv], n[inv]


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the masked entries (unbiased variance), zero elsewhere."""
    n = mask.sum()
    mean = masked_mean(x, mask)
    var = (((x - mean) ** 2) * mask).sum() / (n - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + eps) * mask


# ---- outcome estimators --------------------------------------------------------------------------

@register("grpo")
def grpo(rewards, group_ids, mask, values, token_rewards, *, eps: float = 1e-6) -> Tensor:
    """(r - group mean) / (group std (unbiased) + eps), the same value on every response token."""
    r = sequence_rewards(rewards, mask, token_rewards)
    mean, std, _ = group_stats(r, group_ids)
    return ((r - mean) / (std + eps))[:, None] * mask


@register("dr_grpo")
def dr_grpo(rewards, group_ids, mask, values, token_rewards) -> Tensor:
    """Dr. GRPO: r - group mean, no std normalisation (removes the difficulty bias)."""
    r = sequence_rewards(rewards, mask, token_rewards)
    mean, _, _ = group_stats(r, group_ids)
    return (r - mean)[:, None] * mask


@register("rloo")
def rloo(rewards, group_ids, mask, values, token_rewards) -> Tensor:
    """REINFORCE leave-one-out: r minus the mean of the group's other members (0 for a group of one)."""
    r = sequence_rewards(rewards, mask, token_rewards)
    mean, _, n = group_stats(r, group_ids)
    others = (mean * n - r) / (n - 1).clamp(min=1)
    return torch.where(n > 1, r - others, torch.zeros_like(r))[:, None] * mask


@register("reinforce_pp_baseline")
def reinforce_pp_baseline(rewards, group_ids, mask, values, token_rewards) -> Tensor:
    """REINFORCE++ with a group baseline: r - group mean, then whitened over all of the batch's tokens."""
    return masked_whiten(dr_grpo(rewards, group_ids, mask, values, token_rewards), mask)


# ---- GAE -----------------------------------------------------------------------------------------

def gae_returns(*, rewards: Tensor, mask: Tensor, values: Tensor, token_rewards: Tensor | None = None,
                gamma: float = 1.0, lam: float = 1.0) -> tuple[Tensor, Tensor]:
    """Raw GAE advantages and returns (advantages + values), both [B, T] and zero off the mask.

    Per-token reward: token_rewards (if any) on every response token, plus the outcome reward on
    the last response token. V is taken as 0 after the last response token (the episode ends), so
    delta_t = r_t + gamma V_{t+1} - V_t and A_t = delta_t + gamma lam A_{t+1}, right to left, where
    t + 1 is the next MASKED-IN token: a multi-turn response's observation tokens (mask 0 inside it)
    are stepped over, so the model's last token before a tool call bootstraps from its first token
    after the observation.
    """
    mask = mask.to(torch.float32)
    B, T = mask.shape
    v = values.to(torch.float32) * mask
    r = torch.zeros_like(mask) if token_rewards is None else token_rewards.to(torch.float32) * mask
    pos = torch.arange(T, device=mask.device).expand(B, T)
    last = torch.where(mask > 0, pos, torch.full_like(pos, -1)).max(-1).values  # -1 for an empty response
    has = last >= 0
    r = r.clone()
    r[has, last[has]] += rewards.to(device=mask.device, dtype=torch.float32)[has]
    adv = torch.zeros_like(mask)
    next_v = mask.new_zeros(B)
    next_a = mask.new_zeros(B)
    for t in range(T - 1, -1, -1):
        m = mask[:, t]
        delta = r[:, t] + gamma * next_v - v[:, t]
        a = delta + gamma * lam * next_a
        # Off the mask carry the next masked-in token's V and A through: padding after the response
        # carries the initial zeros; an observation inside it is skipped.
        adv[:, t] = a * m
        next_v = torch.where(m > 0, v[:, t], next_v)
        next_a = torch.where(m > 0, a, next_a)
    return adv, (adv + v) * mask


@register("gae")
def gae(rewards, group_ids, mask, values, token_rewards, *, gamma: float = 1.0, lam: float = 1.0,
        whiten: bool = True) -> Tensor:
    """Generalised advantage estimation from critic values; whitened over the batch's tokens by default."""
    if values is None:
        raise ValueError("advantage estimator 'gae' needs values [B, T] (from a critic)")
    adv, _ = gae_returns(rewards=rewards, mask=mask, values=values, token_rewards=token_rewards, gamma=gamma, lam=lam)
    return masked_whiten(adv, mask) if whiten else adv
