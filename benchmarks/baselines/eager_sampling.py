"""Batched token sampling with per-row temperature / top-p / top-k, and behaviour logprobs.

Behaviour logprob definition (the one the trainer can recompute from a teacher-forced pass):
    logprob(token) = log_softmax(logits / T)[token]      full vocabulary, BEFORE top-p/top-k
For greedy rows (T == 0) T is taken as 1: logprob = log_softmax(logits)[argmax].
Top-p/top-k only decide which tokens may be sampled; the reported logprob is not renormalised
over the truncated set, so it equals what `log_softmax(model(x).logits / T)` gives at the token.
"""

from __future__ import annotations

import torch


def sample(
    logits: torch.Tensor,            # [B, V] float
    temperature: torch.Tensor,       # [B] float; 0 = greedy
    top_p: torch.Tensor,             # [B] float in (0, 1]
    top_k: torch.Tensor,             # [B] int; 0 = off
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (tokens [B] int64, logprobs [B] float32)."""
    logits = logits.float()
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    logp = torch.log_softmax(logits / t[:, None], dim=-1)
    if bool(greedy.all()):
        tokens = logits.argmax(dim=-1)
    else:
        masked = _truncate(logp, top_p, top_k)
        probs = logp.exp() if masked is logp else masked.softmax(dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        if bool(greedy.any()):
            tokens = torch.where(greedy, logits.argmax(dim=-1), tokens)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


def _truncate(logp: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """logp with the tokens outside each row's top-k / top-p nucleus set to -inf."""
    use_k = bool((top_k > 0).any())
    use_p = bool((top_p < 1).any())
    if not (use_k or use_p):
        return logp
    vocab = logp.shape[-1]
    sorted_lp, order = logp.sort(dim=-1, descending=True)
    drop = torch.zeros_like(sorted_lp, dtype=torch.bool)
    if use_k:
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
        drop |= torch.arange(vocab, device=logp.device)[None, :] >= k[:, None]
    if use_p:
        probs = sorted_lp.exp()
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        drop |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
    return torch.full_like(logp, float("-inf")).scatter(1, order, sorted_lp)
