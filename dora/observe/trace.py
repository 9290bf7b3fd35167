"""A small Chrome / Perfetto trace writer (trace.json, "Trace Event Format").

Processes group the rows: "rollout" (one row per instance: spans named v<version>, so Perfetto
gives every version its own colour), "trainer" (training steps, weight publishes) and
"orchestrator" (rebalances, migrations). Timestamps are clock seconds, written as microseconds.
Usable by the real runtime and the simulator alike.
"""

from __future__ import annotations

import json
from typing import Any

_PIDS = {"rollout": 1, "trainer": 2, "orchestrator": 3}


class TraceWriter:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.events: list[dict[str, Any]] = []
        self._tids: dict[tuple[int, str], int] = {}

    def _tid(self, pid: int, row: str) -> int:
        key = (pid, row)
        tid = self._tids.get(key)
        if tid is None:
            tid = self._tids[key] = len(self._tids) + 1
            self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": row}})
        return tid

    def span(self, process: str, row: str, name: str, start: float, end: float, **args: Any) -> None:
        if not self.enabled or end < start:
            return
        pid = _PIDS.setdefault(process, len(_PIDS) + 1)
        self.events.append({"ph": "X", "name": name, "cat": process, "pid": pid, "tid": self._tid(pid, row),
                            "ts": round(start * 1e6, 1), "dur": round((end - start) * 1e6, 1), "args": args})

    def instant(self, process: str, row: str, name: str, t: float, **args: Any) -> None:
        if not self.enabled:
            return
        pid = _PIDS.setdefault(process, len(_PIDS) + 1)
        self.events.append({"ph": "i", "s": "t", "name": name, "cat": process, "pid": pid,
                            "tid": self._tid(pid, row), "ts": round(t * 1e6, 1), "args": args})

    def to_json(self) -> dict[str, Any]:
        meta = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}} for name, pid in _PIDS.items()]
        return {"traceEvents": meta + self.events, "displayTimeUnit": "ms"}

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f)
