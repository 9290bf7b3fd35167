"""One GPU shared by rollout and trainer (pipelines/gpu_single.yaml): memory shares declared on the
nodes, validated per device (over 100% names the nodes, file:line), printed and round-tripped,
placed on the same device (a dry run on a machine without a GPU), the KV budget derived from a
share, which replicas sleep while the trainer steps, and a real CPU run in sync mode where they do."""

from __future__ import annotations

import types

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dora.graph.validate import check_file
from dora.graph.yaml_io import load_graph, load_text, to_yaml
from dora.ops.engines.paged import kv_budget
from dora.ops.engines.torch_engine import TorchEngine
from dora.rl.shared_devices import shared_devices
from dora.runtime.placement import plan
from e2e_audit import PIPELINES, RunDir, check_accounting, check_ledger, check_trace, dora_run, spans_by_row
from test_graph_helpers import line_of, write

GPU_SINGLE = PIPELINES / "gpu_single.yaml"
GiB = 2 ** 30


def _errors(path, overrides=()):
    _, diags = check_file(str(path), overrides)
    return [d for d in diags if d.severity == "error"]


# ---------------------------------------------------------------- declared, validated, shown, round-tripped
def test_shares_over_100_percent_are_refused_naming_each_node_and_line(tmp_path, capsys):
    text = GPU_SINGLE.read_text().replace("    memory: 0.45\n    inputs: {batch", "    memory: 0.6\n    inputs: {batch")
    path = write(tmp_path, text)
    [d] = _errors(path)
    rollout_line, train_line = line_of(text, "memory: 0.45"), line_of(text, "memory: 0.6")
    assert d.node == "rollout" and d.loc.line == rollout_line
    assert (f"gpu pool 'gpu' device 0 shared by rollout[0] 45% ({path}:{rollout_line}) + train[0] 60% "
            f"({path}:{train_line}) = 105% of its memory, over 100%") in d.message, d.message
    from dora.cli import main
    assert main(["validate", path]) == 2
    assert f"{path}:{rollout_line}: error: node 'rollout'" in capsys.readouterr().err
    assert _errors(path, ["nodes.train.memory=0.55"]) == []          # exactly 100% is fine


def test_sharing_needs_a_share_on_every_node_and_well_formed_shares(tmp_path):
    [d] = _errors(GPU_SINGLE, ["nodes.train.memory=null"])
    assert "pool 'gpu' is oversubscribed" in d.message and "memory share on each of its nodes" in d.hint
    [d] = _errors(GPU_SINGLE, ["nodes.train.memory=1.5"])
    assert d.node == "train" and "0 < memory <= 1, got 1.5" in d.message
    [d] = _errors(GPU_SINGLE, ["nodes.reward.memory=0.1"])
    assert d.node == "reward" and "names no pool" in d.message
    assert _errors(GPU_SINGLE, ["pools.gpu.count=2", "nodes.train.memory=null"]) == []   # a device each: no sharing
    # two GPUs, two replicas of each: every device holds one of each, and each is checked
    two = ["pools.gpu.count=2", "nodes.rollout.replicas=2", "nodes.train.replicas=2"]
    assert _errors(GPU_SINGLE, two) == []
    [d] = _errors(GPU_SINGLE, two + ["nodes.rollout.memory=0.6"])
    assert "devices 0, 1 each shared by rollout 60% (<command line: nodes.rollout.memory=0.6>) + train 45% (" \
        in d.message, d.message


def test_shares_print_and_round_trip():
    g = load_graph(str(GPU_SINGLE))
    assert g.nodes["rollout"].memory == 0.45 and g.nodes["reward"].memory is None
    g2, diags = load_text(to_yaml(g))
    assert diags == [] and g2 == g and g2.nodes["train"].memory == 0.45
    text = str(g)
    assert "x1, memory 45%  pool gpu" in text, text
    from dora.graph.viz.view import build_view
    assert build_view(g).nodes["train"].subtitle == "update \u00d71, memory 45%"
    from dora.graph.builder import Pipeline
    p = Pipeline("p", pools={"g": ("gpu", 1)})
    assert p.node("gen", "generate", pool="g", memory=0.3).node.memory == 0.3 and "memory: 0.3" in p.to_yaml()


# ---------------------------------------------------------------- placed on one device
def test_dry_run_shows_rollout_and_trainer_on_gpu_0_without_a_gpu(capsys, monkeypatch):
    from dora.rl.launch import run_main
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")      # this machine: no GPU
    assert run_main([str(GPU_SINGLE), "--dry-run"]) == 0
    out = capsys.readouterr().out
    for node in ("rollout", "train"):
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(f"{node}[0]"))
        assert "gpu 0 (CUDA_VISIBLE_DEVICES=0), memory 45%" in line and "device cuda:0" in line, line
    assert "gpu: 1 x gpu, 2 used  nodes: rollout, train (devices shared by memory shares)" in out
    assert "gpu 0: rollout[0] 45% + train[0] 45% = 90% of its memory" in out
    assert "this machine has 0" in out
    assert run_main([str(GPU_SINGLE), "--backend", "ray", "--dry-run"]) == 2
    assert "local backend only" in capsys.readouterr().err
    # run without a GPU: refused before anything starts, with the override that tries it on the CPU
    assert run_main([str(GPU_SINGLE), "--out", "/nonexistent/never-made"]) == 2
    err = capsys.readouterr().err
    assert "To try it on this machine's CPU, override: pools.gpu.device=cpu" in err and "Traceback" not in err, err
    from dora.graph.diagnostics import errors_of
    from dora.graph.validate import check_file
    assert errors_of(check_file(str(GPU_SINGLE), ["pools.gpu.device=cpu"])[1]) == []   # and that override validates


def test_plan_says_which_replicas_share_the_trainers_devices():
    p = plan(load_graph(str(GPU_SINGLE)))
    assert p.get("rollout", 0).gpus == p.get("train", 0).gpus == ("0",)
    assert (p.get("rollout", 0).memory, p.get("train", 0).memory) == (0.45, 0.45)
    assert p.sharing("rollout", "train") == [0] and p.shared
    two = plan(load_graph(str(GPU_SINGLE), ["pools.gpu.count=3", "nodes.rollout.replicas=2", "nodes.train.replicas=2"]))
    assert [two.get("rollout", r).gpus for r in (0, 1)] == [("0",), ("1",)]
    assert [two.get("train", r).gpus for r in (0, 1)] == [("2",), ("0",)]   # wraps around: only GPU 0 is shared
    assert two.sharing("rollout", "train") == [0]
    apart = plan(load_graph(str(GPU_SINGLE), ["pools.gpu.count=2"]))
    assert apart.sharing("rollout", "train") == [] and not apart.shared


def test_only_colocated_modes_with_an_engine_that_sleeps_hand_the_device_over():
    p = plan(load_graph(str(GPU_SINGLE)))

    def driver(mode: str, engine: str):
        return types.SimpleNamespace(cfg=types.SimpleNamespace(mode=mode, max_staleness=0 if mode == "sync" else 1),
                                     ctrl=types.SimpleNamespace(plan=p),
                                     roles=types.SimpleNamespace(generate="rollout", update="train"),
                                     params={"rollout": {"engine": engine}})
    inst = types.SimpleNamespace(replica=0, name="rollout[0]")
    for mode in ("sync", "partial_colocated"):   # nothing is generated while the trainer steps
        assert shared_devices(driver(mode, "torch"), [inst]).instances == [inst]
    for mode in ("dora", "partial", "partial_inflight", "one_step_off"):
        assert shared_devices(driver(mode, "torch"), [inst]) is None, mode   # async: each keeps its share
    assert shared_devices(driver("sync", "vllm"), [inst]) is None        # no sleep: it keeps its share


# ---------------------------------------------------------------- the KV budget from a share
def test_share_bytes_is_share_of_total_less_weights_and_workspace_within_free():
    assert kv_budget.share_bytes(total=100 * GiB, fraction=0.45, held=2 * GiB, workspace=GiB) == 42 * GiB
    assert kv_budget.share_bytes(total=100 * GiB, fraction=0.45, held=2 * GiB, workspace=GiB, free=30 * GiB) == 29 * GiB


def _llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=64, max_position_embeddings=256, eos_token_id=2)
    return LlamaForCausalLM(cfg).float().eval()


def test_engine_sizes_its_kv_from_the_share_and_refuses_one_too_small(monkeypatch):
    monkeypatch.setattr(kv_budget, "host_memory", lambda: 64 * 2 ** 20)   # a 64 MiB host
    model = _llama()
    per_block = 2 * 2 * 16 * 2 * 16 * 4    # K and V x layers x block of 16 x KV heads x head dim x fp32 bytes
    whole = TorchEngine(model, max_batch=8, max_seq_len=256)
    assert whole.budget == 8 * 16 * 5 // 4                                 # no share: max_batch requests of 256, +25%
    share = 0.01                                                           # 671 KB of the host, less the weights
    eng = TorchEngine(model, max_batch=8, max_seq_len=256, memory_fraction=share)
    expect = (int(64 * 2 ** 20 * share) - eng.weight_bytes()) // per_block
    assert 16 <= eng.budget == expect < 8 * 16, (eng.budget, expect)
    with pytest.raises(ValueError, match=r"memory share 0\.00 of the host's 0\.1 GiB.*holds \d+ tokens.*needs 256"):
        TorchEngine(model, max_batch=8, max_seq_len=256, memory_fraction=0.001)


def test_generate_passes_the_replicas_share_to_its_engine(monkeypatch):
    from dora.graph.op_registry import resolve_op
    from dora.graph.opspec import fill_params
    from dora.ops.generate import make_engine
    monkeypatch.setattr(kv_budget, "host_memory", lambda: 64 * 2 ** 20)
    params = fill_params(resolve_op("generate"), {"max_batch": 8})
    cfg = {"arch": "llama", "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "max_positions": 256}
    whole, _ = make_engine(params, cfg)
    shared, _ = make_engine(params, cfg, memory=0.01)
    assert shared.budget < whole.budget == 8 * 16 * 5 // 4


# ---------------------------------------------------------------- a real run: sync sleeps the sharing replica
STEPS, TBS = 3, 16
ON_CPU = ["pools.gpu.device=cpu", "model={arch: llama, hidden: 64, layers: 2, heads: 4, kv_heads: 2, intermediate: 128, "
          "max_positions: 512, init_std: 0.05, tokenizer: chars}", "nodes.rollout.params.dtype=float32",
          "nodes.train.params.precision=fp32", f"nodes.train.params.steps={STEPS}", f"async.train_batch={TBS}",
          "nodes.prompts.params.group_size=4", "nodes.prompts.params.batch_prompts=4",
          "nodes.rollout.params.max_tokens=24", "nodes.rollout.params.max_batch=8"]


@pytest.mark.slow
def test_sync_run_on_one_shared_device_sleeps_the_engine_while_the_trainer_steps(tmp_path):
    out = tmp_path / "run"
    assert dora_run(out, GPU_SINGLE, *ON_CPU, deadline=240) == 0
    run = RunDir(out)
    check_accounting(run, STEPS, TBS)
    check_ledger(run, STEPS, TBS, 4, 0)
    check_trace(run)
    shared = run.summary["shared_devices"]
    assert shared["replicas"] == ["rollout[0]"] and shared["skipped_busy"] == 0
    assert shared["sleeps"] == STEPS and shared["wakes"] == STEPS and shared["bytes_released"] > 0, shared
    assert all(r["shared_bytes_released"] > 0 for r in run.metrics)
    assert run.summary["weight_loads"] >= STEPS                      # each wake is followed by a load of the new version
    # the engine is asleep through every step: it slept before the step began and woke after it ended
    spans = spans_by_row(run)
    steps = [(a, b) for a, b, e in spans["update"] if e["name"].startswith("train step")]
    mine = spans["rollout[0]"]
    assert len(steps) == STEPS
    for a, b in steps:
        slept = [e for s, t, e in mine if e["name"] == "sleep" and t <= a]
        woke = [e for s, t, e in mine if e["name"] == "wake" and s >= b]
        assert slept and woke, (a, b)
        busy = [e["name"] for s, t, e in mine if e["name"] != "sleep" and s < b and a < t]
        assert not busy, busy
