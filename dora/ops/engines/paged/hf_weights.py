"""Weights in and out of a PagedLM, by transformers' parameter names, always in place.

`load_into` copies a transformers state dict (or a safetensors version file) into the model's
existing storage (q/k/v into row ranges of the fused qkv matrix, gate/up into gate_up), casting
to the model's dtype: the tensors keep their addresses, so CUDA graphs captured on them stay
valid across versions. `release` / `allocate` drop and retake the storage (sleep / wake).
"""

from __future__ import annotations

import torch

from .decoder import PagedLM
from .model_spec import ModelSpec

Rows = tuple[int, int] | None


def weight_map(spec: ModelSpec) -> dict[str, tuple[str, Rows]]:
    """transformers name -> (our parameter name, row range inside it or None for all of it)."""
    out: dict[str, tuple[str, Rows]] = {"model.embed_tokens.weight": ("embed", None), "model.norm.weight": ("norm", None)}
    if not spec.tie_embeddings:
        out["lm_head.weight"] = ("lm_head", None)
    q, kv, inter = spec.q_size, spec.kv_size, spec.intermediate
    for i in range(spec.layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        for part, rows in (("q", (0, q)), ("k", (q, q + kv)), ("v", (q + kv, q + 2 * kv))):
            out[f"{hf}self_attn.{part}_proj.weight"] = (ours + "qkv_w", rows)
            if spec.qkv_bias:
                out[f"{hf}self_attn.{part}_proj.bias"] = (ours + "qkv_b", rows)
        out[f"{hf}self_attn.o_proj.weight"] = (ours + "o_w", None)
        if spec.o_bias:
            out[f"{hf}self_attn.o_proj.bias"] = (ours + "o_b", None)
        out[f"{hf}mlp.gate_proj.weight"] = (ours + "gate_up_w", (0, inter))
        out[f"{hf}mlp.up_proj.weight"] = (ours + "gate_up_w", (inter, 2 * inter))
        out[f"{hf}mlp.down_proj.weight"] = (ours + "down_w", None)
        out[f"{hf}input_layernorm.weight"] = (ours + "ln1", None)
        out[f"{hf}post_attention_layernorm.weight"] = (ours + "ln2", None)
    return out


def _ignored(name: str, spec: ModelSpec) -> bool:
    """Names a transformers state dict may carry that hold nothing of ours: a tied head (the
    embedding itself) and rotary frequency buffers (recomputed from the config)."""
    return (spec.tie_embeddings and name == "lm_head.weight") or name.endswith("rotary_emb.inv_freq")


def hf_views(model: PagedLM) -> dict[str, torch.Tensor]:
    """The model's weights under transformers' names (views, no copies)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    return {name: params[ours] if rows is None else params[ours][rows[0]:rows[1]]
            for name, (ours, rows) in weight_map(model.spec).items()}


@torch.no_grad()
def load_into(model: PagedLM, weights: dict[str, torch.Tensor] | str) -> None:
    if isinstance(weights, str):
        from dora.ops.weights.versions import read_version   # restores tied aliases stored once by save_version
        weights = read_version(weights)
    targets = hf_views(model)
    missing = [k for k in targets if k not in weights]
    unexpected = [k for k in weights if k not in targets and not _ignored(k, model.spec)]
    if missing or unexpected:
        raise ValueError(f"load_weights: state dict does not fit the {model.spec.arch} model: "
                         f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")
    for name, dst in targets.items():
        src = weights[name]
        if tuple(src.shape) != tuple(dst.shape):
            raise ValueError(f"load_weights: {name} has shape {tuple(src.shape)}, the model needs {tuple(dst.shape)}")
        dst.copy_(src)


def weight_bytes(model: PagedLM) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())   # a tied tensor counts once


def release(model: PagedLM) -> int:
    """Drop every parameter's storage (shapes are the spec's); returns the bytes released."""
    freed = weight_bytes(model)
    for p in model.parameters():
        p.data = p.data.new_empty(0)
    return freed


def allocate(model: PagedLM, shapes: dict[str, torch.Size]) -> int:
    """Give released parameters storage again (contents undefined until load_into)."""
    params = dict(model.named_parameters())
    for name, shape in shapes.items():
        params[name].data = torch.empty(shape, dtype=params[name].dtype, device=params[name].device)
    return weight_bytes(model)


def shapes_of(model: PagedLM) -> dict[str, torch.Size]:
    return {name: p.shape for name, p in model.named_parameters()}
