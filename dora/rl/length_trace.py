"""RUN_DIR/length_trace.jsonl: what each training step trained, as lengths, for the simulator.

One line per step, written when the trainer reports it:

    {"step": 3, "groups": [{"prompt_tokens": 40, "responses": [120, 347, 15, 77]},
                           {"prompt_tokens": 33, "responses": [[[30, 0.5, 12], [20, 0.0, 0]], 55, ...]}]}

Each group is one prompt and its G responses, in the order the batch held them: a response is its
length in tokens, or, when it took several turns (a multi-turn generate node), its turns as
[generated tokens, tool wait s, tool output tokens] (the generate replicas' `finished` events carry
them; the last turn's wait and tool output are 0). `dora simulate --trace RUN_DIR/length_trace.jsonl
--sweep-k 1,2,3,5,10` replays it step by step (dora/sim/step_trace.py) to show which K reaches the
ideal on the run's own lengths.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from dora.graph.policy_roles import policy_dir

LENGTH_TRACE = "length_trace.jsonl"


def length_trace_path(metrics, policy: str | None = None) -> str | None:
    """RUN_DIR/length_trace.jsonl, next to the run's metrics.jsonl; in a run of several policies each
    writes its own, RUN_DIR/policies/<update>/length_trace.jsonl (None: a driver without a run folder)."""
    path = getattr(metrics, "path", None)
    if not path:
        return None
    run_dir = os.path.dirname(path)
    return os.path.join(run_dir if policy is None else policy_dir(run_dir, policy), LENGTH_TRACE)


def step_line(step: int, lengths: list[tuple[str, int, int]], turns_of: Callable[[str], Any]) -> dict[str, Any]:
    """The line of one step: `lengths` = (uid, group id, prompt tokens, response tokens) per trajectory
    trained; `turns_of(uid)`: its turns if it took several, else None."""
    groups: dict[str, dict[str, Any]] = {}
    for uid, gid, prompt, response in lengths:
        g = groups.setdefault(gid, {"prompt_tokens": int(prompt), "responses": []})
        turns = turns_of(uid)
        g["responses"].append([[int(o), float(w), int(t)] for o, w, t in turns] if turns and len(turns) > 1
                              else int(turns[0][0]) if turns else int(response))
    return {"step": int(step), "groups": list(groups.values())}


class LengthTrace:
    def __init__(self, path: str | None):
        self.path = path

    def write(self, step: int, sent: dict[str, Any], turns_of: Callable[[str], Any]) -> None:
        """Append the line of a step the trainer reported (`sent`: the batch summary it was sent)."""
        if not self.path or not sent.get("lengths"):
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)   # (a policy's folder, on its first step)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(step_line(step, sent["lengths"], turns_of)) + "\n")
