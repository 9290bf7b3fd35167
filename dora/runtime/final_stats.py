"""Each worker's exact counters at the end of a run, asked for before the workers are stopped.

A worker reports its totals with `finished` only when its input ends. An RL run stops its workers
instead (the trainer took its last step), so without this the run's result and the dashboard's last
snapshot hold live counters up to a heartbeat old: a replica respawned late in a short run would show
nothing of what it sent."""

from __future__ import annotations

import time
from typing import Any

from dora.runtime.errors import CallError, ReplicaLost, RunFailed

FINAL_STATS_TIMEOUT_S = 5.0   # for all workers together: each answers between two loop turns (ms)


def collect_final_stats(ctrl: Any, timeout_s: float = FINAL_STATS_TIMEOUT_S) -> None:
    """Fill `stats` of every live, unfinished worker record from its `worker_stats` built-in call.
    Best effort within the bound: a worker that does not answer keeps its live counters."""
    deadline = time.monotonic() + timeout_s
    for w in list(ctrl.workers.values()):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        if w.state == "finished" or w.lost is not None:
            continue
        try:
            reply = ctrl.call(w.node, w.replica, "worker_stats", timeout=left)
        except (TimeoutError, ReplicaLost, CallError, RunFailed):
            continue
        if isinstance(reply, dict) and isinstance(reply.get("stats"), dict):
            w.stats = reply["stats"]
