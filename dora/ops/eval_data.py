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

from dora.ops.dataset import load_records
from dora.ops.data_files import DatasetError, raw_rows
from dora.ops.holdout import held_out
from dora.ops.prompt_rows import LIMIT_WHY, Loaded, collect, parse_file_row, parsed, prepared

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
# split: holdout on a generated source draws rows until `size` of them are held-out prompts; a source
# that holds out few stops growing this many times `size` rows in.
MAX_DRAW = 64


def raw_records(s: dict[str, Any]) -> list[dict]:
    """The set's records (the split applied), at most `size` (0: a file's every row), unrendered."""
    if not _is_file(s):
        return [r for _, r in _generated(s)]
    read = collect(parsed(raw_rows(s["source"]), parse_file_row(s["source"])), "fail", 0, s["source"])
    rows = [r for r in read.records if _keep(s)(r)]
    return rows[:int(s["size"])] if int(s["size"]) else rows


def eval_prompts(s: dict[str, Any], tokenizer) -> list[dict]:
    """The set's prompts as the model reads them: {prompt, prompt_ids, answer, task[, task_meta]}."""
    return loaded_prompts(s, tokenizer).records


def loaded_prompts(s: dict[str, Any], tokenizer) -> Loaded:
    """The set's prompts, each held to the set's prompt limit (`max_prompt_tokens`, resolved from the
    generate node's context and the set's max_tokens: dora/graph/eval_check.py) as the training
    dataset's rows are: a row that cannot be used raises DatasetError naming it (`bad_rows` fail, the
    training dataset's on_error) or is skipped and counted (skip)."""
    limit, why = s.get("max_prompt_tokens"), s.get("limit_why") or LIMIT_WHY
    if _is_file(s):
        source = s["source"]
        rows = prepared(raw_rows(source), tokenizer, s["chat_template"], limit, parse_file_row(source), why,
                        keep=_keep(s))
    else:
        rows = prepared(_generated(s), tokenizer, s["chat_template"], limit, limit_why=why)
    try:
        return collect(rows, s.get("bad_rows", "fail"), int(s["size"]), s["source"])
    except DatasetError as e:
        raise DatasetError(f"held-out set {s['name']!r}: {e}") from None


def _is_file(s: dict[str, Any]) -> bool:
    return s["source"].endswith(FILE_SUFFIXES)


def _keep(s: dict[str, Any]):
    share = float(s["holdout"])
    return (lambda r: held_out(r, share)) if s["split"] == "holdout" else (lambda r: True)


def _generated(s: dict[str, Any]) -> list[tuple[str, dict]]:
    """(where, record) for the set's `size` rows of a generated source, the split applied."""
    size, keep = int(s["size"]), _keep(s)
    if size < 1:
        raise DatasetError(f"held-out set {s['name']!r}: size must be >= 1 for a generated source ({s['source']})")
    n = size
    while True:
        rows = [(f"{s['source']}[{i}]", r) for i, r in enumerate(load_records(s["source"], n, s["seed"],
                                                                                dict(s["task_params"]))) if keep(r)]
        if len(rows) >= size or n >= size * MAX_DRAW:
            break
        n *= 2
    if not rows:
        raise DatasetError(f"held-out set {s['name']!r}: {s['source']} gave no held-out prompt in {n} rows "
                           f"(the dataset's holdout share is {s['holdout']})")
    return rows[:size]


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
