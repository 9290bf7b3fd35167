"""Multi-turn requests on the torch engine: keep_kv parks a finished request's KV, a continuation
adopts it and prefills only the new tokens, release() drops it, and a short pool drops parked
requests oldest first (their continuations are then prefilled in full)."""

from __future__ import annotations

import pytest
import torch

from dora.ops.engines.engine import SamplingRequest
from dora.ops.engines.torch_engine import TorchEngine
from engine_helpers import drain, teacher_forced_logprobs, tiny_llama

torch.set_num_threads(1)
PER_TOKEN = 2 * 2 * 2 * 16 * 4   # bytes of KV per token of tiny_llama in float32


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def _turn(eng, uid, prompt, **kw):
    eng.submit(SamplingRequest(uid, prompt, 0, max_tokens=kw.pop("max_tokens", 8), temperature=kw.pop("temperature", 0.0), **kw))
    return drain(eng)[uid]


def test_a_continuation_adopts_the_parked_kv_and_prefills_only_the_observation(model):
    eng = TorchEngine(model, max_batch=4, eos_ids=[])
    first = _turn(eng, "t1", [5, 9, 11, 7, 3] * 5, keep_kv=True, temperature=1.0)
    s = eng.stats()
    held = len(first.prompt_ids) + len(first.response_ids) - 1           # KV of every token but the last sampled
    assert (s.parked_requests, s.active, s.kv_tokens_used) == (1, 0, held)
    assert s.parked_blocks == s.kv_blocks_used == -(-held // 16)
    prefilled = s.prefill_tokens
    observation = [40, 41, 42, 43, 44, 45]
    prompt = first.prompt_ids + first.response_ids + observation
    second = _turn(eng, "t2", prompt, continues="t1", temperature=1.0, max_tokens=10)
    s = eng.stats()
    assert s.prefill_tokens - prefilled == len(observation) and s.parked_requests == 0
    assert s.prefix_hit_tokens >= held and s.kv_blocks_used == 0
    ref = teacher_forced_logprobs(model, prompt, second.response_ids, 1.0)
    assert (ref - torch.tensor(second.logprobs)).abs().max().item() < 1e-4


def test_release_and_a_prompt_that_does_not_continue(model):
    eng = TorchEngine(model, max_batch=4, eos_ids=[])
    first = _turn(eng, "a", [5, 6, 7, 8], keep_kv=True)
    with pytest.raises(ValueError, match="do not start with"):
        eng.submit(SamplingRequest("b", [5, 6, 7, 9], 0, continues="a"))
    assert eng.stats().parked_requests == 1
    assert eng.release("a") and not eng.release("a") and eng.stats().kv_blocks_used == 0
    # a continuation of a request no longer parked is prefilled in full
    before = eng.stats().prefill_tokens
    prompt = first.prompt_ids + first.response_ids + [30]
    _turn(eng, "c", prompt, continues="a", max_tokens=2)
    assert eng.stats().prefill_tokens - before == len(prompt) - 1 - eng.stats().prefix_hit_tokens


def test_a_short_pool_drops_parked_requests_oldest_first(model):
    eng = TorchEngine(model, max_batch=2, eos_ids=[], max_seq_len=64, kv_cache_gb=80 * PER_TOKEN / 2 ** 30)
    assert eng.stats().kv_tokens_capacity == 80
    turns = {}
    for i, start in enumerate((10, 20, 30)):       # 3 parked requests of 24 tokens: 2 blocks each
        turns[f"p{i}"] = _turn(eng, f"p{i}", list(range(start, start + 16)), keep_kv=True)
    s = eng.stats()
    assert (s.parked_requests, s.parked_blocks, s.parked_dropped) == (2, 4, 1) and "p0" not in eng.sched.parked
    assert list(eng.sched.parked) == ["p1", "p2"]
    # a fresh request needing 3 blocks takes the pool's last free block and the oldest parked one's two
    _turn(eng, "big", [3 + i % 60 for i in range(40)], max_tokens=4)
    assert eng.stats().parked_dropped == 2 and list(eng.sched.parked) == ["p2"]
    # the dropped one's continuation is prefilled in full, the kept one's only its new tokens
    before = eng.stats().prefill_tokens
    c1 = turns["p1"]
    _turn(eng, "c1", c1.prompt_ids + c1.response_ids + [3], continues="p1", max_tokens=2)
    assert eng.stats().prefill_tokens - before == len(c1.prompt_ids) + len(c1.response_ids)
    before = eng.stats().prefill_tokens
    c2 = turns["p2"]
    _turn(eng, "c2", c2.prompt_ids + c2.response_ids + [3], continues="p2", max_tokens=2)
    assert eng.stats().prefill_tokens - before == 1


def test_parked_requests_hold_no_decode_slot_and_sleep_drops_them(model):
    eng = TorchEngine(model, max_batch=1, eos_ids=[])
    for i in range(3):
        _turn(eng, f"p{i}", [5 + i, 6, 7], keep_kv=True, max_tokens=3)
    assert eng.stats().parked_requests == 3 and eng.stats().active == 0 and not eng.has_work()
    assert eng.sleep() > 0 and eng.stats().parked_dropped == 3


def test_a_continuation_after_a_new_version_is_prefilled_under_it(model):
    eng = TorchEngine(model, max_batch=2, eos_ids=[])
    first = _turn(eng, "a", [5, 6, 7, 8, 9] * 4, keep_kv=True)
    new = tiny_llama(seed=4)
    eng.load_weights(1, new.state_dict())                 # parked KV was computed by version 0
    before = eng.stats().prefill_tokens
    prompt = first.prompt_ids + first.response_ids + [12, 13]
    c = _turn(eng, "b", prompt, continues="a", temperature=1.0)
    assert eng.stats().prefill_tokens - before == len(prompt) - 1 and c.token_versions == [1] * 8
    ref = teacher_forced_logprobs(new, prompt, c.response_ids, 1.0)
    assert (ref - torch.tensor(c.logprobs)).abs().max().item() < 1e-4
