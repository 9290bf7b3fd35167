"""`dora simulate` (simulate_main): JSON contract, table, trace files, exit code 2 on bad input."""

from __future__ import annotations

import json

import pytest

from dora.sim.simulate_cli import simulate_main

SMALL = ["--model", "qwen2.5-1.5b", "--gpus", "8", "--steps", "4", "--train-batch", "64", "--group-size", "8"]
KEYS = {"mode", "step_time_s", "tokens_per_s", "rollout_only_fraction", "bubble_fraction", "staleness_max",
        "c1_violations", "c2_violations", "c3_violations", "overhead_fraction", "ratio_to_ideal"}


def test_json_has_every_mode_and_ideal(tmp_path, capsys):
    out = tmp_path / "out.json"
    rc = simulate_main(SMALL + ["--modes", "sync,one_step_off,partial,dora", "--json", str(out),
                                "--trace-out", str(tmp_path / "trace.json")])
    assert rc == 0
    rows = json.loads(out.read_text())
    assert [r["mode"] for r in rows] == ["sync", "one_step_off", "partial", "dora", "ideal"]
    for r in rows:
        assert KEYS <= set(r), KEYS - set(r)
        assert "ratio_to_sync" in r
    assert rows[0]["ratio_to_sync"] == 1.0
    assert "dora" in capsys.readouterr().out
    for m in ("sync", "dora"):
        assert json.loads((tmp_path / f"trace.{m}.json").read_text())["traceEvents"]


def test_trace_workload(tmp_path):
    f = tmp_path / "lens.jsonl"
    f.write_text("\n".join(json.dumps({"prompt_tokens": 50 + i, "response_tokens": 100 * (i + 1)}) for i in range(20)))
    out = tmp_path / "o.json"
    assert simulate_main(SMALL + ["--modes", "dora", "--trace", str(f), "--json", str(out)]) == 0
    assert json.loads(out.read_text())[0]["c3_violations"] == 0


@pytest.mark.parametrize("args, msg", [
    (["--modes", "sync,turbo"], "unknown mode"),
    (["--gpus", "6", "--model", "qwen2.5-32b"], "multiple of 4"),
    (["--train-batch", "60"], "multiple of group_size"),
    (["--steps", "0"], "--steps"),
    (["--model", "gpt-9"], "unknown model"),
    (["--trace", "/nonexistent/x.jsonl"], "cannot read trace"),
    (["--max-staleness", "0", "--modes", "dora"], "max_staleness"),
    (["--gpus", "many"], "invalid int"),
    (["--drop-groups", "1.5"], "--drop-groups"),
    (["--versions-per-instance", "0"], "must be >= 1, got 0"),
    (["--versions-per-instance", "5", "--model", "qwen2.5-32b"], "5 versions of qwen2.5-32b take 328.0 GB"),
    (["--versions-per-instance", "4", "--model", "qwen2.5-32b", "--workload", "longtail-128k"],
     "4 versions of qwen2.5-32b take 262.4 GB"),
])
def test_bad_arguments_exit_2(args, msg, capsys):
    assert simulate_main(SMALL + args) == 2
    assert msg in capsys.readouterr().err


def test_drop_groups_are_accounted(tmp_path):
    out = tmp_path / "o.json"
    assert simulate_main(SMALL + ["--modes", "sync,dora", "--drop-groups", "0.25", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert all(r["dropped"] > 0 and r["lost"] == 0 and r["c2_violations"] == 0 for r in rows if r["mode"] != "ideal")
