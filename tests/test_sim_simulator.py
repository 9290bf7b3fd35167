"""The simulator drives the real RolloutController: modes keep (or, for partial, count) their
invariants, sync never overlaps rollout with training, runs are deterministic per seed."""

from __future__ import annotations

import json
import math

import pytest

from dora.observe.trace import TraceWriter
from dora.rl.rollout.types import Request, RequestState
from dora.sim.virtual_clock import VirtualClock
from dora.sim.costmodel import MODELS, CostModel
from dora.sim.sim_instance import SimInstance
from dora.sim.simulator import SimConfig, ideal, simulate
from dora.sim.workloads import PromptSource, TraceWorkload, WorkloadError, get_workload


def small(mode, **kw):
    base = dict(mode=mode, model="qwen2.5-1.5b", gpus=8, steps=12, train_batch=64, group_size=8, max_batch=16,
                kv_tokens=40000, tick_s=2.0, rollout={"rebalance_period_s": 5.0})
    base.update(kw)
    return SimConfig(**base)


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "partial", "dora", "partial_colocated", "partial_inflight"])
def test_modes_keep_their_invariants(mode):
    """With held-out evaluations placed as a run places them (dora/sim/sim_evals.py): they finish
    beside training and the training invariants are untouched (a colocated mode that trains while
    rollout generates fails the run)."""
    evals = True
    r = simulate(small(mode, **({"eval_every": 3, "eval_prompts": 16} if evals else {})))
    assert r.get("eval_requests", 0) >= (4 * 16 if evals else 0)
    # (the partial modes load every version at its publish: an evaluation longer than a step waits for the end)
    assert r.get("eval_versions_done", 0) >= (0 if mode.startswith("partial") else 3), r
    assert r["lost"] == 0 and r["c2_violations"] == 0 and r["c3_violations"] == 0
    assert r["trajectories_trained"] == 12 * 64
    k = {"sync": 0, "one_step_off": 1}.get(mode, 3)
    assert r["staleness_max"] <= k
    assert r["colocated"] == (mode in ("sync", "partial_colocated"))
    if mode.startswith("partial"):
        assert r["c1_violations"] > 0
        assert (r["reprefill_tokens"] > 0) == (mode != "partial_inflight")   # PipelineRL keeps the stale KV
    else:
        assert r["c1_violations"] == 0 and r["reprefill_tokens"] == 0
    for s in r["per_step"]:
        assert s["trajectories"] == 64


def test_dora_uses_several_versions_and_beats_sync_on_the_long_tail():
    d, s = simulate(small("dora")), simulate(small("sync"))
    assert d["versions_live_max"] >= 2
    assert d["tokens_per_s"] > s["tokens_per_s"]


def test_sync_never_overlaps_rollout_and_training():
    events = []

    def observe(ctl, trainer, instances):
        send = ctl.manager.dispatch

        def spy(*a, **kw):
            out = send(*a, **kw)
            if out:
                events.append(("dispatch", trainer.busy, ctl.clock.now()))
            return out
        ctl.manager.dispatch = spy
        start = trainer.maybe_start

        def spy_start():
            was = trainer.busy
            start()
            if trainer.busy and not was:
                events.append(("train", any(i.running or i.queue for i in instances), ctl.clock.now()))
        trainer.maybe_start = spy_start

    simulate(small("sync"), observer=observe)
    assert [e for e in events if e[0] == "dispatch"] and [e for e in events if e[0] == "train"]
    assert not any(busy for kind, busy, _ in events if kind == "dispatch"), "dispatched while training"
    assert not any(gen for kind, gen, _ in events if kind == "train"), "trained while generating"


def test_deterministic_per_seed():
    a, b = simulate(small("dora", seed=3)), simulate(small("dora", seed=3))
    assert a == b
    c = simulate(small("dora", seed=4))
    assert c["per_step"] != a["per_step"]


def test_trace_has_versions_training_and_weight_syncs(tmp_path):
    tw = TraceWriter()
    simulate(small("dora", steps=5), tw)
    path = tmp_path / "trace.json"
    tw.write(str(path))
    ev = json.loads(path.read_text())["traceEvents"]
    names = {e["name"] for e in ev}
    assert {"v0", "v1"} <= names
    assert any(n.startswith("train step") for n in names)
    assert any(n.startswith("load v") for n in names)
    assert all(e["dur"] >= 0 for e in ev if e["ph"] == "X")


def test_ideal_bounds_the_paper_setting():
    bound = ideal(SimConfig(gpus=64))["tokens_per_s"]
    for mode in ("sync", "dora"):
        r = simulate(SimConfig(mode=mode, gpus=64, steps=4))
        assert 0 < r["tokens_per_s"] < bound
        assert r["c1_violations"] == r["c2_violations"] == r["c3_violations"] == 0


def test_virtual_clock_orders_events():
    c, seen = VirtualClock(), []
    c.call_at(5, lambda: seen.append(5))
    c.call_at(1, lambda: seen.append(1))
    c.call_at(1, lambda: seen.append(1.5))
    c.sleep_until(3)
    assert seen == [1, 1.5] and c.now() == 3
    c.sleep_until(10)
    assert seen == [1, 1.5, 5]


def test_sim_instance_runs_exports_and_imports_without_reprefill():
    clock, done = VirtualClock(), []
    cost = CostModel(MODELS["qwen2.5-1.5b"])
    a = SimInstance("a", cost, clock, lambda n, f: done.extend(f))
    b = SimInstance("b", cost, clock, lambda n, f: done.extend(f))
    a.load_version(0)
    b.load_version(0)
    a.submit([Request("u1", "g", 0, 100, 1000), Request("u2", "g", 0, 100, 50)])
    clock.sleep_until(1e-9)
    while not done:
        clock.step()
    assert [f.uid for f in done] == ["u2"] and done[0].response_tokens == 50
    states = a.export(["u1"])
    assert states[0].has_kv and 0 < states[0].tokens_done < 1000
    b.import_(states)
    prefill_before = b.prefill_s
    while len(done) < 2:
        assert clock.step()
    assert done[1].uid == "u1" and done[1].response_tokens == 1000 and done[1].token_versions == (0,)
    assert b.prefill_s == prefill_before, "a request imported with its KV must not re-prefill"
    with pytest.raises(RuntimeError, match="version"):
        b.submit([Request("u3", "g", 7, 10, 10)])


def _capped_lognormal_mean(median: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for X lognormal(ln median, sigma), in closed form."""
    mu, phi = math.log(median), lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))
    z = (math.log(cap) - mu) / sigma
    return math.exp(mu + sigma ** 2 / 2) * phi(z - sigma) + cap * (1 - phi(z))


def test_workloads(tmp_path):
    spec = get_workload("dapo-math", None)
    w = spec.stats(n=20000)
    assert w.decoded == pytest.approx(_capped_lognormal_mean(spec.median, spec.sigma, spec.cap), rel=0.03)
    assert w.prompt == pytest.approx(_capped_lognormal_mean(spec.prompt_median, spec.prompt_sigma, spec.prompt_cap), rel=0.03)
    # the calibration target: a step of 8,192 trajectories holds the paper's throughput x step time
    assert 8192 * (w.prompt + w.decoded) == pytest.approx(19.5e6, rel=0.05)
    f = tmp_path / "t.jsonl"
    f.write_text('{"prompt_tokens": 10, "response_tokens": 20}\n{"prompt_tokens": 30, "response_tokens": 40}\n')
    groups = PromptSource(TraceWorkload(str(f)), 4, seed=1)(3)
    assert len(groups) == 3 and all(len(g) == 4 for g in groups)
    assert all(q.payload in (20, 40) and q.prompt_tokens in (10, 30) for g in groups for q in g)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_tokens": 10}\n')
    with pytest.raises(WorkloadError, match="bad.jsonl:1"):
        TraceWorkload(str(bad))
    with pytest.raises(WorkloadError, match="cannot read"):
        TraceWorkload(str(tmp_path / "missing.jsonl"))


def test_cost_model_is_calibrated_to_the_papers_sync_step():
    """The calibration docs/benchmarks.md writes down: training fitted to the paper's sync step
    (481 s at 64 GPUs, 328 s at 128 for ~19.5M tokens), a lone 30K-token trajectory (~790 s, the
    closed form lone_s agrees with summing decode steps), and decode time per step growing with
    the batch (roofline)."""
    c = CostModel(MODELS["qwen2.5-32b"])
    assert abs(c.train_s(19_470_000, 64) - 481) < 15 and abs(c.train_s(19_470_000, 128) - 328) < 15
    lone = sum(c.decode_step_s(1, 300 + t) for t in range(0, 30720, 64)) * 64
    assert 740 < lone < 840 and c.lone_s(300, 30720) == pytest.approx(lone + c.prefill_s(300), rel=0.01)
    steps = [c.decode_step_s(b, b * 2000) for b in (1, 16, 64, 256)]
    assert steps == sorted(steps) and steps[-1] / steps[0] < 3


def test_dapo_math_sync_matches_the_fitted_paper_cells():
    """The fitted cells of the validation table (benchmarks/simulator.py) at 64 GPUs: tokens per
    step within 5% of the paper's throughput x step time, sync's step time and rollout-only share
    within 10%."""
    r = simulate(SimConfig(mode="sync", gpus=64, steps=6))
    assert r["tokens_per_s"] * r["step_time_s"] == pytest.approx(14143 * 22.91 * 60, rel=0.05)
    assert r["step_time_s"] / 60 == pytest.approx(22.91, rel=0.10)
    assert r["rollout_only_fraction"] == pytest.approx(0.65, rel=0.10)


def test_imported_requests_resume_first_in_the_order_they_ran():
    clock, done = VirtualClock(), []
    cost = CostModel(MODELS["qwen2.5-1.5b"])
    a = SimInstance("a", cost, clock, lambda n, f: done.extend(f))
    a.slots = 1
    a.load_version(0)
    a.submit([Request("run", "g", 0, 10, 10_000), Request("queued", "g", 0, 10, 10)])
    states = [RequestState(u, "h", 0, 10, 5, False, 0, 100) for u in ("m1", "m2", "m3")]
    a.import_(states)
    assert list(a.queue) == ["m1", "m2", "m3", "queued"]


def test_imports_that_wait_for_room_pay_the_host_reload_when_admitted():
    """A migrated request that does not fit waits with its KV in host memory; admitting it later
    stalls the instance for the host -> GPU copy (free parking would flatter migration)."""
    clock, done = VirtualClock(), []
    cost = CostModel(MODELS["qwen2.5-1.5b"])
    a = SimInstance("a", cost, clock, lambda n, f: done.extend(f))
    a.slots = 1
    a.load_version(0)
    kv = lambda tokens: tokens * cost.model.kv_bytes_per_token  # noqa: E731
    states = [RequestState(u, "g", 0, 100, 400, True, kv(500), 450) for u in ("first", "waits")]
    a.import_(states)
    transfer = cost.kv_transfer_s(2 * kv(500))
    assert a.kv_import_s == pytest.approx(transfer) and list(a.queue) == ["waits"]
    while len(done) < 2:
        assert clock.step()
    assert [f.uid for f in done] == ["first", "waits"] and a.prefill_s == 0
    assert a.kv_import_s == pytest.approx(transfer + cost.kv_reload_s(kv(500)))


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "partial", "dora"])
def test_dropped_groups_are_replaced_in_the_simulator(mode):
    r = simulate(small(mode, steps=8, drop_groups=0.3))
    assert r["dropped"] > 0 and r["lost"] == 0 and r["c2_violations"] == 0 and r["c3_violations"] == 0
    assert r["trajectories_trained"] == 8 * 64 and all(s["trajectories"] == 64 for s in r["per_step"])


def test_multi_turn_requests_free_their_slot_during_tool_waits_and_survive_migration():
    """A Turns plan: turn 1, a tool call (slot free, KV parked in host), turn 2 with the tool's
    output prefilled on top of the reloaded context; exported mid-wait it resumes elsewhere when
    the tool returns. The trained response counts generated and tool tokens."""
    from dora.sim.workloads import Turns
    clock, done = VirtualClock(), []
    cost = CostModel(MODELS["qwen2.5-1.5b"])
    a = SimInstance("a", cost, clock, lambda n, f: done.extend(f))
    b = SimInstance("b", cost, clock, lambda n, f: done.extend(f))
    for i in (a, b):
        i.load_version(0)
    plan = Turns([(100, 50.0, 30), (40, 0.0, 0)])
    a.submit([Request("u", "g", 0, 20, plan)])
    while not a.waiting:
        assert clock.step()
    assert not a.running and a.waiting["u"].done0 == 100
    t_wait = clock.now()
    [st] = a.export(["u"])
    assert st.resume_at == pytest.approx(t_wait + 50.0) and st.tokens_done == 100 and st.has_kv
    b.import_([st])
    assert "u" in b.waiting
    while not done:
        assert clock.step()
    assert clock.now() > t_wait + 50.0
    assert done[0].uid == "u" and done[0].response_tokens == 100 + 30 + 40 and done[0].token_versions == (0,)
    assert b.tool_reload_s > 0 and b.reprefill_tokens == 0


def test_turns_bookkeeping():
    from dora.sim.workloads import Turns
    t = Turns([(10, 1.0, 5), (20, 2.0, 7), (30, 0.0, 0)])
    assert t.output_tokens == 60 and t.tool_tokens == 12
    assert [t.turn_end(d) for d in (0, 9, 10, 29, 30, 59)] == [10, 10, 30, 30, 60, 60]
    assert t.wait_after(10) == 1.0 and t.wait_after(30) == 2.0 and t.wait_after(15) == 0.0
    assert t.tool_tokens_before(10, waiting=True) == 0 and t.tool_tokens_before(10, waiting=False) == 5
    assert t.tool_tokens_before(45, waiting=False) == 12


def test_bubble_counts_idle_slots_not_only_idle_instances():
    """An instance decoding one sequence with an empty cache is mostly idle: sync, tail-bound,
    shows a large bubble; the same definition for every mode."""
    s, d = simulate(small("sync")), simulate(small("dora"))
    assert s["bubble_fraction"] > 0.3 and d["bubble_fraction"] < s["bubble_fraction"]


def test_ideal_reports_capacity_and_latency_bounds():
    big = ideal(SimConfig(gpus=4096, train_batch=8192, max_staleness=1))
    assert big["bound"] == "latency" and big["step_time_s"] == big["latency_floor_step_s"] > big["capacity_step_s"]
    cost = CostModel(MODELS["qwen2.5-32b"])
    assert big["latency_floor_step_s"] == pytest.approx(big["longest_alone_s"] / 2)
    assert big["longest_alone_s"] >= cost.lone_s(16, 30720) * 0.9
    small_k = ideal(SimConfig(gpus=64, max_staleness=0))
    assert small_k["latency_floor_step_s"] > small_k["longest_alone_s"]       # K=0: then training


@pytest.mark.parametrize("name", ["longtail-64k", "sigma-2.0", "agentic"])
def test_every_shipped_workload_runs_with_its_invariants(name):
    r = simulate(small("dora", workload=name, steps=4, kv_tokens=400000))
    assert r["lost"] == 0 and r["c1_violations"] == r["c2_violations"] == r["c3_violations"] == 0
    assert r["trajectories_trained"] == 4 * 64


def test_offloaded_preemptions_keep_their_kv_in_host_memory():
    """SimConfig.kv_offload: a preempted request's KV goes to host memory and comes back (kv_import_s)
    instead of being recomputed on readmission (re-prefill); nothing is lost either way."""
    engines = {}
    for offload in (False, True):
        r = simulate(small("dora", steps=3, kv_tokens=12000, kv_offload=offload),
                     observer=lambda c, t, inst, o=offload: engines.__setitem__(o, inst))
        assert r["preemptions"] > 0 and r["lost"] == r["c1_violations"] == 0
        assert r["trajectories_trained"] == 3 * 64
    recompute, offload = engines[False], engines[True]
    assert sum(i.reprefill_tokens for i in recompute) > 0 and sum(i.reprefill_tokens for i in offload) == 0
    assert sum(i.kv_import_s for i in offload) > sum(i.kv_import_s for i in recompute)
