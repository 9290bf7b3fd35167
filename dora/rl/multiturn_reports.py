"""What the driver does with the generate replicas' multi-turn reports.

`tool_waits` events (dora/ops/generate.py _report_waits): the replica's count of trajectories
waiting on a tool goes to the rollout controller (the orchestrator does not count them as decoding
load), and each wait becomes a span in trace.json ("rollout" process, row "<replica> tools"),
from the event that saw it start to the one that saw it end (or the trajectory leave the replica).
`finished` events of multi-turn replicas carry per-poll deltas of the engine's parked-KV counters
(parked_dropped, continuation_reprefill_tokens), summed into the step's metrics by the ledger.
"""

from __future__ import annotations

from typing import Any

from dora.observe.trace import TraceWriter
from dora.rl.clock import Clock


class MultiTurnReports:
    def __init__(self, clock: Clock, trace: TraceWriter):
        self.clock, self.trace = clock, trace
        self.since: dict[tuple[str, str], float] = {}   # (replica, uid) -> when its tool wait began

    def on_event(self, replica: str, ev: dict[str, Any], rc) -> None:
        if ev.get("kind") == "finished" and rc is not None:
            rc.ledger.count_kv(ev)
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
