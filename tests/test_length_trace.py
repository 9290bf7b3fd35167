"""A user picks K from their own run: every run appends RUN_DIR/length_trace.jsonl (one line per step:
its groups' prompt and response lengths, turns and tool waits where multi-turn), and `dora simulate
--trace FILE --sweep-k` replays it per K against sync and the partial baselines. Bad input: a bad
line is file:line, exit 2; K < 1 or not an integer, exit 2; a train batch larger than the trace's
steps, an error naming both numbers."""

from __future__ import annotations

import json

import pytest

from dora.rl.length_trace import LengthTrace, length_trace_path
from dora.rl.multiturn_reports import MultiTurnReports
from dora.observe.trace import TraceWriter
from dora.sim.simulate_cli import simulate_main
from dora.sim.step_trace import StepTraceWorkload
from dora.sim.sweep_k import parse_ks, smallest_k
from dora.sim.workloads import PromptSource, Turns, WorkloadError

TINY = ["--model", "qwen2.5-1.5b", "--gpus", "8", "--steps", "3"]


class _Clock:
    def now(self):
        return 0.0


def _write_run_trace(tmp_path, steps=3, groups=4, g=4):
    """What a run's driver writes: one line per trained step, multi-turn turns from `finished` events."""
    class M:
        path = str(tmp_path / "metrics.jsonl")
    path = length_trace_path(M())
    reports = MultiTurnReports(_Clock(), TraceWriter(), None)
    reports.on_event("rollout[0]", {"kind": "finished", "uids": ["s0.g0.0"], "prompt_tokens": [30],
                                    "turn_trace": [[[20, 1.5, 7], [9, 0.0, 0]]]}, None)
    trace = LengthTrace(path)
    for s in range(steps):
        lengths = [(f"s{s}.g{j}.{i}", f"s{s}.g{j}", 30 + j, 40 * (i + 1) + s) for j in range(groups) for i in range(g)]
        trace.write(s + 1, {"lengths": lengths}, reports.take_turns)
    return path


def test_a_run_trace_replays_step_by_step_with_its_groups_and_turns(tmp_path):
    path = _write_run_trace(tmp_path)
    first = json.loads(open(path).readline())
    assert first["step"] == 1 and len(first["groups"]) == 4
    assert first["groups"][0] == {"prompt_tokens": 30, "responses": [[[20, 1.5, 7], [9, 0.0, 0]], 80, 120, 160]}
    w = StepTraceWorkload(path)
    assert (w.group_size, w.per_step) == (4, 16)
    src = PromptSource(w, 4, seed=0)
    drawn = src(8)                                        # the first two steps' groups, in step order
    assert sorted(len(g) for g in drawn) == [4] * 8
    assert {r.prompt_tokens for g in drawn[:4] for r in g} == {30, 31, 32, 33}
    assert isinstance(next(r.payload for g in drawn[:4] for r in g if r.prompt_tokens == 30), Turns)
    assert sorted(r.payload for g in drawn[4:8] for r in g if r.prompt_tokens == 31) == [41, 81, 121, 161]
    with pytest.raises(WorkloadError, match="hold 16 trajectories, fewer than the simulated train batch of 32"):
        w.check(32, 4)
    with pytest.raises(WorkloadError, match="hold 4 responses, the simulated group size is 8"):
        w.check(16, 8)


def test_sweep_k_bad_input_exits_2(tmp_path, capsys):
    path = _write_run_trace(tmp_path)
    for ks, msg in (("0,2", "K must be >= 1"), ("1,x", "'x' is not an integer"), ("2.5", "'2.5' is not an integer")):
        assert simulate_main(TINY + ["--trace", path, "--sweep-k", ks]) == 2
        assert msg in capsys.readouterr().err
    assert simulate_main(TINY + ["--trace", path, "--train-batch", "32", "--sweep-k", "1"]) == 2
    assert "its steps hold 16 trajectories, fewer than the simulated train batch of 32" in capsys.readouterr().err
    with open(path, "a") as f:
        f.write('{"step": 4, "groups": [{"prompt_tokens": 5, "responses": [1, 2, 0, 4]}]}\n')
    assert simulate_main(TINY + ["--trace", path, "--sweep-k", "1"]) == 2
    assert f"{path}:4:" in capsys.readouterr().err
    assert parse_ks("10,1,3,3") == [1, 3, 10]


def test_sweep_k_prints_dora_per_k_against_sync_and_the_partial_baselines(tmp_path, capsys):
    path, out = _write_run_trace(tmp_path), tmp_path / "sweep.json"
    assert simulate_main(TINY + ["--trace", path, "--sweep-k", "1,2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "partial_colocated" in text and "partial_inflight" in text and "of the ideal" in text
    rows = json.loads(out.read_text())
    assert [r["k"] for r in rows] == [1, 2]
    for r in rows:
        assert r["dora"]["staleness_max"] <= r["k"] and r["partial"]["staleness_max"] <= r["k"]
        assert r["dora"]["c1_violations"] == r["dora"]["c3_violations"] == 0 and r["partial"]["mode"] == "partial"
        assert r["dora_of_ideal"] == pytest.approx(r["dora"]["tokens_per_s"] / r["ideal"]["tokens_per_s"])
    assert smallest_k(rows, goal=0.0) == 1 and smallest_k(rows, goal=2.0) is None
