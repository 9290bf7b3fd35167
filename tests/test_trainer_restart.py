"""issue 22, item 2: a trainer that dies restarts itself inside the same `dora run`, from the run's
last complete checkpoint (dora/rl/trainer_restart.py), up to run.max_restarts; with 0 the run fails
as before, saying why. A real `dora run` subprocess on the cut-down quickstart (tests/test_run_lifecycle.py)."""

from __future__ import annotations

import json
import os
import signal
import time
from types import SimpleNamespace

import pytest

from dora.rl import trainer_restart
from dora.rl.run_accounting import merge
from tests.test_run_lifecycle import DORA, _audit_exact, _ledger, _replica_pid, start, wait_for_steps


@pytest.mark.chaos
def test_sigkilled_trainer_rank_restarts_from_its_checkpoint_and_the_run_tells_one_lineage(tmp_path):
    """dora mode, a trainer of 2 ranks: its leader SIGKILLed after step 3 (checkpoints every 2 steps).
    The run finishes all 10 steps by itself; the steps after the checkpoint are rolled back, every uid
    is trained once, each step is in metrics.jsonl once, and what the restart dropped is accounted."""
    # 10 steps: a 6-step run (~8 s) could finish its last step before the kill landed (1 in 4 runs)
    out, steps = tmp_path / "run", 10
    p = start(out, *DORA, "run.save_every=2", "nodes.train.replicas=2", "pools.train.count=2", steps=steps)
    wait_for_steps(p, out, 3)
    os.kill(_replica_pid(p.pid, "train", 0), signal.SIGKILL)
    done_at_kill = len((out / "metrics.jsonl").read_text().splitlines())
    assert p.wait(timeout=300) == 0, p.stdout.read()
    summary = _audit_exact(out, steps, 16, 2)
    acc = summary["accounting"]
    assert summary["trainer_restarts"] == acc["trainer_restarts"] == 1
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == list(range(1, steps + 1))
    assert acc["dropped_by_reason"]["trainer_restart"] > 0 and acc["regenerated_groups_at_restart"] > 0
    assert acc["trained"] == acc["trained_total"] == steps * 16
    # (on a busy machine the kill may land after the checkpoint of step 4: then no metrics row is rolled
    # back, only what step 5 had written before the kill, if anything; rows written after the checkpoint
    # and before the kill are always rolled back)
    rolled = list((out / "rolled_back").glob("restart_1/rolled_back.json"))
    if rolled:
        report = json.loads(rolled[0].read_text())
        n = report["restarted_from_step"]
        assert n % 2 == 0 and n < done_at_kill + 2 and report["metrics_rows"] >= done_at_kill - n
        moved = [json.loads(x) for x in (rolled[0].parent / "trained.jsonl").read_text().splitlines()]
        assert all(rec["step"] > n for rec in moved)
    # (the rank whose loss the controller saw first names the cause: the killed one, or a rank whose
    # collective broke with it)
    assert [r["replica"][:6] for r in summary["respawn_log"]] == ["train["]
    assert len(_ledger(out)) == steps


@pytest.mark.chaos
def test_with_max_restarts_0_a_dead_trainer_fails_the_run_saying_why(tmp_path):
    out = tmp_path / "run"
    p = start(out, "run.max_restarts=0", "nodes.rollout.replicas=1", steps=50)
    deadline = time.monotonic() + 120
    while not (out / "trained.jsonl").exists():   # the trainer's setup is done: the run is under way
        assert p.poll() is None and time.monotonic() < deadline, p.stdout.read() if p.poll() is not None else "slow"
        time.sleep(0.2)
    os.kill(_replica_pid(p.pid, "train", 0), signal.SIGKILL)
    assert p.wait(timeout=120) == 1
    said = p.stdout.read()
    assert "worker train[0] (node 'train', replica 0)" in said and "not restarted: run.max_restarts is 0" in said, said
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "failed" and summary["trainer_restarts"] == 0 and summary["accounting"]["lost"] == 0


def test_segments_books_add_up_and_a_dead_trainers_late_events_are_told_apart():
    earlier = {"dispatched": 40, "trained": 16, "dropped": 24, "dropped_by_reason": {"trainer_restart": 24}, "lost": 0}
    now = {"dispatched": 32, "trained": 32, "dropped": 0, "dropped_by_reason": {"filtered": 0}, "lost": 0}
    assert merge(earlier, now) == {"dispatched": 72, "trained": 48, "dropped": 24, "lost": 0,
                                   "dropped_by_reason": {"trainer_restart": 24, "filtered": 0}}
    r = trainer_restart.TrainerRestarts()
    feed = SimpleNamespace(sent=None)
    d = SimpleNamespace(restarts=r, initial_version=4, steps_done=4, feed=feed)
    assert not trainer_restart.stale(d, {"kind": "train_step", "version": 7})   # no restart yet: every event counts
    r.count = 1
    assert not trainer_restart.stale(d, {"kind": "weights", "version": 4})      # the new trainer's restored version
    assert trainer_restart.stale(d, {"kind": "weights", "version": 5})          # no batch sent yet: the dead one's
    assert trainer_restart.stale(d, {"kind": "train_step", "version": 5})
    feed.sent = {"uids": ["a"]}
    assert not trainer_restart.stale(d, {"kind": "weights", "version": 5})
    assert not trainer_restart.stale(d, {"kind": "train_step", "version": 5})
    assert trainer_restart.stale(d, {"kind": "train_step", "version": 7})
