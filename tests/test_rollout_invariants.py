"""The rollout control code under forced chaos: many versions, publishes, rebalances and
migrations, driven by in-memory instances (no simulator). Every uid must be accounted for once,
every trained group whole, C1/C3 kept (partial: C1 broken and counted), the window within K."""

from __future__ import annotations

import collections
import random

import pytest

from dora.rl.rollout import (Finished, InstanceStats, Request, RequestState, RolloutConfig, Trajectory,
                                  RolloutConfigError, RolloutController, partition)


class Clock:
    def __init__(self):
        self.t = 0.0

    def now(self):
        return self.t

    def sleep_until(self, t):
        self.t = max(self.t, t)


class FakeInstance:
    """Instant in-memory engine: requests advance when the test says so. Checks C1 at the door."""

    def __init__(self, name, slots=8):
        self.name, self.version, self.slots = name, None, slots
        self.reqs: dict[str, dict] = {}
        self.imported_with_kv = 0
        self.eval_aborted: list[str] = []

    def load_version(self, v):
        self.abort_evals()   # (the generate op's rule: evaluation requests never hold up a load)
        assert not self.reqs, f"{self.name}: load_version with requests inside"
        self.version = v

    def abort_evals(self):
        """Held-out evaluation requests leave (reported back, as the generate op's eval_aborted)."""
        gone = [u for u in self.reqs if u.startswith("eval:")]
        for u in gone:
            del self.reqs[u]
        self.eval_aborted += gone

    def abort(self, uids):
        """The control code drops these evaluation requests (not reported back)."""
        gone = [u for u in uids if u in self.reqs]
        for u in gone:
            del self.reqs[u]
        return gone

    def hosted(self):
        """Its current version and the versions of the requests on it."""
        return {s["r"].version for s in self.reqs.values()} | ({self.version} - {None})

    def holds(self, v):
        return v == self.version

    def submit(self, reqs):
        for r in reqs:
            assert r.version == self.version, "C1: request version != instance version"
            self.reqs[r.uid] = {"r": r, "done": 0, "target": r.payload, "versions": set()}

    def export(self, uids):
        out = []
        for u in uids:
            s = self.reqs.pop(u)
            out.append(RequestState(u, s["r"].group_id, s["r"].version, s["r"].prompt_tokens, s["done"], True,
                                    s["done"] * 10, s["target"], tuple(sorted(s["versions"]))))
        return out

    def import_(self, states):
        for st in states:
            assert self.holds(st.version), "C1: imported state of a version the instance does not hold"
            self.imported_with_kv += st.has_kv
            r = Request(st.uid, st.group_id, st.version, st.prompt_tokens, st.payload)
            self.reqs[st.uid] = {"r": r, "done": st.tokens_done, "target": st.payload, "versions": set(st.token_versions)}

    def load_version_in_flight(self, v):
        for s in self.reqs.values():       # keeps going, its next tokens on v (partial_inflight)
            s["r"].version = v
        self.version = v

    def interrupt_all(self):
        self.abort_evals()
        out = self.export(list(self.reqs))
        for s in out:
            s.has_kv = False
        return out

    def stats(self):
        n = len(self.reqs)
        return InstanceStats(min(n, self.slots), max(0, n - self.slots), self.slots, min(1.0, n / (2 * self.slots)))

    def progress(self, rng):
        """Advance the first `slots` requests by a random amount; return the finished ones."""
        done = []
        for u, s in list(self.reqs.items())[: self.slots]:
            step = rng.randint(0, 40)
            if step:
                s["versions"].add(s["r"].version)      # each request decodes on its own version's weights
            s["done"] = min(s["target"], s["done"] + step)
            if s["done"] >= s["target"]:
                del self.reqs[u]
                done.append(Finished(u, s["target"], tuple(sorted(s["versions"]))))
        return done


def make_prompts(g, rng):
    counter = [0]

    def take(n):
        out = []
        for _ in range(n):
            gid = f"g{counter[0]}"
            counter[0] += 1
            out.append([Request(f"{gid}.{j}", gid, -1, 10, rng.choice([5, 20, 60, 300])) for j in range(g)])
        return out
    return take, counter


class Evals:
    """Held-out evaluations as the RL driver runs them (dora/rl/evaluation.py): 6 requests for every
    `every`-th version, added before the mode hears of the version; the older ones then due."""

    def __init__(self, c, every, rng, sync):
        self.c, self.every, self.rng, self.sync = c, every, rng, sync
        self.added: dict[str, int] = {}
        self.finished: collections.Counter = collections.Counter()

    def publish(self, version):
        if self.every and version % self.every == 0:
            self.c.evals.make_due(version - 1)
            reqs = [Request(f"eval:s:v{version}:{i}-0", f"eval:s:v{version}:{i}", version, 10,
                            self.rng.choice([5, 20, 60])) for i in range(6)]
            self.added.update({r.uid: version for r in reqs})
            self.c.evals.add(version, reqs, due=self.sync)

    def split(self, fin):
        """Training completions; the evaluation ones go to EvalWork."""
        ev = [f.uid for f in fin if f.uid.startswith("eval:")]
        self.finished.update(ev)
        self.c.evals.finished(ev)
        return [f for f in fin if not f.uid.startswith("eval:")]

    def aborted(self, insts):
        for i in insts:
            if i.eval_aborted:
                self.c.evals.aborted(i.eval_aborted)
                i.eval_aborted = []


def run_chaos(mode, seed, steps=30, n_inst=5, g=4, tbs=16, k=3, elastic=0, versions=1, make=FakeInstance,
              evals_every=0):
    """`elastic`: that many extra instances are lent while the trainer waits and reclaimed (their
    requests moved off) once its batch is ready. `versions`: versions_per_instance, with instances
    built by `make`. `evals_every`: held-out evaluations of every N-th version, finished after the
    last step (c.held_out: what was added and finished)."""
    rng = random.Random(seed)
    clock = Clock()
    insts = [make(f"i{j}") for j in range(n_inst)]
    spare = [make(f"e{j}") for j in range(elastic)]
    lent = False
    take, counter = make_prompts(g, rng)
    cfg = RolloutConfig(mode=mode, train_batch=tbs, group_size=g, max_staleness=k, rebalance_period_s=1.0,
                        versions_per_instance=versions)
    c = RolloutController(cfg, insts, take, clock)
    ev = c.held_out = Evals(c, evals_every, rng, mode == "sync")
    ev.publish(0)
    c.start()
    trained: list[str] = []
    batches = []
    training = None                       # (step, uids, done_at)
    version = 0
    publish_at = None
    kk = c.cfg.max_staleness
    for _ in range(20000):
        if len(batches) >= steps:
            break
        clock.t += rng.uniform(0.1, 2.0)
        inst = rng.choice(insts + (spare if lent else []))
        fin = ev.split(inst.progress(rng))
        if fin:
            c.on_finished(inst.name, fin)
        ev.aborted(insts + spare)
        if rng.random() < 0.3:
            c.tick()
        if rng.random() < 0.1:
            c.rebalance()                 # forced extra rebalances: many migrations
        if spare and training is None:
            if lent and c.trainer_ready():
                c.reclaim()
                assert not any(i.reqs for i in spare), "a reclaimed device still holds requests"
                lent = False
            elif not lent and not c.trainer_ready() and rng.random() < 0.5:
                c.lend(spare)
                lent = True
        if training is None and c.trainer_ready() and not lent:
            batch = c.take_batch()
            step = len(batches)
            batches.append((step, batch))
            training = (step, [t.uid for t in batch], clock.t + rng.uniform(1, 20))
        if training is not None and clock.t >= training[2]:
            step, uids, _ = training
            trained.extend(uids)
            version = step + 1
            c.on_trained(step, version, uids)
            training = None
            publish_at = clock.t + rng.uniform(0, 3)
        if publish_at is not None and clock.t >= publish_at:
            ev.publish(version)
            c.on_published(version)
            publish_at = None
        # the window: nothing untrained is older than the next step can still take
        live = c.queue.versions_untrained()
        if live:
            assert min(live) >= c.queue.next_step - kk
            assert max(live) - min(live) <= kk
        for i in insts + spare:            # every request sits on an instance holding its own version
            assert len(i.hosted()) <= versions, f"{i.name} hosts {sorted(i.hosted())}"
            assert all(i.holds(s["r"].version) for s in i.reqs.values())
    assert len(batches) >= steps, f"{mode}: only {len(batches)} steps (stuck?)"
    if evals_every:   # training is over: the evaluations still out become due and finish
        if training is not None:   # (the last step ends and its weights are published, as in a run)
            step, uids, _ = training
            trained.extend(uids)
            c.on_trained(step, step + 1, uids)
            c.on_published(step + 1)
        c.evals.make_due()
        c.manager.exhausted = True
        for _ in range(20000):
            if not c.evals.busy():
                break
            inst = rng.choice(insts)
            fin = ev.split(inst.progress(rng))
            c.on_finished(inst.name, fin)
            ev.aborted(insts)
            c.tick()
        assert not c.evals.busy(), f"{mode}: evaluations left {c.evals.versions()}"
    return c, batches, trained, counter[0] * g, insts + spare


@pytest.mark.parametrize("mode, seed, elastic", [
    (m, s, e) for m in ("sync", "one_step_off", "partial", "dora") for s, e in [(0, 0), (1, 0), (2, 0), (3, 2), (4, 3)]]
    + [(m, s, e) for m in ("partial_colocated", "partial_inflight") for s, e in [(0, 0), (3, 2)]])
def test_invariants_under_chaos(mode, seed, elastic):
    c, batches, trained, dispatched_n, insts = run_chaos(mode, seed, elastic=elastic)
    k = c.cfg.max_staleness
    assert len(trained) == len(set(trained)), "a trajectory was trained twice"
    for step, batch in batches:
        assert len(batch) == c.cfg.train_batch
        per_group = collections.Counter(t.group_id for t in batch)
        assert set(per_group.values()) == {c.cfg.group_size}, "a group was split across steps"
        for t in batch:
            assert 0 <= step - t.version <= k, f"C3: staleness {step - t.version} > {k}"
        gv = collections.defaultdict(set)
        for t in batch:
            gv[t.group_id].add(t.version)
        assert all(len(v) == 1 for v in gv.values()), "a group mixes versions"
    s = c.finish()
    assert s["lost"] == 0 and s["c2_violations"] == 0 and s["c3_violations"] == 0
    assert s["dispatched"] == dispatched_n
    assert s["trained"] + s["finished_untrained"] + s["in_flight_at_end"] + s["in_training_at_end"] == dispatched_n
    in_flight = sum(len(i.reqs) for i in insts) + c.dispatch.held() + c.policy.held()
    assert in_flight == s["in_flight_at_end"]
    c1 = sum(m.c1_violations for m in c.step_metrics)
    if mode.startswith("partial"):
        assert c1 > 0, f"{mode} must break C1 at publishes"
        # partial and partial_colocated resume under the new weights with a re-prefill; partial_inflight keeps the KV
        assert (s["reprefill_tokens"] > 0) == (mode != "partial_inflight"), s["reprefill_tokens"]
    else:
        assert c1 == 0 and s["c1_violations"] == 0
    if mode == "sync":
        assert all(m.staleness_max == 0 for m in c.step_metrics)
    if mode == "one_step_off":
        assert all(m.staleness_max <= 1 for m in c.step_metrics)


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "partial", "dora", "partial_colocated"])
def test_held_out_evaluations_finish_on_their_version_outside_the_books(mode):
    """Evaluation requests fill what training leaves, on instances of their own version (the fake's
    submit asserts it), are aborted by loads and placed again, and all finish; the training books
    hold none of them and their invariants are those of a run without evaluation."""
    c, batches, trained, dispatched_n, insts = run_chaos(mode, 11, steps=16, evals_every=4, versions=1)
    ev = c.held_out
    assert set(ev.finished) == set(ev.added) and len(ev.added) == 6 * 4   # versions 0, 4, 8, 12
    assert max(ev.finished.values()) == 1, "an evaluation request finished twice"
    s = c.finish()
    assert s["lost"] == 0 and s["dispatched"] == dispatched_n and s["c2_violations"] == 0
    assert s["trained"] + s["finished_untrained"] + s["in_flight_at_end"] + s["in_training_at_end"] == dispatched_n
    assert not any(u.startswith("eval:") for u in trained)
    assert all(len(b) == c.cfg.train_batch for _, b in batches)


def test_dora_chaos_migrates_and_runs_several_versions():
    c, *_ = run_chaos("dora", 7, steps=40)
    assert c.totals["migrated_requests"] > 0
    assert max(m.versions_live for m in c.step_metrics) >= 2


def test_partition_never_zero_for_live_versions():
    assert partition(4, {0: 1, 1: 1000}) == {0: 1, 1: 3}
    assert sum(partition(16, {0: 3, 1: 50, 2: 700}).values()) == 16
    out = partition(3, {0: 1, 1: 1, 2: 5000})
    assert out[0] == 1 and out[1] == 1 and out[2] == 1
    assert partition(4, {}) == {}


def test_zero_share_version_keeps_an_instance_and_loses_nothing():
    clock = Clock()
    insts = [FakeInstance(f"i{j}", slots=100) for j in range(3)]
    rng = random.Random(0)
    take, _ = make_prompts(4, rng)
    cfg = RolloutConfig(mode="dora", train_batch=8, rollout_batch=8, group_size=4, max_staleness=3)
    c = RolloutController(cfg, insts, take, clock)
    c.start()
    before = {u for i in insts for u in i.reqs}
    assert len(before) == 8
    c.on_published(1)                 # version 1: by proportion version 0 would get 0 instances
    c.on_published(2)
    after_v0 = [u for i in insts if i.version == 0 for u in i.reqs]
    assert before <= set(after_v0), "version 0's requests must stay on a version-0 instance"
    assert sum(1 for i in insts if i.version == 0) >= 1
    assert all(s["r"].version == i.version for i in insts for s in i.reqs.values())


def test_release_migrates_with_kv_to_same_version():
    clock = Clock()
    insts = [FakeInstance(f"i{j}", slots=100) for j in range(4)]
    take, _ = make_prompts(4, random.Random(1))
    cfg = RolloutConfig(mode="dora", train_batch=8, rollout_batch=32, group_size=4, max_staleness=3,
                        queue_allowance_groups=0)
    c = RolloutController(cfg, insts, take, clock)
    c.start()                         # version 0 requests spread over 4 instances
    n0 = sum(len(i.reqs) for i in insts)
    assert n0 == 32
    for i in insts:                   # half of them finish: room for version 1's prompts
        fin = [Finished(u) for u in list(i.reqs)[:4]]
        for f in fin:
            del i.reqs[f.uid]
        c.on_finished(i.name, fin)
    c.on_published(1)                 # version 1 gets a share: version 0 consolidates
    v0 = [i for i in insts if i.version == 0]
    assert 1 <= len(v0) < 4
    assert sum(len(i.reqs) for i in v0) == 16
    assert any(i.version == 1 and i.reqs for i in insts)
    assert c.totals["migrated_requests"] > 0
    assert sum(i.imported_with_kv for i in insts) == c.totals["migrated_requests"]


def test_config_errors():
    with pytest.raises(RolloutConfigError, match="multiple of group_size"):
        RolloutConfig(train_batch=10, group_size=4).resolved()
    with pytest.raises(RolloutConfigError, match="unknown rollout mode"):
        RolloutConfig(mode="fast").resolved()
    with pytest.raises(RolloutConfigError, match=">= train_batch"):
        RolloutConfig(mode="dora", train_batch=16, rollout_batch=8, group_size=4).resolved()
    assert RolloutConfig(mode="sync", max_staleness=5, train_batch=8, group_size=4).resolved().max_staleness == 0


def run_with_drops(mode, seed, steps=25, n_inst=5, g=4, tbs=16, k=3, p_drop=0.3):
    """Like run_chaos, with a filter that drops whole groups (DAPO dynamic sampling): finished
    groups in the queue, groups with members still generating, and groups inside a batch that
    was taken but is still being scored (that batch is revoked and taken again)."""
    rng = random.Random(seed)
    clock = Clock()
    insts = [FakeInstance(f"i{j}") for j in range(n_inst)]
    take, counter = make_prompts(g, rng)
    c = RolloutController(RolloutConfig(mode=mode, train_batch=tbs, group_size=g, max_staleness=k,
                                        rebalance_period_s=1.0), insts, take, clock)
    c.start()
    finished: dict[str, set[str]] = collections.defaultdict(set)
    dropped_groups: set[str] = set()
    batches, trained = [], []
    pending = None                        # (step, batch, scored_at): taken, being scored
    training = None                       # (step, uids, done_at)
    publish_at, version, revocations = None, 0, 0

    def drop(gid, reason):
        nonlocal pending, revocations
        members = [f"{gid}.{j}" for j in range(g)]
        dropped_groups.add(gid)
        revoked = c.on_dropped(members, reason)
        if pending is not None and any(t.group_id == gid for t in pending[1]):
            assert revoked == [pending[0]], "a batch holding a dropped group must be revoked"
            pending, revocations = None, revocations + 1
        else:
            assert revoked == []

    for _ in range(40000):
        if len(batches) >= steps:
            break
        clock.t += rng.uniform(0.1, 2.0)
        inst = rng.choice(insts)
        fin = inst.progress(rng)
        if fin:
            c.on_finished(inst.name, fin)
            for f in fin:
                gid = f.uid.rsplit(".", 1)[0]
                finished[gid].add(f.uid)
                if len(finished[gid]) == g and gid not in dropped_groups and rng.random() < p_drop:
                    drop(gid, "filtered")          # all G rewards equal: the filter drops the group
        if rng.random() < 0.05:                    # a group with members still generating
            part = [gid for gid, us in finished.items() if 0 < len(us) < g and gid not in dropped_groups]
            if part:
                drop(rng.choice(part), "partial")
        if pending is not None and rng.random() < 0.2:   # a group of the batch being scored
            drop(rng.choice(pending[1]).group_id, "filtered")
        if rng.random() < 0.3:
            c.tick()
        if rng.random() < 0.1:
            c.rebalance()
        if pending is None and training is None and c.trainer_ready():
            step = len(batches)
            batch = c.take_batch()
            assert c.queue.next_step == step + 1
            pending = (step, batch, clock.t + rng.uniform(0, 3))
        if pending is not None and training is None and clock.t >= pending[2]:
            step, batch, _ = pending
            pending = None
            batches.append((step, batch))
            training = (step, [t.uid for t in batch], clock.t + rng.uniform(1, 20))
        if training is not None and clock.t >= training[2]:
            step, uids, _ = training
            trained.extend(uids)
            version = step + 1
            c.on_trained(step, version, uids)
            training = None
            publish_at = clock.t + rng.uniform(0, 3)
        if publish_at is not None and clock.t >= publish_at:
            c.on_published(version)
            publish_at = None
    assert len(batches) >= steps, f"{mode}: only {len(batches)} steps with drops (replacements not dispatched?)"
    return c, batches, trained, counter[0] * g, insts, finished, dropped_groups, revocations


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "partial", "dora"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dropped_groups_are_replaced_never_trained_and_accounted(mode, seed):
    c, batches, trained, dispatched_n, insts, finished, dropped_groups, revocations = run_with_drops(mode, seed)
    k = c.cfg.max_staleness
    assert len(trained) == len(set(trained))
    assert not {u.rsplit(".", 1)[0] for u in trained} & dropped_groups, "a dropped group was trained"
    for step, batch in batches:
        assert len(batch) == c.cfg.train_batch, "every step trains exactly TBS despite the drops"
        assert set(collections.Counter(t.group_id for t in batch).values()) == {c.cfg.group_size}
        assert all(0 <= step - t.version <= k for t in batch)
    assert [m.trajectories for m in c.step_metrics] == [c.cfg.train_batch] * len(c.step_metrics)
    s = c.finish()
    want_dropped = sum(len(finished[gid]) for gid in dropped_groups)
    assert s["dropped"] == want_dropped > 0
    assert sum(s["dropped_by_reason"].values()) == s["dropped"]
    assert set(s["dropped_by_reason"]) <= {"filtered", "partial"}
    assert sum(m.dropped for m in c.step_metrics) <= s["dropped"]
    assert s["lost"] == 0 and s["c2_violations"] == 0 and s["c3_violations"] == 0
    assert s["dispatched"] == dispatched_n
    assert (s["trained"] + s["finished_untrained"] + s["in_flight_at_end"] + s["in_training_at_end"]
            + s["dropped"]) == dispatched_n
    assert s["in_flight_at_end"] == sum(len(i.reqs) for i in insts) + c.dispatch.held()
    if mode != "partial":
        assert s["c1_violations"] == 0
    # a repeated or unknown drop changes nothing but the unknown counter
    before = c.finish()["dropped"]
    c.on_dropped(["nope.0"], "filtered")
    c.on_dropped([f"{next(iter(dropped_groups))}.0"], "filtered")
    assert c.finish()["dropped"] == before and c.totals["dropped_unknown"] == 1


def test_drops_revoke_taken_batches():
    revs = sum(run_with_drops("dora", seed)[7] for seed in range(3))
    assert revs > 0, "the harness must exercise revoking a taken batch"


def test_speed_model_spreads_as_far_as_the_fixed_cost_allows():
    """Iteration = fixed + per-request part: the fit recovers the fixed part from reports, and the
    batch asked for makes each request sigma times faster; when even alone it could not be, no
    spreading (it would cost throughput and still miss the deadline)."""
    from dora.rl.rollout.speed import SpeedModel
    sm = SpeedModel()
    for active, kv in [(200, 0.9), (100, 0.5), (50, 0.6), (10, 0.2), (150, 0.3), (30, 0.9)]:
        sm.observe(InstanceStats(active, 0, 256, kv, step_s=0.025 + 0.0001 * active + 0.02 * kv))
    assert sm.fixed_s() == pytest.approx(0.025, rel=1e-6)
    step = 0.025 + 0.0001 * 200 + 0.02 * 0.9               # 0.063 s at 200 requests
    b = sm.batch_for(200, step, 1.5)
    assert 0.025 + (step - 0.025) * b / 200 <= step / 1.5 < 0.025 + (step - 0.025) * (b + 1) / 200
    assert sm.batch_for(200, step, 3.0) == 200 and sm.batch_for(200, step, 1.0) == 200


def test_deadlines_come_from_the_trainers_pace():
    """Version v must be complete when step v+K starts: estimated from the trainer's own step time
    (waits excluded) and whether it is training now; a request may start on a version only if the
    longest generation measured would still end in time."""
    clock = Clock()
    insts = [FakeInstance(f"i{j}", slots=8) for j in range(2)]
    take, _ = make_prompts(4, random.Random(0))
    c = RolloutController(RolloutConfig(mode="dora", train_batch=8, group_size=4, max_staleness=2), insts, take, clock)
    c.start()
    dl = c.policy.deadlines
    assert dl.deadline(0) == float("inf")                   # no pace before the first step
    for i in insts:                                         # finish everything: a batch is ready
        c.on_finished(i.name, [Finished(u, 10) for u in list(i.reqs)])
        i.reqs.clear()
    clock.t = 30.0
    c.take_batch()                                          # waited 30 s
    clock.t = 130.0
    c.on_trained(0, 1, [u for u in c.ledger.taken[0]])      # step 0: 130 s, 30 of them waiting
    assert dl.pace() == 100.0
    assert c.queue.next_step == 1 and not c.ledger.taken    # idle: step 1 could start now
    assert dl.deadline(0) == 130.0 + (0 + 2 - 1) * 100.0
    c.ledger.gen_max[-1] = 150.0
    assert not dl.can_start(0) and dl.can_start(1)


def test_dropping_a_group_that_has_not_started_keeps_the_accounting():
    clock = Clock()
    insts = [FakeInstance(f"i{j}", slots=4) for j in range(2)]
    take, _ = make_prompts(4, random.Random(3))
    c = RolloutController(RolloutConfig(mode="dora", train_batch=8, rollout_batch=16, group_size=4),
                          insts, take, clock)
    c.start()
    queued = [u for i in insts for u in list(i.reqs)[4:]]      # beyond the slots: not started
    gid = queued[0].rsplit(".", 1)[0]
    assert c.on_dropped([queued[0]], "filtered") == []
    c.on_published(1)                                           # retag must leave the dropped group alone
    c.on_published(2)
    for _ in range(200):
        for i in insts:
            fin = i.progress(random.Random(len(i.reqs)))
            if fin:
                c.on_finished(i.name, fin)
    s = c.finish()
    assert s["lost"] == 0 and s["c2_violations"] == 0
    still = [u for i in insts for u in i.reqs if u.rsplit(".", 1)[0] == gid]
    assert s["dropped"] == 4 - len(still) and s["dropped_by_reason"].get("filtered", 0) == s["dropped"]
    assert s["dropped"] > 0


def test_every_rollout_policy_runs_in_the_controller():
    """The modes are the registered policies (dora validate takes async.mode's names from them)."""
    from dora.rl.rollout import POLICIES
    assert POLICIES.names()[:4] == ["sync", "one_step_off", "partial", "dora"]
    for mode in POLICIES.names():
        c = RolloutController(RolloutConfig(mode=mode, train_batch=8, group_size=4, max_staleness=2),
                              [FakeInstance("i0")], make_prompts(4, random.Random(0))[0], Clock())
        assert type(c.policy) is POLICIES[mode] and c.policy.name == mode


@pytest.mark.parametrize("mode", ["sync", "partial", "dora"])
def test_a_lost_instance_drops_its_groups_whole_and_a_restored_batch_trains(mode):
    """instance_replaced: the groups it held are dropped whole (members elsewhere discarded when they
    finish), counted under the reason, never lost; the new process takes the newest version first.
    restore_finished: finished-untrained trajectories of a resumed run form a batch again."""
    rng, clock = random.Random(1), Clock()
    insts = [FakeInstance(f"i{j}", slots=4) for j in range(2)]
    take, _ = make_prompts(4, rng)
    c = RolloutController(RolloutConfig(mode=mode, train_batch=8, group_size=4, max_staleness=2), insts, take, clock)
    c.start()
    held = list(insts[0].reqs)
    assert held
    insts[0].reqs.clear()                                     # the process is gone with them
    insts[0].version = -1                                     # its replacement holds no served version yet
    gids, revoked = c.instance_replaced("i0")
    assert insts[0].version == c.newest
    assert gids == sorted({u.split(".")[0] for u in held}) and revoked == []
    for _ in range(200):                                      # run everything out
        clock.t += 1
        for i in insts:
            c.on_finished(i.name, i.progress(rng))
        if c.trainer_ready():
            batch = c.take_batch()
            assert not {t.group_id for t in batch} & set(gids), "a lost group was trained"
            c.on_trained(c.queue.next_step - 1, c.newest + 1, [t.uid for t in batch])
            c.on_published(c.newest + 1)
        c.tick()
    s = c.finish()
    assert s["lost"] == 0 and s["c2_violations"] == 0 and s["dropped_by_reason"]["replica_lost"] == 4 * len(gids)
    # resume: a fresh controller gets two finished groups back and trains them as one batch
    fresh = RolloutController(RolloutConfig(mode=mode, train_batch=8, group_size=4, max_staleness=2),
                              [FakeInstance("j0")], lambda n: [], clock, initial_version=5)
    fresh.restore_finished([Trajectory(f"r{g}.{j}", f"r{g}", 5, 10, 20, (5,), clock.t) for g in range(2) for j in range(4)])
    assert fresh.trainer_ready() and {t.uid for t in fresh.take_batch()} == {f"r{g}.{j}" for g in range(2) for j in range(4)}


@pytest.mark.parametrize("publish_first", [True, False])
def test_partial_colocated_stops_rollout_while_the_trainer_steps(publish_first):
    """The training barrier: the take interrupts every request (tokens kept) and nothing runs until
    the step is over and its weights are published, in either order (a run's trainer publishes
    before it reports its step, the simulator's after); then all resume under the new version."""
    rng, clock = random.Random(0), Clock()
    insts = [FakeInstance(f"i{j}", slots=4) for j in range(2)]
    c = RolloutController(RolloutConfig(mode="partial_colocated", train_batch=8, group_size=4, max_staleness=2),
                          insts, make_prompts(4, rng)[0], clock)
    c.start()
    while not c.trainer_ready():
        clock.t += 1
        for i in insts:
            c.on_finished(i.name, i.progress(rng))
    evals = [Request(f"eval:s:v0:{j}-0", f"eval:s:v0:{j}", 0, 10, 50) for j in range(3)]
    c.evals.add(0, evals, due=True)   # (due: placed behind training work)
    c.tick()
    assert any(u.startswith("eval:") for i in insts for u in i.reqs)
    batch = c.take_batch()
    paused = c.policy.held()
    assert paused and not any(i.reqs for i in insts), "rollout (or an evaluation) still runs while the trainer steps"
    assert c.evals.busy() and len(c.evals.pending[0]) == 3, "the evaluation waits for the barrier to lift"
    c.tick()
    assert not any(i.reqs for i in insts), "dispatched while the trainer steps"
    events = [lambda: c.on_published(1), lambda: c.on_trained(0, 1, [t.uid for t in batch])]
    events[0 if publish_first else 1]()
    assert not any(i.reqs for i in insts)
    events[1 if publish_first else 0]()
    assert c.policy.held() == 0 and sum(len(i.reqs) for i in insts if not i.name.startswith("eval")) >= paused
    assert all(i.version == 1 for i in insts) and all(s["r"].version == 1 for i in insts for s in i.reqs.values())
