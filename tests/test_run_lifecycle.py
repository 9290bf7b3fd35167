"""A run's life end to end, as a user's shell sees it: SIGTERM, a double SIGINT, kill -9, a run dir
held by a live run, a run folder left by a dead one, bad numbers on the command line.

`dora run` is a real subprocess here (signals go to it), on the quickstart cut to a size that
keeps each run to seconds of work.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dora.ops.weights.versions import shm_dir
from dora.runtime import run_files
from tests.runtime_graphs import alive

ROOT = Path(__file__).resolve().parent.parent
QUICK = ["nodes.rollout.params.max_tokens=24", "nodes.rollout.params.max_batch=8", "async.train_batch=16",
         "async.rollout_batch=16", "nodes.prompts.params.batch_prompts=4", "eval=null", "run.keep_best=null"]
pytestmark = pytest.mark.chaos


def start(out: Path, *extra: str, steps: int = 400) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "dora.cli", "run", str(ROOT / "pipelines" / "quickstart.yaml"),
                             *QUICK, f"nodes.train.params.steps={steps}", "--out", str(out), "--quiet", *extra],
                            cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def children(pid: int) -> list[int]:
    """Every live descendant of `pid` (workers are forked from a zygote: grandchildren of dora run)."""
    parent_of = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parent_of[int(entry)] = int(fields[1])
    out, frontier = [], {pid}
    while frontier:
        frontier = {c for c, p in parent_of.items() if p in frontier}
        out += sorted(frontier)
    return out


def wait_for_steps(p: subprocess.Popen, out: Path, n: int = 1, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    metrics = out / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= n:
            return
        assert p.poll() is None, p.stdout.read()
        time.sleep(0.5)
    raise AssertionError(f"no {n} step(s) within {timeout} s")


def finish(p: subprocess.Popen, timeout: float) -> int:
    """The run's exit code; a run still going after `timeout` is killed and fails the test with what
    it printed (a hang once seen in 1 of 20 chaos passes left nothing to read)."""
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError(f"run still going after {timeout} s; its output:\n{p.communicate()[0][-20000:]}")


def wait_gone(pids: list[int], timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


def _resume(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dora.cli", "run", "--resume", str(out), "--quiet"], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})


def test_sigterm_checkpoints_summarises_cleans_up_and_exits_143(tmp_path):
    out = tmp_path / "run"
    p = start(out)
    wait_for_steps(p, out, 2)
    workers = children(p.pid)
    ipc = [f for f in os.listdir("/tmp") if f.startswith("dora-ipc-")
           and (run_files.owner_of(os.path.join("/tmp", f)) or {}).get("pid") == p.pid]
    assert workers and os.path.isdir(shm_dir(str(out)))
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=60)
    assert rc == 143, p.stdout.read()
    assert time.monotonic() - t0 < 60
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "preempted" and "SIGTERM" in summary["stop_reason"]
    assert summary["accounting"]["lost"] == 0
    steps = len((out / "metrics.jsonl").read_text().splitlines())
    assert (out / "checkpoints" / f"step_{steps}").is_dir()          # the last step trained is checkpointed
    assert json.loads((out / "trace.json").read_text())["traceEvents"]
    assert not os.path.exists(shm_dir(str(out)))                       # shared memory removed
    assert not any(os.path.exists(os.path.join("/tmp", f)) for f in ipc)   # socket folder removed
    assert not wait_gone(workers)                                      # every child ended


def test_second_sigint_stops_at_once_and_still_cleans_up(tmp_path):
    out = tmp_path / "run"
    p = start(out)
    wait_for_steps(p, out, 1)
    workers = children(p.pid)
    p.send_signal(signal.SIGINT)
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=30)
    # 130 from dora run; or, when the second signal lands after the summary is written (the process
    # is exiting), the default handler's death by SIGINT, which a shell reports as 130 too
    assert rc in (130, -signal.SIGINT), p.stdout.read()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "preempted"
    assert not os.path.exists(shm_dir(str(out)))
    assert not wait_gone(workers)


SYNC_PINNED = ["nodes.rollout.replicas=1", "run.save_every=3"]


@pytest.fixture(scope="module")
def killed_sync_run(tmp_path_factory):
    """Seeded sync mode, one generate replica, 6 steps: `dora run` kill -9ed after step 4 (its last
    checkpoint is step 3). What the kill left is looked at right after it (workers, the shared-memory
    folder, the sweep a next run does); the run folder is what the resume test resumes."""
    out = tmp_path_factory.mktemp("killed") / "broken"
    p = start(out, *SYNC_PINNED, steps=6)
    wait_for_steps(p, out, 4)
    workers = children(p.pid)
    p.kill()
    p.wait(timeout=10)
    left = shm_dir(str(out))
    seen = {"out": out, "pid": p.pid, "workers": workers, "outlived": wait_gone(workers), "left": left,
            "left_there": os.path.isdir(left), "left_owner": (run_files.owner_of(left) or {}).get("pid")}
    seen["swept"] = left in run_files.sweep_stale()
    seen["left_after_sweep"] = os.path.exists(left)
    return seen


def test_kill_9_takes_the_workers_along_and_the_next_run_sweeps_what_it_left(killed_sync_run):
    k = killed_sync_run
    assert k["workers"]
    assert not k["outlived"], "workers outlived a kill -9 of dora run"
    assert k["left_there"] and k["left_owner"] == k["pid"]
    assert k["swept"] and not k["left_after_sweep"]


def test_a_run_dir_held_by_a_live_run_is_refused_untouched(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{\"step\": 1}\n")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        folder = shm_dir(str(out))
        os.mkdir(folder, 0o700)
        with open(os.path.join(folder, run_files.OWNER), "w") as f:
            json.dump({"pid": holder.pid, "run_dir": str(out)}, f)
        p = start(out, "--overwrite", steps=1)   # even --overwrite leaves a live run's folder alone
        text = p.communicate(timeout=120)[0]
        assert p.returncode == 2 and "in use by a live run" in text, text
        assert (out / "metrics.jsonl").read_text() == "{\"step\": 1}\n"   # nothing of the live run was touched
    finally:
        holder.kill()
        holder.wait()
        run_files.sweep_stale()


@pytest.mark.parametrize("flag, value", [("--deadline", "-5"), ("--stall-timeout", "0"), ("--start-timeout", "nan"),
                                         ("--seed", "-1"), ("--hb-timeout", "soon")])
def test_bad_numbers_on_the_command_line_exit_2(flag, value, capsys):
    from dora.rl.launch import run_main

    assert run_main([str(ROOT / "pipelines" / "quickstart.yaml"), flag, value, "--dry-run"]) == 2
    assert flag in capsys.readouterr().err


def test_a_driver_error_is_a_named_failure_with_a_summary(tmp_path, monkeypatch):
    from dora.rl.launch import run_main
    from dora.rl.driver import RLDriver

    def broken(self, ev):
        raise ZeroDivisionError("bookkeeping bug")

    monkeypatch.setattr(RLDriver, "_on_train_step", broken)
    out = tmp_path / "run"
    rc = run_main([str(ROOT / "pipelines" / "quickstart.yaml"), *QUICK, "nodes.train.params.steps=2", "--out", str(out), "--quiet"])
    assert rc == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "failed" and "control code failed: ZeroDivisionError: bookkeeping bug" in summary["error"]
    assert not os.path.exists(shm_dir(str(out)))


def _rewards(out: Path) -> dict[int, float]:
    """reward_mean by step (each step once, resumed or not)."""
    by_step = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        assert rec["step"] not in by_step, f"step {rec['step']} twice in metrics.jsonl"
        by_step[rec["step"]] = rec["reward_mean"]
    return by_step


def _ledger(out: Path) -> list[dict]:
    """trained.jsonl (after a resume: one lineage, the steps a dead run trained past its checkpoint
    moved to rolled_back/)."""
    return [json.loads(raw) for raw in (out / "trained.jsonl").read_text().splitlines()]


def test_sync_run_killed_and_resumed_equals_the_uninterrupted_run(tmp_path, killed_sync_run):
    """Seeded sync mode, one generate replica: kill -9 after step 4 (the last checkpoint is step 3),
    resume: the same reward at every step and the same final weights, to 1e-6; the ledger exact."""
    from safetensors.torch import load_file

    whole, broken = tmp_path / "whole", killed_sync_run["out"]
    p = start(whole, *SYNC_PINNED, steps=6)
    assert finish(p, 600) == 0, p.stdout.read()
    assert (broken / "checkpoints" / "step_3").is_dir()
    r = _resume(broken)
    assert r.returncode == 0, r.stdout + r.stderr
    a, b = _rewards(whole), _rewards(broken)
    assert sorted(a) == sorted(b) == list(range(1, 7))
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-6, (step, a[step], b[step])
    wa = load_file(str(whole / "checkpoints" / "step_6" / "model.safetensors"))
    wb = load_file(str(broken / "checkpoints" / "step_6" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for name in wa:
        assert float((wa[name] - wb[name]).abs().max()) <= 1e-6, name
    ledger = _ledger(broken)
    uids = [u for rec in ledger for u in rec["uids"]]
    assert [rec["step"] for rec in ledger] == list(range(1, 7)) and len(uids) == len(set(uids)) == 6 * 16
    assert uids == [u for rec in _ledger(whole) for u in rec["uids"]]
    summary = json.loads((broken / "summary.json").read_text())
    assert summary["ended"] == "finished" and summary["accounting"]["lost"] == 0
    assert summary["accounting"]["trained_total"] == 6 * 16


def _workers_of(pid: int, node: str) -> list[int]:
    out = []
    for child in children(pid):
        try:
            cmd = open(f"/proc/{child}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"--node" in cmd and cmd[cmd.index(b"--node") + 1] == node.encode():
            out.append(child)
    return out


def _audit_exact(out: Path, steps: int, tbs: int, k: int) -> dict:
    """Every step trained exactly TBS whole groups, no uid twice, none too stale; accounting closes."""
    ledger = _ledger(out)
    assert [rec["step"] for rec in ledger] == list(range(1, steps + 1))
    uids = [u for rec in ledger for u in rec["uids"]]
    assert len(uids) == len(set(uids)) == steps * tbs
    for rec in ledger:
        assert len(rec["uids"]) == tbs
        assert all(0 <= (rec["version"] - 1) - v <= k for v in rec["policy_versions"]), rec
    summary = json.loads((out / "summary.json").read_text())
    acc = summary["accounting"]
    assert summary["ended"] == "finished" and acc["lost"] == 0 and summary["c2_violations"] == 0
    assert acc["dispatched"] == (acc["trained"] + acc["finished_untrained"] + acc["in_flight_at_end"]
                                 + acc["in_training_at_end"] + acc["dropped"]), acc
    return summary


DORA = ["async.mode=dora", "async.max_staleness=2", "async.rollout_batch=24"]


def test_random_sigkills_of_generate_replicas_keep_the_ledger_exact(tmp_path):
    """Seeded chaos: two generate replicas SIGKILLed at random moments of a dora-mode run. Each is
    respawned, its requests reissued whole; the run completes and every uid is trained once."""
    import random

    rng = random.Random(7)
    out = tmp_path / "run"
    # the last kill comes 15+ steps before the end, so the run still needs the respawned replica when
    # it is up (respawns count once the new process is up: a run that ends first counts none)
    p = start(out, *DORA, steps=20)
    killed = []
    for target_step in sorted(rng.sample(range(1, 6), 2)):
        wait_for_steps(p, out, target_step)
        time.sleep(rng.uniform(0.0, 1.0))
        victims = _workers_of(p.pid, "rollout")
        if victims and p.poll() is None:
            victim = rng.choice(victims)
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)
            deadline = time.monotonic() + 120   # the next kill waits for this respawn
            while time.monotonic() < deadline and len(_workers_of(p.pid, "rollout")) < 2 and p.poll() is None:
                time.sleep(0.2)
    assert finish(p, 600) == 0, p.stdout.read()
    summary = _audit_exact(out, 20, 16, 2)
    assert summary["accounting"]["respawns"] == len(killed) == 2


def test_killed_after_step_12_of_30_and_resumed_leaves_one_lineage(tmp_path):
    """issue 22's check, dora mode: kill -9 after step 12 of 30 (save_every 5), resume: metrics.jsonl,
    trained.jsonl and TensorBoard hold steps 1..30 once and every uid once; the dead run's steps after
    its checkpoint are in rolled_back/resume_1/, not in the run's files. The newest checkpoint is
    also corrupted on disk: --resume names it and continues from the one before."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    p = start(out, *DORA, "run.save_every=5", "run.loggers=[jsonl, tensorboard]", steps=30)
    wait_for_steps(p, out, 12)
    p.kill()   # (on a busy machine the run may be a step or two further on: the check is the same)
    p.wait(timeout=10)
    died_at = len((out / "metrics.jsonl").read_text().splitlines())
    from dora.rl import checkpoint
    # (the kill may come between step 15's metrics line and its checkpoint: the newest is then step 10)
    newest = checkpoint.trusted(str(out))[0][0]
    assert newest >= 10 and newest % 5 == 0
    with open(out / "checkpoints" / f"step_{newest}" / "model.safetensors", "r+b") as f:
        f.seek(1000)
        f.write(b"\xff" * 4)   # and the disk corrupted the newest checkpoint: resume names it, takes the one before
    r = _resume(out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"skipping checkpoint {out}/checkpoints/step_{newest}: model.safetensors does not match" in r.stderr, r.stderr
    summary = _audit_exact(out, 30, 16, 2)
    n = summary["resumed_from_step"]
    assert n == newest - 5 and summary["accounting"]["trained_total"] == 30 * 16
    assert "resumed_from_step" not in (out / "trained.jsonl").read_text()     # no mark a reader must honour
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 31)) and summary["steps"] == 30
    seg = out / "rolled_back" / "resume_1"
    assert [json.loads(x)["step"] for x in (seg / "metrics.jsonl").read_text().splitlines()] == list(range(n + 1, died_at + 1))
    assert json.loads((seg / "rolled_back.json").read_text())["metrics_rows"] == died_at - n
    assert (seg / "checkpoints" / f"step_{newest}").is_dir()                     # the corrupted one, kept for audit
    ea = EventAccumulator(str(out / "tb"))
    ea.Reload()
    assert [(e.step, e.value) for e in ea.Scalars("reward_mean")] == [
        (m["step"], pytest.approx(m["reward_mean"], rel=1e-6)) for m in metrics]


def _replica_pid(pid: int, node: str, replica: int) -> int | None:
    for child in _workers_of(pid, node):
        try:
            cmd = open(f"/proc/{child}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if cmd[cmd.index(b"--replica") + 1] == str(replica).encode():
            return child
    return None


def test_sigkilled_elastic_spare_is_respawned_and_the_ledger_stays_exact(tmp_path):
    """async.elastic: the spare on the trainer's devices (rollout[2]) SIGKILLed twice, lent or asleep
    as chance has it. Either way it comes back asleep, whatever it held is reissued whole, lending
    goes on, and every uid is trained once."""
    import random

    rng = random.Random(5)
    out = tmp_path / "run"
    steps = 14   # (longer responses: the run outlasts both respawns, which take seconds here)
    p = start(out, *DORA, "async.elastic=true", "nodes.rollout.params.max_batch=4", "nodes.rollout.params.max_tokens=64",
              steps=steps)
    killed = 0
    for target_step in (1, 4):
        wait_for_steps(p, out, target_step)
        time.sleep(rng.uniform(0.0, 0.5))
        victim = _replica_pid(p.pid, "rollout", 2)
        assert victim and p.poll() is None, "the run ended before the spare could be killed"
        os.kill(victim, signal.SIGKILL)
        killed += 1
        deadline = time.monotonic() + 120   # the next kill waits until this respawn is in the metrics
        while time.monotonic() < deadline and p.poll() is None:
            lines = (out / "metrics.jsonl").read_text().splitlines()
            if lines and json.loads(lines[-1])["respawns"] >= killed:
                break
            time.sleep(0.2)
    assert finish(p, 600) == 0, p.stdout.read()
    summary = _audit_exact(out, steps, 16, 2)
    assert summary["accounting"]["respawns"] == killed == 2
    assert summary["elastic"]["lends"] > 0 and summary["elastic"]["reclaims"] > 0
