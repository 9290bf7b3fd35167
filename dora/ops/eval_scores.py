"""Scores of one evaluation (a version on a held-out set): the metrics of eval.jsonl.

    set_metrics(prompts, k, correct_at) -> {n_prompts, k, mean_reward, pass@1, pass@k, maj@k,
                                            mean_response_tokens, truncated_share}

`prompts` holds, per prompt, its samples in order: {reward, response_tokens, finish_reason,
answer (the extracted final answer, None if none)}. A sample is correct when its reward >= correct_at.
- pass@1 and pass@k: the unbiased estimator from n samples with c correct (Chen et al. 2021),
  1 - C(n - c, k) / C(n, k), averaged over prompts; pass@1 is then the share correct.
- maj@k: the most frequent extracted answer among the first k samples (ties: the one seen first)
  is correct if a sample giving it is; null when no sample of the set had an answer to extract.
- truncated_share: samples that stopped at max_tokens (finish_reason length).
"""

from __future__ import annotations

import collections
import math
from typing import Any


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k samples drawn without replacement from n, c of them
    correct, is correct."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_correct(samples: list[dict[str, Any]], correct_at: float) -> bool | None:
    """Is the most frequent extracted answer a correct one? None when no sample has an answer."""
    answers = [s["answer"] for s in samples if s.get("answer") is not None]
    if not answers:
        return None
    top = collections.Counter(answers).most_common()
    best = max(count for _, count in top)
    winner = next(a for a in answers if dict(top)[a] == best)   # first seen among the most frequent
    return any(s["reward"] >= correct_at for s in samples if s.get("answer") == winner)


def set_metrics(prompts: list[list[dict[str, Any]]], k: int, correct_at: float) -> dict[str, Any]:
    samples = [s for p in prompts for s in p]
    if not samples:
        return {"n_prompts": 0, "k": k}
    pass1, passk, maj = [], [], []
    for p in prompts:
        c = sum(1 for s in p if s["reward"] >= correct_at)
        pass1.append(pass_at_k(len(p), c, 1))
        passk.append(pass_at_k(len(p), c, k))
        m = majority_correct(p[:k], correct_at)
        if m is not None:
            maj.append(float(m))
    any_answer = any(s.get("answer") is not None for s in samples)
    return {
        "n_prompts": len(prompts), "k": k,
        "mean_reward": sum(s["reward"] for s in samples) / len(samples),
        "pass@1": sum(pass1) / len(pass1), "pass@k": sum(passk) / len(passk),
        # a prompt none of whose k samples had an answer counts as wrong
        "maj@k": (sum(maj) / len(prompts)) if any_answer else None,
        "mean_response_tokens": sum(s["response_tokens"] for s in samples) / len(samples),
        "truncated_share": sum(1 for s in samples if s["finish_reason"] == "length") / len(samples),
    }
