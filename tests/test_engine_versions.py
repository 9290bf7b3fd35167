"""Several policy versions in one torch engine (max_versions): a load of v+1 leaves v's running
requests untouched, each step runs every hosted version on its own requests over one KV pool,
and a version's slot is reused once its last request is done."""

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
    # v0's slot is free now: v2 goes there, and v1 stays hosted for requests dispatched on it
    eng.load_weights(2, models[2].state_dict())
    assert sorted(s.version for s in eng.runner.slots) == [1, 2] and eng.version == 2
    eng.submit(SamplingRequest("on1", [3, 4, 5], 1, max_tokens=4, temperature=0.0))
    eng.submit(SamplingRequest("on0", [3, 4, 5], 0, max_tokens=4, temperature=0.0))   # v0 is gone: the newest runs it
    out = drain(eng)
    assert out["on1"].token_versions == [1] * 4 and out["on0"].token_versions == [2] * 4


def test_one_version_engine_loads_only_when_idle():
    eng = TorchEngine(tiny_llama(), max_batch=2, eos_ids=[])
    eng.submit(SamplingRequest("a", [5, 6], 0, max_tokens=3))
    with pytest.raises(RuntimeError, match="interrupt_all"):
        eng.load_weights(1, tiny_llama(seed=1).state_dict())
    drain(eng)
    eng.load_weights(1, tiny_llama(seed=1).state_dict())
    assert len(eng.runner.slots) == 1 and eng.version == 1
