"""The prompts of a held-out set (the pipeline's `eval:` section, dora/graph/eval_check.py), read
with the dataset op's own sources and rendering, and the hold-out rule the dataset op trains by.

A set is `size` rows drawn from its source as the dataset op draws them (a generator's rows with
the set's seed, a file's first rows), so it follows the source's distribution, repeats included.
`eval_rows` are the requests the generate op takes for them (dora/ops/eval_requests.py).
`split: holdout` takes only the prompts the training dataset holds out (dora/ops/holdout.py: the
dataset op skips exactly those).
"""

from __future__ import annotations

from typing import Any

from dora.ops.dataset import load_records, render
from dora.ops.data_files import DatasetError, raw_rows
from dora.ops.holdout import held_out
from dora.ops.prompt_rows import collect, parse_file_row, parsed

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
# split: holdout on a generated source draws rows until `size` of them are held-out prompts; a source
# that holds out few stops growing this many times `size` rows in.
MAX_DRAW = 64


def raw_records(s: dict[str, Any]) -> list[dict]:
    """The set's records (the split applied), at most `size` (0: a file's every row)."""
    size, share = int(s["size"]), float(s["holdout"])
    keep = (lambda r: held_out(r, share)) if s["split"] == "holdout" else (lambda r: True)
    if s["source"].endswith(FILE_SUFFIXES):
        read = collect(parsed(raw_rows(s["source"]), parse_file_row(s["source"])), "fail",
                       0 if s["split"] == "holdout" else size, s["source"])
        rows = [r for r in read.records if keep(r)]
        return rows[:size] if size else rows
    if size < 1:
        raise DatasetError(f"held-out set {s['name']!r}: size must be >= 1 for a generated source ({s['source']})")
    n, rows = size, []
    while True:
        rows = [r for r in load_records(s["source"], n, s["seed"], dict(s["task_params"])) if keep(r)]
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


def eval_rows(name: str, s: dict[str, Any], prompts: list[dict], version: int) -> list[dict[str, Any]]:
    """The prompt rows the generate op takes as evaluation requests of `version` on set `name`:
    samples per prompt, uid `eval:<set>:v<version>:<prompt>-<sample>`, the set's sampling alongside."""
    rows = []
    for i, p in enumerate(prompts):
        gid = f"eval:{name}:v{version}:{i}"
        for j in range(s["samples"]):
            rows.append({"uid": f"{gid}-{j}", "group_id": gid, "prompt": p["prompt"], "prompt_ids": p["prompt_ids"],
                         "answer": p["answer"], "task": p.get("task"), "task_meta": p.get("task_meta"),
                         "eval_set": name, "eval_temperature": float(s["temperature"]),
                         "eval_top_p": float(s["top_p"]), "eval_max_tokens": int(s["max_tokens"]),
                         "policy_version": version})
    return rows


def is_eval(row: dict[str, Any]) -> bool:
    """Is this prompt row a held-out evaluation request (one of eval_rows)?"""
    return row.get("eval_set") is not None


def eval_sampling(row: dict[str, Any], sampling: dict[str, Any]) -> dict[str, Any]:
    """A request's sampling: an evaluation row's set's temperature, top_p and max_tokens instead of
    the generate node's (`sampling`: temperature, top_p, top_k, max_tokens)."""
    if not is_eval(row):
        return sampling
    return {**sampling, "temperature": float(row["eval_temperature"]), "top_p": float(row["eval_top_p"]), "top_k": 0,
            "max_tokens": int(row["eval_max_tokens"])}
