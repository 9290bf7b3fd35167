"""The llama / qwen2 decoder as the paged engine runs it: tokens of many sequences packed in one
row, their positions explicit, KV read and written through the paged cache (attention.py).

Projections are fused (q|k|v in one matrix, gate|up in another: fewer, larger kernels) and the
parameters are plain tensors that hf_weights.py fills in place from a transformers state dict, so a
captured CUDA graph stays valid across weight loads. The arithmetic follows transformers'
LlamaForCausalLM / Qwen2ForCausalLM step for step (RMSNorm in float32, rotate-half rotary
embeddings, residual adds in the model dtype), so logprobs match a transformers forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .model_spec import ModelSpec


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:    # one fused op; below float32, transformers' exact order of casts
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, D]; cos/sin [N, D/2] (float32). Rotate-half convention, computed in float32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


def rope_tables(hf_config, positions: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [positions, head_dim / 2] (float32), from transformers' own frequency computation so
    every static rope type (scaled or not) is what the checkpoint was trained with."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding   # same math as qwen2's

    rotary = LlamaRotaryEmbedding(config=hf_config)
    inv_freq = rotary.inv_freq.float().cpu()
    freqs = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)
    scale = float(getattr(rotary, "attention_scaling", 1.0))
    return (freqs.cos() * scale).to(device), (freqs.sin() * scale).to(device)


def _param(*shape: int, dtype: torch.dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device):
        super().__init__()
        p = lambda *shape: _param(*shape, dtype=dtype, device=device)   # noqa: E731
        self.spec = spec
        self.ln1, self.ln2 = p(spec.hidden), p(spec.hidden)
        self.qkv_w = p(spec.q_size + 2 * spec.kv_size, spec.hidden)
        self.qkv_b = p(spec.q_size + 2 * spec.kv_size) if spec.qkv_bias else None
        self.o_w = p(spec.hidden, spec.q_size)
        self.o_b = p(spec.hidden) if spec.o_bias else None
        self.gate_up_w = p(2 * spec.intermediate, spec.hidden)
        self.down_w = p(spec.hidden, spec.intermediate)
        self.scale = spec.head_dim ** -0.5

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta) -> torch.Tensor:
        s = self.spec
        h = rms_norm(x, self.ln1, s.rms_eps)
        qkv = F.linear(h, self.qkv_w, self.qkv_b).view(-1, s.heads + 2 * s.kv_heads, s.head_dim)
        q, k = apply_rope(qkv[:, :s.heads + s.kv_heads], cos, sin).split([s.heads, s.kv_heads], dim=1)
        k_cache.index_copy_(0, meta.slots, k)
        v_cache.index_copy_(0, meta.slots, qkv[:, s.heads + s.kv_heads:])
        x = x + F.linear(meta.attend(q, k_cache, v_cache, self.scale), self.o_w, self.o_b)
        gate, up = F.linear(rms_norm(x, self.ln2, s.rms_eps), self.gate_up_w).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.down_w)


class PagedLM(nn.Module):
    """One set of weights (a weight slot). forward() returns the final hidden states of every token;
    logits() applies the head to the rows that sample."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device):
        super().__init__()
        self.spec = spec
        self.embed = _param(spec.vocab, spec.hidden, dtype=dtype, device=device)
        self.layers = nn.ModuleList(DecoderLayer(spec, dtype, device) for _ in range(spec.layers))
        self.norm = _param(spec.hidden, dtype=dtype, device=device)
        self.lm_head = self.embed if spec.tie_embeddings else _param(spec.vocab, spec.hidden, dtype=dtype, device=device)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_layers: list[tuple[torch.Tensor, torch.Tensor]], meta) -> torch.Tensor:
        x = F.embedding(ids, self.embed)
        cos, sin = rope[0][positions], rope[1][positions]
        for layer, (k_cache, v_cache) in zip(self.layers, kv_layers):
            x = layer(x, cos, sin, k_cache, v_cache, meta)
        return rms_norm(x, self.norm, self.spec.rms_eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.lm_head)
