"""What the driver does with the generate replicas' multi-turn reports.

`tool_waits` events (dora/ops/generate.py _report_waits): the replica's count of trajectories
waiting on a tool goes to the rollout controller (the orchestrator does not count them as decoding
load), and each wait becomes a span in trace.json ("rollout" process, row "<replica> tools"),
from the event that saw it start to the one that saw it end (or the trajectory leave the replica).
`finished` events carry the engine's counters (per-poll deltas) and gauges (ENGINE_COUNTERS,
ENGINE_GAUGES of dora/graph/builtin_ops.py), which the ledger puts in the step's metrics; those of
multi-turn replicas also carry each trajectory's turns: appended to RUN_DIR/turn_trace.jsonl, one {"prompt_tokens": N, "turns":
[[generated tokens, tool wait s, tool output tokens], ...]} per line, the format `dora simulate
--trace FILE` replays (dora/sim/workloads.py TraceWorkload); each trajectory's turns are also kept
until its step's line of RUN_DIR/length_trace.jsonl takes them (dora/rl/length_trace.py).
"""

from __future__ import annotations

import json
import os
from typing import Any

from dora.observe.trace import TraceWriter
from dora.rl.clock import Clock
from dora.rl.length_trace import LengthTrace


TURN_TRACE = "turn_trace.jsonl"


def turn_trace_path(metrics) -> str | None:
    """RUN_DIR/turn_trace.jsonl, next to the run's metrics.jsonl (None: a driver without a run folder)."""
    path = getattr(metrics, "path", None)
    return os.path.join(os.path.dirname(path), TURN_TRACE) if path else None


class MultiTurnReports:
    def __init__(self, clock: Clock, trace: TraceWriter, turn_trace: str | None = None, length_trace: str | None = None):
        self.clock, self.trace, self.turn_trace = clock, trace, turn_trace
        self.lengths = LengthTrace(length_trace)        # RUN_DIR/length_trace.jsonl (None: not written)
        self.since: dict[tuple[str, str], float] = {}   # (replica, uid) -> when its tool wait began
        self.turns: dict[str, list] = {}                # uid -> its turns, until its step's length trace takes them

    def on_event(self, replica: str, ev: dict[str, Any], rc) -> None:
        if ev.get("kind") == "finished" and rc is not None:
            rc.ledger.count_engine(replica, ev)
        if ev.get("kind") == "finished" and "turn_trace" in ev:
            self.turns.update((str(u), t) for u, t in zip(ev["uids"], ev["turn_trace"]))
        if ev.get("kind") == "finished" and self.turn_trace and "turn_trace" in ev:
            with open(self.turn_trace, "a", encoding="utf-8") as f:
                for p, turns in zip(ev["prompt_tokens"], ev["turn_trace"]):
                    f.write(json.dumps({"prompt_tokens": int(p), "turns": turns}) + "\n")
        if ev.get("kind") != "tool_waits":
            return
        now = self.clock.now()
        for uid in ev.get("started", []):
            self.since[(replica, str(uid))] = now
        for uid in ev.get("ended", []):
            t0 = self.since.pop((replica, str(uid)), None)
            if t0 is not None:
                self.trace.span("rollout", f"{replica} tools", "tool wait", t0, now, uid=str(uid))
        if rc is not None:
            rc.on_tool_waits(replica, int(ev.get("waiting", 0)))

    def step_trained(self, step: int, sent: dict[str, Any]) -> None:
        """The step's line of RUN_DIR/length_trace.jsonl (`sent`: the batch summary the trainer was sent),
        taking its trajectories' turns."""
        self.lengths.write(step, sent, self.take_turns)

    def take_turns(self, uid: str) -> list | None:
        """A trained trajectory's turns (None: it was single-turn), forgotten once taken."""
        return self.turns.pop(uid, None)
