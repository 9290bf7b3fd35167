"""issue 34, end to end: pipelines/challenger_solver.yaml, two policies in one `dora run` (2 solver steps,
2 challenger steps, short responses), then `--resume` one step further. Each policy's part of the run is
audited as a single-policy run is (tests/e2e_audit.py): its metrics lines (prefixed by its update node),
its accounting (lost 0, C1-C3 0), its own trained.jsonl and checkpoints, one lineage across the resume."""

from __future__ import annotations

import json

import pytest

from e2e_audit import PolicyRunDir, RunDir, check_accounting, check_ledger, check_metrics, dora_run

# (async.elastic: each trainer lends its devices to its own generate node while it waits)
SHORT = ["nodes.challenger_rollout.params.max_tokens=24", "nodes.solver_rollout.params.max_tokens=24",
         "nodes.problems.params.task_params.max_count=24", "run.save_every=1", "async.elastic=true"]
TBS = {"solver": 32, "challenger": 16}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("two-policies")
    rc = dora_run(out, "challenger_solver.yaml", *SHORT, "nodes.solver.params.steps=2",
                  "nodes.challenger.params.steps=2", deadline=400)
    assert rc == 0, RunDir(out).describe()
    return out


def test_each_policy_is_audited_as_a_run_of_its_own(run):
    for policy, steps in (("solver", 2), ("challenger", 2)):
        part = PolicyRunDir(run, policy)
        check_metrics(part, steps, TBS[policy])
        check_accounting(part, steps, TBS[policy])
        check_ledger(part, steps, TBS[policy], group_size=4, max_staleness=0)
        assert part.summary["c1_violations"] == 0 and part.summary["trainer_restarts"] == 0
        assert part.summary["elastic"]["spares"] == [f"{policy}_rollout[1]"] and part.summary["elastic"]["lends"] >= 1
        assert (run / "policies" / policy / "checkpoints" / f"step_{steps}" / "manifest.json").is_file()
    # the solver trained its 2 steps first and went on answering the challenger's proposals (the
    # challenger's 2 steps need 4 steps' worth of answers): those answers are accounted, never trained
    solver = PolicyRunDir(run, "solver").summary["accounting"]
    assert solver["dropped_by_reason"].get("after_last_step", 0) > 0, solver
    top = RunDir(run)
    assert top.summary["accounting"]["lost"] == 0 and top.summary["c3_violations"] == 0
    assert not (run / "trained.jsonl").exists() and not (run / "checkpoints").exists()


def test_metrics_lines_are_prefixed_by_the_update_node(run):
    lines = RunDir(run).metrics
    assert {r["policy"] for r in lines} == {"solver", "challenger"}
    for r in lines:
        p = r["policy"]
        assert all(k in ("policy", "step") or k.startswith(f"{p}/") for k in r), sorted(r)
        assert r[f"{p}/policy_version"] == r["step"] and f"{p}/reward_mean" in r


def test_trace_rows_and_the_timeline_are_per_policy(run):
    events = json.loads((run / "trace.json").read_text())["traceEvents"]
    rows = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"solver update", "challenger update", "solver_rollout[0]", "challenger_rollout[0]"} <= rows, rows
    steps = [e for e in events if e["ph"] == "X" and e.get("cat") == "trainer"]
    assert {e["args"]["policy"] for e in steps} == {"solver", "challenger"}
    state = json.loads((run / "state.json").read_text())
    assert {r["name"]: r["policy"] for r in state["timeline"]["rows"]} == {
        "challenger_rollout[0]": "challenger", "solver_rollout[0]": "solver"}


@pytest.mark.slow
def test_resume_continues_each_policy_from_its_own_checkpoint(run):
    from dora.rl.launch import run_main
    assert run_main(["--resume", str(run), "nodes.solver.params.steps=3", "nodes.challenger.params.steps=3",
                     "--quiet", "--deadline", "400"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from_step"] == {"solver": 2, "challenger": 2}
    for policy in ("solver", "challenger"):
        part = PolicyRunDir(run, policy)
        check_metrics(part, 3, TBS[policy])   # one lineage: steps 1..3 of each, once
        acc = part.summary["accounting"]
        assert acc["lost"] == 0 and acc["trained_total"] == 3 * TBS[policy]
        acc["trained"] = acc["trained_total"]   # (this segment's books tie to the earlier one's by trained_before)
        check_ledger(part, 3, TBS[policy], group_size=4, max_staleness=0)


@pytest.mark.chaos
def test_a_dead_trainer_restarts_its_policy_alone(tmp_path):
    """The challenger's trainer SIGKILLed after its step 2 (checkpoints every 2 steps): it restarts from
    its own last checkpoint; the solver goes on untouched. One lineage per policy, nothing lost."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from test_run_lifecycle import ROOT, _replica_pid, finish

    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-m", "dora.cli", "run", str(ROOT / "pipelines" / "challenger_solver.yaml"),
                          *SHORT[:3], "run.save_every=2", "nodes.solver.params.steps=8", "nodes.challenger.params.steps=4",
                          "--out", str(out), "--quiet"], cwd=str(ROOT), env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 400
    while True:
        lines = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").exists() else []
        if sum('"policy": "challenger"' in x for x in lines) >= 2:
            break
        assert p.poll() is None and time.monotonic() < deadline, p.stdout.read() if p.poll() is not None else "slow"
        time.sleep(0.3)
    os.kill(_replica_pid(p.pid, "challenger", 0), signal.SIGKILL)
    assert finish(p, 600) == 0
    for policy, steps in (("solver", 8), ("challenger", 4)):
        part = PolicyRunDir(out, policy)
        check_metrics(part, steps, TBS[policy])   # each step of each policy once
        acc = part.summary["accounting"]
        assert acc["lost"] == 0 and acc["trained"] == steps * TBS[policy]
        check_ledger(part, steps, TBS[policy], group_size=4, max_staleness=0)
        assert part.summary["trainer_restarts"] == (1 if policy == "challenger" else 0)
    rolled = [json.loads(f.read_text()) for f in (out / "rolled_back").glob("*/rolled_back.json")]
    assert all(r["policy"] == "challenger" for r in rolled)   # (none when the kill landed right at a checkpoint)
