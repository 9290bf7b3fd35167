"""run.loggers: validation names an unknown or uninstalled logger (exit 2); TensorBoard and W&B
(offline) get every step, read back with TensorBoard's event reader and from the W&B run file."""

from __future__ import annotations

import json

import pytest

from dora.graph import loggers
from dora.graph.diagnostics import errors_of
from dora.graph.validate import check_file
from dora.observe.metric_sinks import open_sinks, write_to
from tests.e2e_audit import PIPELINES, SHORT, dora_run

QUICKSTART = str(PIPELINES / "quickstart.yaml")
RECORDS = [{"step": s, "policy_version": s, "reward_mean": 0.1 * s, "tokens_per_s": 1000.0 + s, "staleness_max": 1,
            "train/loss": -0.5 / s, "note": "text", "flag": True, "missing": None} for s in (1, 2, 3)]


def _errors(*overrides):
    _, diags = check_file(QUICKSTART, list(overrides))
    return [d.format() for d in errors_of(diags)]


def test_unknown_logger_is_named_with_a_suggestion():
    errs = _errors("run.loggers=[jsonl, tensorbord]")
    assert len(errs) == 1 and "unknown logger 'tensorbord'" in errs[0] and "did you mean 'tensorboard'" in errs[0], errs
    assert "<command line" in errs[0]                           # where it came from
    errs = _errors("run.loggers=wandb")
    assert len(errs) == 1 and "run.loggers must be list" in errs[0], errs
    errs = _errors("run.loggers=[jsonl, 3]")
    assert len(errs) == 1 and "list of logger names" in errs[0], errs
    assert "more than once" in _errors("run.loggers=[jsonl, jsonl]")[0]
    assert _errors() == [] and _errors("run.loggers=[jsonl]") == []


def test_a_logger_whose_package_is_missing_is_named_at_validation(monkeypatch):
    monkeypatch.setattr(loggers, "installed", lambda package: package != "wandb")
    errs = _errors("run.loggers=[jsonl, tensorboard, wandb]")
    assert len(errs) == 1 and "'wandb' needs the 'wandb' package" in errs[0] and "pip install" in errs[0], errs


def test_dora_run_with_a_missing_logger_exits_2_before_starting(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(loggers, "installed", lambda package: False)
    assert dora_run(tmp_path / "run", "quickstart.yaml", "run.loggers=[tensorboard]") == 2
    assert "needs the 'tensorboard' package" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_tensorboard_sink_writes_event_files_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    sinks = open_sinks(["jsonl", "tensorboard"], str(tmp_path), "t", {"mode": "dora"})
    for r in RECORDS:
        write_to(sinks, r)
    for s in sinks:
        s.close()
    ea = EventAccumulator(str(tmp_path / "tb"))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    assert {"reward_mean", "tokens_per_s", "staleness_max", "train/loss", "policy_version"} <= tags
    assert not {"note", "flag", "missing", "step"} & tags        # only numbers are curves; step is the x axis
    assert [(e.step, round(e.value, 4)) for e in ea.Scalars("reward_mean")] == [(1, 0.1), (2, 0.2), (3, 0.3)]


def test_wandb_sink_writes_an_offline_run_read_back(tmp_path, monkeypatch):
    """Offline (the default), named as asked: project from run.wandb, name from WANDB_NAME."""
    pytest.importorskip("wandb")
    import glob

    from tests.wandb_records import history, records
    monkeypatch.setenv("WANDB_NAME", "from-env")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    sinks = open_sinks(["wandb"], str(tmp_path), "t", {"mode": "dora"}, {"wandb": {"project": "my-project"}})
    for r in RECORDS:
        write_to(sinks, r)
    for s in sinks:
        s.close()
    rows = history(str(tmp_path))
    assert [r["_step"] for r in rows] == [1, 2, 3]
    assert [round(r["reward_mean"], 4) for r in rows] == [0.1, 0.2, 0.3]
    assert all("note" not in r and "flag" not in r for r in rows)
    run = next(r.run for r in records(glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))[0])
               if r.WhichOneof("record_type") == "run")
    assert (run.project, run.display_name) == ("my-project", "from-env")


def test_a_run_logs_every_step_to_tensorboard_and_wandb(tmp_path, remove_shm_weights):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tests.wandb_records import history
    rc = dora_run(tmp_path, "quickstart.yaml", "run.loggers=[jsonl, tensorboard, wandb]", "async.mode=dora",
                  "async.train_batch=16", "async.rollout_batch=24", "nodes.train.params.steps=3", *SHORT,
                  "eval.heldout.every=1", "eval.heldout.size=8", deadline=240, evaluate=True)
    assert rc == 0
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    ea = EventAccumulator(str(tmp_path / "tb"))
    ea.Reload()
    got = [(e.step, e.value) for e in ea.Scalars("reward_mean")]
    assert got == [(m["step"], pytest.approx(m["reward_mean"], rel=1e-6)) for m in metrics]
    assert [e.step for e in ea.Scalars("staleness_max")] == [1, 2, 3]
    rows = history(str(tmp_path))
    steps = [r for r in rows if "tokens_per_s" in r]
    assert [r["_step"] for r in steps] == [1, 2, 3]
    assert [r["tokens_per_s"] for r in steps] == [pytest.approx(m["tokens_per_s"]) for m in metrics]
    # held-out evaluation in dora mode (idle slots): every version's line, the same numbers in both loggers
    evals = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert sorted(e["version"] for e in evals) == [0, 1, 2, 3]
    tb = {e.step: e.value for e in ea.Scalars("eval/heldout/mean_reward")}
    assert tb == {e["version"]: pytest.approx(e["mean_reward"], rel=1e-6) for e in evals}
    wb = {int(r["eval/version"]): r["eval/heldout/pass@1"] for r in rows if "eval/version" in r}
    assert wb == {e["version"]: pytest.approx(e["pass@1"]) for e in evals}
    # samples.jsonl's rows as one W&B table (a history row names it by nested keys: samples/_type, ...)
    table = [r for r in rows if "samples/_type" in r]
    assert len(table) == 1 and table[0]["samples/_type"] == "table-file" and table[0]["samples/nrows"] > 0


def test_wandb_project_entity_name_come_from_the_pipeline_then_the_environment():
    """Offline stays the default; online, project, entity and name are set in run.wandb or WANDB_*."""
    assert loggers.wandb_run({}, "grpo", "run-1", env={}) == {"project": "grpo", "entity": None, "name": "run-1",
                                                              "mode": "offline"}
    env = {"WANDB_PROJECT": "p-env", "WANDB_ENTITY": "team", "WANDB_MODE": "online"}
    assert loggers.wandb_run({}, "grpo", "run-1", env=env) == {"project": "p-env", "entity": "team", "name": "run-1",
                                                               "mode": "online"}
    mine = {"project": "mine", "name": "first try", "mode": "offline"}
    assert loggers.wandb_run(mine, "grpo", "run-1", env=env) == {"project": "mine", "entity": "team",
                                                                 "name": "first try", "mode": "offline"}
    errs = _errors("run.loggers=[wandb]", "run.wandb={projetc: x, mode: onlin}")
    assert any("unknown key 'projetc'" in e and "did you mean 'project'" in e for e in errs), errs
    assert any("run.wandb.mode must be one of ['offline', 'online']" in e and "did you mean 'online'" in e for e in errs)
    assert _errors("run.loggers=[wandb]", "run.wandb={project: rl, entity: me, name: a, mode: online}") == []
