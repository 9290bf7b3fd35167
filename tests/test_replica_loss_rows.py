"""A generate replica reports trajectories finished (a control event) before their rows have left
its process: a SIGKILL between the two takes rows the rollout controller already counts as
finished. The RL driver, with a stand-in for the run controller, sees exactly that order of events;
the batch that waited for those rows must be revoked and their groups reissued, or the trainer
waits forever (seen in the generate-SIGKILL chaos test under load)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pyarrow as pa
import pytest

from dora.graph.resolve import resolve
from dora.graph.yaml_io import load_graph
from dora.rl.driver import RLDriver
from dora.rl.roles import RLRoles
from dora.runtime.errors import RunFailed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FakeControl:
    """The run controller as the driver calls it: each generate replica keeps what was submitted
    to it; nothing else runs."""

    def __init__(self, replicas: int):
        self.submitted: dict[int, list[str]] = {r: [] for r in range(replicas)}
        self.plan = SimpleNamespace(of=lambda node: [SimpleNamespace(replica=r, spare=False) for r in range(replicas)],
                                    sharing=lambda a, b: [])
        self.sent: list[tuple] = []
        self.stall_timeout_s = 600.0

    def call(self, node, replica, method, args, timeout=None, buffers=()):
        if method == "submit":
            for buf in buffers:
                table = pa.ipc.open_stream(buf).read_all()
                self.submitted[replica] += [str(u) for u in table.column("uid").to_pylist()]
        if method in ("export", "interrupt_all"):
            return {"states": [], "frame_counts": []}
        if method == "stats":
            return {"active": 0, "queued": 0, "kv_tokens_capacity": 4096, "kv_tokens_used": 0}
        return {}

    def send(self, node, replica, kind, payload, timeout=None):
        self.sent.append((node, replica, kind))


def _driver(mode: str) -> tuple[RLDriver, FakeControl]:
    g = load_graph(os.path.join(ROOT, "pipelines", "quickstart.yaml"),
                   [f"async.mode={mode}", "async.max_staleness=2", "async.train_batch=8", "async.rollout_batch=8",
                    "nodes.prompts.params.group_size=4", "eval=null", "run.keep_best=null"])
    r = resolve(g)
    d = RLDriver(r, RLRoles.find(g, r.op_of), metrics=None, progress=SimpleNamespace(status=lambda msg: None))
    ctrl = FakeControl(g.nodes[d.roles.generate].replicas)
    d.attach(ctrl)
    return d, ctrl


def _prompts(first_group: int, groups: int) -> pa.RecordBatch:
    rows = [{"uid": f"{gid}-{i}", "group_id": gid, "prompt": "3*a", "prompt_ids": [7, 75, 14], "answer": "aaa"}
            for gid in range(first_group, first_group + groups) for i in range(4)]
    return pa.RecordBatch.from_pylist(rows)


def _scored(uids: list[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"uid": u, "advantage": 0.0} for u in uids])


def test_rows_that_died_with_their_replica_are_reissued_not_waited_for():
    d, ctrl = _driver("dora")
    gen = d.roles.generate
    d.on_batch(d.roles.dataset, _prompts(0, 8))
    d.on_event(d.roles.update, 0, {"kind": "weights", "version": 0, "path": "v0"})
    d.tick(0.0)
    assert d.rc is not None and sum(len(u) for u in ctrl.submitted.values()) == 8
    # replica 0 finishes everything it holds and reports it; the rows never leave the process
    on0 = list(ctrl.submitted[0])
    assert on0
    d.on_event(gen, 0, {"kind": "finished", "uids": on0, "version": 0, "token_versions": [[0]] * len(on0),
                        "response_tokens": [5] * len(on0)})
    # replica 1's trajectories finish and their rows arrive
    on1 = list(ctrl.submitted[1])
    d.on_event(gen, 1, {"kind": "finished", "uids": on1, "version": 0, "token_versions": [[0]] * len(on1),
                        "response_tokens": [5] * len(on1)})
    d.on_batch(d.roles.trainer_feed, _scored(on1))
    assert d.feed.pending is not None and set(on0) & set(d.feed.pending), "the batch waits on replica 0's rows"
    # what replica 0 held: the finished groups above, and those dispatched to it since (in flight)
    lost_groups = {u.split("-")[0] for u in ctrl.submitted[0]}
    assert len(lost_groups) > len({u.split("-")[0] for u in on0})

    d.on_replica_lost(gen, 0, "killed by SIGKILL")

    # the batch that waited for the lost rows is revoked; their groups go again as new groups
    assert d.feed.pending is None or not set(on0) & set(d.feed.pending)
    assert all(not d.prompts.is_open(u) for u in on0)
    again = {grp[0].group_id for grp in d.prompts.waiting if int(grp[0].group_id) < 0}
    again |= {u.rsplit("-", 1)[0] for uids in ctrl.submitted.values() for u in uids if u.startswith("-")}
    assert len(again) == len(lost_groups), (again, lost_groups)
    assert d.rc.ledger.dropped["replica_lost"] == 4 * len(lost_groups)
    # a row of the old attempt that does arrive later is not trained
    d.on_batch(d.roles.trainer_feed, _scored(on0[:1]))
    assert d.feed.late_rows == 1 and on0[0] not in d.feed.scored
    assert not d.feed.in_transit.keys() & set(on0)
    summary = d.rc.finish()
    assert summary["lost"] == 0 and summary["c2_violations"] == 0, summary


def test_a_batch_whose_rows_never_come_fails_the_run_after_the_stall_timeout():
    """Every wait has a bound: rows that nothing will deliver (here: never sent, and no replica
    reported lost) end the run naming them, instead of a trainer waiting forever."""
    d, ctrl = _driver("dora")
    ctrl.stall_timeout_s = 0.2
    gen = d.roles.generate
    d.on_batch(d.roles.dataset, _prompts(0, 8))
    d.on_event(d.roles.update, 0, {"kind": "weights", "version": 0, "path": "v0"})
    d.tick(0.0)
    for r, uids in ctrl.submitted.items():
        d.on_event(gen, r, {"kind": "finished", "uids": list(uids), "version": 0,
                            "token_versions": [[0]] * len(uids), "response_tokens": [5] * len(uids)})
    assert d.feed.pending is not None
    d.tick(0.0)                                    # the wait starts
    time.sleep(0.1)
    d.tick(0.0)                                    # within the bound
    time.sleep(0.25)
    with pytest.raises(RunFailed, match=r"waited \d+ s .* for the scored rows of 8 trajectories .*finished on rollout\[0\]"):
        d.tick(0.0)
