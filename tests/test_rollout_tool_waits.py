"""The orchestrator and tool waits: a multi-turn request waiting on a tool holds no decode slot, so
an instance whose requests are in tool waits takes new groups (the rollout controller learns the
counts from the replicas' `tool_waits` events), and a request moved mid-tool-wait keeps its masks
aligned with its tokens (tests/test_generate_multiturn.py covers the engine side of the move)."""

from __future__ import annotations

from dora.rl.rollout.manager import RolloutManager
from dora.rl.rollout.types import Request
from test_rollout_invariants import FakeInstance


def _manager() -> tuple[RolloutManager, dict]:
    a, b = FakeInstance("a", slots=4), FakeInstance("b", slots=4)
    a.version = b.version = 0
    n = [0]

    def take(k):
        out = []
        for _ in range(k):
            n[0] += 1
            out.append([Request(f"g{n[0]}.{j}", f"g{n[0]}", -1, 10, 5) for j in range(2)])
        return out
    m = RolloutManager([a, b], take, group_size=2)
    m.slots = {"a": 4, "b": 4}
    m.dispatch(0, 2, ["a"])          # a: 4 requests (its slots full)
    m.dispatch(0, 1, ["b"])          # b: 2 requests
    return m, {"a": a, "b": b}


def test_requests_in_a_tool_wait_are_not_decoding_load():
    m, inst = _manager()
    assert m.dispatch(0, 2, allowance=0) and len(inst["a"].reqs) == 4 and len(inst["b"].reqs) == 4
    m, inst = _manager()
    m.tool_waiting["a"] = 4          # every request on a waits on a tool
    assert m.decoding_load("a") == 0 and m.decoding_load("b") == 2
    assert len(m.dispatch(0, 2, allowance=0)) == 2
    assert len(inst["a"].reqs) == 8 and len(inst["b"].reqs) == 2   # both groups to the instance with free slots
    assert m.load("a") == 8          # still placed there: they move and finish with the instance's requests


def test_the_controller_takes_the_counts_from_tool_wait_events():
    from dora.observe.trace import TraceWriter
    from dora.rl.multiturn_reports import MultiTurnReports

    class Clock:
        t = 0.0

        def now(self):
            return self.t

    class RC:
        def __init__(self, m):
            self.manager = m

        from dora.rl.rollout.rollout_controller import RolloutController
        on_tool_waits = RolloutController.on_tool_waits

    m, _ = _manager()
    clock, trace = Clock(), TraceWriter()
    reports = MultiTurnReports(clock, trace)
    reports.on_event("a", {"kind": "tool_waits", "waiting": 3, "started": ["g1.0", "g1.1", "g2.0"], "ended": []}, RC(m))
    assert m.decoding_load("a") == 1
    clock.t = 2.5
    reports.on_event("a", {"kind": "tool_waits", "waiting": 1, "started": [], "ended": ["g1.0", "g1.1"]}, RC(m))
    assert m.decoding_load("a") == 3
    spans = [e for e in trace.events if e["ph"] == "X"]
    assert [(e["name"], e["dur"], e["args"]["uid"]) for e in spans] == [("tool wait", 2.5e6, "g1.0"), ("tool wait", 2.5e6, "g1.1")]
