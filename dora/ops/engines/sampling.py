"""Batched token sampling on the device: per-row temperature / top-p / top-k, and behaviour logprobs.

Behaviour logprob definition (the one the trainer can recompute from a teacher-forced pass):
    logprob(token) = log_softmax(logits / T)[token]      full vocabulary, BEFORE top-p/top-k
For greedy rows (T == 0) T is taken as 1: logprob = log_softmax(logits)[argmax].
Top-p/top-k only decide which tokens may be sampled; the reported logprob is not renormalised
over the truncated set, so it equals what `log_softmax(model(x).logits / T)` gives at the token.

Drawing: argmax(log p - log E) with E ~ Exp(1) drawn from the seeded generator picks token i with
probability p_i (the exponential race; -log E is a Gumbel variable). Nothing here reads a device
value on the host: which branches run (all greedy? any top-p/top-k?) is decided from the requests'
parameters, which the caller knows (`SamplePlan`), so a step costs no synchronisation until its
single device-to-host copy of (tokens, logprobs).
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class SamplePlan:
    all_greedy: bool
    any_greedy: bool
    truncate: bool      # some row has top_k > 0 or top_p < 1

    @staticmethod
    def of(temperatures: list[float], top_ps: list[float], top_ks: list[int]) -> "SamplePlan":
        greedy = [t <= 0 for t in temperatures]
        return SamplePlan(all(greedy), any(greedy), any(k > 0 for k in top_ks) or any(p < 1 for p in top_ps))


def sampling_tensors(temperatures: list[float], top_ps: list[float], top_ks: list[int],
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The per-row parameters on the device, in one host-to-device copy."""
    both = torch.tensor([temperatures, top_ps, [float(k) for k in top_ks]], dtype=torch.float32).to(device)
    return both[0], both[1], both[2].long()


def sample(
    logits: torch.Tensor,            # [B, V]
    temperature: torch.Tensor,       # [B] float; 0 = greedy
    top_p: torch.Tensor,             # [B] float in (0, 1]
    top_k: torch.Tensor,             # [B] int; 0 = off
    generator: torch.Generator,
    plan: SamplePlan | None = None,  # None: read from the tensors (a host sync)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (tokens [B] int64, logprobs [B] float32)."""
    if plan is None:
        plan = SamplePlan.of(temperature.tolist(), top_p.tolist(), top_k.tolist())
    logits = logits.float()
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    logp = torch.log_softmax(logits / t[:, None], dim=-1)
    if plan.all_greedy:
        tokens = logits.argmax(dim=-1)
    else:
        candidates = _truncate(logp, top_p, top_k) if plan.truncate else logp
        race = torch.empty_like(candidates).exponential_(1.0, generator=generator)
        tokens = (candidates - race.log()).argmax(dim=-1)
        if plan.any_greedy:
            tokens = torch.where(greedy, logits.argmax(dim=-1), tokens)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


def _truncate(logp: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """logp with the tokens outside each row's top-k / top-p nucleus set to -inf."""
    vocab = logp.shape[-1]
    sorted_lp, order = logp.sort(dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    drop = torch.arange(vocab, device=logp.device)[None, :] >= k[:, None]
    probs = sorted_lp.exp()
    # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
    drop |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
    return torch.full_like(logp, float("-inf")).scatter(1, order, sorted_lp)
