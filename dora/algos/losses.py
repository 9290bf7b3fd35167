"""Policy losses: per-token surrogate objectives, aggregated to one scalar, plus KL and entropy terms.

    compute(name, *, logprobs, old_logprobs, advantages, mask, **params) -> (loss: Tensor[], metrics: dict)

All tensors are [B, T] over response tokens; mask is 1 on real tokens. Three policies are involved:

- pi_theta   `logprobs`: the trainer's current weights, with grad.
- pi_prox    `old_logprobs`: the SAME trainer weights before this step's first optimizer update,
             without grad (the "proximal" policy of decoupled PPO). The PPO ratio and its clipping
             are taken against pi_prox: r = exp(logprobs - old_logprobs).
- pi_behav   what the rollout engine reported when it sampled, under policy version w_j, possibly
             several versions old (DORA's window K) and from a different numeric stack. The loss does
             not see it: an off-policy correction (dora/algos/off_policy.py) turns pi_prox / pi_behav
             into `token_weights`, detached, which multiply each token's surrogate loss. Without
             token_weights every token counts once (on-policy PPO).

Common params: agg ("token_mean" | "seq_mean_token_mean" | "seq_mean_token_sum"),
token_weights, ref_logprobs + kl_coef + kl_estimator (adds kl_coef * agg(KL) to
the loss), entropy [B, T] + entropy_coef (subtracts entropy_coef * agg(entropy): a bonus),
total_tokens / total_seqs (denominators of the whole training batch, so that the losses of
micro-batches add up to exactly the full-batch loss under gradient accumulation).

metrics: "loss" is this call's contribution (it sums over micro-batches); every other entry is
a mean over this call's masked tokens, with "tokens" to weight them when combining calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dora.algos import kl as kl_mod
from dora.algos.lazy import torch
from dora.algos.registry import Registry

if TYPE_CHECKING:   # (annotations only: torch itself is imported at first use, dora/algos/lazy.py)
    from torch import Tensor

LOSSES = Registry("policy loss")
AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")


def aggregate(x: Tensor, mask: Tensor, agg: str, *, total_tokens: float | None = None,
              total_seqs: float | None = None) -> Tensor:
    """Reduce a [B, T] per-token quantity to a scalar.

    token_mean: sum over tokens / number of tokens. seq_mean_token_mean: mean over sequences of
    each sequence's token mean. seq_mean_token_sum: mean over sequences of each sequence's token
    sum. total_tokens / total_seqs replace the denominators of the mean over the whole batch.
    Sequences with no tokens do not count.
    """
    mask = mask.to(x.dtype)
    if agg == "token_mean":
        return (x * mask).sum() / (total_tokens if total_tokens is not None else mask.sum().clamp(min=1))
    n_tok = mask.sum(-1)
    seq_sum = (x * mask).sum(-1)
    nonempty = (n_tok > 0).to(x.dtype)
    if agg == "seq_mean_token_mean":
        per_seq = seq_sum / n_tok.clamp(min=1)
    elif agg == "seq_mean_token_sum":
        per_seq = seq_sum
    else:
        raise ValueError(f"unknown agg {agg!r}; valid: {', '.join(AGGS)}")
    return (per_seq * nonempty).sum() / (total_seqs if total_seqs is not None else nonempty.sum().clamp(min=1))


def compute(name: str, *, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
            agg: str = "token_mean", token_weights: Tensor | None = None,
            ref_logprobs: Tensor | None = None, kl_coef: float = 0.0, kl_estimator: str = "k3",
            entropy: Tensor | None = None, entropy_coef: float = 0.0,
            total_tokens: float | None = None, total_seqs: float | None = None,
            **params: Any) -> tuple[Tensor, dict[str, float]]:
    fn = LOSSES.get(name)
    LOSSES.check_params(name, params)
    if agg not in AGGS:
        raise ValueError(f"unknown agg {agg!r}; valid: {', '.join(AGGS)}")
    fixed = getattr(fn, "fixed_agg", None)
    if fixed is not None and agg != fixed:
        raise ValueError(f"policy loss {name!r} aggregates by {fixed}; for agg={agg!r} use ppo_clip")
    for label, t in (("old_logprobs", old_logprobs), ("advantages", advantages), ("mask", mask),
                     ("token_weights", token_weights), ("ref_logprobs", ref_logprobs), ("entropy", entropy)):
        if t is not None and t.shape != logprobs.shape:
            raise ValueError(f"{label} has shape {tuple(t.shape)}, logprobs has {tuple(logprobs.shape)}: they must match")
    mask = mask.to(logprobs.dtype)
    old_logprobs = old_logprobs.detach()
    advantages = advantages.detach().to(logprobs.dtype)

    per_token, clipped = fn(logprobs, old_logprobs, advantages, mask, **params)

    w = torch.ones_like(mask) if token_weights is None else token_weights.detach().to(mask.dtype)
    red = dict(total_tokens=total_tokens, total_seqs=total_seqs)
    pg_loss = aggregate(per_token * w, mask, agg, **red)
    loss = pg_loss

    def tmean(x: Tensor) -> float:
        return float((x.detach() * mask).sum() / mask.sum().clamp(min=1))

    log_ratio = (logprobs.detach() - old_logprobs).clamp(-20, 20)
    metrics: dict[str, float] = {
        "tokens": float(mask.sum()),
        "clip_frac": tmean(clipped.to(mask.dtype)),
        "ratio_mean": tmean(torch.exp(log_ratio)),
        "ratio_max": float(torch.where(mask > 0, torch.exp(log_ratio), torch.zeros_like(mask)).max()) if mask.numel() else 0.0,
        "approx_kl": tmean(torch.exp(-log_ratio) + log_ratio - 1),   # k3 of pi_theta vs pi_prox
    }
    if ref_logprobs is not None and kl_coef:
        kl = kl_mod.compute(kl_estimator, logprobs=logprobs, ref_logprobs=ref_logprobs.detach())
        loss = loss + kl_coef * aggregate(kl, mask, agg, **red)
        metrics["kl"] = tmean(kl)
    if entropy is not None:
        if entropy_coef:
            loss = loss - entropy_coef * aggregate(entropy, mask, agg, **red)
        metrics["entropy"] = tmean(entropy)
    metrics["pg_loss"] = float(pg_loss.detach())
    metrics["loss"] = float(loss.detach())
    return loss, metrics


def _clipped_surrogate(ratio: Tensor, advantages: Tensor, lo: float, hi: float,
                       dual_clip: float | None) -> tuple[Tensor, Tensor]:
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - lo, 1.0 + hi)
    loss = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (it bounds the loss of negative advantages at -A * c); got {dual_clip}")
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * dual_clip), loss)
    return loss, clipped > unclipped


@LOSSES.register("ppo_clip")
def ppo_clip(logprobs, old_logprobs, advantages, mask, *, clip_eps: float = 0.2, clip_eps_high: float | None = None,
             dual_clip: float | None = None) -> tuple[Tensor, Tensor]:
    """PPO clipped surrogate, ratio clipped to [1 - clip_eps, 1 + clip_eps_high]; optional dual clip."""
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    return _clipped_surrogate(ratio, advantages, clip_eps, hi, dual_clip)


@LOSSES.register("dapo")
def dapo(logprobs, old_logprobs, advantages, mask, *, clip_eps: float = 0.2, clip_eps_high: float | None = None,
         dual_clip: float | None = None) -> tuple[Tensor, Tensor]:
    """DAPO: ppo_clip with decoupled clip-higher (eps_high defaults to 0.28) and token-mean aggregation."""
    return ppo_clip(logprobs, old_logprobs, advantages, mask, clip_eps=clip_eps,
                    clip_eps_high=0.28 if clip_eps_high is None else clip_eps_high, dual_clip=dual_clip)


dapo.fixed_agg = "token_mean"


@LOSSES.register("gspo")
def gspo(logprobs, old_logprobs, advantages, mask, *, clip_eps: float = 0.2,
         clip_eps_high: float | None = None) -> tuple[Tensor, Tensor]:
    """GSPO: one importance ratio per sequence, s_i = exp(mean_t(logp - old)), clipped per sequence.

    Token form (GSPO-token): s_it = sg[s_i] * pi_t / sg[pi_t] has the value s_i and the gradient of
    s_i spread over the tokens, so per-token advantages may differ. The paper uses tiny clip ranges
    (3e-4 / 4e-4); set clip_eps / clip_eps_high accordingly.
    """
    n = mask.sum(-1).clamp(min=1)
    seq_log_ratio = ((logprobs - old_logprobs) * mask).sum(-1) / n
    log_s = seq_log_ratio.detach()[:, None] + logprobs - logprobs.detach()
    ratio = torch.exp(log_s.clamp(-20.0, 20.0))
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    return _clipped_surrogate(ratio, advantages, clip_eps, hi, None)
