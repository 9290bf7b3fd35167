"""The exactly-once proof on the ray backend: same graph, same worker code, actors in placement groups."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("ray")

from dora.runtime.run_controller import Controller
from tests.runtime_graphs import alive, pipeline, read_sink
from tests.test_runtime_dataflow import check_exactly_once


@pytest.mark.ray
@pytest.mark.slow
def test_exactly_once_ray_100k(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    rows, g = 100_000, 4
    ctl = Controller(pipeline(rows, g), backend="ray", backend_options={"num_cpus": 2}, run_dir=str(tmp_path),
                     deadline_s=110, start_timeout_s=90)
    res = ctl.run()
    assert res.ok and res.rejected == 0
    check_exactly_once(read_sink(str(tmp_path)), rows, g)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in ctl.pids().values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in ctl.pids().values()), "actor processes left running"


@pytest.mark.ray
@pytest.mark.slow
def test_tp_group_on_one_node_and_trainer_ranks_across_two_nodes(tmp_path, monkeypatch):
    """A local 2-node Ray cluster whose custom resource `standin_gpu` stands in for GPUs (3 on the
    head, 1 on the other node): the replica holding 2 devices (a TP group) can only fit on the head,
    so the 2-rank trainer placed after it must span both nodes, rendezvous at rank 0's node address
    and train (4 steps, sharded checkpoint)."""
    import glob
    import os
    import sys

    import ray
    from ray.cluster_utils import Cluster

    from dora.graph.model import AsyncConfig, Graph, Node, Pool
    from tests.runtime_graphs import OPS, edge

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"standin_gpu": 3},
                                                            "include_dashboard": False})
    other = cluster.add_node(num_cpus=2, resources={"standin_gpu": 1})
    path = os.pathsep.join([p for p in sys.path if p and os.path.isdir(p)] + [os.getcwd()])
    ray.init(address=cluster.address, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1"}})
    try:
        g = Graph("ray_scale", pools={"gpus": Pool("gpus", "cpu", 4)}, async_=AsyncConfig("sync", 0, 4, 4),
                  model={"hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 64})
        g.nodes["data"] = Node("data", OPS + "Trajectories", {"groups": 8, "group_size": 2})
        g.nodes["tp"] = Node("tp", OPS + "DeviceProbe", {}, pool="gpus", devices=2, inputs={"in": edge("data", "tp")})
        g.nodes["train"] = Node("train", "update", {"steps": 4, "lr": 1e-3}, pool="gpus", replicas=2,
                                inputs={"batch": edge("tp", "train", port="batch")})
        ctl = Controller(g, backend="ray", backend_options={"pool_resources": {"gpus": "standin_gpu"}},
                         run_dir=str(tmp_path), deadline_s=600, start_timeout_s=300, hb_timeout=60)
        res = ctl.run()
        assert res.ok
        where = ctl.backend.placement
        assert where["tp[0]"] == cluster.head_node.node_id            # both devices of the group on one node
        assert {where["train[0]"], where["train[1]"]} == {cluster.head_node.node_id, other.node_id}
        steps = [e for node, r, e in res.events if e["kind"] == "train_step"]
        assert [e["step"] for e in steps] == [1, 2, 3, 4] and all(e["metrics"]["train_ranks"] == 2 for e in steps)
        assert {(node, r) for node, r, e in res.events if e["kind"] in ("train_step", "weights", "done")} == {("train", 0)}
        assert len(glob.glob(str(tmp_path / "checkpoints" / "step_4" / "sharded" / "*.distcp"))) == 2
    finally:
        from dora.ops.weights import versions as weights
        weights.cleanup(str(tmp_path))
        ray.shutdown()
        cluster.shutdown()
