"""One lineage on resume (dora/rl/lineage.py): the files of a run that died after step 5, resumed
from checkpoint 3, hold steps 1..3 once; steps 4-5 (and a line torn by the crash) go to
rolled_back/resume_1/ with a count; TensorBoard and W&B show the resumed run's steps 4-5, never the
dead run's. The kill -9 + resume of a real run is in tests/test_run_lifecycle.py."""

from __future__ import annotations

import json

import pytest

from dora.observe.metric_sinks import open_sinks
from dora.observe.metrics import MetricsLog
from dora.rl import lineage


def _rec(step: int, reward: float) -> dict:
    return {"step": step, "policy_version": step, "reward_mean": reward, "staleness_max": 0, "staleness_mean": 0.0,
            "step_time_s": 1.0, "rollout_only_s": 0.0, "tokens": 10, "tokens_per_s": 10.0, "trajectories": 2}


def _dead_run(run_dir, loggers: list[str]) -> None:
    log = MetricsLog(str(run_dir), open_sinks(loggers, str(run_dir), "t", {}))
    for s in range(1, 6):
        log.write(_rec(s, 0.1 * s))   # the dead run's rewards: 0.1 .. 0.5
        log.write_samples([{"kind": "train", "step": s, "response": "x"}])
        if s % 2 == 0:                # held-out evaluations of versions 2 and 4
            log.write_eval({"version": s, "step": s, "set": "h", "pass@1": 0.1 * s})
    log.close()
    best = run_dir / "checkpoints" / "best"
    best.mkdir(parents=True)
    (best / "best.json").write_text(json.dumps({"metric": "eval/h/pass@1", "value": 0.4, "version": 4}))
    with open(run_dir / "trained.jsonl", "w") as f:
        for s in range(1, 6):
            f.write(json.dumps({"step": s, "version": s, "uids": [f"{s}-0", f"{s}-1"], "policy_versions": [s - 1] * 2}) + "\n")
        f.write('{"step": 6, "version": 6, "uids": ["6-')   # torn by the kill


def test_resume_cuts_the_ledgers_to_the_checkpoint_and_keeps_the_rest_for_audit(tmp_path):
    _dead_run(tmp_path, [])
    (tmp_path / "checkpoints" / "step_5").mkdir(parents=True)   # newer, not trusted by --resume
    report = lineage.roll_back(str(tmp_path), 3, untrusted=[str(tmp_path / "checkpoints" / "step_5")])
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    trained = [json.loads(x) for x in (tmp_path / "trained.jsonl").read_text().splitlines()]
    assert [t["step"] for t in trained] == [1, 2, 3]
    seg = tmp_path / "rolled_back" / "resume_1"
    assert [json.loads(x)["step"] for x in (seg / "metrics.jsonl").read_text().splitlines()] == [4, 5]
    assert len((seg / "trained.jsonl").read_text().splitlines()) == 3          # steps 4, 5 and the torn line
    assert (seg / "checkpoints" / "step_5").is_dir() and not (tmp_path / "checkpoints" / "step_5").exists()
    assert json.loads((seg / "rolled_back.json").read_text()) == {k: v for k, v in report.items() if k != "folder"}
    assert report["metrics_rows"] == 2 and report["trained_rows"] == 3 and report["trained_trajectories"] == 4
    # eval.jsonl and samples.jsonl keep one lineage too, and checkpoints/best of an abandoned version goes
    assert [json.loads(x)["version"] for x in (tmp_path / "eval.jsonl").read_text().splitlines()] == [2]
    assert [json.loads(x)["version"] for x in (seg / "eval.jsonl").read_text().splitlines()] == [4]
    assert [json.loads(x)["step"] for x in (tmp_path / "samples.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert (seg / "checkpoints" / "best" / "best.json").is_file() and not (tmp_path / "checkpoints" / "best").exists()
    # the resumed run appends steps 4..; a second crash and resume gets a folder of its own
    log = MetricsLog(str(tmp_path), append=True, earlier=lineage.kept_records(str(tmp_path)))
    log.write(_rec(4, 0.9))
    log.close()
    assert [r["step"] for r in log.records] == [1, 2, 3, 4]                   # the summary is the lineage's
    assert [e["version"] for e in log.evals] == [2]                           # (a resumed run does not redo it)
    assert lineage.roll_back(str(tmp_path), 3)["metrics_rows"] == 1
    assert (tmp_path / "rolled_back" / "resume_2" / "metrics.jsonl").is_file()


def test_tensorboard_and_wandb_after_resume_show_the_resumed_steps_only(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tests.wandb_records import history
    loggers = ["tensorboard", "wandb"]
    _dead_run(tmp_path, loggers)
    lineage.roll_back(str(tmp_path), 3)
    log = MetricsLog(str(tmp_path), open_sinks(loggers, str(tmp_path), "t", {}), append=True,
                     earlier=lineage.kept_records(str(tmp_path)))   # replays steps 1..3
    for s in (4, 5):
        log.write(_rec(s, 0.9))
    log.close()
    want = [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.9), (5, 0.9)]
    ea = EventAccumulator(str(tmp_path / "tb"))
    ea.Reload()
    assert [(e.step, round(e.value, 4)) for e in ea.Scalars("reward_mean")] == want
    assert [(r["_step"], round(r["reward_mean"], 4)) for r in history(str(tmp_path))] == want   # one offline run
    seg = tmp_path / "rolled_back" / "resume_1"
    assert (seg / "tb").is_dir() and (seg / "wandb").is_dir()                  # the dead run's curves, for audit
    assert [r["_step"] for r in history(str(seg))] == [1, 2, 3, 4, 5]
