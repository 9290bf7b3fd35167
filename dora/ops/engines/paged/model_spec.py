"""What the paged engine needs to know about a model, read from its transformers config, and the
check `engine_problem` that says (before anything starts) why a model cannot run here.

The engine runs decoder-only llama and qwen2 models (SmolLM2 is a llama): RMSNorm, rotary
embeddings with a static frequency table, grouped-query attention, a SiLU-gated MLP.
"""

from __future__ import annotations

import dataclasses
from typing import Any

ARCHS = ("llama", "qwen2")
# rope types whose frequencies do not depend on the sequence length (dynamic/longrope rescale per length)
STATIC_ROPE = ("default", "linear", "llama3", "yarn")
MAX_HEAD_DIM = 256   # the decode kernel holds one head's vector in registers


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    arch: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    rms_eps: float
    qkv_bias: bool          # qwen2: q/k/v projections carry a bias; llama: attention_bias
    o_bias: bool            # llama attention_bias also biases o_proj; qwen2's o_proj has none
    tie_embeddings: bool

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim


def _rope_type(cfg: Any) -> str:
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return str(params.get("rope_type", params.get("type", "default")) or "default")


def config_problem(cfg: Any) -> str | None:
    """Why the paged engine cannot run a model with this transformers config (None: it can)."""
    arch = getattr(cfg, "model_type", None)
    if arch not in ARCHS:
        return f"architecture {arch!r}: the torch engine runs {' and '.join(ARCHS)} models (SmolLM2 is a llama)"
    heads, hidden = cfg.num_attention_heads, cfg.hidden_size
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    if heads % kv_heads:
        return f"{heads} attention heads do not divide into {kv_heads} KV heads"
    if head_dim % 2 or head_dim > MAX_HEAD_DIM:
        return f"head size {head_dim}: the torch engine needs an even head size of at most {MAX_HEAD_DIM}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r}: the torch engine's MLP is SiLU-gated"
    if getattr(cfg, "mlp_bias", False):
        return "mlp_bias: the torch engine's MLP has no biases"
    if arch == "qwen2" and getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention (use_sliding_window) is not supported by the torch engine"
    rope = _rope_type(cfg)
    if rope not in STATIC_ROPE:
        return f"rope type {rope!r}: the torch engine supports {', '.join(STATIC_ROPE)} (frequencies fixed per position)"
    return None


def engine_problem(model: Any) -> str | None:
    """Why the torch engine cannot run a model, given a transformers config or a pipeline's `model:`
    section (dict); None when it can, or when the section is bad in a way model_problems reports."""
    if isinstance(model, dict):   # read without transformers: dora validate runs this
        from dora.ops.model_section import ModelConfigError, model_shape
        try:
            model = model_shape(model)
        except (ModelConfigError, OSError, ValueError):
            return None
        if model is None:
            return None
    return config_problem(model)


def spec_of(cfg: Any) -> ModelSpec:
    """The ModelSpec of a transformers config; ValueError naming the problem if the engine cannot run it."""
    problem = config_problem(cfg)
    if problem:
        raise ValueError(f"torch engine: {problem}")
    heads = cfg.num_attention_heads
    attention_bias = bool(getattr(cfg, "attention_bias", False))
    qwen = cfg.model_type == "qwen2"
    return ModelSpec(
        arch=cfg.model_type, hidden=cfg.hidden_size, layers=cfg.num_hidden_layers, heads=heads,
        kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        intermediate=cfg.intermediate_size, vocab=cfg.vocab_size, max_positions=cfg.max_position_embeddings,
        rms_eps=float(cfg.rms_norm_eps), qkv_bias=qwen or attention_bias, o_bias=attention_bias and not qwen,
        tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)))
