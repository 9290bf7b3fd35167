"""Replaying a run's RUN_DIR/length_trace.jsonl (dora/rl/length_trace.py): its steps' groups, in order.

Each line is one trained step: {"step": N, "groups": [{"prompt_tokens": P, "responses": [R, ...]}]},
a response being a length or a list of turns [[generated tokens, tool wait s, tool output tokens],
...]. The simulated run takes the trace's groups in the order the steps trained them (the groups of
one step shuffled by the seed) and starts again at the first step when it runs out, so each
simulated step sees the lengths, the within-group spread and the drift over training the run had.
A simulated step must not take more trajectories than a trace step holds, and a simulated group is a
trace group: `check()` says so with both numbers. A bad line is an error at file:line.
"""

from __future__ import annotations

import json
import random

from .workload_base import Turns, Workload, WorkloadError

WANT = ('{"step": int, "groups": [{"prompt_tokens": int, "responses": [int or [[generated, wait_s, tool_tokens], '
        '...], ...]}, ...]}')


def is_length_trace(path: str) -> bool:
    """Does the file's first line look like a length trace (a step with groups)?"""
    try:
        with open(path) as f:
            for line in f:
                if line.strip():
                    obj = json.loads(line)
                    return isinstance(obj, dict) and "groups" in obj and "step" in obj
    except (OSError, ValueError):
        return False
    return False


def _response(x) -> int | Turns:
    if isinstance(x, list):
        turns = [(int(o), float(w), int(t)) for o, w, t in x]
        if not turns or any(o < 1 or w < 0 or t < 0 for o, w, t in turns):
            raise ValueError("every turn needs >= 1 generated token, a wait >= 0 and tool tokens >= 0")
        return Turns(turns) if len(turns) > 1 else turns[0][0]
    n = int(x)
    if isinstance(x, bool) or n != x or n < 1:
        raise ValueError(f"a response length must be an integer >= 1, got {x!r}")
    return n


class StepTraceWorkload(Workload):
    def __init__(self, path: str):
        self.name = f"trace:{path}"
        self.path = path
        self.steps: list[list[tuple[int, list[int | Turns]]]] = []
        try:
            with open(path) as f:
                for i, line in enumerate(f, 1):
                    if line.strip():
                        self.steps.append(self._line(i, line))
        except OSError as e:
            raise WorkloadError(f"cannot read trace {path}: {e.strerror}") from None
        if not self.steps:
            raise WorkloadError(f"trace {path} has no steps")
        self.group_size = len(self.steps[0][0][1])
        self.all = [(p, r) for step in self.steps for p, rs in step for r in rs]
        self._order: list[tuple[int, list]] = []
        self._cursor = 0

    def _line(self, i: int, line: str) -> list[tuple[int, list[int | Turns]]]:
        try:
            obj = json.loads(line)
            int(obj["step"])
            groups = [(int(g["prompt_tokens"]), [_response(r) for r in g["responses"]]) for g in obj["groups"]]
            if not groups or any(p < 1 or not rs for p, rs in groups):
                raise ValueError("a step needs groups, each with prompt_tokens >= 1 and at least one response")
            if len({len(rs) for _, rs in groups}) > 1 or (self.steps and len(groups[0][1]) != len(self.steps[0][0][1])):
                raise ValueError("every group of the trace must hold the same number of responses (the group size)")
        except (ValueError, KeyError, TypeError) as e:
            raise WorkloadError(f"{self.path}:{i}: expected {WANT}: {e}") from None
        return groups

    @property
    def per_step(self) -> int:
        """Trajectories in the trace's smallest step."""
        return min(sum(len(rs) for _, rs in step) for step in self.steps)

    def check(self, train_batch: int, group_size: int) -> None:
        """Can the simulator take steps of `train_batch` trajectories in groups of `group_size` from it?"""
        if group_size != self.group_size:
            raise WorkloadError(f"trace {self.path}: its groups hold {self.group_size} responses, the simulated "
                                f"group size is {group_size} (use --group-size {self.group_size})")
        if train_batch > self.per_step:
            raise WorkloadError(f"trace {self.path}: its steps hold {self.per_step} trajectories, fewer than the "
                                f"simulated train batch of {train_batch} (use --train-batch {self.per_step} or less)")

    # -- what the simulator draws ----------------------------------------------------------------
    def group(self, rng: random.Random, size: int) -> tuple[int, list[int | Turns]]:
        """The next trace group in step order (each step's groups shuffled by `rng`), cycling."""
        if self._cursor >= len(self._order):
            self._order = []
            for step in self.steps:
                part = list(step)
                rng.shuffle(part)
                self._order += part
            self._cursor = 0
        p, rs = self._order[self._cursor]
        self._cursor += 1
        return p, list(rs)

    def prompt_len(self, rng: random.Random) -> int:
        return rng.choice(self.all)[0]

    def response(self, rng: random.Random) -> int | Turns:
        return rng.choice(self.all)[1]
