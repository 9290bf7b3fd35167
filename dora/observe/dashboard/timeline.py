"""The version timeline: which policy version each rollout instance hosted, when, and where
weights were loaded and requests migrated, read from the rollout control code's trace.

The RolloutController writes the same trace events in a real run and in the simulator
(dora/observe/trace.py): a span `v<version>` per instance row each time it stops
hosting a version, an orchestrator instant `load v<version>` (args.instance) per weight load
and `migrate v<version>` (args.src, dests, requests) per migration. A version still hosted has
no span yet: `hosting` gives the live tail (instance -> version now).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

VERSION_SPAN = re.compile(r"^v(\d+)$")
VERSION_IN = re.compile(r"v(\d+)")
MAX_SEGMENTS = 600     # per row: a long run keeps its most recent segments (the page draws them all)


class Timeline:
    """Folds trace events into rows, incrementally (a live run feeds the same growing list)."""

    def __init__(self):
        self.seen = 0
        self.rows: dict[str, dict[str, list]] = {}
        self._threads: dict[tuple[Any, Any], str] = {}

    def _row(self, name: str) -> dict[str, list]:
        return self.rows.setdefault(name, {"segments": [], "loads": [], "migrations": []})

    def feed(self, events: list[dict[str, Any]]) -> None:
        for ev in events[self.seen:]:
            self._one(ev)
        self.seen = len(events)

    def _one(self, ev: dict[str, Any]) -> None:
        ph, name, args = ev.get("ph"), str(ev.get("name", "")), ev.get("args") or {}
        if ph == "M" and name == "thread_name":
            self._threads[(ev.get("pid"), ev.get("tid"))] = str(args.get("name"))
        elif ph == "X" and ev.get("cat") == "rollout":
            m = VERSION_SPAN.match(name)
            row = self._threads.get((ev.get("pid"), ev.get("tid")))
            if m and row is not None:
                t0 = float(ev["ts"]) / 1e6
                _push(self._row(row)["segments"], [round(t0, 3), round(t0 + float(ev["dur"]) / 1e6, 3), int(m.group(1))])
        elif ph == "i" and ev.get("cat") == "orchestrator":
            t = round(float(ev["ts"]) / 1e6, 3)
            m = VERSION_IN.search(name)
            v = int(m.group(1)) if m else None
            if name.startswith("load") and args.get("instance"):
                _push(self._row(str(args["instance"]))["loads"], [t, v])
            elif name.startswith("migrate") and args.get("src"):
                n = int(args.get("requests") or 0)
                dests = [str(d) for d in args.get("dests") or []]
                # out: -requests on the source row; in: +requests of the whole migration on each
                # destination (the trace does not split it per destination)
                _push(self._row(str(args["src"]))["migrations"], [t, v, -n, dests])
                for d in dests:
                    _push(self._row(d)["migrations"], [t, v, n, [str(args["src"])]])

    def section(self, instances: Iterable[str], now: float, hosting: dict[str, int | None] | None = None) -> dict[str, Any]:
        """The timeline of these instances up to `now` (clock seconds); `hosting` adds each
        instance's open segment (from its last closed segment to now)."""
        rows, versions = [], set()
        for name in instances:
            r = self.rows.get(name) or {"segments": [], "loads": [], "migrations": []}
            segs = list(r["segments"])
            v = (hosting or {}).get(name)
            if v is not None:
                start = max([s[1] for s in segs] + [m[0] for m in r["loads"] if m[1] == v] + [0.0])
                start = min(start, now)
                segs.append([round(start, 3), round(now, 3), int(v)])
            versions.update(s[2] for s in segs)
            rows.append({"name": name, "segments": segs, "loads": list(r["loads"]), "migrations": list(r["migrations"])})
        return {"now": round(now, 3), "rows": rows, "versions": sorted(versions)}


def natural(name: str) -> list:
    """Sort key: rollout[2] before rollout[10]."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _push(items: list, item: list) -> None:
    items.append(item)
    if len(items) > MAX_SEGMENTS:
        del items[: len(items) - MAX_SEGMENTS]


def timeline_of_trace(trace: dict[str, Any] | list[dict[str, Any]], instances: Iterable[str] | None = None) -> dict[str, Any]:
    """The timeline of a finished run's trace.json (every span closed)."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else list(trace)
    t = Timeline()
    t.feed(events)
    names = list(instances) if instances is not None else sorted((n for n, r in t.rows.items() if r["segments"]), key=natural)
    end = max([s[1] for r in t.rows.values() for s in r["segments"]] + [0.0])
    return t.section(names, end)
