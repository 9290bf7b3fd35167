"""One multi-turn trajectory, token in and token out: the prompt and ONE growing response token list.

Model turns and tool observations are appended in order and never re-rendered: what the model was
conditioned on is exactly prompt_ids + tokens. Every response token carries
    mask       1 = sampled by the model (trained), 0 = observation (never trained)
    logprob    the behaviour logprob of a sampled token; 0.0 for an observation token
    version    the policy version that sampled it; an observation token takes the version of the
               token before it (so the set of versions is the set the model's tokens were sampled on)
and `turn_log` holds one [generated tokens, tool wait s, observation tokens] entry per model turn
(the simulator's trace format, dora/sim/workloads.py TraceWorkload), so turn boundaries are exact.

Limits: at most `max_turns` model turns and `max_total_tokens` response tokens (turns and
observations together); a trajectory that reaches either with more to do ends with finish_reason
"length". The four per-token lists must have one entry per token: any mismatch raises at once
(`check`), here and whenever a trajectory is rebuilt from a dict (an exported request's meta).
Contract: docs/architecture.md, "Tools and multi-turn rollouts".
"""

from __future__ import annotations

import dataclasses
from typing import Any

FIELDS = ("prompt_ids", "max_turns", "max_total_tokens", "tokens", "mask", "logprobs", "versions", "turn_log",
          "tool_calls", "tool_errors", "finish_reason")


class TrajectoryError(ValueError):
    """Tokens, masks, logprobs and versions that do not line up, or a turn past a limit."""


@dataclasses.dataclass
class Trajectory:
    prompt_ids: list[int]
    max_turns: int
    max_total_tokens: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    turn_log: list[list] = dataclasses.field(default_factory=list)   # [generated, tool wait s, observation tokens]
    tool_calls: int = 0
    tool_errors: int = 0
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_total_tokens < 1:
            raise TrajectoryError(f"max_turns and max_total_tokens must be >= 1, got {self.max_turns}, {self.max_total_tokens}")

    # ------------------------------------------------------------------ reading
    @property
    def turns(self) -> int:
        return len(self.turn_log)

    @property
    def room(self) -> int:
        """Response tokens that may still be appended."""
        return self.max_total_tokens - len(self.tokens)

    @property
    def tool_wait_s(self) -> float:
        return float(sum(t[1] for t in self.turn_log))

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def context(self) -> list[int]:
        """Everything the next model turn is conditioned on."""
        return self.prompt_ids + self.tokens

    def final_turn(self) -> list[int]:
        """The tokens of the last model turn when the trajectory ends on one (else []: it ended on an
        observation, so no model text follows the last tool output)."""
        if not self.turn_log or not self.mask or self.mask[-1] != 1:
            return []
        return self.tokens[len(self.tokens) - int(self.turn_log[-1][0]):]

    # ------------------------------------------------------------------ growing
    def add_model_turn(self, ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        if self.done:
            raise TrajectoryError(f"a model turn after the trajectory ended ({self.finish_reason})")
        if not (len(ids) == len(logprobs) == len(versions)):
            raise TrajectoryError(f"model turn: {len(ids)} tokens, {len(logprobs)} logprobs, {len(versions)} versions")
        if not ids:
            raise TrajectoryError("model turn with no tokens")
        if self.turns >= self.max_turns:
            raise TrajectoryError(f"model turn {self.turns + 1} past max_turns {self.max_turns}")
        if len(ids) > self.room:
            raise TrajectoryError(f"model turn of {len(ids)} tokens with room for {self.room} (max_total_tokens "
                                  f"{self.max_total_tokens})")
        self.tokens += [int(t) for t in ids]
        self.mask += [1] * len(ids)
        self.logprobs += [float(x) for x in logprobs]
        self.versions += [int(v) for v in versions]
        self.turn_log.append([len(ids), 0.0, 0])

    def add_observation(self, ids: list[int], *, wait_s: float, calls: int, errors: int) -> bool:
        """Append a tool observation after the last model turn (cut to the room left). True when a
        further model turn fits; otherwise the trajectory ends with finish_reason "length"."""
        if self.done or not self.turn_log or self.mask[-1] != 1:
            raise TrajectoryError("an observation must follow a model turn of a trajectory still going")
        kept = [int(t) for t in ids[:self.room]]
        version = self.versions[-1]
        self.tokens += kept
        self.mask += [0] * len(kept)
        self.logprobs += [0.0] * len(kept)
        self.versions += [version] * len(kept)
        self.turn_log[-1][1:] = [float(wait_s), len(kept)]
        self.tool_calls += int(calls)
        self.tool_errors += int(errors)
        if len(kept) < len(ids) or self.room < 1 or self.turns >= self.max_turns:
            self.finish("length")
            return False
        return True

    def finish(self, reason: str) -> None:
        self.finish_reason = reason

    # ------------------------------------------------------------------ checking and moving
    def check(self) -> None:
        """Fail fast on any misalignment of the per-token lists (see the module docstring)."""
        n = len(self.tokens)
        if not (len(self.mask) == len(self.logprobs) == len(self.versions) == n):
            raise TrajectoryError(f"{n} tokens but {len(self.mask)} mask bits, {len(self.logprobs)} logprobs, "
                                  f"{len(self.versions)} versions")
        if any(m not in (0, 1) for m in self.mask):
            raise TrajectoryError("mask bits must be 0 or 1")
        if any(lp != 0.0 for lp, m in zip(self.logprobs, self.mask) if m == 0):
            raise TrajectoryError("an observation token has a non-zero logprob")
        if sum(int(t[0]) + int(t[2]) for t in self.turn_log) != n:
            raise TrajectoryError(f"turn_log accounts for {sum(int(t[0]) + int(t[2]) for t in self.turn_log)} tokens, "
                                  f"the trajectory has {n}")
        if sum(self.mask) != sum(int(t[0]) for t in self.turn_log):
            raise TrajectoryError("turn_log's generated tokens differ from the mask's model tokens")
        if n > self.max_total_tokens or self.turns > self.max_turns:
            raise TrajectoryError(f"{n} tokens in {self.turns} turns is over max_total_tokens {self.max_total_tokens} "
                                  f"/ max_turns {self.max_turns}")

    def to_dict(self) -> dict[str, Any]:
        """Plain lists and numbers (msgpack-safe): a request's meta carries it across export/import."""
        return {f: (list(v) if isinstance(v, list) else v) for f in FIELDS for v in [getattr(self, f)]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        if not isinstance(d, dict) or set(d) != set(FIELDS):
            got = sorted(d) if isinstance(d, dict) else type(d).__name__
            raise TrajectoryError(f"trajectory state: expected keys {sorted(FIELDS)}, got {got}")
        t = cls(**{f: d[f] for f in FIELDS})
        t.turn_log = [list(x) for x in t.turn_log]
        t.check()
        return t
