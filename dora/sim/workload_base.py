"""What every workload is: a generator of trajectories, a prompt length shared by the GRPO group and
per response a length (single turn) or a `Turns` plan (multi-turn: per turn the tokens generated,
then a tool call that takes some seconds and returns some tokens to the context). The shipped
workloads and trace readers build on these (workloads.py, step_trace.py)."""

from __future__ import annotations

import bisect
import dataclasses
import random
from typing import Sequence


class WorkloadError(ValueError):
    pass


class Turns:
    """A multi-turn trajectory. Turn i generates outs[i] tokens; after every turn but the last a
    tool runs for waits[i] seconds and appends tools[i] tokens to the context."""

    __slots__ = ("outs", "waits", "tools", "ends")

    def __init__(self, turns: Sequence[tuple[int, float, int]]):
        if not turns:
            raise ValueError("a trajectory has at least one turn")
        self.outs = tuple(int(o) for o, _, _ in turns)
        self.waits = tuple(float(w) for _, w, _ in turns[:-1])
        self.tools = tuple(int(t) for _, _, t in turns[:-1])
        ends, c = [], 0
        for o in self.outs:
            c += o
            ends.append(c)
        self.ends = tuple(ends)

    @property
    def output_tokens(self) -> int:
        return self.ends[-1]

    @property
    def tool_tokens(self) -> int:
        return sum(self.tools)

    def turn_end(self, done: int) -> int:
        """Output tokens at the end of the turn in progress after `done` output tokens."""
        return self.ends[min(bisect.bisect_right(self.ends, done), len(self.ends) - 1)]

    def _boundary(self, done: int) -> int | None:
        i = bisect.bisect_left(self.ends, done)
        return i if i < len(self.tools) and self.ends[i] == done else None

    def wait_after(self, done: int) -> float:
        i = self._boundary(done)
        return self.waits[i] if i is not None else 0.0

    def tool_tokens_after(self, done: int) -> int:
        i = self._boundary(done)
        return self.tools[i] if i is not None else 0

    def tool_tokens_pending(self, done: int) -> int:
        """At a turn boundary whose tool output has arrived: the tokens not yet prefilled."""
        return self.tool_tokens_after(done)

    def tool_tokens_before(self, done: int, waiting: bool) -> int:
        """Tool tokens in context after `done` output tokens (a tool still running adds none)."""
        n = min(bisect.bisect_right(self.ends, done), len(self.tools))
        if waiting and n and self.ends[n - 1] == done:
            n -= 1
        return sum(self.tools[:n])


def response_tokens(payload: int | Turns) -> int:
    """Tokens after the prompt in the trained sequence: generated tokens and tool outputs."""
    return payload.output_tokens + payload.tool_tokens if isinstance(payload, Turns) else int(payload)


@dataclasses.dataclass(frozen=True)
class WorkStats:
    """Per-trajectory means (by sampling) and the slowest trajectory of a step-sized sample."""
    prompt: float            # prompt tokens
    decoded: float           # generated tokens
    tool_tokens: float       # tool-output tokens prefilled into the context (multi-turn)
    ctx_per_decoded: float   # mean context a generated token attends to
    longest: int | Turns     # the response with the most generated tokens in one step's draws
    longest_prompt: int

    @property
    def train_tokens(self) -> float:
        return self.prompt + self.decoded + self.tool_tokens


class Workload:
    name = "workload"
    description = ""

    def prompt_len(self, rng: random.Random) -> int:
        raise NotImplementedError

    def response(self, rng: random.Random) -> int | Turns:
        raise NotImplementedError

    def group(self, rng: random.Random, size: int) -> tuple[int, list[int | Turns]]:
        """One prompt group: its prompt length and `size` responses (independent draws, unless the
        workload replays recorded groups)."""
        p = self.prompt_len(rng)
        return p, [self.response(rng) for _ in range(size)]

    def stats(self, n: int = 20000, seed: int = 12345, step_trajectories: int = 8192) -> WorkStats:
        """Means over n sampled trajectories; `longest` = the longest of the first step_trajectories."""
        rng = random.Random(seed)
        ps = [self.prompt_len(rng) for _ in range(n)]
        rs = [self.response(rng) for _ in range(n)]
        dec = tool = 0
        ctx_w = 0.0
        for p, r in zip(ps, rs):
            if isinstance(r, Turns):
                c = p
                for i, o in enumerate(r.outs):
                    ctx_w += o * (c + o / 2)
                    c += o + (r.tools[i] if i < len(r.tools) else 0)
                dec += r.output_tokens
                tool += r.tool_tokens
            else:
                ctx_w += r * (p + r / 2)
                dec += r
        k = min(n, step_trajectories)
        i = max(range(k), key=lambda j: response_tokens(rs[j]))
        return WorkStats(sum(ps) / n, dec / n, tool / n, ctx_w / max(1, dec), rs[i], ps[i])
