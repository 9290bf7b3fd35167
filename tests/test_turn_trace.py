"""The simulator learns from real runs: the driver appends each multi-turn trajectory's turns (from
the generate replicas' `finished` events) to RUN_DIR/turn_trace.jsonl, and `dora simulate --trace`
replays that file: turn counts, tokens per turn and tool waits as recorded; a bad line is an error
naming file:line, exit 2."""

from __future__ import annotations

import json

from dora.observe.trace import TraceWriter
from dora.rl.multiturn_reports import MultiTurnReports, turn_trace_path
from dora.sim.simulate_cli import simulate_main
from dora.sim.workloads import TraceWorkload, Turns
from test_sim_cli import SMALL


class _Clock:
    def now(self):
        return 0.0


def _record(path) -> None:
    rec = MultiTurnReports(_Clock(), TraceWriter(), str(path))
    for i in range(10):
        ev = {"kind": "finished", "uids": [f"a{i}", f"b{i}"], "prompt_tokens": [40 + i, 60],
              "turn_trace": [[[30, 0.5, 12], [20, 1.5, 8], [10, 0.0, 0]], [[25, 0.0, 0]]]}
        rec.on_event("rollout[0]", ev, None)


def test_a_recorded_trace_replays_with_its_turns_and_waits(tmp_path):
    class M:
        path = str(tmp_path / "metrics.jsonl")
    path = turn_trace_path(M())
    assert path == str(tmp_path / "turn_trace.jsonl")
    _record(path)
    rows = TraceWorkload(path).rows
    assert len(rows) == 20
    prompt, plan = rows[0]
    assert prompt == 40 and isinstance(plan, Turns)
    assert (plan.outs, plan.waits, plan.tools) == ((30, 20, 10), (0.5, 1.5), (12, 8))
    assert rows[1] == (60, 25)                       # a one-turn trajectory is a plain length
    out = tmp_path / "o.json"
    assert simulate_main(SMALL + ["--modes", "dora", "--trace", path, "--json", str(out)]) == 0
    assert json.loads(out.read_text())[0]["c1_violations"] == 0


def test_a_bad_trace_line_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "turn_trace.jsonl"
    _record(path)
    with open(path, "a") as f:
        f.write(json.dumps({"prompt_tokens": 5, "turns": [[0, 1.0, 2]]}) + "\n")
    assert simulate_main(SMALL + ["--trace", str(path)]) == 2
    assert f"{path}:21:" in capsys.readouterr().err
