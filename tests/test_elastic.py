"""Elastic trainer devices (async.elastic): the torch engine's sleep/wake, the spare's placement,
and real `dora run`s of the quickstart in dora and sync mode where a spare generate replica on the
trainer's devices is lent while the trainer waits and reclaimed before each step."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dora.graph.yaml_io import load_graph
from dora.ops.engines.engine import SamplingRequest
from dora.ops.engines.torch_engine import TorchEngine
from dora.rl.elastic_lending import elastic_spares
from dora.runtime.placement import plan as place
from e2e_audit import PIPELINES, RunDir, check_accounting, check_ledger, check_trace, dora_run
from engine_helpers import drain

torch.set_num_threads(1)


def _llama(tied: bool, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=64, max_position_embeddings=256, eos_token_id=2,
                      tie_word_embeddings=tied)
    return LlamaForCausalLM(cfg).float().eval()


def _generate(engine: TorchEngine) -> dict[str, tuple[list[int], list[float]]]:
    for i in range(6):
        engine.submit(SamplingRequest(f"r{i}", [3 + i, 7, 11 + i], engine.version, max_tokens=12, temperature=1.0))
    return {u: (c.response_ids, c.logprobs) for u, c in drain(engine).items()}


@pytest.mark.parametrize("tied", [False, True])
def test_sleep_releases_weights_and_kv_and_wake_then_load_generates_the_same(tied):
    policy = _llama(tied, seed=0)
    weights = {k: v.clone() for k, v in policy.state_dict().items()}
    expected = _generate(TorchEngine(_llama(tied, seed=0), max_batch=4, seed=5))

    eng = TorchEngine(_llama(tied, seed=1), max_batch=4, seed=5)   # other weights: only the load can fix them
    fresh = eng.sampling_state()
    eng.submit(SamplingRequest("busy", [3, 4], 0, max_tokens=4))
    eng.step()
    with pytest.raises(RuntimeError, match="export them first"):
        eng.sleep()
    eng.export(["busy"])
    weights_bytes = sum(v.numel() * v.element_size() for k, v in weights.items() if not (tied and k == "lm_head.weight"))
    assert eng.weight_bytes() == weights_bytes
    kv_bytes = eng.runner.kv.nbytes
    assert eng.sleep() == weights_bytes + kv_bytes and kv_bytes > 0
    assert eng.weight_bytes() == 0 and eng.runner.kv.nbytes == 0
    with pytest.raises(RuntimeError, match="asleep"):
        eng.submit(SamplingRequest("x", [3], 0))
    with pytest.raises(RuntimeError, match="asleep"):
        eng.load_weights(1, weights)
    assert eng.wake() == weights_bytes + eng.runner.kv.nbytes and eng.weight_bytes() == weights_bytes
    with pytest.raises(RuntimeError, match="without weights"):
        eng.submit(SamplingRequest("x", [3], 0))
    eng.load_weights(0, weights)
    eng.set_sampling_state(fresh)        # (the busy request drew from the sampler)
    got = _generate(eng)
    assert {u: r for u, (r, _) in got.items()} == {u: r for u, (r, _) in expected.items()}
    for u, (_, lps) in got.items():
        assert torch.allclose(torch.tensor(lps), torch.tensor(expected[u][1]), atol=1e-5)


def plan(graph):
    """The run's placement: elastic spares are the RL layer's to ask for."""
    return place(graph, spares=elastic_spares(graph))


def test_spare_is_placed_on_the_trainer_devices():
    g = load_graph(str(PIPELINES / "quickstart.yaml"), ["async.elastic=true"])
    spares = [r for r in plan(g).replicas if r.spare]
    trainer = plan(g).get("train", 0)
    assert [(r.node, r.replica) for r in spares] == [("rollout", 2)]   # after the node's own 2 replicas
    assert (spares[0].pool, spares[0].slots, spares[0].threads) == (trainer.pool, trainer.slots, trainer.threads)
    gpu = load_graph(str(PIPELINES / "quickstart.yaml"),
                     ["async.elastic=true", "pools.train.device=gpu", "pools.train.count=2", "nodes.train.replicas=2"])
    got = [(r.replica, r.gpus) for r in plan(gpu).replicas if r.spare]
    assert got == [(2, (plan(gpu).get("train", 0).gpus[0],)), (3, (plan(gpu).get("train", 1).gpus[0],))]
    assert not [r for r in plan(load_graph(str(PIPELINES / "quickstart.yaml"), [])).replicas if r.spare]


STEPS, TBS, G = 4, 16, 4
QUICK = ["nodes.rollout.params.max_tokens=24", "nodes.rollout.params.max_batch=4", f"async.train_batch={TBS}",
         "nodes.prompts.params.batch_prompts=4", f"nodes.train.params.steps={STEPS}",
         "async.elastic=true"]


def _spans(run: RunDir) -> dict[str, list[tuple[float, float, dict]]]:
    """Complete spans by row name (thread name) -> (start, end, event)."""
    events = json.loads((run.path / "trace.json").read_text())["traceEvents"]
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    out: dict[str, list] = {}
    for e in events:
        if e["ph"] == "X":
            out.setdefault(rows[(e["pid"], e["tid"])], []).append((e["ts"], e["ts"] + e["dur"], e))
    return out


@pytest.mark.parametrize("mode, k, rbs", [("dora", 1, 32), ("sync", 0, 16)])
def test_run_lends_the_trainer_devices_and_hands_them_back_before_each_step(tmp_path, mode, k, rbs):
    out = tmp_path / mode
    assert dora_run(out, "quickstart.yaml", *QUICK, f"async.mode={mode}", f"async.rollout_batch={rbs}", deadline=240) == 0
    run = RunDir(out)
    check_accounting(run, STEPS, TBS)
    check_ledger(run, STEPS, TBS, G, k)
    check_trace(run)
    acc, el = run.accounting, run.summary["elastic"]
    assert acc["c1_violations"] == 0 and acc["lost"] == 0
    assert el["spares"] == ["rollout[2]"]
    assert el["lends"] >= (STEPS if mode == "sync" else 1) and el["reclaims"] >= el["lends"] - 1, el
    assert el["trajectories_finished"] > 0 and el["tokens_generated"] > 0, el   # it really generated
    assert el["bytes_released"] > 0, el
    # sync: a batch is ready only once everything dispatched finished, so a reclaim finds the spare
    # empty; dora keeps RBS > TBS in flight, so the spare holds requests to move (with their KV)
    assert (el["requests_moved"] > 0 and el["kv_bytes_moved"] > 0) if mode == "dora" else el["requests_moved"] == 0, el
    assert el["handback_s"] > 0 and el["lend_s"] > 0
    assert 0 < sum(r["elastic_lends"] for r in run.metrics) <= el["lends"]   # per step (the last lend may follow the last step)
    # the spare and the trainer never run at once: nothing on the spare's row, nor a lend, overlaps a step
    spans = _spans(run)
    steps = [(a, b) for a, b, e in spans["update"] if e["name"].startswith("train step")]
    assert len(steps) == STEPS
    spare = spans["rollout[2]"] + [s for s in spans["elastic"] if s[2]["name"] == "lend"]
    assert any(e["name"].startswith("v") for _, _, e in spare)
    clash = [(e["name"], a, b) for a, b, e in spare for s, t in steps if a < t and s < b]
    assert not clash, clash
    # the reclaim's export/import is counted where every migration is
    assert acc["migrated_requests"] >= el["requests_moved"]


def test_run_refuses_elastic_on_ray_with_exit_2(capsys):
    from dora.rl.launch import run_main
    assert run_main([str(PIPELINES / "quickstart.yaml"), "async.elastic=true", "--backend", "ray", "--dry-run"]) == 2
    assert "local backend only" in capsys.readouterr().err
