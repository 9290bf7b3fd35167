"""issue 34: two policies on one shared rollout pool in the simulator (dora/sim/two_policies.py): the
real RolloutController per policy, the pool split statically or by load (dora/sim/policy_split.py)."""

from __future__ import annotations

import json

import pytest

from dora.sim.simulate_cli import simulate_main
from dora.sim.simulator import SimConfig
from dora.sim.two_policies import SimPolicy, simulate_policies

POLICIES = [SimPolicy("solver", "dapo-math", 512), SimPolicy("challenger", "sigma-1.0", 128)]


@pytest.mark.parametrize("split", ["static", "load"])
def test_each_policy_trains_its_steps_on_the_shared_pool(split):
    cfg = SimConfig(mode="dora", gpus=64, train_gpus=16, steps=4, group_size=16)
    row = simulate_policies(cfg, POLICIES, split)
    assert row["rollout_instances"] == 8 and row["split"] == split
    held = {u: p["instances_held"] for u, p in row["policies"].items()}
    assert sum(held.values()) == pytest.approx(8, abs=0.05)   # every instance held by one policy at a time
    for p in row["policies"].values():
        assert (p["c1_violations"], p["c2_violations"], p["c3_violations"], p["lost"]) == (0, 0, 0, 0)
        assert p["finished_s"] <= row["makespan_s"] and p["step_time_s"] > 0
    if split == "static":
        assert row["instances_moved"] == 0 and held == {"solver": 4, "challenger": 4}
    else:   # the solver's long responses are most of the work: it holds more of the pool
        assert row["instances_moved"] > 0 and held["solver"] > held["challenger"]


def test_the_cli_prints_a_row_per_split_and_refuses_bad_policies(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert simulate_main(["--modes", "dora", "--gpus", "64", "--train-gpus", "16", "--steps", "2", "--policy",
                          "solver:dapo-math:512", "--policy", "challenger:sigma-1.0:128", "--json", str(out)]) == 0
    assert [r["split"] for r in json.loads(out.read_text())] == ["static", "load"]
    assert simulate_main(["--policy", "solver:dapo-math", "--policy", "b:sigma-1.0:64"]) == 2
    assert "expected NAME:WORKLOAD:TBS" in capsys.readouterr().err
    assert simulate_main(["--policy", "a:nope:64", "--policy", "b:sigma-1.0:64"]) == 2


def test_parked_requests_of_two_versions_take_two_empty_instances():
    """Requests parked with their KV (a reclaimed instance's, of versions no instance holds) go to empty
    instances that load their version: one instance per version, never one loading both in turn."""
    from test_rollout_invariants import FakeInstance

    from dora.rl.rollout import Request, RolloutConfig, RolloutController
    from dora.rl.rollout.types import RequestState

    insts = [FakeInstance("i0"), FakeInstance("i1")]
    c = RolloutController(RolloutConfig(mode="dora", train_batch=1, rollout_batch=2, group_size=1, max_staleness=3),
                          insts, lambda n: [], type("Clock", (), {"now": lambda self: 0.0})())
    c.start()
    reqs = [Request("a", "ga", 5, 10, 100), Request("b", "gb", 6, 10, 100)]
    c.dispatch.park(reqs, [RequestState(r.uid, r.group_id, r.version, 10, 3, True, 30, 100, (r.version,)) for r in reqs])
    c.dispatch.place_parked()
    assert sorted((i.version, sorted(i.reqs)) for i in insts) == [(5, ["a"]), (6, ["b"])]
