"""End to end: `dora run` on bad input, a failing user reward and --dry-run.

Exit codes: 2 for a pipeline with errors (each reported as file:line, nothing started),
1 for a run that failed (the message names the node and, for a reward error, the uid),
0 for --dry-run (the placement plan, nothing started).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from e2e_audit import PIPELINES, ROOT, SHORT, RunDir, dora_run

QUICKSTART = (PIPELINES / "quickstart.yaml").read_text()


def raising_reward(text: str, answer: str, row: dict) -> float:
    """`fn: test_e2e_cli:raising_reward`: a user reward function that fails on every row."""
    raise ValueError(f"cannot score {text[:10]!r}")


def _cli(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "dora.cli", "run", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT), env=env)


def test_run_of_a_broken_pipeline_exits_2_with_file_line(tmp_path):
    bad = tmp_path / "broken.yaml"
    text = QUICKSTART.replace("op: generate", "op: generat").replace("estimator: grpo", "estimator: grpo, bogus: 1")
    bad.write_text(text)
    lines = text.splitlines()
    op_line = 1 + next(i for i, line in enumerate(lines) if "op: generat" in line)
    out = tmp_path / "run"
    p = _cli(str(bad), "--out", str(out))
    assert p.returncode == 2, p.stderr
    assert f"{bad}:{op_line}:" in p.stderr and "generat" in p.stderr, p.stderr
    assert "bogus" in p.stderr, p.stderr            # every error at once, not just the first
    assert "Traceback" not in p.stderr
    assert not out.exists(), "a pipeline with errors must not start a run"


def test_bad_override_exits_2():
    p = _cli(str(PIPELINES / "quickstart.yaml"), "async.mode=warp", "--dry-run")
    assert p.returncode == 2 and "warp" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_overrides_may_follow_options():
    # `dora run p.yaml --dry-run k=v`: the override after an option still applies (a bad one is named)
    p = _cli(str(PIPELINES / "quickstart.yaml"), "--dry-run", "async.mode=warp")
    assert p.returncode == 2 and "warp" in p.stderr and "unrecognized" not in p.stderr, p.stderr


def test_dry_run_prints_the_plan_and_exits_0(tmp_path):
    out = tmp_path / "run"
    p = _cli(str(PIPELINES / "grpo.yaml"), "--dry-run", "--out", str(out))
    assert p.returncode == 0, p.stderr
    for node in ("prompts", "rollout", "reference", "reward", "advantage", "train"):
        assert node in p.stdout, p.stdout
    assert not out.exists(), "--dry-run must not start a run"


def test_a_bad_DORA_TRANSPORT_is_a_clear_error_with_exit_2(tmp_path):
    out = tmp_path / "run"
    p = _cli(str(PIPELINES / "quickstart.yaml"), "--out", str(out), env={"DORA_TRANSPORT": "udp"})
    assert p.returncode == 2 and "DORA_TRANSPORT" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not out.exists()


def test_dry_run_names_each_inbox_endpoint_for_the_transport():
    from dora.runtime.placement import endpoint_hint
    assert endpoint_hint("ray", "train", 0) == "tcp://<node address>:<random port>"
    p = _cli(str(PIPELINES / "quickstart.yaml"), "--dry-run")
    want = "tcp://127.0.0.1:<random port>" if os.environ.get("DORA_TRANSPORT") == "tcp" else "/rollout-1.sock"
    assert p.returncode == 0 and want in p.stdout, p.stdout


def test_raising_user_reward_fails_the_run_naming_the_uid(tmp_path, capsys):
    rc = dora_run(tmp_path, "quickstart.yaml", "nodes.reward.params.fn=test_e2e_cli:raising_reward",
                  "nodes.reward.params.on_error=fail", "async.train_batch=16", "async.rollout_batch=16",
                  "nodes.train.params.steps=2", *SHORT, deadline=150)
    err = capsys.readouterr().err
    assert rc == 1, err
    assert re.search(r"uid '\d+-\d+'", err), err
    assert "reward" in err and "cannot score" in err, err
    run = RunDir(tmp_path)
    assert run.summary["ok"] is False and "uid" in run.summary["error"]
