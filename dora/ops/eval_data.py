"""The prompts of a held-out set (the pipeline's `eval:` section, dora/graph/eval_check.py), read
with the dataset op's own sources and rendering, and the hold-out rule the dataset op trains by.

A set is distinct prompts: a source that repeats a prompt (a small synthetic task) gives it once.
`split: holdout` takes only the prompts the training dataset holds out: `held_out(record, share)` is
a hash of the prompt text, so the dataset op (which skips them) and a set (which takes them) agree
on every run and every machine without sharing any state.
"""

from __future__ import annotations

import hashlib
from typing import Any

from dora.ops.dataset import load_records, render
from dora.ops.data_files import DatasetError, file_records

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
# split: holdout on a generated source draws rows until `size` held-out prompts are found; a source
# whose distinct prompts run out first stops growing this many times `size` rows in.
MAX_DRAW = 64


def prompt_text(record: dict) -> str:
    """The prompt as written in the source (chat messages joined), before any template."""
    p = record["prompt"]
    return p if isinstance(p, str) else "\n".join(f"{m.get('role')}: {m.get('content')}" for m in p)


def held_out(record: dict, share: float) -> bool:
    """Is this prompt in the held-out `share` of its source? (a hash of its text: the same everywhere)"""
    if share <= 0:
        return False
    digest = hashlib.sha1(prompt_text(record).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64 < share


def _distinct(records: list[dict], keep) -> list[dict]:
    seen, out = set(), []
    for r in records:
        key = prompt_text(r)
        if key not in seen and keep(r):
            seen.add(key)
            out.append(r)
    return out


def raw_records(s: dict[str, Any]) -> list[dict]:
    """The set's records (distinct prompts, the split applied), at most `size` (0: a file's every row)."""
    size, share = int(s["size"]), float(s["holdout"])
    keep = (lambda r: held_out(r, share)) if s["split"] == "holdout" else (lambda r: True)
    if s["source"].endswith(FILE_SUFFIXES):
        rows = _distinct(file_records(s["source"], 0).records, keep)
        return rows[:size] if size else rows
    if size < 1:
        raise DatasetError(f"held-out set {s['name']!r}: size must be >= 1 for a generated source ({s['source']})")
    n, rows = size, []
    while True:
        rows = _distinct(load_records(s["source"], n, s["seed"], dict(s["task_params"])), keep)
        if len(rows) >= size or n >= size * MAX_DRAW:
            break
        n *= 2
    if not rows:
        raise DatasetError(f"held-out set {s['name']!r}: {s['source']} gave no held-out prompt in {n} rows "
                           f"(the dataset's holdout share is {share})")
    return rows[:size]


def eval_prompts(s: dict[str, Any], tokenizer) -> list[dict]:
    """The set's prompts as the model reads them: {prompt, prompt_ids, answer, task[, task_meta]}."""
    return [render(r, tokenizer, s["chat_template"]) for r in raw_records(s)]
