"""issue 34: several policies in one graph, the graph side: what each policy is made of, the settings it
runs with, and every bad input `dora validate` names at file:line (pipelines/challenger_solver.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dora.graph.builder import Pipeline
from dora.graph.policies import find_policies
from dora.graph.resolve import resolve
from dora.graph.schema import resolve_all
from dora.graph.yaml_io import load_graph, load_text, to_yaml
from test_graph_helpers import errors, line_of

PIPELINE = Path(__file__).resolve().parents[1] / "pipelines" / "challenger_solver.yaml"
TEXT = PIPELINE.read_text()


def only_error(tmp_path, text, overrides=()):
    errs = errors(tmp_path, text, overrides)
    assert len(errs) == 1, [d.format() for d in errs]
    return errs[0]


def test_the_shipped_pipeline_has_two_policies_with_their_own_settings():
    g = load_graph(str(PIPELINE))
    specs, _ = resolve_all(g)
    by_update = {p.update: p for p in find_policies(g, specs)}
    assert set(by_update) == {"solver", "challenger"}
    assert by_update["challenger"].generate == "challenger_rollout" and by_update["challenger"].prompt_source == "topics"
    assert by_update["solver"].generate == "solver_rollout" and by_update["solver"].prompt_source == "problems"
    assert set(by_update["challenger"].scoring) == {"frontier", "challenger_advantage"}
    assert set(by_update["solver"].scoring) == {"grade", "solver_advantage"}
    r = resolve(g)
    solver, challenger = r.policies["solver"], r.policies["challenger"]
    assert (solver.train_batch, solver.group_size, solver.policy) == (32, 4, "solver")
    assert (challenger.train_batch, challenger.policy) == (16, "challenger")   # the per-policy override
    assert r.async_of("frontier") is challenger and r.async_of("grade") is solver and r.async_of("problems") is solver
    # the ops that join the policies name the versions of the policy on the other side
    assert r.params["problems"]["version_column"] == "challenger_version"
    assert r.params["frontier"]["version_column"] == "solver_version" and r.params["frontier"]["answers"] == 4


def test_print_yaml_and_builder_show_the_same_graph():
    g = load_graph(str(PIPELINE))
    text = str(g)
    assert "policies:" in text and "%challenger:" in text and "generate %solver_rollout" in text
    assert "policy %challenger:  train_batch=16" in text
    again, diags = load_text(to_yaml(g))
    assert not [d for d in diags if d.severity == "error"] and again == g
    p = Pipeline("two", model=dict(g.model), async_={"mode": "sync", "train_batch": 32,
                                                     "policies": {"challenger": {"train_batch": 16}}})
    topics = p.node("topics", "dataset", source="synthetic:quickstart_propose", group_size=4)
    roll = p.node("challenger_rollout", "generate", model={"hidden": 32})
    topics >> roll.prompts
    problems = p.node("problems", "to_prompts", group_size=4)
    roll >> problems.trajectories
    solve = p.node("solver_rollout", "generate")
    problems >> solve.prompts
    grade = p.node("grade", "reward")
    solve >> grade.trajectories
    sadv = p.node("solver_advantage", "advantage")
    grade >> sadv.scored.opts(group_by="group_id")
    strain = p.node("solver", "update")
    sadv >> strain.batch
    front = p.node("frontier", "frontier")
    roll >> front.trajectories
    grade >> front.solved
    cadv = p.node("challenger_advantage", "advantage")
    front >> cadv.scored.opts(group_by="group_id")
    ctrain = p.node("challenger", "update", model={"hidden": 32})
    cadv >> ctrain.batch
    p.weights(ctrain, roll)
    p.weights(strain, solve)
    assert [d.format() for d in p.validate() if d.severity == "error"] == []
    assert "model hidden=32" in str(p.graph)
    assert resolve(p.graph).policies["challenger"].train_batch == 16


def test_a_generate_node_fed_by_two_update_nodes(tmp_path):
    text = TEXT.replace("  - {from: solver, to: solver_rollout}", "  - {from: solver, to: solver_rollout}\n"
                        "  - {from: challenger, to: solver_rollout}")
    errs = errors(tmp_path, text)
    d = next(e for e in errs if "fed weights by two update nodes" in e.message)
    assert d.loc.line == line_of(text, "{from: challenger, to: solver_rollout}")
    assert "'solver'" in d.message and "'challenger'" in d.message


def test_a_weights_edge_between_different_architectures_or_vocabularies(tmp_path):
    text = TEXT.replace("  challenger_rollout:\n    op: generate", "  challenger_rollout:\n    model: {hidden: 32}\n    op: generate")
    d = only_error(tmp_path, text)
    assert "different architectures" in d.message and "hidden_size 64 vs 32" in d.message
    assert d.loc.line == line_of(text, "{from: challenger, to: challenger_rollout}")
    text = TEXT.replace("  challenger:\n    op: update", "  challenger:\n    model: {vocab: 300}\n    op: update")
    d = only_error(tmp_path, text)
    assert "different vocabularies" in d.message and "vocab_size 300" in d.message
    # the same own model on both ends is fine: each policy may train a model of its own
    both = text.replace("  challenger_rollout:\n    op: generate", "  challenger_rollout:\n    model: {vocab: 300}\n    op: generate")
    assert errors(tmp_path, both) == []


def test_per_policy_settings_naming_no_update_node_or_no_setting(tmp_path):
    text = TEXT.replace("    challenger: {train_batch: 16}", "    challengr: {train_batch: 16}")
    d = only_error(tmp_path, text)
    assert "async.policies names 'challengr', which is not an update node" in d.message
    assert "did you mean 'challenger'" in (d.hint or "") and d.loc.line == line_of(text, "challengr:")
    text = TEXT.replace("    challenger: {train_batch: 16}", "    challenger:\n      train_batch: 16\n      max_stalenes: 2")
    d = only_error(tmp_path, text)
    assert "unknown setting 'max_stalenes'" in d.message and d.loc.line == line_of(text, "      max_stalenes: 2")
    text = TEXT.replace("    challenger: {train_batch: 16}", "    challenger:\n      mode: dora\n      max_staleness: 0")
    d = only_error(tmp_path, text)   # the mode's rules apply to the merged settings of that policy
    assert "policy 'challenger'" in d.message and "max_staleness >= 1" in d.message
    assert d.loc.line == line_of(text, "      max_staleness: 0")
    text = TEXT.replace("    challenger: {train_batch: 16}", "    challenger: {train_batch: 18}")
    d = only_error(tmp_path, text)
    assert "not a multiple of group_size 4" in d.message and d.loc.line == line_of(text, "train_batch: 18")


def test_a_cycle_of_data_between_policies_with_no_dataset_to_start_it(tmp_path):
    text = (TEXT.replace("    inputs: {prompts: topics/out}", "    inputs: {prompts: answers/out}")
            .replace("  problems:\n", "  answers:\n    op: to_prompts\n    inputs: {trajectories: solver_rollout/out}\n"
                     "    params: {task: \"synthetic:quickstart\", group_size: 4}\n  problems:\n"))
    errs = errors(tmp_path, text)
    d = next(e for e in errs if "cycle of data between the policies" in e.message)
    assert "no dataset starts it" in d.message and "from a dataset" in (d.hint or "")
    assert d.loc.file is not None and d.loc.line is not None


def test_memory_shares_of_two_policies_on_one_device(tmp_path):
    text = (TEXT.replace("  rollout: {device: cpu, count: 2}", "  gpu: {device: gpu, count: 1}")
            .replace("  train:   {device: cpu, count: 2}", "")
            .replace("pool: rollout", "pool: gpu\n    memory: 0.3").replace("pool: train", "pool: gpu\n    memory: 0.3"))
    errs = errors(tmp_path, text)
    d = next(e for e in errs if "120%" in e.message)
    assert "gpu pool 'gpu' device 0 shared by" in d.message and d.loc.line is not None
    assert errors(tmp_path, text.replace("memory: 0.3", "memory: 0.2")) == []


@pytest.mark.parametrize("bad, said", [
    ("    challenger: 16", "must be a mapping of settings"),
    ("    topics: {train_batch: 16}", "not an update node (op 'dataset')"),
])
def test_per_policy_entry_shapes(tmp_path, bad, said):
    text = TEXT.replace("    challenger: {train_batch: 16}", bad)
    assert said in only_error(tmp_path, text).message


def test_elastic_lending_is_checked_per_policy(tmp_path):
    assert errors(tmp_path, TEXT, ["async.elastic=true"]) == []   # each trainer has its own pool's devices to lend
    d = only_error(tmp_path, TEXT, ["async.elastic=true", "nodes.challenger.pool=rollout", "pools.rollout.count=3"])
    assert "'challenger' and 'challenger_rollout' share pool 'rollout'" in d.message
