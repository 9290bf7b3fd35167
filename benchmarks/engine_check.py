"""Is the torch engine right in bfloat16? Its behaviour logprobs against a plain transformers forward,
the measure tests/test_engine_bf16.py asserts on CPU and benchmarks/engine_gpu.py's `paged-check`
section reports on the GPU (the engine as configured there: CUDA graphs, the Triton kernel).

Tolerance: bf16 keeps 8 bits of mantissa, so two correct bf16 forwards that round in a different
order (fused q|k|v, paged attention) differ by a few 1e-3 nats, more in larger models. So the
engine is held to transformers' own bf16 forward, both against the float32 model (the truth):
  mean |engine - float32|   <= 1.5 x mean |transformers bf16 - float32| + 1e-3, and
  max  |engine - float32|   <= 2 x max |transformers bf16 - float32| + 0.01:
the engine in bf16 is as close to the float32 model as transformers in bf16 is. A wrong cast, rope
or mask is off by far more (tenths of a nat and up).
"""

from __future__ import annotations

import dataclasses
import random

import torch

MEAN_RATIO, MEAN_SLACK = 1.5, 1e-3
MAX_RATIO, MAX_SLACK = 2.0, 0.01


@dataclasses.dataclass
class Bf16Errors:
    max_vs_hf_bf16: float          # max |engine - transformers bf16| over every sampled token (reported)
    mean_vs_fp32: float            # mean |engine - transformers float32|
    max_vs_fp32: float
    hf_bf16_mean_vs_fp32: float    # mean |transformers bf16 - transformers float32|: the bf16 noise floor
    hf_bf16_max_vs_fp32: float
    tokens: int

    @property
    def ok(self) -> bool:
        return (self.mean_vs_fp32 <= MEAN_RATIO * self.hf_bf16_mean_vs_fp32 + MEAN_SLACK
                and self.max_vs_fp32 <= MAX_RATIO * self.hf_bf16_max_vs_fp32 + MAX_SLACK)


def check_models(device: str, *, hidden: int = 128, layers: int = 3, vocab: int = 256, seed: int = 0):
    """(float32, bfloat16) copies of one random llama (GQA 8 heads / 2 KV heads) on `device`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                      intermediate_size=2 * hidden, vocab_size=vocab, max_position_embeddings=1024,
                      eos_token_id=None, initializer_range=0.05)
    fp32 = LlamaForCausalLM(cfg).float().eval()
    bf16 = LlamaForCausalLM(cfg).eval()
    bf16.load_state_dict(fp32.state_dict())
    return fp32.to(device), bf16.to(device=device, dtype=torch.bfloat16)


def check_prompts(vocab: int, n: int = 6, group: int = 3, longest: int = 60, seed: int = 3) -> list[list[int]]:
    """n prompts of 2..longest tokens, then `group` copies of one of them (prefix hits)."""
    rnd = random.Random(seed)
    own = [[rnd.randrange(3, vocab) for _ in range(rnd.randint(2, longest))] for _ in range(n)]
    return own + [own[min(2, n - 1)]] * group


def _teacher(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response], device=device)).logits[0, len(prompt) - 1:-1].float()
    picked = torch.log_softmax(logits, -1).gather(1, torch.tensor(response, device=device)[:, None])[:, 0]
    return picked.cpu()


def bf16_errors(eng, models, prompts: list[list[int]], prefix: str, max_tokens: int = 16) -> Bf16Errors:
    """Sample `prompts` on engine `eng` (temperature 1), then score every sampled token's logprob."""
    from dora.ops.engines.engine import SamplingRequest

    fp32, bf16 = models
    for i, p in enumerate(prompts):
        eng.submit(SamplingRequest(f"{prefix}{i}", p, eng.version, max_tokens=max_tokens, temperature=1.0))
    done = []
    while eng.has_work():
        done += eng.step()
    vs_bf16, vs_fp32, hf_vs_fp32 = [], [], []
    for c in done:
        got = torch.tensor(c.logprobs)
        truth, hf = _teacher(fp32, c.prompt_ids, c.response_ids), _teacher(bf16, c.prompt_ids, c.response_ids)
        vs_bf16.append((got - hf).abs())
        vs_fp32.append((got - truth).abs())
        hf_vs_fp32.append((hf - truth).abs())
    vs_bf16, vs_fp32, hf_vs_fp32 = torch.cat(vs_bf16), torch.cat(vs_fp32), torch.cat(hf_vs_fp32)
    return Bf16Errors(vs_bf16.max().item(), vs_fp32.mean().item(), vs_fp32.max().item(), hf_vs_fp32.mean().item(),
                      hf_vs_fp32.max().item(), sum(len(c.response_ids) for c in done))
