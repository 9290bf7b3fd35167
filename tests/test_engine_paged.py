"""The paged torch engine's own guarantees: model parity with transformers, prefix sharing, chunked
prefill, KV budgets and preemption, partial-KV migration, dtypes, and what the engine refuses."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from dora.ops.engines.engine import SamplingRequest
from dora.ops.engines.paged.model_spec import engine_problem
from dora.ops.engines.torch_engine import TorchEngine
from engine_helpers import drain, teacher_forced_logprobs, tiny_llama

torch.set_num_threads(1)
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             vocab_size=80, max_position_embeddings=256)


def _model(cls, cfg_cls, seed=0, **kw):
    torch.manual_seed(seed)
    model = cls(cfg_cls(**{**SMALL, **kw})).float().eval()
    with torch.no_grad():   # biases are zero at init: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


def _prompts(n, seed=0, lo=2, hi=30, vocab=80):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]


def _greedy(eng, prompts, max_tokens=12, prefix="r", **kw):
    for i, p in enumerate(prompts):
        eng.submit(SamplingRequest(f"{prefix}{i}", p, eng.version, max_tokens=max_tokens, temperature=0.0, **kw))
    return drain(eng)


MODELS = {
    "llama": lambda: _model(LlamaForCausalLM, LlamaConfig),
    "llama-tied-mha": lambda: _model(LlamaForCausalLM, LlamaConfig, num_key_value_heads=4, tie_word_embeddings=True),
    "llama-bias-headdim": lambda: _model(LlamaForCausalLM, LlamaConfig, attention_bias=True, head_dim=24),
    "llama3-rope": lambda: _model(LlamaForCausalLM, LlamaConfig, rope_parameters={
        "rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}),
    "qwen2": lambda: _model(Qwen2ForCausalLM, Qwen2Config, num_attention_heads=6, num_key_value_heads=3, hidden_size=72),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_logprobs_equal_a_transformers_forward(name):
    """fp32 on CPU, sampled at several temperatures, prefill cut into chunks of 7 tokens."""
    model = MODELS[name]()
    eng = TorchEngine(model, max_batch=5, seed=1, eos_ids=[], max_prefill_tokens=7)
    temps = {}
    for i, p in enumerate(_prompts(8, seed=2, hi=40)):
        temps[f"r{i}"] = [0.0, 0.7, 1.0, 1.3][i % 4]
        eng.submit(SamplingRequest(f"r{i}", p, 0, max_tokens=6 + 2 * i, temperature=temps[f"r{i}"], top_k=[0, 5][i % 2]))
    out = drain(eng)
    worst = max((teacher_forced_logprobs(model, c.prompt_ids, c.response_ids, temps[u]) - torch.tensor(c.logprobs))
                .abs().max().item() for u, c in out.items())
    assert len(out) == 8 and worst <= 1e-4, worst


def test_a_group_prefills_its_prompt_once():
    model = tiny_llama()
    prompt = _prompts(1, seed=3, lo=40, hi=41, vocab=64)[0]      # 40 tokens: context 39 = 2 full blocks + 7
    eng = TorchEngine(model, max_batch=8, eos_ids=[])
    out = _greedy(eng, [prompt] * 8, max_tokens=10)
    s = eng.stats()
    assert s.prefix_hit_tokens == 7 * 39 and s.prefill_tokens == 39   # the blocks shared, the tail of 7 copied
    alone = _greedy(TorchEngine(model, max_batch=1, eos_ids=[]), [prompt], max_tokens=10)["r0"]
    for c in out.values():
        assert c.response_ids == alone.response_ids
        assert max(abs(a - b) for a, b in zip(c.logprobs, alone.logprobs)) < 1e-5
    # the shared blocks stay cached after the group is done: a later twin hits them too
    _greedy(eng, [prompt], max_tokens=2, prefix="late")
    assert eng.stats().prefix_hit_tokens == 8 * 32 + 7 * 7     # (the tail's block was filled and sealed since)


def test_a_long_prompt_is_prefilled_in_chunks_while_others_decode():
    model = tiny_llama()
    long_prompt = _prompts(1, seed=4, lo=100, hi=101, vocab=64)[0]
    eng = TorchEngine(model, max_batch=4, eos_ids=[], max_prefill_tokens=8)
    eng.submit(SamplingRequest("short", [5, 6, 7], 0, max_tokens=40, temperature=0.0))
    eng.step()
    eng.submit(SamplingRequest("long", long_prompt, 0, max_tokens=5, temperature=0.0))
    grown = []
    for _ in range(12):   # 99 context tokens at 8 a step: the short one decodes every step meanwhile
        eng.step()
        grown.append(len(eng.sched.find("short").response))
    assert grown == list(range(2, 14)) and eng.sched.find("long").response == []
    out = drain(eng)
    ref = _greedy(TorchEngine(model, max_batch=4, eos_ids=[]), [long_prompt], max_tokens=5)["r0"]
    assert out["long"].response_ids == ref.response_ids


def test_kv_budget_too_small_for_one_request_is_refused_with_the_numbers():
    model = tiny_llama()
    per_token = 2 * 2 * 2 * 16 * 4      # k and v, 2 layers, 2 KV heads, head size 16, float32
    with pytest.raises(ValueError, match=r"holds 96 tokens .* max_seq_len=512 tokens needs 512"):
        TorchEngine(model, kv_cache_gb=100 * per_token / 2 ** 30)
    eng = TorchEngine(model, kv_cache_gb=600 * per_token / 2 ** 30, max_batch=4)
    assert eng.stats().kv_tokens_capacity == 592 and eng.stats().kv_blocks_free == 37
    with pytest.raises(ValueError, match="max_seq_len"):
        eng.submit(SamplingRequest("long", [3] * 512, 0))


def test_a_short_pool_preempts_and_every_request_still_completes_identically():
    model = tiny_llama()
    prompts = _prompts(10, seed=5, lo=20, hi=40, vocab=64)
    per_token = 2 * 2 * 2 * 16 * 4
    tight = TorchEngine(model, max_batch=10, eos_ids=[], max_seq_len=128, kv_cache_gb=160 * per_token / 2 ** 30)
    out = _greedy(tight, prompts, max_tokens=30)
    ref = _greedy(TorchEngine(model, max_batch=10, eos_ids=[]), prompts, max_tokens=30)
    assert tight.stats().preempted > 0
    assert {u: c.response_ids for u, c in out.items()} == {u: c.response_ids for u, c in ref.items()}
    assert tight.stats().kv_blocks_used == 0 and tight.stats().kv_blocks_free == 10


def test_export_mid_prefill_carries_the_computed_prefix():
    model = tiny_llama()
    prompt = _prompts(1, seed=6, lo=50, hi=51, vocab=64)[0]
    a = TorchEngine(model, max_batch=2, eos_ids=[], max_prefill_tokens=16)
    a.submit(SamplingRequest("x", prompt, 0, max_tokens=6, temperature=0.0))
    a.step()
    (state,) = a.export(["x"])
    assert state.kv_len == 16 and state.response_ids == [] and a.stats().kv_blocks_used == 0
    b = TorchEngine(model, max_batch=2, eos_ids=[])
    b.import_([state])
    got = drain(b)["x"]
    assert b.stats().prefill_tokens == 49 - 16 and b.stats().reprefill_tokens == 0
    assert got.response_ids == _greedy(TorchEngine(model, max_batch=1, eos_ids=[]), [prompt], max_tokens=6)["r0"].response_ids


def test_bfloat16_engine_generates_and_migrates_its_kv():
    model = tiny_llama()
    prompts = _prompts(4, seed=7, vocab=64)
    ref = _greedy(TorchEngine(model, max_batch=4, eos_ids=[], dtype="bfloat16"), prompts, max_tokens=10)
    a = TorchEngine(model, max_batch=4, eos_ids=[], dtype="bfloat16")
    for i, p in enumerate(prompts):
        a.submit(SamplingRequest(f"r{i}", p, 0, max_tokens=10, temperature=0.0))
    for _ in range(4):
        a.step()
    states = a.export(["r0", "r2"])
    assert all(k.dtype == torch.bfloat16 for s in states for k, _ in s.kv)
    b = TorchEngine(model, max_batch=4, eos_ids=[], dtype=torch.bfloat16)
    b.import_(states)
    out = {**drain(a), **drain(b)}
    assert {u: c.response_ids for u, c in out.items()} == {u: c.response_ids for u, c in ref.items()}
    assert b.stats().reprefill_tokens == 0 and b.weight_bytes() * 2 == TorchEngine(model).weight_bytes()
    fp32 = teacher_forced_logprobs(model, ref["r1"].prompt_ids, ref["r1"].response_ids, 1.0)
    assert (fp32 - torch.tensor(ref["r1"].logprobs)).abs().max().item() < 0.1   # bf16 rounding, not another model


def test_engine_problem_names_what_the_engine_cannot_run():
    from transformers import GPT2Config
    assert engine_problem({"arch": "qwen2", "hidden": 64, "heads": 4, "kv_heads": 2}) is None
    assert engine_problem(LlamaConfig(**SMALL)) is None
    assert "architecture 'gpt2'" in engine_problem(GPT2Config())
    assert "KV heads" in engine_problem(LlamaConfig(**{**SMALL, "num_key_value_heads": 3}))
    assert "head size 512" in engine_problem(LlamaConfig(**{**SMALL, "head_dim": 512}))
    assert "rope type 'dynamic'" in engine_problem(LlamaConfig(**SMALL, rope_parameters={
        "rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}))
    assert "sliding" in engine_problem(Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=64))
    assert "activation" in engine_problem(LlamaConfig(**SMALL, hidden_act="gelu"))
    with pytest.raises(ValueError, match="architecture 'gpt2'"):
        from transformers import GPT2LMHeadModel
        TorchEngine(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)))
