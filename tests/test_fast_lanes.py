"""Fast lanes (dora/rl/rollout/fast_lanes.py): async.fast_lanes is validated with its line (it must
leave the newest version a generate replica), the simulator refuses the same (exit 2), and a run
whose stragglers need lanes moves requests into them, counted per step as fast_lane_requests."""

from __future__ import annotations

from test_graph_helpers import BASE, diagnose, line_of
from test_sim_cli import SMALL
from test_sim_simulator import small

from dora.sim.simulate_cli import simulate_main
from dora.sim.simulator import simulate


def _with_lanes(n: int) -> str:
    return BASE.replace("async: {mode: sync,", f"async: {{fast_lanes: {n}, mode: dora,")


def test_validate_refuses_lanes_that_leave_no_replica_for_the_newest_version(tmp_path):
    for n in (-1, 0, 1):                                    # the pipeline has 2 generate replicas
        assert not [d for d in diagnose(tmp_path, _with_lanes(n)) if d.severity == "error"], n
    for n, msg in ((2, "leaves no generate replica for the newest version"), (-2, "must be >= -1")):
        errors = [d for d in diagnose(tmp_path, _with_lanes(n)) if d.severity == "error"]
        assert len(errors) == 1 and msg in errors[0].message, errors
        assert errors[0].loc.line == line_of(_with_lanes(n), "fast_lanes")


def test_simulate_refuses_lanes_that_leave_no_instance(capsys):
    assert simulate_main(SMALL + ["--modes", "dora", "--fast-lanes", "2"]) == 2   # 8 GPUs, TP 1: the split leaves 2
    assert "leaves no rollout instance for the newest version" in capsys.readouterr().err


def test_stragglers_move_into_lanes_and_are_counted():
    on, off = simulate(small("dora")), simulate(small("dora", fast_lanes=0))
    assert on["fast_lane_requests"] > 0 and sum(s["fast_lane_requests"] for s in on["per_step"]) > 0
    assert off["fast_lane_requests"] == 0
    assert on["fast_lane_requests"] <= on["migrated_requests"]
    for r in (on, off):
        assert r["c1_violations"] == r["c2_violations"] == r["c3_violations"] == r["lost"] == 0


def test_queued_siblings_of_a_running_group_start_on_the_newest_version():
    """Length-aware dispatch (length_aware.start_siblings_on_newest): a group of an old version whose
    samples run has siblings still queued without a token; they start on the newest version, each
    trajectory on one version (C1), the group whole and as stale as its oldest member (C2, C3)."""
    import random
    from test_rollout_invariants import Clock, FakeInstance, make_prompts
    from dora.rl.rollout import RolloutConfig, RolloutController
    from dora.rl.rollout.length_aware import start_siblings_on_newest

    rng, clock = random.Random(0), Clock()
    old, new = FakeInstance("old", slots=2), FakeInstance("new", slots=8)
    c = RolloutController(RolloutConfig(mode="dora", train_batch=4, group_size=4, max_staleness=2,
                                        rollout_batch=4), [old, new], make_prompts(4, rng)[0], clock)
    c.start()
    holder = old if old.reqs else new
    assert len(holder.reqs) == 4 and holder.stats().queued == 2     # two samples run, two wait for a slot
    other = new if holder is old else old
    c.manager.instances[other.name].version = 1                   # the newest version lives elsewhere
    c.manager.versions_changed()
    c.dispatch.newest = 1
    assert start_siblings_on_newest(c.dispatch, {0}) == 2
    assert sorted(s["r"].version for s in other.reqs.values()) == [1, 1]
    assert len(holder.reqs) == 2 and all(s["r"].version == 0 for s in holder.reqs.values())
    for _ in range(100):
        clock.t += 1
        for i in (holder, other):
            c.on_finished(i.name, i.progress(rng))
    assert c.trainer_ready()
    batch = c.take_batch()
    assert len(batch) == 4 and {t.version for t in batch} == {0}                 # one group, its oldest version
    assert sorted(t.versions for t in batch) == [(0,), (0,), (1,), (1,)]         # each sample on one version
