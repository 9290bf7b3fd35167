"""What a worker reports about itself besides its data: the stall watchdog's view of its op (which
method runs, since when without a sign of progress), its edge statistics, and the live counters the
dashboard turns into rates."""

from __future__ import annotations

import time
from typing import Any


class OpWatch:
    """Op code runs through `call`, so the heartbeat thread can tell a long op call that still makes
    progress (ctx.progress() -> `progress`) from one that hangs."""

    def __init__(self):
        self.where = "start"                    # the op method running now, for error messages
        self.in_op_since: float | None = None   # inside op code since (None: in the worker's own loop)
        self.progress_at = time.monotonic()     # the last sign of work: an op call returned, or progress()

    def call(self, where: str, fn, *args):
        self.where = where
        self.in_op_since = time.monotonic()
        try:
            return fn(*args)
        finally:
            self.in_op_since = None
            self.progress_at = time.monotonic()

    def progress(self) -> None:
        self.progress_at = time.monotonic()

    def stalled_s(self) -> float:
        """Seconds inside one op call without a sign of progress (0 when not inside op code)."""
        since = self.in_op_since
        return 0.0 if since is None else round(time.monotonic() - max(since, self.progress_at), 3)


def worker_stats(inbox, outs) -> dict[str, Any]:
    """Rows and bytes in (per input edge) and out (per output edge), and rejected messages."""
    return {"in": dict(inbox.stats) if inbox else {}, "rejected": inbox.rejected if inbox else 0,
            "reject_samples": list(inbox.reject_samples) if inbox else [],
            "out": {o.edge: dict(o.stats) for o in outs}}


def live_counters(op, outs, work: int) -> dict[str, Any]:
    """Counters the controller turns into edge rates and replica state: per out edge [batches, rows,
    bytes sent, batches unacknowledged or queued], work done, the op's own (op None: none)."""
    op_stats = None
    if op is not None:
        try:
            op_stats = op.live_stats()
        except Exception as e:   # a dashboard figure must never stop the run
            op_stats = {"error": f"{type(e).__name__}: {e}"}
    return {"out": {o.edge: [o.stats["batches"], o.stats["rows"], o.stats["bytes"], sum(o.inflight_n) + len(o.queue)]
                    for o in outs},
            "work": work, "op": op_stats}
