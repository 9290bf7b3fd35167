"""A raising op, a SIGKILLed worker, a SIGSTOPped worker and an op that hangs each end the run with
a clear message naming the replica, within the deadline, and leave no process behind."""

from __future__ import annotations

import time

import pytest

from dora.runtime.run_controller import Controller
from dora.runtime.errors import RunFailed
from tests.runtime_graphs import alive, pipeline

DEADLINE_S = 60


def run_failing(tmp_path, mode: str, hb_timeout: float = 5.0, **kw) -> tuple[RunFailed, float, Controller]:
    g = pipeline(rows=20_000, batch_rows=200, map_params={"fail_mode": mode, "fail_at": 3, "delay_s": 0.01})
    ctl = Controller(g, run_dir=str(tmp_path), deadline_s=DEADLINE_S, hb_timeout=hb_timeout, **kw)
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as ei:
        ctl.run()
    elapsed = time.monotonic() - t0
    pids = ctl.pids()
    assert len(pids) == 7 and all(pids.values())
    left = [label for label, pid in pids.items() if alive(pid)]
    assert not left, f"processes left running: {left}"
    return ei.value, elapsed, ctl


def test_raising_op_ends_run_with_traceback(tmp_path):
    err, elapsed, _ = run_failing(tmp_path, "raise")
    assert err.node == "map" and err.replica == 0
    text = str(err)
    assert "worker map[0]" in text and "raised in process()" in text
    assert "RuntimeError: test failure in map[0] at batch 3" in text
    assert "Traceback" in text and "runtime_ops.py" in text
    assert elapsed < DEADLINE_S


def test_sigkilled_worker_is_reported_by_name(tmp_path):
    err, elapsed, _ = run_failing(tmp_path, "sigkill")
    assert (err.node, err.replica) == ("map", 0)
    assert "worker map[0]" in str(err) and "killed by signal SIGKILL" in str(err)
    assert elapsed < DEADLINE_S


def test_hanging_op_is_named_by_the_stall_watchdog(tmp_path):
    """Its process lives and its heartbeat thread keeps beating: only the stall report can tell."""
    err, elapsed, _ = run_failing(tmp_path, "hang", stall_timeout_s=3.0)
    assert (err.node, err.replica) == ("map", 0)
    assert "worker map[0]" in str(err) and "no progress" in str(err) and "inside process()" in str(err)
    assert elapsed < DEADLINE_S


def test_sigstopped_worker_is_detected_by_heartbeat(tmp_path):
    err, elapsed, _ = run_failing(tmp_path, "sigstop", hb_timeout=1.5)
    assert (err.node, err.replica) == ("map", 0)
    assert "worker map[0]" in str(err) and "missed heartbeats" in str(err)
    assert elapsed < DEADLINE_S


class RespawnMap:
    """A driver that lets `map` replicas be respawned and records what the controller told it."""

    def __init__(self):
        self.lost = []

    def respawnable(self, node):
        return node == "map"

    def on_replica_lost(self, node, replica, why):
        self.lost.append((node, replica, why))

    def done(self):
        return False


@pytest.mark.parametrize("mode", ["sigkill", "hang"])
def test_respawned_replica_takes_work_again_and_the_run_ends(tmp_path, mode):
    """The replica comes back at the same inbox, its neighbours' connections are reset, the run ends
    (no hang on credits or end-of-stream), and no row arrives twice. Rows the dead replica held are
    gone: an RL driver reissues them (test_e2e_pipelines); plain dataflow has none to ask."""
    from dora.graph.model import Graph, Node
    from tests.runtime_graphs import OPS, edge, read_sink

    drv = RespawnMap()
    g = Graph("respawn")   # source -> map x3 -> sink (no reducer: lost rows leave no group short)
    g.nodes["src"] = Node("src", OPS + "Source", {"rows": 8_000, "batch_rows": 200, "group_size": 4})
    g.nodes["map"] = Node("map", OPS + "Map", {"fail_mode": mode, "fail_at": 3, "fail_once": True, "delay_s": 0.01},
                          replicas=3, inputs={"in": edge("src", "map")})
    g.nodes["sink"] = Node("sink", OPS + "Sink", {}, inputs={"in": edge("map", "sink")})
    ctl = Controller(g, run_dir=str(tmp_path), deadline_s=DEADLINE_S, hb_timeout=5.0, driver=drv, max_restarts=1,
                     stall_timeout_s=3.0)
    res = ctl.run()
    assert res.ok and [x[:2] for x in drv.lost] == [("map", 0)]
    assert [r["replica"] for r in ctl.respawn_log] == ["map[0]"]
    uids = read_sink(str(tmp_path)).column("uid").to_pylist()
    assert len(uids) == len(set(uids)) and 0 < len(uids) <= 8_000


def test_respawn_budget_spent_fails_naming_the_replica(tmp_path):
    drv = RespawnMap()
    g = pipeline(rows=20_000, batch_rows=200, map_params={"fail_mode": "sigkill", "fail_at": 3, "delay_s": 0.01})
    ctl = Controller(g, run_dir=str(tmp_path), deadline_s=DEADLINE_S, hb_timeout=5.0, driver=drv, max_restarts=1)
    with pytest.raises(RunFailed, match=r"worker map\[0\].*after 1 respawn"):
        ctl.run()


def test_a_raising_op_is_not_respawned(tmp_path):
    """An exception is a bug in op code: a fresh process would raise it again on the same row, so
    the run fails at once naming it, even where the driver allows respawns."""
    drv = RespawnMap()
    g = pipeline(rows=20_000, batch_rows=200, map_params={"fail_mode": "raise", "fail_at": 3, "delay_s": 0.01})
    ctl = Controller(g, run_dir=str(tmp_path), deadline_s=DEADLINE_S, hb_timeout=5.0, driver=drv, max_restarts=3)
    with pytest.raises(RunFailed, match=r"worker map\[0\].*raised") as e:
        ctl.run()
    assert "respawn" not in str(e.value) and drv.lost == []
