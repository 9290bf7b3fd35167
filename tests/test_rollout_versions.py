"""Instances hosting several policy versions (async.versions_per_instance M > 1) in the one control
code: the VersionPacker under forced chaos (C1 kept, never more than M versions on an instance,
an old version's weights gone with its last request) and step by step; the simulator's costs of a
hosted extra version."""

from __future__ import annotations

import pytest
from test_rollout_invariants import FakeInstance, run_chaos

from dora.rl.rollout import InstanceStats, Request, RolloutConfig, RolloutController
from dora.sim.costmodel import MODELS, CostModel
from dora.sim.sim_instance import SimInstance
from dora.sim.virtual_clock import VirtualClock


class TwoVersionInstance(FakeInstance):
    """Hosts its current version and the versions of the requests on it, at most 2 (asserted)."""

    limit = 2

    def __init__(self, name, slots=8):
        super().__init__(name, slots)
        self.loads_beside_old = 0            # load_version calls that kept an older version's requests

    def holds(self, v):
        return v in self.hosted()

    def load_version(self, v):
        present = {s["r"].version for s in self.reqs.values()}
        assert len(present | {v}) <= self.limit, f"{self.name}: v{v} beside {sorted(present)}"
        self.loads_beside_old += bool(present - {v})
        self.version = v


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_versions_keep_c1_and_the_bound_under_chaos(seed):
    c, batches, trained, dispatched, insts = run_chaos("dora", seed, versions=2, make=TwoVersionInstance)
    s = c.finish()
    assert s["c1_violations"] == 0 and s["lost"] == 0 and s["c2_violations"] == 0 and s["c3_violations"] == 0
    assert len(trained) == len(set(trained)) and s["dispatched"] == dispatched
    assert all(len(t.versions) == 1 for _, b in batches for t in b), "a trajectory mixes versions (C1)"
    assert sum(i.loads_beside_old for i in insts) > 0, "no instance ever took a version beside an older one"
    for i in insts:                       # the manager's view of hosted weights is the instance's
        assert c.manager.hosted(i.name) == i.hosted()


class Idle:
    def now(self):
        return 0.0


def test_packer_moves_stragglers_onto_one_holder_and_frees_the_others():
    """v0's last 3 requests sit on 3 instances: they move (with KV) onto the instance that holds
    most of them; the two freed instances and the packed one take v1 (the packed one keeping v0)."""
    insts = [TwoVersionInstance(f"i{j}", slots=8) for j in range(3)]
    groups = iter([[Request(f"g{j}.0", f"g{j}", -1, 10, 100)] for j in range(9)])   # 9 single-request groups
    c = RolloutController(RolloutConfig(mode="dora", train_batch=2, rollout_batch=8, group_size=1, max_staleness=3,
                                        versions_per_instance=2), insts, lambda n: [next(groups) for _ in range(n)],
                          Idle())
    c.start()
    m = c.manager
    assert [m.load(n) for n in ("i0", "i1", "i2")] == [3, 3, 2]   # the staleness room: (K + 1) x TBS
    for i in insts:                      # every request finishes but one on i0 and i1 and two on i2
        for u in list(m.on_instance[i.name])[2 if i.name == "i2" else 1:]:
            del i.reqs[u]
            m.finished(u)
    c.dispatch.newest = 1
    c.policy.packer.rebalance(1, {})
    assert [len(m.requests_of(n, 0)) for n in ("i0", "i1", "i2")] == [0, 0, 4]
    assert [i.version for i in insts] == [1, 1, 1] and insts[2].hosted() == {0, 1}
    assert insts[0].hosted() == insts[1].hosted() == {1}


def _sim(limit):
    cost = CostModel(MODELS["qwen2.5-32b"])
    inst = SimInstance("a", cost, VirtualClock(), lambda n, f: None)
    inst.hv.limit = limit
    return cost, inst


def test_a_hosted_extra_version_takes_kv_room_and_reads_its_weights_every_step():
    cost, a = _sim(2)
    a.load_version(0)
    a.submit([Request("old", "g0", 0, 100, 5000)])
    room = a.kv_capacity
    a.load_version(1)                    # v0's request stays, decoding on v0's weights
    assert a.hosted_versions() == {0, 1} and a.kv_capacity == room - cost.weight_tokens()
    assert a.stats().version_kv_fraction == pytest.approx(cost.weight_tokens() / a.kv_capacity)
    a.submit([Request("new", "g1", 1, 100, 5000)])
    ctx = a.ctx_base + 2 * a.P
    assert a._step_s() == pytest.approx(cost.decode_step_versions_s([1, 1], ctx))
    assert a._step_s() - cost.decode_step_s(2, ctx) == pytest.approx(cost.t_weights)   # one more weight read
    with pytest.raises(RuntimeError, match="more than versions_per_instance = 2"):
        a.load_version(2)
    (st,) = a.export(["old"])            # v0's last request leaves: its weights go, the room comes back
    assert st.version == 0 and a.hosted_versions() == {1} and a.kv_capacity == room
    with pytest.raises(RuntimeError, match="instance hosts"):
        a.import_([st])                  # ... and v0 cannot come back: the instance no longer holds it


def test_one_version_per_instance_refuses_a_load_with_requests_inside():
    _, a = _sim(1)
    a.load_version(0)
    a.submit([Request("u", "g", 0, 10, 50)])
    with pytest.raises(RuntimeError, match="requests still on it"):
        a.load_version(1)


def test_stats_report_no_version_room_with_one_version_per_instance():
    _, a = _sim(1)
    assert isinstance(a.stats(), InstanceStats) and a.stats().version_kv_fraction == 0.0
