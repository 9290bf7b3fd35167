"""What the run controller knows of each worker (from its hello, heartbeats and reports), and
what a run returns."""

from __future__ import annotations

import dataclasses
import time
from typing import Any


@dataclasses.dataclass
class RunResult:
    ok: bool
    elapsed_s: float
    stats: dict[str, dict[str, Any]]          # "node[r]" -> worker stats at finish (rows/bytes in & out per edge)
    rejected: int                             # wire messages rejected, summed over workers and the controller
    events: list[tuple[str, int, dict]]       # (node, replica, event) when no driver took them
    plan: Any                                 # the placement Plan it ran on
    run_dir: str | None = None


@dataclasses.dataclass
class WorkerRecord:
    node: str
    replica: int
    state: str = "starting"     # starting | configured | ready | running | finished
    pid: int | None = None
    host: str | None = None     # the address it reported in hello (rank 0 of a group binds its rendezvous there)
    endpoint: str | None = None
    last_hb: float = 0.0
    rejected: int = 0
    stalled_s: float = 0.0      # from heartbeats: inside one op call this long without progress
    error: tuple[str, str | None] | None = None   # (what, traceback) the op raised
    error_at: float = 0.0                          # when (time.monotonic())
    bad_input: bool = False     # what it raised is the user's input (dora.graph.diagnostics.BadInput)
    lost: str | None = None     # why it is being replaced (respawn pending or under way)
    lost_exited: bool = False
    where: str = "?"            # the op method it is in
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    live: dict[str, Any] | None = None   # the worker's latest live counters (see Worker.sample_live)
    live_at: float = 0.0                 # when they last changed
    # what the replica's earlier processes sent, per out edge [batches, rows, bytes], as their last
    # counters said (a respawned process counts from 0; the dashboard adds this)
    sent_before: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    in_op: bool = False                  # its last heartbeat came while it was inside an op method

    @property
    def label(self) -> str:
        return f"{self.node}[{self.replica}]"

    def on_heartbeat(self, msg: dict[str, Any], now: float) -> None:
        self.last_hb = now
        self.rejected = int(msg.get("rejected") or 0)
        self.stalled_s, self.where = float(msg.get("stalled_s") or 0.0), str(msg.get("where") or "?")
        self.in_op = bool(msg.get("busy"))
        if isinstance(msg.get("live"), dict):
            self.live, self.live_at = msg["live"], now

    def sent(self) -> dict[str, list[int]]:
        """Per out edge [batches, rows, bytes, queued] this process sent: its exact totals once it
        reported them (finished, or asked at the run's end), else its latest live counters."""
        counts = {}
        live = (self.live or {}).get("out")
        for edge, c in (live.items() if isinstance(live, dict) else ()):
            if isinstance(c, list) and len(c) == 4:
                counts[edge] = [int(x or 0) for x in c]
        for edge, final in (self.stats.get("out") or {}).items():
            if isinstance(final, dict):
                counts[edge] = [int(final.get(k, 0) or 0) for k in ("batches", "rows", "bytes")] + [0]
        return counts

    def succeeded_by(self, fresh: "WorkerRecord") -> None:
        """Hand what this process sent on to the record of the process that replaces it."""
        for edge, c in self.sent().items():
            before = self.sent_before.get(edge, [0, 0, 0])
            fresh.sent_before[edge] = [a + b for a, b in zip(before, c[:3])]
        for edge, c in self.sent_before.items():
            fresh.sent_before.setdefault(edge, list(c))

    def on_report(self, msg: dict[str, Any]) -> None:
        """A `ready`, `finished` or `error` report of the worker."""
        kind = msg["kind"]
        if kind == "ready":
            self.endpoint, self.state = msg["endpoint"], "ready"
        elif kind == "error":
            if self.error is None:   # the first one is the cause
                self.bad_input = bool(msg.get("bad_input"))
                what = f"found bad input: {msg.get('error')}" if self.bad_input else f"raised in {msg.get('where')}(): {msg.get('error')}"
                self.error, self.error_at = (what, msg.get("traceback")), time.monotonic()
        elif kind == "finished":
            self.state, self.stats = "finished", msg.get("stats") or {}
            self.rejected = int(self.stats.get("rejected", self.rejected))
