"""`dora validate` on reward-model, judge and reward-source nodes (issue 33's bad input): each error at
the file:line of the setting, naming the node, all at once; a reward function checked against the
contract; the pipeline file's folder importable. No model is loaded (config.json is read)."""

from __future__ import annotations

import json
import sys
import textwrap

from dora.graph.diagnostics import errors_of
from dora.graph.validate import check_file
from test_graph_helpers import line_of, write

TINY = "{arch: llama, hidden: 32, layers: 1, heads: 2, kv_heads: 1, intermediate: 64, tokenizer: chars}"
HEAD = """\
name: t
nodes:
  prompts: {op: dataset, params: {group_size: 2}}
  rollout: {op: generate, inputs: {prompts: prompts/out}, params: {max_tokens: 8}}
"""
TAIL = """\
  advantage: {op: advantage, inputs: {scored: {from: reward/out, group_by: group_id}}}
  train: {op: update, inputs: {batch: advantage/out}}
weights:
  - {from: train, to: rollout}
async: {mode: sync, max_staleness: 1, rollout_batch: 4, train_batch: 4}
"""


def _folder(tmp_path, name, config):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    (d / "model.safetensors").write_text("")
    (d / "tokenizer.json").write_text("{}")
    return d


def test_every_bad_setting_is_named_at_its_line(tmp_path):
    causal = _folder(tmp_path, "causal", {"architectures": ["LlamaForCausalLM"]})
    two = _folder(tmp_path, "two", {"architectures": ["LlamaForSequenceClassification"], "id2label": {"0": "a", "1": "b"}})
    text = HEAD + "  " + textwrap.dedent(f"""\
      rm1: {{op: reward_model, inputs: {{trajectories: rollout/out}}, params: {{model: {{path: {causal}}}, column: reward/rm1}}}}
      rm2: {{op: reward_model, inputs: {{trajectories: rm1/out}}, params: {{model: {{path: {two}}}, column: reward/rm2}}}}
      rm3: {{op: reward_model, inputs: {{trajectories: rm2/out}}, params: {{model: {TINY}, template: "{{prompt}} only", column: reward/rm3}}}}
      j1:
        op: judge
        inputs: {{trajectories: rm3/out}}
        params: {{rubric: "Is {{prompt}} good?", column: reward/j1}}
      j2:
        op: judge
        inputs: {{trajectories: j1/out}}
        params: {{parser: regex, pattern: "(unclosed", column: "reward/j2"}}
      j3:
        op: judge
        inputs: {{trajectories: j2/out}}
        params: {{engine: http, url: "localhost:8000", column: reward/j3}}
      j4: {{op: judge, inputs: {{trajectories: j3/out}}, params: {{column: bad}}}}
      reward:
        op: reward
        inputs: {{trajectories: j4/out}}
        params:
          sources:
            - {{name: a, fn: synthetic, weight: .inf}}
            - {{name: a, column: reward/j1}}
            - {{name: c, fn: synthetic, column: reward/j2}}
    """).replace("\n", "\n  ").rstrip(" ") + TAIL
    path = write(tmp_path, text)
    _, diags = check_file(path)
    errs = errors_of(diags)
    got = {(d.node, d.loc.line): d.message for d in errs}
    expect = [
        ("rm1", f"path: {causal}", "not a sequence classifier"),
        ("rm2", f"path: {two}", "2 labels"),
        ("rm3", 'template: "{prompt} only"', "template has no {response}"),
        ("j1", 'rubric: "Is {prompt} good?"', "rubric has no {response}"),
        ("j2", 'pattern: "(unclosed"', "does not compile"),
        ("j3", 'url: "localhost:8000"', "not an http(s) URL"),
        ("j4", "column: bad", "column must be 'reward' or 'reward/<name>'"),
        ("reward", "weight: .inf", "finite"),
        ("reward", "- {name: a, column: reward/j1}", "used twice"),
        ("reward", "- {name: c, fn: synthetic, column: reward/j2}", "exactly one of fn"),
    ]
    for node, needle, words in expect:
        line = line_of(text, needle)
        assert (node, line) in got and words in got[(node, line)], (node, needle, [d.format() for d in errs])
    assert len(errs) == len(expect), [d.format() for d in errs]


def test_a_reward_function_is_checked_against_the_contract(tmp_path, monkeypatch):
    """The pipeline's folder is importable (no PYTHONPATH); a function whose signature cannot take
    (response_text, answer, row, **params) fails validate at its line, naming the node."""
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent("""\
        def two_args(text, answer):
            return 1.0

        async def good(response_text, answer, row, scale=1.0):
            return scale
    """))
    monkeypatch.setattr(sys, "path", list(sys.path))   # (check_file adds the pipeline's folder)
    base = HEAD + "  reward: {op: reward, inputs: {trajectories: rollout/out}, params: {fn: FN, params: PARAMS}}\n" + TAIL
    bad = base.replace("FN", "my_rewards:two_args").replace("PARAMS", "{}")
    _, diags = check_file(write(tmp_path, bad))
    (err,) = errors_of(diags)
    assert err.node == "reward" and err.loc.line == line_of(bad, "two_args") and "cannot be called as" in err.message
    wrong_kw = base.replace("FN", "my_rewards:good").replace("PARAMS", "{scael: 2}")
    (err,) = errors_of(check_file(write(tmp_path, wrong_kw))[1])
    assert "scael" in err.message
    ok = base.replace("FN", "my_rewards:good").replace("PARAMS", "{scale: 2}")
    assert not errors_of(check_file(write(tmp_path, ok))[1])


def test_the_judge_node_shows_with_its_pool_and_the_ops_catalogue_lists_the_new_ops(capsys):
    from dora.cli import main
    from dora.graph import viz
    from dora.graph.yaml_io import load_graph
    from e2e_audit import PIPELINES

    g = load_graph(str(PIPELINES / "judge.yaml"))
    printed = str(g)
    assert "%judge" in printed and "judge(trajectories=rollout)" in printed and "pool judge" in printed
    mermaid = viz.render(g, "mmd")
    assert 'pool judge' in mermaid and "+ reward/judge" in mermaid   # its pool, and the column it adds
    assert main(["ops", "--json"]) == 0
    ops = {o["name"]: o for o in json.loads(capsys.readouterr().out)}
    for name in ("reward_model", "judge"):
        assert ops[name]["columns"] and {"column", "model"} <= {p["name"] for p in ops[name]["params"]}
    assert {"url", "concurrency", "timeout_s", "retries", "rubric", "parser", "on_error"} <= {p["name"] for p in ops["judge"]["params"]}
    assert "sources" in {p["name"] for p in ops["reward"]["params"]}
