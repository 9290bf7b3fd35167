"""Validation: each case names the right node, column and line, and all errors come at once."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from dora.graph.diagnostics import GraphError
from dora.graph.validate import check_file, load_and_validate, validate
from test_graph_helpers import BASE, diagnose, errors, line_of, write


def only(diags, severity="error"):
    picked = [d for d in diags if d.severity == severity]
    assert len(picked) == 1, [d.format() for d in diags]
    return picked[0]


def test_base_is_valid(tmp_path):
    assert diagnose(tmp_path, BASE) == []


def test_yaml_syntax_error_has_line(tmp_path):
    text = BASE.replace("  reward: {op: reward,", "  reward: {op: reward,, ]")
    d = only(diagnose(tmp_path, text))
    assert "YAML syntax error" in d.message
    assert d.loc.line == line_of(text, "reward: {op: reward,, ]")
    assert d.format().startswith(f"{tmp_path / 'p.yaml'}:{d.loc.line}: error:")


def test_duplicate_key_is_rejected_with_both_lines(tmp_path):
    text = BASE.replace("  train: {op: update", "  reward: {op: reward, inputs: {trajectories: rollout/out}}\n  train: {op: update")
    d = only(diagnose(tmp_path, text))
    assert "duplicate key 'reward'" in d.message
    assert d.loc.line == line_of(text, "  reward: {op: reward", nth=1)
    assert f"first at line {line_of(text, '  reward: {op: reward')}" in d.message


def test_duplicate_key_inside_a_node(tmp_path):
    text = BASE.replace("replicas: 2,", "replicas: 2, replicas: 1,")
    d = only(diagnose(tmp_path, text))
    assert "duplicate key 'replicas'" in d.message and d.loc.line == line_of(text, "replicas: 1")


def test_unknown_top_level_key(tmp_path):
    text = BASE.replace("async:", "asnyc:")
    d = only(diagnose(tmp_path, text))
    assert "unknown key 'asnyc'" in d.message and "did you mean 'async'" in d.hint
    assert d.loc.line == line_of(text, "asnyc:")


def test_unknown_node_key(tmp_path):
    text = BASE.replace("replicas: 2,", "replica: 2,")
    d = only(diagnose(tmp_path, text))
    assert d.node == "rollout" and "unknown key 'replica'" in d.message and "'replicas'" in d.hint
    assert d.loc.line == line_of(text, "replica: 2")


def test_unknown_op_did_you_mean(tmp_path):
    text = BASE.replace("op: generate", "op: generat")
    d = only(diagnose(tmp_path, text))
    assert d.node == "rollout" and "unknown op 'generat'" in d.message and "did you mean 'generate'" in d.message
    assert d.loc.line == line_of(text, "op: generat")


def test_unknown_param_did_you_mean(tmp_path):
    text = BASE.replace("params: {max_tokens: 8}", "params: {max_tokens: 8, temperatur: 0.7}")
    d = only(diagnose(tmp_path, text))
    assert d.node == "rollout" and "unknown param 'temperatur'" in d.message and "did you mean 'temperature'" in d.hint
    assert d.loc.line == line_of(text, "temperatur")


def test_param_of_wrong_type(tmp_path):
    text = BASE.replace("params: {max_tokens: 8}", "params: {max_tokens: many}")
    d = only(diagnose(tmp_path, text))
    assert d.node == "rollout" and "'max_tokens' must be int" in d.message and "'many'" in d.message


def test_param_not_in_choices(tmp_path):
    d = only(diagnose(tmp_path, BASE.replace("params: {max_tokens: 8}", "params: {engine: tensorrt}")))
    assert d.node == "rollout" and "must be one of ['torch', 'vllm']" in d.message


def test_input_names_unknown_node(tmp_path):
    text = BASE.replace("{prompts: prompts/out}", "{prompts: promts/out}")
    d = only(diagnose(tmp_path, text))
    assert d.node == "rollout" and "unknown node 'promts'" in d.message and "did you mean 'prompts'" in d.hint
    assert d.loc.line == line_of(text, "promts/out")


def test_input_names_unknown_source_port(tmp_path):
    d = only(diagnose(tmp_path, BASE.replace("{prompts: prompts/out}", "{prompts: prompts/output}")))
    assert d.node == "rollout" and "unknown port 'output' of node 'prompts'" in d.message


def test_input_names_unknown_destination_port(tmp_path):
    diags = errors(tmp_path, BASE.replace("{prompts: prompts/out}", "{prompt: prompts/out}"))
    msgs = [d.format() for d in diags]
    assert any("has no input port 'prompt'" in m and "did you mean 'prompts'" in m for m in msgs), msgs
    assert any("needs an input on port 'prompts'" in m for m in msgs), msgs


def test_data_cycle_names_every_node_and_suggests_weights_edge(tmp_path):
    text = BASE.replace("{prompts: prompts/out}", "{prompts: train/out}")
    diags = errors(tmp_path, text)
    cyc = [d for d in diags if "cycle" in d.message]
    assert len(cyc) == 1, [d.format() for d in diags]
    for n in ("rollout", "reward", "advantage", "train"):
        assert repr(n) in cyc[0].message
    assert "{from: train, to: rollout}" in cyc[0].hint
    assert cyc[0].loc.line == line_of(text, "{prompts: train/out}")


def test_weights_edge_must_go_update_to_generate(tmp_path):
    text = BASE.replace("{from: train, to: rollout}", "{from: reward, to: rollout}")
    diags = diagnose(tmp_path, text)
    d = only(diags)
    assert "from 'reward' is op 'reward'" in d.message and "update nodes here: train" in d.hint
    assert d.loc.line == line_of(text, "{from: reward, to: rollout}")
    assert "weights reward -> rollout" in d.format()


def test_weights_edge_names_unknown_node(tmp_path):
    d = only(diagnose(tmp_path, BASE.replace("to: rollout}", "to: rolout}")))
    assert "unknown node 'rolout'" in d.message and "did you mean 'rollout'" in d.hint


def test_missing_column_names_column_node_and_producers(tmp_path):
    text = BASE.replace("inputs: {batch: advantage/out}", "inputs: {batch: reward/out}")
    diags = diagnose(tmp_path, text)
    d = only(diags)
    assert d.node == "train" and "needs column 'advantages'" in d.message
    assert "ops that add 'advantages': advantage" in d.hint
    assert d.loc.line == line_of(text, "inputs: {batch: reward/out}")


def test_conditional_column_gae_needs_values_from_a_critic(tmp_path):
    text = BASE.replace("{from: reward/out, group_by: group_id}}}", "{from: reward/out, group_by: group_id}}, params: {estimator: gae}}")
    d = only(diagnose(tmp_path, text))
    assert d.node == "advantage" and "'values'" in d.message and "critic" in d.hint


def test_kl_coef_needs_ref_logprobs_from_a_reference(tmp_path):
    text = BASE.replace("inputs: {batch: advantage/out}}", "inputs: {batch: advantage/out}, params: {kl_coef: 0.01}}")
    d = only(diagnose(tmp_path, text))
    assert d.node == "train" and "'ref_logprobs'" in d.message and "reference" in d.hint


def test_group_by_on_column_not_flowing(tmp_path):
    text = BASE.replace("group_by: group_id", "group_by: group")
    d = only(diagnose(tmp_path, text))
    assert "group_by column 'group' does not flow on this edge" in d.message and "'group_id'" in d.hint
    assert d.edge == "reward/out -> advantage.scored" and d.loc.line == line_of(text, "group_by: group}")


def test_hash_routing_on_column_not_flowing(tmp_path):
    d = only(diagnose(tmp_path, BASE.replace("group_by: group_id", "group_by: group_id, routing: 'hash:prompt_id'")))
    assert "routing hash column 'prompt_id'" in d.message


def test_undefined_pool(tmp_path):
    text = BASE.replace("pool: train,", "pool: trian,")
    d = only(diagnose(tmp_path, text))
    assert d.node == "train" and "pool 'trian' is not defined" in d.message and "did you mean 'train'" in d.hint
    assert d.loc.line == line_of(text, "pool: trian")


def test_pool_oversubscribed(tmp_path):
    text = BASE.replace("replicas: 2,", "replicas: 3,")
    d = only(diagnose(tmp_path, text))
    assert "pool 'rollout' is oversubscribed" in d.message and "rollout (3)" in d.message and "count 2" in d.message
    assert d.loc.line == line_of(text, "rollout: {device: cpu")


# ---------------------------------------------------------------- devices per replica, sharded ops

def test_devices_below_one(tmp_path):
    text = BASE.replace("replicas: 2, inputs", "replicas: 2, devices: 0, inputs")
    d = only(diagnose(tmp_path, text))
    assert d.node == "rollout" and "devices must be a positive int" in d.message and "got 0" in d.message
    assert d.loc.line == line_of(text, "devices: 0")


def test_pool_too_small_for_replicas_times_devices(tmp_path):
    text = BASE.replace("replicas: 2, inputs", "replicas: 2, devices: 2, inputs").replace("max_tokens: 8}", "max_tokens: 8, engine: vllm}")
    d = only(diagnose(tmp_path, text))
    assert "pool 'rollout' is oversubscribed" in d.message and "need 4 devices" in d.message
    assert "rollout (2 x 2 devices = 4)" in d.message and "count 2" in d.message and "pools.rollout.count to 4" in d.hint
    assert d.loc.line == line_of(text, "rollout: {device: cpu")
    assert errors(tmp_path, text.replace("rollout: {device: cpu, count: 2}", "rollout: {device: gpu, count: 4}")) == []


def test_tensor_parallel_needs_an_engine_that_can(tmp_path):
    text = BASE.replace("rollout: {device: cpu, count: 2}", "rollout: {device: gpu, count: 4}").replace(
        "replicas: 2, inputs", "replicas: 2, devices: 2, inputs")
    d = only(diagnose(tmp_path, text))
    assert d.node == "rollout" and "devices: 2 asks for tensor parallelism" in d.message and "'torch'" in d.message
    assert "engine: vllm" in d.message and d.loc.line == line_of(text, "devices: 2")


def test_devices_on_ops_that_use_one_per_replica(tmp_path):
    text = BASE.replace("train: {op: update, pool: train,", "train: {op: update, pool: train, devices: 2,").replace(
        "train: {device: cpu, count: 1}", "train: {device: cpu, count: 2}").replace(
        "reward: {op: reward,", "reward: {op: reward, devices: 3,")
    by_node = {d.node: d for d in errors(tmp_path, text)}
    assert set(by_node) == {"train", "reward"}, [d.format() for d in by_node.values()]
    assert "each rank of its process group holds one device" in by_node["train"].message
    assert "replicas: 2 gives one group of that many ranks" in by_node["train"].hint
    assert "op 'reward' runs each replica on one device" in by_node["reward"].message


def test_trainer_ranks_cannot_span_pools(tmp_path):
    text = BASE.replace("train: {op: update, pool: train,", "train: {op: update, pool: [train, rollout], replicas: 2,")
    d = only(diagnose(tmp_path, text))
    assert d.node == "train" and "ranks of update node 'train' would span pools ['train', 'rollout']" in d.message
    assert "one torch.distributed group" in d.message and "count >= 2" in d.hint
    assert d.loc.line == line_of(text, "pool: [train, rollout]")


def test_print_and_viz_show_devices_and_ranks():
    from dora.graph.builder import Pipeline
    from dora.graph.viz.view import build_view

    p = Pipeline("p", pools={"g": ("gpu", 8), "t": ("gpu", 4)})
    prompts = p.node("prompts", "dataset")
    gen = p.node("generate", "generate", pool="g", replicas=2, devices=4, engine="vllm")
    train = p.node("train", "update", pool="t", replicas=4)
    prompts >> gen
    text = str(p.graph)
    assert "x2, 4 devices each" in text and "x4 ranks" in text, text
    view = build_view(p.graph)
    assert view.nodes["generate"].subtitle == "generate \u00d72, 4 devices each"
    assert view.nodes["train"].subtitle == "update \u00d74 ranks" and view.nodes["prompts"].subtitle == "dataset"
    assert train.node.devices == 1


def test_unreachable_node(tmp_path):
    text = BASE.replace("weights:", "  lone_gen: {op: generate}\n  lone_reward: {op: reward, inputs: {trajectories: lone_gen/out}}\nweights:")
    diags = errors(tmp_path, text)
    by_node = {d.node: d for d in diags}
    assert "needs an input on port 'prompts'" in by_node["lone_gen"].message
    assert "unreachable from any source" in by_node["lone_reward"].message
    assert by_node["lone_reward"].loc.line == line_of(text, "lone_reward:")


def test_async_settings_out_of_range_all_reported(tmp_path):
    text = BASE.replace("{mode: sync, max_staleness: 1, rollout_batch: 16, train_batch: 16}", "{mode: turbo, max_staleness: -1, rollout_batch: 16, train_batch: 0}")
    msgs = [d.format() for d in errors(tmp_path, text)]
    assert len(msgs) == 3, msgs
    assert any("async.mode: unknown name 'turbo' (one of sync, one_step_off, partial, dora, partial_colocated, partial_inflight)" in m for m in msgs)
    assert any("async.train_batch must be >= 1, got 0" in m for m in msgs)
    assert any("async.max_staleness must be >= 0, got -1" in m for m in msgs)


def test_async_elastic_needs_a_trainer_with_its_own_devices_and_an_engine_that_sleeps(tmp_path):
    bad = BASE.replace("train_batch: 16}", "train_batch: 16, elastic: maybe}")
    [d] = errors(tmp_path, bad)
    assert "async.elastic must be bool, got str 'maybe'" in d.format()
    on = BASE.replace("train_batch: 16}", "train_batch: 16, elastic: true}")
    assert not errors(tmp_path, on)                       # train has its own pool: there is something to lend
    assert not errors(tmp_path, BASE.replace("train_batch: 16}", "train_batch: 16, elastic: false}"))
    shared = on.replace("train: {op: update, pool: train,", "train: {op: update, pool: rollout,")
    [d] = [d for d in errors(tmp_path, shared) if "elastic" in d.message]   # (besides the pool being too small)
    assert "share pool 'rollout'" in d.message and "no devices of its own" in d.message
    assert d.loc.line == line_of(shared, "async:")
    [d] = errors(tmp_path, on.replace("params: {max_tokens: 8}", "params: {max_tokens: 8, engine: vllm}"))
    assert "engine vllm cannot" in d.message and d.node == "rollout"


def test_warning_generate_without_weights_edge(tmp_path):
    text = BASE.replace("weights:\n  - {from: train, to: rollout}\n", "")
    d = only(diagnose(tmp_path, text), "warning")
    assert d.node == "rollout" and "no weights edge" in d.message and "{from: train, to: rollout}" in d.hint
    assert not errors(tmp_path, text)


def test_every_error_at_once(tmp_path):
    text = (BASE.replace("max_tokens: 8", "max_tokns: 8")
            .replace("weights:", "  extra: {op: rewrd, inputs: {trajectories: rollout/out}}\nweights:")
            .replace("pool: train,", "pool: trian,")
            .replace("group_by: group_id", "group_by: gid")
            .replace("mode: sync", "mode: syncc"))
    msgs = [d.format() for d in errors(tmp_path, text)]
    for part in ("'max_tokns'", "unknown op 'rewrd'", "pool 'trian'", "'gid'", "'syncc'"):
        assert any(part in m for m in msgs), (part, msgs)


def test_override_errors_point_at_the_command_line(tmp_path):
    d = only(diagnose(tmp_path, BASE, ["nodes.rollout.params.temprature=0.5"]))
    assert "<command line: nodes.rollout.params.temprature=0.5>" in d.format() and "'temperature'" in d.hint
    # a node, a pool or a key the pipeline does not have: did-you-mean, at the override (not an empty node)
    d = only(diagnose(tmp_path, BASE, ["nodes.trian.params.steps=3"]))
    assert d.format().startswith("<command line: nodes.trian.params.steps=3>: error: override") and \
        "names node 'trian', which the pipeline does not have" in d.message and "did you mean 'train'?" in d.hint, d.format()
    d = only(diagnose(tmp_path, BASE, ["pools.rollot.count=2"]))
    assert "names pool 'rollot'" in d.message and "did you mean 'rollout'?" in d.hint, d.format()
    d = only(diagnose(tmp_path, BASE, ["nodes.train.parms.steps=3"]))
    assert d.format().startswith("<command line: nodes.train.parms.steps=3>: error: node 'train': unknown key 'parms'") \
        and "did you mean 'params'?" in d.hint, d.format()
    added = diagnose(tmp_path, BASE, ["nodes.extra={op: reward, inputs: {trajectories: rollout/out}}"])
    assert [d.format() for d in added if d.severity == "error"] == []   # a new node given whole is fine


def test_load_and_validate_raises_with_every_diagnostic(tmp_path):
    path = write(tmp_path, BASE.replace("op: generate", "op: generat").replace("pool: train,", "pool: trian,"))
    with pytest.raises(GraphError) as ei:
        load_and_validate(path)
    assert len(ei.value.diagnostics) == 2
    assert "generat" in str(ei.value) and "trian" in str(ei.value)
    assert load_and_validate(write(tmp_path, BASE, "ok.yaml")).name == "t"


USER_OP = '''
from dora.graph.opspec import OpSpec, ParamSpec, PortSpec

class Shaper:
    spec = OpSpec(name="shaper", doc="length penalty", inputs=(PortSpec("scored", ("reward", "response_ids")),),
                  adds=("shaped",), params={"alpha": ParamSpec("alpha", "float", 0.1, "penalty per token")},
                  impl="mytestops:Shaper")

class NoSpec:
    pass
'''


def test_user_op_is_checked_like_a_builtin(tmp_path, monkeypatch):
    (tmp_path / "mytestops.py").write_text(USER_OP)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("mytestops", None)
    ok = BASE.replace("{batch: advantage/out}", "{batch: shaper/out}").replace(
        "weights:", "  shaper: {op: 'mytestops:Shaper', inputs: {scored: advantage/out}, params: {alpha: 0.2}}\nweights:")
    assert errors(tmp_path, ok) == []
    bad = ok.replace("alpha: 0.2", "alpah: 0.2").replace("{scored: advantage/out}", "{scored: rollout/out}")
    msgs = [d.format() for d in errors(tmp_path, bad)]
    assert any("unknown param 'alpah'" in m and "'alpha'" in m for m in msgs), msgs
    assert any("node 'shaper'" in m and "needs column 'reward'" in m for m in msgs), msgs
    nospec = ok.replace("mytestops:Shaper", "mytestops:NoSpec")
    d = [d for d in errors(tmp_path, nospec) if d.node == "shaper"][0]
    assert "no class attribute `spec`" in d.message
    missing = ok.replace("mytestops:Shaper", "mytestops_absent:Shaper")
    d = [d for d in errors(tmp_path, missing) if d.node == "shaper"][0]
    assert "cannot import module 'mytestops_absent'" in d.message


def test_validate_works_on_python_built_graphs():
    from dora.graph.builder import Pipeline

    import inspect

    line = inspect.currentframe().f_lineno
    p = Pipeline("py", pools={"rollout": ("cpu", 1)})
    prompts = p.node("prompts", "dataset")
    rollout = p.node("rollout", "generate", pool="rollout", replicas=2, temprature=1.0)
    prompts >> rollout
    errs = [d for d in validate(p.graph) if d.severity == "error"]
    pool, param = sorted(errs, key=lambda d: d.loc.line)   # each at the Python line that made it
    assert "oversubscribed" in pool.message and str(pool.loc) == f"{__file__}:{line + 1}"
    assert "did you mean 'temperature'" in param.format() and str(param.loc) == f"{__file__}:{line + 3}"


def test_formatter_shape():
    from dora.graph.diagnostics import error
    from dora.graph.model import SourceLoc

    d = error("bad thing", SourceLoc("p.yaml", 7), node="x", hint="do this")
    assert d.format() == "p.yaml:7: error: node 'x': bad thing (do this)"


@pytest.mark.parametrize("snippet", [textwrap.dedent("""\
    name: t
    nodes: [a, b]
    """), "just a string\n", ""])
def test_wrong_shapes_are_errors_not_tracebacks(tmp_path, snippet):
    assert errors(tmp_path, snippet)


def test_a_model_the_torch_engine_cannot_run_is_refused_naming_the_node(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, bos_token_id=0, eos_token_id=0)).save_pretrained(folder)
    quickstart = os.path.join(os.path.dirname(__file__), "..", "pipelines", "quickstart.yaml")
    graph, diags = check_file(quickstart, [f"model.path={folder}"])
    errs = [d for d in diags if d.severity == "error"]
    assert len(errs) == 1 and errs[0].node == "rollout", [d.format() for d in diags]
    assert "engine torch cannot run this model: architecture 'gpt2'" in errs[0].message
    assert errs[0].loc.line is not None   # the generate node's engine line (its default: the node's own line)
