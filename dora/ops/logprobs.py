"""Per-token log-probabilities (and entropies, hidden states) of responses under a causal LM.

The logits at column P - 1 + t predict response token t (see dora.ops.batching.collate); only
those T columns are turned into log-softmax over the vocabulary, in float32, so memory is
B x T x V rather than B x (P + T) x V.
"""

from __future__ import annotations

import torch

from dora.ops.batching import PolicyBatch


def _forward(model, pb: PolicyBatch):
    return model(input_ids=pb.input_ids, attention_mask=pb.attention_mask, position_ids=pb.position_ids, use_cache=False)


def response_logprobs(model, pb: PolicyBatch, *, temperature: float = 1.0,
                      with_entropy: bool = False, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs [B, T], entropy [B, T] or None) of pb's response tokens; zero on padding.

    entropy_grad=False computes the entropy without autograd (a metric only): no B x T x V
    graph is kept for it.
    """
    T = pb.response_ids.shape[1]
    logits = _forward(model, pb).logits[:, pb.prompt_width - 1: pb.prompt_width - 1 + T].float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, pb.response_ids.unsqueeze(-1)).squeeze(-1) * pb.response_mask
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = -(logp_all.exp() * logp_all).sum(-1) * pb.response_mask
    return logp, entropy


def response_hidden(backbone, pb: PolicyBatch) -> torch.Tensor:
    """[B, T, H] last hidden states at the positions that predict each response token (value inputs)."""
    T = pb.response_ids.shape[1]
    h = _forward(backbone, pb).last_hidden_state
    return h[:, pb.prompt_width - 1: pb.prompt_width - 1 + T]
