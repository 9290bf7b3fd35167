"""The Python builder makes the same Graph as the YAML file."""

from __future__ import annotations

import os

import pytest

from dora.graph.builder import Pipeline
from dora.graph.yaml_io import load_graph, load_text

QUICKSTART = os.path.join(os.path.dirname(__file__), "..", "pipelines", "quickstart.yaml")
MODEL = {"arch": "llama", "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128,
         "vocab": 0, "max_positions": 512, "init_std": 0.05, "tokenizer": "chars"}


def build_quickstart() -> Pipeline:
    p = Pipeline("grpo-quickstart", model=MODEL, pools={"rollout": ("cpu", 2), "train": {"device": "cpu", "count": 1}},
                 async_={"mode": "sync", "max_staleness": 1, "rollout_batch": 96, "train_batch": 64},
                 description="GRPO on a tiny random model and the synthetic quickstart task (CPU only)",
                 run={"seed": 0, "keep_best": "eval/heldout/mean_reward"})
    prompts = p.node("prompts", "dataset", source="synthetic:quickstart", size=1024, group_size=4, batch_prompts=4, seed=0, epochs=0)
    rollout = p.node("rollout", "generate", pool="rollout", replicas=2, temperature=1.0, max_tokens=128, max_batch=32)
    reward = p.node("reward", "reward", fn="synthetic")
    adv = p.node("advantage", "advantage", estimator="grpo")
    train = p.node("train", "update", pool="train", params={"loss": "ppo_clip", "lr": 5e-3, "weight_decay": 0.0, "grad_clip": 1.0, "agg": "token_mean",
                                                              "steps": 40, "micro_batch_tokens": 8192})
    prompts >> rollout >> reward >> adv.scored.opts(group_by="group_id")
    adv.out >> train.batch
    train.weights >> rollout.weights
    p.eval_set("heldout", source="synthetic:quickstart", size=64, every=10)
    return p


def test_builder_equals_yaml():
    p = build_quickstart()
    assert p.validate() == []
    assert p.graph == load_graph(QUICKSTART)
    assert load_text(p.to_yaml())[0] == p.graph


def test_chaining_returns_the_right_hand_node():
    p = Pipeline("x")
    a, b, c = p.node("a", "dataset"), p.node("b", "generate"), p.node("c", "reward")
    assert (a >> b >> c).name == "c"
    assert p.graph.nodes["c"].inputs["trajectories"].src == "b"
    assert p["b"].node.inputs["prompts"].label == "a/out -> b.prompts"


def test_builder_errors_are_clear():
    p = Pipeline("x")
    a, b = p.node("a", "dataset"), p.node("b", "generate")
    with pytest.raises(ValueError, match="already exists"):
        p.node("a", "dataset")
    with pytest.raises(ValueError, match="a weights port joins only another weights port"):
        a.weights >> b.prompts
    with pytest.raises(ValueError, match="has input ports \\[\\]"):
        b >> a
    u = p.node("u", "nosuchop")
    with pytest.raises(ValueError, match="unknown op 'nosuchop'"):
        a >> u


def test_tuples_become_lists_so_the_graph_round_trips():
    p = Pipeline("x")
    p.node("g", "generate", stop=("\n", "###"))
    assert p.graph.nodes["g"].params["stop"] == ["\n", "###"]
    assert load_text(p.to_yaml())[0] == p.graph
