"""Workloads: where prompt and response lengths come from.

`dapo-math`: response length lognormal (median 1,100, sigma 1.5) capped at 30,720 -> mean ~3.2K,
~1.5% truncated, max/median ~28 (a fit to the DAPO-Math-17k figures in DORA.md); prompt length
lognormal (median 300, sigma 0.6) capped at 2,048. `--trace FILE`: JSONL lines
{"prompt_tokens": int, "response_tokens": int}, sampled with replacement.
Responses within a GRPO group are independent draws; the prompt is shared by the group.
"""

from __future__ import annotations

import json
import math
import random

from dora.runtime.rollout.types import Request


class WorkloadError(ValueError):
    pass


class Workload:
    name = "workload"

    def prompt_len(self, rng: random.Random) -> int:
        raise NotImplementedError

    def response_len(self, rng: random.Random) -> int:
        raise NotImplementedError

    def mean_lengths(self, n: int = 20000, seed: int = 12345) -> tuple[float, float, float]:
        """(mean prompt, mean response, mean context seen by a decoded token), by sampling."""
        rng = random.Random(seed)
        ps = [self.prompt_len(rng) for _ in range(n)]
        rs = [self.response_len(rng) for _ in range(n)]
        tok = sum(rs)
        ctx = sum(r * (p + r / 2) for p, r in zip(ps, rs)) / max(1, tok)
        return sum(ps) / n, tok / n, ctx


class DapoMath(Workload):
    name = "dapo-math"

    def __init__(self, median: float = 1100, sigma: float = 1.5, cap: int = 30720,
                 prompt_median: float = 300, prompt_sigma: float = 0.6, prompt_cap: int = 2048):
        self.mu, self.sigma, self.cap = math.log(median), sigma, cap
        self.pmu, self.psigma, self.pcap = math.log(prompt_median), prompt_sigma, prompt_cap

    def prompt_len(self, rng: random.Random) -> int:
        return max(16, min(self.pcap, int(rng.lognormvariate(self.pmu, self.psigma))))

    def response_len(self, rng: random.Random) -> int:
        return max(1, min(self.cap, int(rng.lognormvariate(self.mu, self.sigma))))


class TraceWorkload(Workload):
    """Lengths resampled from a JSONL trace. A prompt keeps its own length; each response is
    drawn from the whole trace (independent draws, seeded)."""

    def __init__(self, path: str):
        self.name = f"trace:{path}"
        self.rows: list[tuple[int, int]] = []
        try:
            with open(path) as f:
                for i, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                        p, r = int(obj["prompt_tokens"]), int(obj["response_tokens"])
                    except (ValueError, KeyError, TypeError) as e:
                        raise WorkloadError(f"{path}:{i}: expected {{\"prompt_tokens\": int, \"response_tokens\": int}}: {e}") from None
                    if p < 1 or r < 1:
                        raise WorkloadError(f"{path}:{i}: prompt_tokens and response_tokens must be >= 1")
                    self.rows.append((p, r))
        except OSError as e:
            raise WorkloadError(f"cannot read trace {path}: {e.strerror}") from None
        if not self.rows:
            raise WorkloadError(f"trace {path} has no rows")

    def prompt_len(self, rng: random.Random) -> int:
        return rng.choice(self.rows)[0]

    def response_len(self, rng: random.Random) -> int:
        return rng.choice(self.rows)[1]


def get_workload(name: str | None, trace: str | None) -> Workload:
    if trace:
        return TraceWorkload(trace)
    if name in (None, "dapo-math"):
        return DapoMath()
    raise WorkloadError(f"unknown workload {name!r}; expected 'dapo-math' or --trace FILE")


class PromptSource:
    """take_prompts(n_groups) for the controller: seeded groups of G requests whose payload is the
    target response length (what the simulated engine generates)."""

    def __init__(self, workload: Workload, group_size: int, seed: int, limit_groups: int | None = None):
        self.w, self.g, self.rng = workload, group_size, random.Random(seed)
        self.next_group = 0
        self.limit = limit_groups

    def __call__(self, n_groups: int) -> list[list[Request]]:
        if self.limit is not None:
            n_groups = max(0, min(n_groups, self.limit - self.next_group))
        out = []
        for _ in range(n_groups):
            gid = f"g{self.next_group}"
            self.next_group += 1
            p = self.w.prompt_len(self.rng)
            out.append([Request(f"{gid}.{j}", gid, -1, p, self.w.response_len(self.rng)) for j in range(self.g)])
        return out
