"""YAML loading (lines, defaults, overrides, interpolation) and the YAML -> Graph -> YAML round trip."""

from __future__ import annotations

import glob
import os

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from dora.graph.model import Graph, Node
from dora.graph.validate import check_file, validate
from dora.graph.yaml_io import load_file, load_graph, load_text, to_yaml
from test_graph_helpers import BASE, graphs, line_of, valid_graphs, write

# no "explain" phase: it is slow and its patch files are noise
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink]
PIPELINES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "pipelines", "*.yaml")))


def test_pipelines_exist():
    names = {os.path.basename(p) for p in PIPELINES}
    assert {"quickstart.yaml", "grpo.yaml", "dapo.yaml", "ppo.yaml", "rloo.yaml", "smollm2_arithmetic.yaml"} <= names


@pytest.mark.parametrize("path", PIPELINES, ids=os.path.basename)
def test_every_pipeline_validates_without_warnings(path):
    g, diags = check_file(path)
    assert g is not None and diags == [], [d.format() for d in diags]
    with open(path) as f:
        head = f.read().split("\nname:")[0]
    assert head.startswith("#") and f"dora run pipelines/{os.path.basename(path)} --out runs/" in head


@pytest.mark.parametrize("path", PIPELINES, ids=os.path.basename)
def test_every_pipeline_round_trips(path):
    g = load_graph(path)
    g2, diags = load_text(to_yaml(g))
    assert diags == [] and g2 == g
    assert to_yaml(g2) == to_yaml(g)


def test_lines_are_recorded(tmp_path):
    g = load_graph(write(tmp_path, BASE))
    assert g.nodes["rollout"].loc.line == line_of(BASE, "  rollout: {op")
    assert g.nodes["advantage"].inputs["scored"].loc.line == line_of(BASE, "  advantage:")
    assert g.loc_of("nodes.rollout.params.max_tokens").line == line_of(BASE, "max_tokens")
    assert g.loc_of("async.mode").line == line_of(BASE, "async:")
    assert g.weights[0].loc.line == line_of(BASE, "{from: train, to: rollout}")


def test_defaults_are_merged_in_order_and_this_file_wins(tmp_path):
    write(tmp_path, "pools: {rollout: {device: cpu, count: 8}}\nasync: {mode: dora, max_staleness: 3}\nrun: {seed: 1}\n", "a.yaml")
    write(tmp_path, "async: {max_staleness: 5}\nrun: {seed: 2, out: runs/b}\n", "b.yaml")
    text = "defaults: [a.yaml, b.yaml]\n" + BASE.replace("async: {mode: sync, max_staleness: 1, ", "async: {")
    g, diags = load_file(write(tmp_path, text))
    assert diags == []
    assert g.pools["rollout"].count == 2                # this file wins over a.yaml
    assert g.async_.mode == "dora" and g.async_.max_staleness == 5   # b.yaml over a.yaml
    assert (g.run.seed, g.run.out) == (2, "runs/b")
    assert g.loc_of("async.mode").file.endswith("a.yaml")


def test_defaults_errors(tmp_path):
    write(tmp_path, "defaults: [p.yaml]\n", "loop.yaml")
    _, diags = load_file(write(tmp_path, "defaults: [loop.yaml, nothere.yaml]\n" + BASE))
    msgs = [d.format() for d in diags]
    assert any("defaults form a cycle" in m for m in msgs), msgs
    assert any("'nothere.yaml' not found" in m for m in msgs), msgs


def test_interpolation(tmp_path):
    text = BASE.replace("train: {device: cpu, count: 1}", "train: {device: cpu, count: '${pools.rollout.count}'}").replace(
        "max_tokens: 8", "max_tokens: '${async.rollout_batch}'")
    g = load_graph(write(tmp_path, text))
    assert g.pools["train"].count == 2 and g.nodes["rollout"].params["max_tokens"] == 16


def test_interpolation_error_names_the_key(tmp_path):
    _, diags = load_file(write(tmp_path, BASE.replace("max_tokens: 8", "max_tokens: '${nope.nothing}'")))
    assert len(diags) == 1 and "interpolation failed" in diags[0].message and "nodes.rollout.params.max_tokens" in diags[0].message
    assert diags[0].loc.line == line_of(BASE, "max_tokens")


def test_overrides(tmp_path):
    path = write(tmp_path, BASE)
    g = load_graph(path, ["nodes.rollout.replicas=4", "pools.rollout.count=4", "async.mode=dora", "nodes.rollout.params.temperature=0.5",
                          "weights.0.to=rollout", "run.seed=3"])
    assert g.nodes["rollout"].replicas == 4 and g.pools["rollout"].count == 4 and g.async_.mode == "dora"
    assert g.nodes["rollout"].params["temperature"] == 0.5 and g.run.seed == 3
    _, diags = load_file(path, ["noequals", "name.deeper=1"])
    assert len(diags) == 2 and "not key=value" in diags[0].message and "not a mapping" in diags[1].message


def test_override_feeds_interpolation(tmp_path):
    text = BASE.replace("max_tokens: 8", "max_tokens: '${async.train_batch}'")
    assert load_graph(write(tmp_path, text), ["async.train_batch=32"]).nodes["rollout"].params["max_tokens"] == 32


def test_short_input_form_and_yaml_merge_keys(tmp_path):
    text = BASE.replace("{prompts: prompts/out}", "{prompts: prompts}").replace(
        "  reward: {op: reward, inputs: {trajectories: rollout/out}}",
        "  reward: &r {op: reward, inputs: {trajectories: rollout/out}}\n  reward2: {<<: *r, params: {fn: format}}")
    g, diags = load_file(write(tmp_path, text))
    assert diags == [] and g.nodes["rollout"].inputs["prompts"].src_port == "out"
    assert g.nodes["reward2"].inputs["trajectories"].src == "rollout" and g.nodes["reward2"].params == {"fn": "format"}


def test_literal_dollar_brace_survives_round_trip():
    g = Graph(name="x", nodes={"d": Node("d", "dataset", params={"source": "lit ${not.a.ref} and \\${x}"})})
    assert load_text(to_yaml(g))[0] == g


# ------------------------------------------------------------------ property: random graphs round-trip

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=PHASES)
@given(graphs())
def test_round_trip_is_identity(g):
    y = to_yaml(g)
    g2, diags = load_text(y)
    assert diags == [], [d.format() for d in diags]
    assert g2 == g, y
    assert to_yaml(g2) == y


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=PHASES)
@given(valid_graphs())
def test_random_valid_graphs_validate_and_round_trip(g):
    assert [d.format() for d in validate(g) if d.severity == "error"] == []
    g2, diags = load_text(to_yaml(g))
    assert diags == [] and g2 == g
    assert [(d.severity, d.message) for d in validate(g2)] == [(d.severity, d.message) for d in validate(g)]


def test_load_text_resolves_defaults_in_base_dir(tmp_path):
    write(tmp_path, "pools: {rollout: {device: cpu, count: 2}, train: {device: cpu, count: 1}}\n", "base.yaml")
    text = "defaults: [base.yaml]\n" + BASE.replace("pools:\n  rollout: {device: cpu, count: 2}\n  train: {device: cpu, count: 1}\n", "")
    assert "pools" not in text
    g, diags = load_text(text, base_dir=str(tmp_path))
    assert diags == [] and g.pools["train"].count == 1


def test_print_graph_shows_pools_nodes_edges_weights_and_round_trips():
    g = load_graph(os.path.join(os.path.dirname(__file__), "..", "pipelines", "quickstart.yaml"))
    text = str(g)
    lines = text.splitlines()
    assert lines[0] == "graph grpo-quickstart:"
    node_lines = {ln.split()[0]: ln for ln in lines if ln.strip().startswith("%") and " = " in ln.replace("  ", " ")}
    assert set(node_lines) == {f"%{n}" for n in g.nodes}
    assert "generate(prompts=prompts)" in node_lines["%rollout"] and "x2" in node_lines["%rollout"] and "pool rollout" in node_lines["%rollout"]
    assert "advantage(scored=reward [group_by=group_id])" in node_lines["%advantage"]
    assert any(ln.split() == ["%train", "->", "%rollout"] for ln in lines)
    assert any(ln.split() == ["rollout", "cpu", "x", "2"] for ln in lines)
    # columns line up, as in torch.fx's printout
    assert len({ln.index("=") for ln in node_lines.values()}) == 1
    assert load_text(to_yaml(g))[0] == g   # printing is a view; YAML still round-trips


@pytest.mark.parametrize("text, opened, failed", [
    ("name: x\nnodes:\n  a: {op: dataset,\n  b: 1\nc: 2\n", 3, 5),      # unclosed {
    ("name: x\npools: [1, 2,\n  3\nnodes: {}\n", 2, 4),                  # unclosed [
    ('name: "abc\nnodes: {}\n', 1, 3),                                  # unclosed quote
])
def test_syntax_error_names_where_the_construct_opened_and_where_parsing_failed(text, opened, failed):
    _, diags = load_text(text, file="p.yaml")
    assert len(diags) == 1 and diags[0].loc.line == opened, diags
    assert f"line {failed}" in diags[0].message and "not closed" in diags[0].message


@pytest.mark.parametrize("text, what", [
    ("name: x\nmodel: &m\n  a: *m\n", "recursive anchor"),
    ("name: x\nmodel: &m [1, *m]\n", "recursive anchor"),
    ("name: x\nmodel: &m\n  <<: *m\n  a: 1\n", "recursive anchor"),
    ("a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n"
                                            for p, c in zip("abcdefgh", "bcdefghi")), "alias bomb"),
])
def test_recursive_anchors_and_alias_bombs_are_refused_quickly(tmp_path, text, what):
    """In a fresh process (so a hang or a memory blow-up cannot take the suite with it): exit 2, an
    error naming the problem, well inside a second of work and bounded memory."""
    import subprocess
    import sys
    import time

    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "   # 2 GiB: bounded memory
    code = limit + "import sys; from dora.cli import main; sys.exit(main(['validate', sys.argv[1]]))"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60,
                       cwd=os.path.join(os.path.dirname(__file__), ".."))
    assert r.returncode == 2 and what in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert time.monotonic() - t0 < 30   # a bound on the hang, not a speed claim: the parse itself is ~0.2 s
