"""Shared helpers for the engine tests: the tiny Llama of the issue, and running an engine dry."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dora.ops.engines.engine import Completion, Engine


def tiny_llama(seed: int = 0, eos: int | None = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=64, max_position_embeddings=512, eos_token_id=eos)
    return LlamaForCausalLM(cfg).float().eval()


def drain(engine: Engine, max_steps: int = 10_000) -> dict[str, Completion]:
    out: dict[str, Completion] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return out
        for c in engine.step():
            out[c.uid] = c
    raise AssertionError(f"engine still busy after {max_steps} steps")


def teacher_forced_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) at the response tokens, one plain forward pass (T = 0 -> 1)."""
    t = temperature if temperature > 0 else 1.0
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits / t, dim=-1).gather(1, torch.tensor(response)[:, None]).squeeze(1)
