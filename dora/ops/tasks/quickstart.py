"""The quickstart task: "repeat a symbol n times", where a few n are very large.

Prompt "n*c" (a count, then a symbol); the ideal response is c written n times, then EOS.
Each symbol has its own range of counts (log-uniform inside it); by default 80% of prompts
are "a" with n in 1..3 and 20% are "d" with n in 40..120. A policy that follows the prompt
therefore has long-tailed response lengths, as RL on reasoning does: most answers a few
tokens, a few of them 40-128 tokens (max/median ~20-60 within a step of 64 once it has learned).

Reward in [0, 1]: min(len, n) / max(len, n) * (0.5 + 0.5 * share of response characters equal
to c), 0 for an empty response. The length factor multiplies on purpose: with an additive
reward a policy that writes c forever and never stops keeps 0.5, and small models fall into
that trap; here it scores ~n/max_tokens. Both factors are easy for a tiny random model to climb
by policy gradient: the symbol is the last prompt token (with tied embeddings a random model
already leans to repeating the current token), and the length scale is tied to the symbol, so
"stop after a few a's, keep going after d" is a per-token decision; reading the digits refines it.

Measured (benchmarks/task_learnability.py, docs/benchmarks.md): a llama of hidden 64, 2 layers,
init_std 0.05, GRPO 16 prompts x 4, lr 5e-3, temperature 1, max_tokens 128: mean reward of the
last 3 of 40 steps exceeds the first 3 by +0.30..+0.39 (seeds 0-2); the random start has
median length ~80, and from step ~8 on most steps have max/median >= 10.
"""

from __future__ import annotations

import math
import random

# (symbol, smallest count, largest count, probability)
DEFAULT_CLASSES = (("a", 1, 3, 0.8), ("d", 40, 120, 0.2))


class Quickstart:
    name = "quickstart"

    def make(self, size: int, seed: int, classes=DEFAULT_CLASSES, max_count: int | None = None) -> list[dict]:
        """`classes`: [[symbol, n_min, n_max, probability], ...]; `max_count` caps every n
        (set it to the generate op's max_tokens so a perfect answer fits)."""
        classes = [tuple(c) for c in classes]
        for c in classes:
            if len(c) != 4 or len(str(c[0])) != 1 or not (1 <= c[1] <= c[2]) or c[3] < 0:
                raise ValueError(f"quickstart classes: each must be [symbol(1 char), n_min >= 1, n_max >= n_min, "
                                 f"probability >= 0], got {list(c)}")
        rng = random.Random(seed)
        weights = [c[3] for c in classes]
        rows = []
        for _ in range(size):
            sym, lo, hi, _ = classes[rng.choices(range(len(classes)), weights)[0]]
            n = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
            n = max(lo, min(hi, n))
            if max_count is not None:
                n = min(n, max_count)
            rows.append({"prompt": f"{n}*{sym}", "answer": sym * n})
        return rows

    def propose(self, response_text: str, source_prompt: str, max_count: int = 120) -> dict:
        """A challenger's proposal as a problem (dora/ops/to_prompts.py): the symbol its prompt asked for
        (`?c`, quickstart_propose; else `a`), the count = its response's length (1..max_count). Total:
        every text is a problem, and the proposer sets its difficulty by how long it writes."""
        sym = source_prompt[-1] if source_prompt.startswith("?") and len(source_prompt) == 2 else "a"
        n = max(1, min(max_count, len(response_text)))
        return {"prompt": f"{n}*{sym}", "answer": sym * n}

    def score(self, response_text: str, answer: str) -> float:
        n, length = len(answer), len(response_text)
        if n == 0:
            return 1.0 if length == 0 else 0.0
        if length == 0:
            return 0.0
        symbol_share = response_text.count(answer[0]) / length
        length_match = min(length, n) / max(length, n)
        return length_match * (0.5 + 0.5 * symbol_share)


TASK = Quickstart()


class QuickstartPropose:
    """The challenger's side of the quickstart task (pipelines/challenger_solver.yaml): prompt `?c`
    asks for a quickstart problem with symbol c; the proposal is written as a run of c whose length is
    the count (Quickstart.propose). Its own score is how well-formed the run is (the share of its
    characters equal to c); a challenger is rewarded by the frontier op on the solver's answers instead."""

    name = "quickstart_propose"

    def make(self, size: int, seed: int, symbols: str = "ad") -> list[dict]:
        if not symbols:
            raise ValueError("quickstart_propose: symbols must name at least one symbol")
        rng = random.Random(seed)
        rows = []
        for _ in range(size):
            sym = rng.choice(symbols)
            rows.append({"prompt": f"?{sym}", "answer": sym})
        return rows

    def score(self, response_text: str, answer: str) -> float:
        return response_text.count(answer[:1]) / len(response_text) if response_text and answer else 0.0


PROPOSE = QuickstartPropose()
