"""Reward models: transformers sequence classifiers with one label (a scalar score per sequence).

A reward_model node's `model` section is one of
  {path: DIR}                     a transformers folder: AutoModelForSequenceClassification, num_labels 1
                                  (a Bradley-Terry reward model), with its tokenizer
  {arch: llama, hidden: ..., tokenizer: chars, ...}
                                  a tiny seeded one, built as the quickstart's tiny policy is
                                  (dora/ops/models.py): the same keys, a one-label score head, weights a
                                  pure function of (section, seed), so every replica scores alike
`classifier_problems` checks a section by reading config.json only (no torch, no weights loaded):
what `dora validate` says of a folder that is not a one-label classifier, or cannot load.
"""

from __future__ import annotations

import json
import os
from typing import Any

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "dora_tokenizer.json")
DTYPES = ("float32", "bfloat16", "float16")


def classifier_problems(section: Any) -> list[tuple[str, str]]:
    """[(key, problem)] for a reward model's `model` section (key "" = the whole section)."""
    if not isinstance(section, dict) or not section:
        return [("", "a reward model needs model: {path: DIR} (a one-label sequence classifier) or a tiny "
                     "section {arch: llama, hidden: ..., tokenizer: chars}")]
    if section.get("name"):
        return [("name", f"model {section['name']!r} is a causal language model; a reward model is a sequence "
                         "classifier with one label (model: {path: DIR})")]
    if not section.get("path"):
        from dora.ops.model_section import model_problems   # the tiny section's own checks
        return model_problems(section)
    path = os.path.expanduser(str(section["path"]))
    extra = sorted(set(section) - {"path"})
    if extra:
        return [(extra[0], f"a reward model folder takes path only, not {extra}")]
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        return [("path", f"{path!r} is not a transformers model folder (no config.json there)")]
    except (OSError, ValueError) as e:
        return [("path", f"{path}/config.json cannot be read: {e}")]
    archs = [str(a) for a in cfg.get("architectures") or []]
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        return [("path", f"{path} holds {archs or 'no architectures'}, not a sequence classifier "
                         "(AutoModelForSequenceClassification: a reward model's score head)")]
    labels = len(cfg["id2label"]) if isinstance(cfg.get("id2label"), dict) else cfg.get("num_labels", 2)
    if labels != 1:
        return [("path", f"{path} is a classifier with {labels} labels; a reward model has one (a scalar score)")]
    if not any(os.path.isfile(os.path.join(path, w)) for w in WEIGHT_FILES):
        return [("path", f"{path} holds no weights ({' / '.join(WEIGHT_FILES)})")]
    if not any(os.path.isfile(os.path.join(path, t)) for t in TOKENIZER_FILES):
        return [("path", f"{path} holds no tokenizer ({' / '.join(TOKENIZER_FILES)})")]
    return []


def load_classifier(section: dict[str, Any], device: str = "cpu", seed: int = 0, dtype: str = "float32"):
    """(model in eval mode on `device`, tokenizer) for a checked section; num_labels 1, pad id set."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from dora.ops import models

    torch_dtype = getattr(torch, dtype)
    if section.get("path"):
        directory = models._local_dir(section)
        tok = models.hf_tokenizer(directory)
        model = AutoModelForSequenceClassification.from_pretrained(directory, dtype=torch_dtype, local_files_only=True)
        if model.config.num_labels != 1:
            raise ValueError(f"reward model {directory}: {model.config.num_labels} labels; a reward model has one")
    else:
        tok = models.CharTokenizer()
        cfg = models.tiny_config(section)
        hf = models.tiny_hf_config(cfg, tok)
        hf.num_labels = 1
        model = AutoModelForSequenceClassification.from_config(hf).to(torch.float32)
        models.seeded_init_(model, float(cfg["init_std"]), seed)
        model = model.to(torch_dtype)
    if model.config.pad_token_id is None:   # batches are padded: the score is read at each row's last real token
        model.config.pad_token_id = tok.pad_token_id
    return model.to(device).eval(), tok


def save_tiny_classifier(section: dict[str, Any], directory: str, seed: int = 0) -> str:
    """Write the tiny seeded reward model of `section` as a transformers folder (tests, examples)."""
    model, tok = load_classifier(section, seed=seed)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory
