"""The modes benchmark: what it reports from collected runs (equal steps, equal wall time, ratios),
resume (a run already in runs.jsonl is not run again), and one real short run end to end."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import modes  # noqa: E402


def fake_run(mode, seed, rewards, walls, tps, correction="default", held=()):
    """`held`: (version, pass@1) of the run's held-out evaluations (published when that step ended)."""
    n = len(rewards)
    key = modes.run_key("pipelines/quickstart.yaml", mode, correction, seed, n, [])
    per_step = {k: [0.0] * n for k in modes.PER_STEP}
    per_step.update(reward_mean=rewards, wall_s=walls, is_seq_ess=[1.0] * n, lr_scale=[1.0] * n)
    return {"key": key, "pipeline": "pipelines/quickstart.yaml", "mode": mode, "correction": correction, "seed": seed,
            "steps": n, "overrides": [], "ok": True, "error": None, "wall_s": walls[-1], "tokens": 1000,
            "tokens_per_s": tps, "staleness_max": 1, "c1_violations": 0, "c3_violations": 0, "reprefill_tokens": 0,
            "migrated_requests": 0, "lost": 0, "rollout_only_fraction": 0.0, "per_step": per_step,
            "evals": [{"set": "heldout", "version": v, "pass@1": p, "mean_reward": p, "published_s": ([0.0] + walls)[v],
                       "seconds": 1.0} for v, p in held]}


def test_report_compares_at_equal_steps_and_equal_time(tmp_path):
    n = 30
    held = lambda last: [(0, 0.0), (10, 0.2), (20, 0.3), (30, last)]   # noqa: E731
    runs = [fake_run("sync", s, [0.1] * 10 + [0.5] * 20, [2.0 * (i + 1) for i in range(n)], 100.0, held=held(0.6))
            for s in (0, 1)]
    # dora: finishes in half the time; reward 0.3 in its last 20 steps, 0.4 / 0.2 by seed
    runs += [fake_run("dora:1", s, [0.1] * 10 + [r] * 20, [1.0 * (i + 1) for i in range(n)], 200.0, held=held(r))
             for s, r in ((0, 0.4), (1, 0.2))]
    with open(tmp_path / "runs.jsonl", "w") as fh:
        for r in runs:
            fh.write(json.dumps(r) + "\n")
    rows = {r["mode"]: r for r in modes.summarize(modes.load_results(str(tmp_path)))}
    assert rows["sync"]["reward_last"]["mean"] == pytest.approx(0.5)
    assert rows["dora:1"]["reward_last"]["by_seed"] == pytest.approx([0.4, 0.2])
    assert rows["dora:1"]["gap_to_sync"] == pytest.approx(-0.2)
    assert rows["dora:1"]["x_sync"] == pytest.approx(2.0)
    assert rows["dora:1"]["gain"] == pytest.approx(0.3 - 0.1)
    # equal wall time = when the fastest run ended (30 s): sync had done 15 steps, the last 10 of them 0.1 x 5 + 0.5 x 5
    assert rows["sync"]["time_eq_s"] == 30.0 and rows["sync"]["steps_at_time"] == 15
    assert rows["sync"]["reward_at_time"]["mean"] == pytest.approx(0.3)
    assert rows["dora:1"]["reward_at_time"]["mean"] == pytest.approx(0.3)
    # held-out: at equal steps the last version evaluated (30); at equal time (30 s) sync had published
    # version 15, so its newest evaluated version then is 10; dora had published all 30
    hs = {h["mode"]: h for h in modes.held_out_rows(modes.load_results(str(tmp_path)), list(rows.values()))}
    st, tm = (lambda mode: hs[mode]["equal_steps"]), (lambda mode: hs[mode]["equal_time"])
    assert st("sync")["pass@1"] == {0: 0.6, 1: 0.6} and tm("sync")["pass@1"] == {0: 0.2, 1: 0.2}
    assert st("dora:1")["pass@1"] == {0: 0.4, 1: 0.2} and tm("dora:1")["version"] == 30
    assert st("dora:1")["pass@1_gap"]["mean"] == pytest.approx(-0.3)
    assert tm("dora:1")["pass@1_gap"]["mean"] == pytest.approx(0.1)
    md, png = tmp_path / "t.md", tmp_path / "c.png"
    assert modes.main(["report", "--out", str(tmp_path), "--pipelines", "pipelines/quickstart.yaml", "--modes",
                       "sync,dora:1", "--seeds", "0,1", "--steps", "30", "--md", str(md), "--png", str(png)]) == 0
    assert "| quickstart | dora:1 | default | - | 2 | 0.300 ± 0.141; 0.40 / 0.20 | -0.200 |" in md.read_text()
    assert "| quickstart | dora:1 | heldout | - | 2 | 0.300 ± 0.141 (30) | -0.300 ± 0.100 |" in md.read_text()
    assert png.stat().st_size > 10_000


def test_a_run_already_collected_is_skipped_and_a_failed_one_retried(tmp_path, monkeypatch):
    done = fake_run("sync", 0, [0.1] * 25, list(range(1, 26)), 10.0)
    failed = {**fake_run("sync", 1, [0.1] * 25, list(range(1, 26)), 10.0), "ok": False, "error": "boom"}
    with open(tmp_path / "runs.jsonl", "w") as fh:
        fh.write(json.dumps(done) + "\n" + json.dumps(failed) + "\n")
    ran = []
    monkeypatch.setattr(modes, "run_one", lambda r, out: ran.append(r["key"]) or {**fake_run("sync", r["seed"], [0.2] * 25, list(range(1, 26)), 10.0)})
    assert modes.main(["run", "--out", str(tmp_path), "--pipelines", "pipelines/quickstart.yaml", "--modes", "sync",
                       "--seeds", "0,1", "--steps", "25"]) == 0
    assert ran == [failed["key"]]
    assert {r["key"]: r["ok"] for r in modes.load_results(str(tmp_path))} == {done["key"]: True, failed["key"]: True}


@pytest.mark.parametrize("argv", [["--modes", "dora:x"], ["--modes", "async"], ["--steps", "10"], ["--seeds", "a"]])
def test_bad_arguments_exit_2(tmp_path, argv, capsys):
    with pytest.raises(SystemExit) as e:
        modes.main(["report", "--out", str(tmp_path), *argv])
    assert e.value.code == 2


@pytest.mark.slow
def test_one_short_real_run(tmp_path):
    argv = ["--out", str(tmp_path), "--pipelines", "pipelines/quickstart.yaml", "--modes", "dora:1", "--corrections",
            "m2po", "--seeds", "0", "--steps", "25", "nodes.rollout.params.max_tokens=32"]
    assert modes.main(["run", *argv]) == 0
    (r,) = modes.load_results(str(tmp_path))
    assert r["ok"] and len(r["per_step"]["reward_mean"]) == 25 and r["c1_violations"] == 0 and r["lost"] == 0
    assert max(r["per_step"]["staleness_mean"]) > 0 and 0 < min(r["per_step"]["is_seq_ess"][1:]) <= 1
    assert modes.main(["report", *argv]) == 0


def test_paired_gap_compares_seed_by_seed(tmp_path):
    """Seeds spread far more than the modes differ: the paired gap takes seed s of dora against seed s of
    sync (same start), and only seeds both modes have."""
    n = 25
    runs = [fake_run("sync", s, [r] * n, list(range(1, n + 1)), 100.0) for s, r in ((0, 0.5), (1, 0.9))]
    runs += [fake_run("dora:1", s, [r] * n, list(range(1, n + 1)), 100.0) for s, r in ((0, 0.4), (1, 0.85), (2, 0.0))]
    with open(tmp_path / "runs.jsonl", "w") as fh:
        for r in runs:
            fh.write(json.dumps(r) + "\n")
    rows = {r["mode"]: r for r in modes.summarize(modes.load_results(str(tmp_path)))}
    pg = rows["dora:1"]["paired_gap"]
    assert pg["n"] == 2 and pg["mean"] == pytest.approx(-0.075)
    assert pg["se"] == pytest.approx(0.025)
    assert rows["sync"]["paired_gap"] is None
    assert "-0.075 ± 0.025 (2)" in modes.table(list(rows.values()))
