"""A judged run end to end (pipelines/judge.yaml with the policy's own frozen initial weights as the
judge, so no model package is needed): the judge on its own pool scores every trajectory, the reward
node sums the verifier and the judge (columns and metrics reward/task, reward/judge), verdicts that do
not parse skip their whole group (C2), failures are counted per step, and a judge replica killed mid-run
is respawned with the groups it held generated and scored again: every step trains exactly TBS, the
ledger closes, nothing is lost."""

from __future__ import annotations

import json
import os
import signal
import string
import threading
import time
from pathlib import Path

import pytest

from e2e_audit import PIPELINES, RunDir, check_ledger, dora_run

STEPS, TBS, G = 8, 16, 4   # (8: steps take well under a second; the judge killed after step 1 must be needed again)
# The tiny random judge's first character is its verdict: most characters map to a score, white space
# and anything else do not parse, so some groups are skipped (on_error: skip).
VALUES = {c: round((ord(c) % 11) / 10, 1) for c in string.ascii_letters + string.digits + string.punctuation}


def _children_named(node: str) -> list[int]:
    """This process's worker processes of `node` (forked from the run's zygote: its descendants)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if b"--node" in cmd and cmd[cmd.index(b"--node") + 1] == node.encode() and stat[0] != "Z":
            pid, ppid = int(entry), int(stat[1])
            while ppid not in (0, 1, me):   # (a descendant of this process)
                try:
                    ppid = int(open(f"/proc/{ppid}/stat").read().rsplit(")", 1)[1].split()[1])
                except OSError:
                    break
            if ppid == me:
                found.append(pid)
    return found


def _kill_judge_after_step_1(out: Path, killed: list[int]) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        metrics = out / "metrics.jsonl"
        if metrics.exists() and metrics.read_text().strip():
            for pid in _children_named("judge"):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            return
        time.sleep(0.2)


@pytest.fixture(scope="module")
def judged_run(tmp_path_factory, remove_shm_weights_module):
    out = tmp_path_factory.mktemp("judged") / "run"
    killed: list[int] = []
    killer = threading.Thread(target=_kill_judge_after_step_1, args=(out, killed), daemon=True)
    killer.start()
    # the shipped pipeline (its length penalty imports from beside it), the judge's model the policy's own
    code = dora_run(out, PIPELINES / "judge.yaml", "nodes.judge.params.model=null", "nodes.judge.params.parser=regex",
                    "nodes.judge.params.pattern=" + json.dumps(r"^\s*(\S)"), "nodes.judge.params.values=" + json.dumps(VALUES),
                    "nodes.judge.params.max_tokens=1", "nodes.judge.params.on_error=skip", f"nodes.train.params.steps={STEPS}",
                    "nodes.rollout.params.max_tokens=24", f"async.train_batch={TBS}", deadline=600)
    killer.join(timeout=5)
    return code, RunDir(out), killed


@pytest.fixture(scope="module")
def remove_shm_weights_module(tmp_path_factory):
    from dora.ops.weights import versions as weights
    yield
    base = tmp_path_factory.getbasetemp()
    for run in base.rglob("run"):
        weights.cleanup(str(run))


def test_judged_run_trains_exact_batches_of_whole_groups(judged_run):
    code, run, _ = judged_run
    assert code == 0, run.describe()
    check_ledger(run, STEPS, TBS, G, max_staleness=1)
    acc = run.accounting
    assert acc["lost"] == 0 and run.summary["c2_violations"] == 0
    assert acc["dispatched"] == (acc["trained"] + acc["finished_untrained"] + acc["in_flight_at_end"]
                                 + acc["in_training_at_end"] + acc["dropped"]), acc
    assert set(acc["dropped_by_reason"]) <= {"judge_error", "replica_lost"}, acc
    # skipped groups are dropped whole: a multiple of G, and no more than the verdicts that failed
    skipped = acc["dropped_by_reason"].get("judge_error", 0)
    assert skipped % G == 0 and skipped // G <= acc["judge_parse_errors"], acc


def test_each_source_is_a_column_and_a_metric(judged_run):
    _, run, _ = judged_run
    for rec in run.metrics:
        assert rec["trajectories"] == TBS
        for key in ("reward/task", "reward/judge", "reward/length", "judge_parse_errors", "judge_timeouts",
                    "judge_server_errors"):
            assert key in rec, (key, sorted(rec))
        assert 0.0 <= rec["reward/judge"] <= 1.0 and 0.0 <= rec["reward/task"] <= 1.0
        assert rec["reward/length"] == 0.0   # (responses of at most 24 characters: none is penalised)
        assert rec["reward_mean"] == pytest.approx(rec["reward/task"] + 0.5 * rec["reward/judge"], abs=1e-5)
        assert rec["judge_timeouts"] == rec["judge_server_errors"] == 0
    assert sum(r["judge_parse_errors"] for r in run.metrics) <= run.accounting["judge_parse_errors"]


def test_a_killed_judge_replica_is_respawned_and_its_groups_scored_again(judged_run):
    _, run, killed = judged_run
    assert len(killed) == 1, "the judge replica was not found to kill"
    assert run.accounting["respawns"] == 1, run.accounting
    # the groups it held were dropped whole (replica_lost) and dispatched again as new groups
    acc = run.accounting
    assert acc["reissued_requests"] >= acc["dropped_by_reason"].get("replica_lost", 0), acc


def test_the_dashboard_state_shows_the_judge_and_its_input_edge(judged_run):
    _, run, _ = judged_run
    state = json.loads((run.path / "state.json").read_text())
    (edge,) = [e for e in state["edges"] if e["src"] == "rollout" and e["dst"] == "judge"]
    assert edge["rows"] >= STEPS * TBS and edge["window"] > 0 and "queued" in edge   # its queue against its credit window
    (out_edge,) = [e for e in state["edges"] if e["src"] == "judge"]
    assert out_edge["rows"] > 0   # the judge's rows, its killed process's last counts carried over to the respawned one
    judges = [r for r in state["replicas"] if r["node"] == "judge"]
    assert judges and all(r["pool"] == "judge" and r["op"] == "judge" for r in judges)
