"""End-to-end dataflow on the local backend: exactly-once with group_by, back-pressure, driver API."""

from __future__ import annotations

import collections
import sys

import pyarrow as pa
import pytest

from dora.runtime.run_controller import Controller
from dora.runtime.errors import CallError
from tests.runtime_graphs import OPS, alive, edge, pipeline, read_sink
from dora.graph.model import Graph, Node


def check_exactly_once(t: pa.Table, rows: int, group_size: int) -> None:
    uids = t.column("uid").to_pylist()
    assert len(uids) == rows, f"{len(uids)} rows delivered, expected {rows}"
    assert set(uids) == {f"u{i}" for i in range(rows)}, "some uid missing or unknown"
    # every group whole: group_size rows, all from one reducer replica
    by_group: dict[int, set[str]] = collections.defaultdict(set)
    count: collections.Counter = collections.Counter()
    for gid, red in zip(t.column("group_id").to_pylist(), t.column("reduced_by").to_pylist()):
        by_group[gid].add(red)
        count[gid] += 1
    assert set(count.values()) == {group_size}
    assert all(len(v) == 1 for v in by_group.values()), "a group was split across reducer replicas"
    # rows of one group came from several map replicas, so group_by really merged producers
    mapped = collections.defaultdict(set)
    for gid, m in zip(t.column("group_id").to_pylist(), t.column("mapped_by").to_pylist()):
        mapped[gid].add(m)
    assert sum(len(v) > 1 for v in mapped.values()) > len(mapped) // 2


def test_exactly_once_local_100k(tmp_path):
    rows, g = 100_000, 4
    ctl = Controller(pipeline(rows, g), run_dir=str(tmp_path), deadline_s=120)
    res = ctl.run()
    assert res.ok and res.rejected == 0
    check_exactly_once(read_sink(str(tmp_path)), rows, g)
    assert {res.stats[f"red[{r}]"]["in"]["rows"] > 0 for r in range(2)} == {True}  # both reducers used
    assert not any(alive(p) for p in ctl.pids().values()), "worker processes left running"


def backpressure_graph(capacity_bytes: int) -> Graph:
    # source makes a 100 KB batch every 2 ms; the sink takes 20 ms per batch: 10x slower
    g = Graph("backpressure")
    g.nodes["src"] = Node("src", OPS + "Source", {"rows": 600, "batch_rows": 10, "payload_bytes": 10_000, "delay_s": 0.002})
    g.nodes["sink"] = Node("sink", OPS + "Sink", {"delay_s": 0.02},
                           inputs={"in": edge("src", "sink", capacity=1000, capacity_bytes=capacity_bytes)})
    return g


def test_backpressure_bounds_bytes_in_flight(tmp_path):
    bound = 350_000  # 3.5 batches of ~100 KB
    res = Controller(backpressure_graph(bound), run_dir=str(tmp_path / "a"), deadline_s=60).run()
    out = res.stats["src[0]"]["out"]
    (st,) = out.values()
    assert st["batches"] == 60 and st["bytes"] > 6_000_000
    assert 100_000 < st["max_inflight_bytes"] <= bound, st
    # the same run without a byte bound queues far more: the measurement can tell the difference
    res2 = Controller(backpressure_graph(64 << 20), run_dir=str(tmp_path / "b"), deadline_s=60).run()
    (st2,) = res2.stats["src[0]"]["out"].values()
    assert st2["max_inflight_bytes"] > 3 * bound, st2


class EchoDriver:
    """Feeds echo replicas by hand through a managed edge and exercises call/on_event."""

    def __init__(self):
        self.ctl: Controller | None = None
        self.n = 0
        self.events = []
        self.loaded = None
        self.boom = None
        self.ended = False

    def managed_edges(self):
        return [("src", "echo")]

    def on_batch(self, src, batch):
        assert src == "src"
        self.ctl.send("echo", self.n % 2, "in", batch)
        self.n += 1

    def on_event(self, node, replica, event):
        self.events.append((node, replica, event))

    def on_eos(self, src, dst):
        self.ctl.close("echo", "in")
        self.ended = True

    def tick(self, now):
        if self.loaded is None:
            self.loaded = [self.ctl.call("echo", r, "load_version", {"version": 7}, timeout=30) for r in range(2)]
            with pytest.raises(CallError, match="boom on request") as ei:
                self.ctl.call("echo", 1, "boom", timeout=30)
            self.boom = str(ei.value)
            self.ping = self.ctl.call("echo", 0, "ping", timeout=30)

    def done(self):
        return False


def test_driver_managed_edge_call_and_events(tmp_path):
    g = Graph("driver")
    g.nodes["src"] = Node("src", OPS + "Source", {"rows": 1000, "batch_rows": 50})
    g.nodes["echo"] = Node("echo", OPS + "Echo", {}, replicas=2, inputs={"in": edge("src", "echo")})
    g.nodes["sink"] = Node("sink", OPS + "Sink", {}, inputs={"in": edge("echo", "sink")})
    d = EchoDriver()
    d.ctl = ctl = Controller(g, driver=d, run_dir=str(tmp_path), deadline_s=60)
    res = ctl.run()
    assert res.ok and d.ended and d.n == 20
    assert d.loaded == [{"version": 7, "replica": 0}, {"version": 7, "replica": 1}]
    assert "echo[1].boom() failed: ValueError: boom on request" in d.boom
    assert d.ping["pong"] is True
    assert sorted((n, r) for n, r, e in d.events if e.get("kind") == "loaded") == [("echo", 0), ("echo", 1)]
    assert read_sink(str(tmp_path)).num_rows == 1000
    assert {res.stats[f"echo[{r}]"]["in"]["batches"] for r in range(2)} == {10}


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_exactly_once_over_each_transport(tmp_path, transport):
    rows, g = 8_000, 4
    ctl = Controller(pipeline(rows, g, batch_rows=500), run_dir=str(tmp_path), deadline_s=60,
                     backend_options={"transport": transport})
    res = ctl.run()
    want = "ipc://" if transport == "ipc" else "tcp://127.0.0.1:"
    assert all(ep.startswith(want) for ep in (r.endpoint for r in res.plan.replicas))
    check_exactly_once(read_sink(str(tmp_path)), rows, g)


def test_local_backend_defaults_to_ipc_and_obeys_DORA_TRANSPORT(monkeypatch):
    from dora.runtime.backends.local import LocalBackend
    monkeypatch.delenv("DORA_TRANSPORT", raising=False)
    assert LocalBackend().transport == ("tcp" if sys.platform == "win32" else "ipc")
    monkeypatch.setenv("DORA_TRANSPORT", "tcp")
    assert LocalBackend().transport == "tcp"
    monkeypatch.setenv("DORA_TRANSPORT", "udp")
    with pytest.raises(ValueError, match="DORA_TRANSPORT"):
        LocalBackend()


def test_ipc_socket_paths_fit_a_unix_socket():
    from dora.runtime.worker_setup import IPC_PATH_MAX, ipc_socket_path
    assert ipc_socket_path("/tmp/dora-ipc-x", "gen", 1) == "/tmp/dora-ipc-x/gen-1.sock"
    long_node = "n" * 200
    p1, p2 = ipc_socket_path("/tmp/dora-ipc-x", long_node, 0), ipc_socket_path("/tmp/dora-ipc-x", long_node, 1)
    assert len(p1) <= IPC_PATH_MAX and p1 != p2
    with pytest.raises(ValueError, match="DORA_TRANSPORT=tcp"):
        ipc_socket_path("/" + "d" * 120, "gen", 0)


class HoldDriver:
    """wants() False for a while: the controller holds the batches and their credits, so the
    source stops after `capacity` batches; then everything flows."""

    def __init__(self):
        self.ctl: Controller | None = None
        self.t_release = None
        self.sent_while_held = None
        self.got = 0

    def managed_edges(self):
        return [("src", "sink")]

    def wants(self, src):
        return self.t_release is not None and self.sent_while_held is not None

    def on_batch(self, src, batch):
        self.got += 1
        self.ctl.send("sink", 0, "in", batch)

    def on_eos(self, src, dst):
        self.ctl.close(dst, "in")

    def tick(self, now):
        if self.t_release is None:
            self.t_release = now + 1.0
        elif now > self.t_release and self.sent_while_held is None:
            self.sent_while_held = self.ctl.call("src", 0, "worker_stats")["stats"]["out"]["src/out -> sink.in"]["batches"]

    def done(self):
        return False


def test_driver_wants_holds_the_producer_by_credit(tmp_path):
    g = Graph("hold")
    g.nodes["src"] = Node("src", OPS + "Source", {"rows": 400, "batch_rows": 20})
    g.nodes["sink"] = Node("sink", OPS + "Sink", {}, inputs={"in": edge("src", "sink", capacity=3)})
    d = HoldDriver()
    d.ctl = Controller(g, driver=d, run_dir=str(tmp_path), deadline_s=60)
    res = d.ctl.run()
    assert res.ok and d.sent_while_held == 3 and d.got == 20
    assert read_sink(str(tmp_path)).num_rows == 400
