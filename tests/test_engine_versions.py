"""Several policy versions in one torch engine (max_versions): a load of v+1 leaves v's running
requests untouched, each step runs every hosted version on its own requests over one KV pool,
and a version's weights leave once its last request is done (or exported), unless the engine's
owner still holds that version (keep_versions)."""

from __future__ import annotations

import pytest
import torch

from dora.ops.engines.engine import SamplingRequest
from dora.ops.engines.torch_engine import TorchEngine
from engine_helpers import drain, teacher_forced_logprobs, tiny_llama

torch.set_num_threads(1)


def test_two_versions_decode_side_by_side_and_every_token_keeps_its_version():
    models = {v: tiny_llama(seed=10 + v) for v in range(3)}
    eng = TorchEngine(models[0], max_batch=8, seed=0, eos_ids=[], max_versions=2)
    prompt = [7, 8, 9, 10, 11] * 7           # shared by a v0 and a v1 request: 2 full blocks, never shared across versions
    for i in range(3):
        eng.submit(SamplingRequest(f"old{i}", prompt if i == 0 else [5 + i, 6, 7], 0, max_tokens=20, temperature=1.0))
    for _ in range(4):
        eng.step()
    eng.load_weights(1, models[1].state_dict())            # while v0's requests run
    assert eng.version == 1 and eng.has_work()
    for i in range(3):
        eng.submit(SamplingRequest(f"new{i}", prompt if i == 0 else [9 + i, 6, 7], 1, max_tokens=12, temperature=1.0))
    eng.submit(SamplingRequest("late0", [20, 21, 22], 0, max_tokens=6, temperature=1.0))   # dispatched on v0: runs on v0
    for _ in range(3):
        eng.step()
    with pytest.raises(RuntimeError, match="interrupt_all"):
        eng.load_weights(2, models[2].state_dict())        # both slots hold versions with requests in flight
    out = drain(eng)
    assert len(out) == 7
    for uid, c in out.items():
        v = 1 if uid.startswith("new") else 0
        assert c.token_versions == [v] * len(c.response_ids), uid
        ref = teacher_forced_logprobs(models[v], c.prompt_ids, c.response_ids, 1.0)
        assert (ref - torch.tensor(c.logprobs)).abs().max().item() < 1e-4, uid
    assert eng.stats().prefix_hit_tokens == 0
    # v0's last request is done: its weights left (memory released on CPU); v1 is the current one
    one = eng.weight_bytes()
    assert eng.hosted_versions() == [1] and one == sum(p.numel() * p.element_size() for p in eng.runner.slots[1].model.parameters())
    eng.load_weights(2, models[2].state_dict())            # idle: in place over v1
    assert eng.hosted_versions() == [2] and eng.weight_bytes() == one


def test_an_older_version_leaves_with_its_last_request_or_when_its_owner_lets_go():
    models = {v: tiny_llama(seed=10 + v) for v in range(3)}
    eng = TorchEngine(models[0], max_batch=4, seed=0, eos_ids=[], max_versions=2)
    one = eng.weight_bytes()
    eng.submit(SamplingRequest("a", [5, 6, 7], 0, max_tokens=30))
    eng.step()
    eng.load_weights(1, models[1].state_dict())
    assert eng.hosted_versions() == [0, 1] and eng.weight_bytes() == 2 * one
    (state,) = eng.export(["a"])                           # its last request leaves: v0's weights go
    assert state.kv_version == 0 and eng.hosted_versions() == [1] and eng.weight_bytes() == one
    # the owner holds a version with no request in the engine (a trajectory waiting on a tool)
    held = {1}
    eng.keep_versions = lambda: held
    eng.load_weights(2, models[2].state_dict())            # into the free slot, memory taken again
    assert eng.hosted_versions() == [1, 2] and eng.weight_bytes() == 2 * one
    eng.submit(SamplingRequest("next-turn", [5, 6, 7, 8], 1, max_tokens=3, temperature=0.0))
    eng.submit(SamplingRequest("fresh", [5, 6, 7, 8], 2, max_tokens=3, temperature=0.0))
    with pytest.raises(RuntimeError, match="interrupt_all"):
        eng.load_weights(3, models[0].state_dict())        # both slots have requests in flight
    out = drain(eng)
    assert out["next-turn"].token_versions == [1] * 3 and out["fresh"].token_versions == [2] * 3
    held.clear()                                           # the trajectory ended
    assert eng.hosted_versions() == [2] and eng.weight_bytes() == one


def test_one_version_engine_loads_only_when_idle():
    eng = TorchEngine(tiny_llama(), max_batch=2, eos_ids=[])
    eng.submit(SamplingRequest("a", [5, 6], 0, max_tokens=3))
    with pytest.raises(RuntimeError, match="interrupt_all"):
        eng.load_weights(1, tiny_llama(seed=1).state_dict())
    drain(eng)
    eng.load_weights(1, tiny_llama(seed=1).state_dict())
    assert len(eng.runner.slots) == 1 and eng.version == 1


def test_the_kv_budget_leaves_room_for_every_hosted_weight_copy_and_vllm_hosts_one():
    from dora.ops.engines.paged.kv_budget import GiB, budget_blocks, host_memory
    from dora.ops.engines.paged.kv_cache import bytes_per_block
    from dora.ops.engines.paged.model_spec import spec_of
    from dora.ops.engines.vllm_engine import VllmEngine

    spec = spec_of(tiny_llama().config)
    weights = 3 * GiB
    share = (weights * 4) / host_memory()      # a share of the host: four weight copies' worth
    common = dict(block_size=16, dtype=torch.float32, device=torch.device("cpu"), max_batch=10 ** 6,
                  max_seq_len=512, kv_cache_gb=None, memory_fraction=share, workspace=0, weight_bytes=weights)
    one, two = budget_blocks(spec, **common), budget_blocks(spec, weight_copies=2, **common)
    assert one - two == pytest.approx(weights / bytes_per_block(spec, 16, torch.float32), abs=1)
    assert TorchEngine(tiny_llama(), max_versions=2).max_versions == 2 and VllmEngine.max_versions == 1
