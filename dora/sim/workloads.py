"""Workloads: where prompt and response lengths (and, for agents, turns and tool waits) come from.

Every workload is a generator of trajectories: a prompt length shared by the GRPO group, and per
response either a length (single turn) or a `Turns` plan (multi-turn: per turn the tokens
generated, then a tool call that takes some seconds and returns some tokens to the context).
Responses within a group are independent draws.

`WORKLOADS` is the shipped family (`--workload NAME`); `--trace FILE` resamples a JSONL trace of
trajectories or replays a run's length_trace.jsonl step by step (step_trace.py).
"""

from __future__ import annotations

import json
import math
import random
from typing import Callable

from dora.rl.rollout.types import Request

from .step_trace import StepTraceWorkload, is_length_trace
from .workload_base import Turns, WorkStats, Workload, WorkloadError, response_tokens

__all__ = ["WORKLOADS", "Turns", "WorkStats", "Workload", "WorkloadError", "response_tokens", "get_workload",
           "PromptSource", "TraceWorkload", "LognormalWorkload", "AgenticWorkload", "StepTraceWorkload"]


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(rng.lognormvariate(math.log(median), sigma))))


class LognormalWorkload(Workload):
    """Single-turn: response lognormal(median, sigma) capped at `cap` (the generation limit);
    prompt lognormal(prompt_median, prompt_sigma) capped at prompt_cap."""

    def __init__(self, name: str, description: str, median: float, sigma: float, cap: int,
                 prompt_median: float = 300, prompt_sigma: float = 0.6, prompt_cap: int = 2048):
        self.name, self.description = name, description
        self.median, self.sigma, self.cap = median, sigma, cap
        self.prompt_median, self.prompt_sigma, self.prompt_cap = prompt_median, prompt_sigma, prompt_cap

    def prompt_len(self, rng: random.Random) -> int:
        return _lognormal(rng, self.prompt_median, self.prompt_sigma, 16, self.prompt_cap)

    def response(self, rng: random.Random) -> int:
        return _lognormal(rng, self.median, self.sigma, 1, self.cap)


class AgenticWorkload(Workload):
    """Multi-turn tool use: turns = 1 + geometric(mean_turns - 1) up to max_turns; per turn a
    lognormal number of generated tokens; between turns a tool call with a lognormal wait and a
    lognormal output appended to the context; the context stops growing at ctx_cap (the
    trajectory ends with the turn that reaches it)."""

    def __init__(self, name: str, description: str, mean_turns: float, max_turns: int, out_median: float,
                 out_sigma: float, wait_median_s: float, wait_sigma: float, wait_cap_s: float,
                 tool_median: float, tool_sigma: float, tool_cap: int, ctx_cap: int,
                 prompt_median: float = 600, prompt_sigma: float = 0.5, prompt_cap: int = 4096):
        self.name, self.description = name, description
        self.mean_turns, self.max_turns = mean_turns, max_turns
        self.out = (out_median, out_sigma)
        self.wait = (wait_median_s, wait_sigma, wait_cap_s)
        self.tool = (tool_median, tool_sigma, tool_cap)
        self.ctx_cap = ctx_cap
        self.prompt = (prompt_median, prompt_sigma, prompt_cap)

    def prompt_len(self, rng: random.Random) -> int:
        m, s, cap = self.prompt
        return _lognormal(rng, m, s, 16, cap)

    def response(self, rng: random.Random) -> Turns:
        p_stop = 1.0 / self.mean_turns
        turns, ctx = [], 0
        while True:
            out = min(_lognormal(rng, *self.out, 1, self.ctx_cap), max(1, self.ctx_cap - ctx))
            ctx += out
            last = len(turns) + 1 >= self.max_turns or ctx >= self.ctx_cap or rng.random() < p_stop
            if last:
                turns.append((out, 0.0, 0))
                return Turns(turns)
            w_med, w_sig, w_cap = self.wait
            wait = min(w_cap, rng.lognormvariate(math.log(w_med), w_sig))
            t_med, t_sig, t_cap = self.tool
            tool = min(_lognormal(rng, t_med, t_sig, 1, t_cap), max(1, self.ctx_cap - ctx))
            ctx += tool
            turns.append((out, wait, tool))


class TraceWorkload(Workload):
    """Lengths resampled from a JSONL trace: one object per line, {"prompt_tokens": int,
    "response_tokens": int} or, multi-turn, {"prompt_tokens": int, "turns": [[generated tokens,
    tool wait s, tool output tokens], ...]} (the last turn's wait and tool output are ignored).
    A prompt keeps its own length; each response is drawn from the whole trace (seeded)."""

    def __init__(self, path: str):
        self.name = f"trace:{path}"
        self.rows: list[tuple[int, int | Turns]] = []
        try:
            with open(path) as f:
                for i, line in enumerate(f, 1):
                    if line.strip():
                        self.rows.append(self._row(path, i, line))
        except OSError as e:
            raise WorkloadError(f"cannot read trace {path}: {e.strerror}") from None
        if not self.rows:
            raise WorkloadError(f"trace {path} has no rows")

    @staticmethod
    def _row(path: str, i: int, line: str) -> tuple[int, int | Turns]:
        want = '{"prompt_tokens": int, "response_tokens": int} or {"prompt_tokens": int, "turns": [[int, float, int], ...]}'
        try:
            obj = json.loads(line)
            p = int(obj["prompt_tokens"])
            if "turns" in obj:
                turns = [(int(o), float(w), int(t)) for o, w, t in obj["turns"]]
                if not turns or any(o < 1 or w < 0 or t < 0 for o, w, t in turns):
                    raise ValueError("every turn needs >= 1 generated token, a wait >= 0 and tool tokens >= 0")
                r: int | Turns = Turns(turns) if len(turns) > 1 else turns[0][0]
            else:
                r = int(obj["response_tokens"])
        except (ValueError, KeyError, TypeError) as e:
            raise WorkloadError(f"{path}:{i}: expected {want}: {e}") from None
        if p < 1 or (isinstance(r, int) and r < 1):
            raise WorkloadError(f"{path}:{i}: prompt_tokens and response_tokens must be >= 1")
        return p, r

    def prompt_len(self, rng: random.Random) -> int:
        return rng.choice(self.rows)[0]

    def response(self, rng: random.Random) -> int | Turns:
        return rng.choice(self.rows)[1]


# The shipped family. dapo-math is fitted to the DORA paper (docs/benchmarks.md, "Calibration"):
# max/median 28 as the paper reports (cap 30,720, median 1,100) and sigma such that a step of
# 8,192 trajectories holds the paper's throughput x step time (~19.5M tokens). The others keep
# its median and change the tail.
MEDIAN = 1100
WORKLOADS: dict[str, Callable[[], Workload]] = {
    "dapo-math": lambda: LognormalWorkload(
        "dapo-math", "DAPO-Math-17k lengths fitted to the paper: lognormal sigma 1.1, cap 30,720", MEDIAN, 1.1, 30720),
    "longtail-64k": lambda: LognormalWorkload(
        "longtail-64k", "heavier tail (sigma 1.5) running to a 64K generation cap", MEDIAN, 1.5, 65536),
    "longtail-128k": lambda: LognormalWorkload(
        "longtail-128k", "heavier tail (sigma 1.5) running to a 128K generation cap", MEDIAN, 1.5, 131072),
    "sigma-1.0": lambda: LognormalWorkload(
        "sigma-1.0", "lighter tail: sigma 1.0, cap 30,720", MEDIAN, 1.0, 30720),
    "sigma-2.0": lambda: LognormalWorkload(
        "sigma-2.0", "heavy tail: sigma 2.0, cap 30,720 (5% of responses truncated)", MEDIAN, 2.0, 30720),
    "agentic": lambda: AgenticWorkload(
        "agentic", "multi-turn tool use: ~4 turns, tool waits of seconds to minutes, context growing to <= 32K",
        mean_turns=4, max_turns=16, out_median=350, out_sigma=1.0, wait_median_s=8.0, wait_sigma=1.0,
        wait_cap_s=300.0, tool_median=600, tool_sigma=1.0, tool_cap=8192, ctx_cap=32768),
}


def get_workload(name: str | None, trace: str | None) -> Workload:
    """A shipped workload by name, or a trace: a run's RUN_DIR/length_trace.jsonl (its steps, replayed
    in order: dora/sim/step_trace.py) or one trajectory per line (resampled: TraceWorkload)."""
    if trace:
        return StepTraceWorkload(trace) if is_length_trace(trace) else TraceWorkload(trace)
    make = WORKLOADS.get(name or "dapo-math")
    if make is None:
        raise WorkloadError(f"unknown workload {name!r}; expected one of {', '.join(WORKLOADS)} or --trace FILE")
    return make()


class PromptSource:
    """take_prompts(n_groups) for the controller: seeded groups of G requests whose payload is the
    response to generate (a length, or a Turns plan)."""

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
            p, responses = self.w.group(self.rng, self.g)
            out.append([Request(f"{gid}.{j}", gid, -1, p, r) for j, r in enumerate(responses)])
        return out
