"""Held-out evaluation (the `eval:` section): declared and checked at file:line, run during training
apart from the training books, written to eval.jsonl / samples.jsonl / summary.json / the dashboard /
checkpoints/best, and `dora eval` giving the run's own numbers at temperature 0.

One short sync run of the quickstart (module-scoped) serves most assertions; its evaluation sets
include a reward that hangs (timed out, named), one that raises with on_error fail (abandoned,
named) and one with on_error zero (scored 0, counted). Dora mode with the loggers: test_loggers.py;
every mode's placement and accounting: test_rollout_invariants.py (held_out)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dora.graph.diagnostics import errors_of
from dora.graph.validate import check_file
from dora.ops.eval_scores import majority_correct, pass_at_k, set_metrics
from tests.e2e_audit import PIPELINES, dora_run

QUICKSTART = str(PIPELINES / "quickstart.yaml")
STEPS, TBS = 4, 16
RUN = ["async.train_batch=16", "async.rollout_batch=16", "nodes.prompts.params.batch_prompts=4",
       "nodes.rollout.params.max_tokens=24", "nodes.rollout.params.max_batch=8", f"nodes.train.params.steps={STEPS}",
       "run.save_every=2", "run.samples_per_step=2", "eval.heldout.every=2", "eval.heldout.size=12",
       "eval.slow={source: 'synthetic:quickstart', size: 2, every: 0, before_training: false, "
       "reward: 'tests.test_eval:hanging_reward', timeout_s: 2}",
       "eval.broken={source: 'synthetic:quickstart', size: 2, every: 0, before_training: false, "
       "reward: 'tests.test_eval:raising_reward', on_error: fail}",
       "eval.lenient={source: 'synthetic:quickstart', size: 2, every: 0, before_training: false, "
       "reward: 'tests.test_eval:raising_reward', on_error: zero}"]


def hanging_reward(text: str, answer: str, row: dict) -> float:
    time.sleep(60)   # (a daemon thread: the run does not wait for it)
    return 0.0


def raising_reward(text: str, answer: str, row: dict) -> float:
    raise ValueError("no score")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from dora.ops.weights import versions as weights
    out = tmp_path_factory.mktemp("eval") / "run"
    t0 = time.monotonic()
    rc = dora_run(out, "quickstart.yaml", *RUN, deadline=300, evaluate=True)
    yield out, rc, time.monotonic() - t0
    weights.cleanup(str(out))


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_eval_jsonl_has_one_line_per_version_and_set(run):
    out, rc, _ = run
    assert rc == 0
    lines = [e for e in _jsonl(out / "eval.jsonl") if e["set"] == "heldout"]
    assert [e["version"] for e in lines] == [0, 2, 4] and [e["step"] for e in lines] == [0, 2, 4]
    keys = {"version", "step", "set", "n_prompts", "k", "mean_reward", "pass@1", "pass@k", "maj@k",
            "mean_response_tokens", "truncated_share"}
    for e in lines:
        assert keys <= set(e), keys - set(e)
        assert e["n_prompts"] == 12 and e["k"] == 1 and e["pass@k"] == e["pass@1"] and e["samples"] == 12
        assert 0 <= e["mean_reward"] <= 1 and 0 < e["mean_response_tokens"] <= 24


def test_a_slow_or_failing_evaluation_is_named_and_never_holds_the_run(run):
    out, rc, wall = run
    s = json.loads((out / "summary.json").read_text())
    failed = {f["set"]: f["why"] for f in s["eval"]["failed"]}
    assert set(failed) == {"slow", "broken"} and "not finished 2 s after it became due" in failed["slow"], failed
    assert "failed on eval:broken:v4:" in failed["broken"] and "no score" in failed["broken"]
    assert wall < 200 and s["eval"]["unfinished"] == []
    lenient = [e for e in _jsonl(out / "eval.jsonl") if e["set"] == "lenient"]
    assert len(lenient) == 1 and lenient[0]["reward_errors"] == 2 and lenient[0]["mean_reward"] == 0


def test_eval_samples_are_counted_apart_from_training(run):
    out, _, _ = run
    s = json.loads((out / "summary.json").read_text())
    a = s["accounting"]
    assert a["lost"] == 0 and a["trained"] == STEPS * TBS
    assert a["dispatched"] == a["trained"] + a["finished_untrained"] + a["in_flight_at_end"] + a["in_training_at_end"] + a["dropped"]
    assert a["eval_samples"] == 3 * 12 + 2 + 2 + 2 and a["eval_requests"] == a["eval_samples"]
    assert s["eval"]["version_mismatch"] == 0
    trained = {u for line in _jsonl(out / "trained.jsonl") for u in line["uids"]}
    assert not any(u.startswith("eval:") for u in trained)
    samples = _jsonl(out / "samples.jsonl")
    train = [x for x in samples if x["kind"] == "train"]
    assert sorted(x["step"] for x in train) == sorted([1, 2, 3, 4] * 2)
    ev = [x for x in samples if x["kind"] == "eval" and x["set"] == "heldout"]
    assert len(ev) == 36 and {x["version"] for x in ev} == {0, 2, 4}
    for x in train + ev:
        assert {"prompt", "response", "reward", "version", "finish_reason"} <= set(x)


def test_summary_names_the_best_version_and_keep_best_holds_it(run):
    out, _, _ = run
    s = json.loads((out / "summary.json").read_text())
    lines = [e for e in _jsonl(out / "eval.jsonl") if e["set"] == "heldout"]
    best = max(lines, key=lambda e: (e["mean_reward"], -e["version"]))
    got = s["eval"]["sets"]["heldout"]
    assert got["best"]["mean_reward"] == {"version": best["version"], "value": best["mean_reward"]}
    assert got["evaluations"] == 3 and got["last"]["version"] == 4
    kept = json.loads((out / "checkpoints" / "best" / "best.json").read_text())
    assert kept["metric"] == "eval/heldout/mean_reward" and kept["version"] == best["version"]
    assert (out / "checkpoints" / "best" / "config.json").is_file()


def test_dora_eval_gives_the_runs_numbers_at_temperature_0(run, tmp_path, capsys):
    from dora.rl.eval_cli import eval_main
    out, _, _ = run
    js = tmp_path / "e.json"
    assert eval_main([str(out / "checkpoints" / "step_4"), "--set", "heldout", "--json", str(js)]) == 0
    table = capsys.readouterr().out
    assert "heldout" in table and "pass@1" in table
    mine = json.loads(js.read_text())["sets"]["heldout"]
    theirs = next(e for e in _jsonl(out / "eval.jsonl") if e["set"] == "heldout" and e["version"] == 4)
    for k in ("n_prompts", "mean_reward", "pass@1", "pass@k", "maj@k", "mean_response_tokens", "truncated_share"):
        assert mine[k] == theirs[k], (k, mine[k], theirs[k])
    assert eval_main([str(out)]) == 2   # the run folder itself is not a checkpoint
    assert "lacks config.json and weights" in capsys.readouterr().err


def test_dashboard_and_plot_show_the_evaluations(run, tmp_path):
    from dora.observe.dashboard.read_run import load_state
    from dora.observe.plot_runs import plot_main
    out, _, _ = run
    state = load_state(str(out))
    assert {(e["set"], e["version"]) for e in state["evals"]} >= {("heldout", 0), ("heldout", 2), ("heldout", 4)}
    assert state["samples"] and all("response" in x for x in state["samples"])
    assert json.loads((out / "state.json").read_text())["evals"], "the live state.json carries them too"
    assert plot_main([str(out), "-o", str(tmp_path / "p.png")]) == 0


# -- declared and checked: no run --------------------------------------------------------------------
def _errors(*overrides: str) -> list[str]:
    _, diags = check_file(QUICKSTART, list(overrides))
    return [d.format() for d in diags]


def test_bad_eval_settings_are_named_at_file_line(tmp_path):
    text = Path(QUICKSTART).read_text() + (
        "  bad:\n    source: missing.jsonl\n    samples: 2\n    k: 3\n    reward: math_verfy\n    every: -1\n")
    p = tmp_path / "p.yaml"
    p.write_text(text)
    lines = text.splitlines()
    at = {k: 1 + next(i for i, x in enumerate(lines) if x.strip().startswith(f"{k}:") and i > 40)
          for k in ("source", "reward", "every")}
    _, diags = check_file(str(p), [])
    errs = [d.format() for d in errors_of(diags)]
    assert any(f"{p}:{at['every']}:" in e and "every must be >= 0" in e for e in errs), errs
    assert any(f"{p}:{at['source']}:" in e and "missing.jsonl" in e and "does not exist" in e for e in errs), errs
    assert any(f"{p}:{at['reward']}:" in e and "did you mean 'math_verify'" in e for e in errs), errs
    errs = _errors("eval.heldout.samples=2", "eval.heldout.k=3")
    assert len(errs) == 1 and "k 3 needs at least k samples" in errs[0], errs
    errs = _errors("eval.heldout.k=0")
    assert len(errs) == 1 and "k must be >= 1" in errs[0], errs
    errs = _errors("run.keep_best=eval/heldout/mean_rewrd")
    assert len(errs) == 1 and "no held-out set produces" in errs[0] and "did you mean 'eval/heldout/mean_reward'" in errs[0]
    errs = _errors("eval.heldout.colour=1")
    assert len(errs) == 1 and "unknown key 'colour'" in errs[0], errs
    errs = _errors("eval.heldout.split=holdout")
    assert len(errs) == 1 and "holds out" in errs[0] and "holdout: 0.1" in errs[0], errs
    bad_rows = tmp_path / "bad.jsonl"   # a file source's rows are parsed as a run reads them, the bad one named
    bad_rows.write_text('{"prompt": "1*a", "answer": "a"}\n{"answer": "b"}\n')
    errs = _errors(f"eval.heldout.source={bad_rows}")
    assert len(errs) == 1 and f"{bad_rows}:2: error: held-out set 'heldout': column 'prompt'" in errs[0], errs


def test_a_held_out_prompt_no_engine_can_take_refuses_the_run_before_any_work(tmp_path, capsys):
    """A held-out prompt over the generate node's context (the quickstart's 512 positions) is named at
    file:N by `dora validate`, refuses the run at its start with exit 2 (before any worker starts:
    not at the first evaluation, where the engine would fail the run), and with the training dataset's
    on_error: skip is skipped and counted instead."""
    from dora.graph.resolve import resolve
    from dora.graph.yaml_io import load_graph
    from dora.rl.execute import execute
    rows = tmp_path / "ev.jsonl"
    rows.write_text(json.dumps({"prompt": "1*a", "answer": "a"}) + "\n" + json.dumps({"prompt": "a" * 600, "answer": "a"}) + "\n")
    errs = _errors(f"eval.heldout.source={rows}", "eval.heldout.size=0")
    assert len(errs) == 1 and f"{rows}:2: error: held-out set 'heldout': the prompt is" in errs[0] and "over the limit of 511" in errs[0], errs
    skip = [f"eval.heldout.source={rows}", "eval.heldout.size=0", "nodes.prompts.params.on_error=skip"]
    assert [": warning: " in d for d in _errors(*skip)] == [True]
    late = tmp_path / "late.jsonl"   # `dora validate` reads a file's first 100 rows; the run reads every row at its start
    late.write_text((json.dumps({"prompt": "1*a", "answer": "a"}) + "\n") * 100
                    + json.dumps({"prompt": "a" * 600, "answer": "a"}) + "\n")
    assert not [e for e in _errors(f"eval.heldout.source={late}", "eval.heldout.size=0") if ": error: " in e]
    graph = load_graph(QUICKSTART, [f"eval.heldout.source={late}", "eval.heldout.size=0"])
    assert execute(graph, str(tmp_path / "run"), quiet=True) == 2
    assert f"{late}:101: the prompt is 600 tokens" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.jsonl").read_text()
    from dora.ops.eval_data import loaded_prompts
    from dora.ops.models import load_tokenizer
    sets = resolve(load_graph(QUICKSTART, skip)).evals
    loaded = loaded_prompts(sets["heldout"], load_tokenizer(load_graph(QUICKSTART, []).model))
    assert len(loaded.records) == 1 and loaded.skipped == 1 and f"{rows}:2:" in loaded.skipped_where[0]


def test_held_out_sets_are_refused_where_they_cannot_be_evaluated():
    """Several policies (a generate node each): refused at the set (dora validate exits 2 on it);
    evaluation per policy is not built. Weighted reward sources: a set names its one reward function."""
    over = 'eval={solve: {source: "synthetic:quickstart"}}'
    _, diags = check_file(str(PIPELINES / "challenger_solver.yaml"), [over])
    errs = [d.format() for d in errors_of(diags)]
    assert len(errs) == 1 and "2 generate nodes" in errs[0] and "one policy only" in errs[0], errs
    weighted = "nodes.reward.params.sources=[{name: right, fn: synthetic}, {name: fmt, fn: format, weight: 0.1}]"
    errs = [e for e in _errors(weighted) if "error" in e]
    assert len(errs) == 1 and "scores by weighted sources" in errs[0], errs
    assert not [e for e in _errors(weighted, "eval.heldout.reward=synthetic") if "error" in e]


def test_a_set_that_is_the_training_source_is_warned_about(tmp_path):
    rows = tmp_path / "d.jsonl"
    rows.write_text("\n".join(json.dumps({"prompt": f"{n}*a", "answer": "a" * n}) for n in (1, 2, 3)) + "\n")
    w = [d for d in _errors(f"nodes.prompts.params.source={rows}", f"eval.heldout.source={rows}") if "warning" in d]
    assert len(w) == 1 and "is the training source itself (the same file)" in w[0], w
    w = [d for d in _errors("eval.heldout.seed=0") if "warning" in d]
    assert len(w) == 1 and "same source and seed (0)" in w[0], w
    assert not [d for d in _errors() if "warning" in d]        # the shipped set: its own seed


def test_yaml_round_trip_keeps_the_eval_section():
    from dora.graph.yaml_io import load_graph, load_text, to_yaml
    g = load_graph(QUICKSTART, ["eval.heldout.samples=4", "eval.heldout.temperature=0.7"])
    again, diags = load_text(to_yaml(g))
    assert not errors_of(diags) and again == g and again.evals["heldout"].samples == 4


# -- the pieces --------------------------------------------------------------------------------------
def test_pass_at_k_and_majority():
    assert pass_at_k(4, 1, 1) == 0.25 and pass_at_k(4, 1, 2) == 0.5 and pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)
    s = lambda r, a: {"reward": r, "answer": a, "response_tokens": 3, "finish_reason": "stop"}   # noqa: E731
    assert majority_correct([s(0, "4"), s(1, "5"), s(0, "4")], 1.0) is False
    assert majority_correct([s(1, "5"), s(0, "4")], 1.0) is True            # a tie: the first seen
    assert majority_correct([s(1, None)], 1.0) is None
    m = set_metrics([[s(1, "5"), s(0, "4")], [s(0, None), s(0, None)]], 2, 1.0)
    assert m["pass@1"] == 0.25 and m["pass@k"] == 0.5 and m["maj@k"] == 0.5 and m["n_prompts"] == 2


def test_holdout_split_is_exactly_what_training_leaves_out():
    from dora.ops.dataset import load_records
    from dora.ops.eval_data import raw_records
    from dora.ops.holdout import held_out, prompt_text
    s = {"name": "h", "source": "synthetic:arithmetic", "size": 20, "seed": 5, "task_params": {}, "split": "holdout",
         "holdout": 0.3}
    evald = {prompt_text(r) for r in raw_records(s)}
    train = load_records("synthetic:arithmetic", 200, 0, {})
    assert evald and all(held_out({"prompt": p}, 0.3) for p in evald)
    kept = {prompt_text(r) for r in train if not held_out(r, 0.3)}   # what the dataset op trains on
    assert kept and not kept & evald
