"""The torch engine: continuous batching, sampling, behaviour logprobs, KV export/import, versions."""

from __future__ import annotations

import msgpack
import pytest
import torch

from dora.ops.engines.engine import SamplingRequest, state_from_wire, state_to_wire
from dora.ops.engines.torch_engine import TorchEngine
from engine_helpers import drain, teacher_forced_logprobs, tiny_llama

torch.set_num_threads(1)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 64, (int(torch.randint(1, 14, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def test_behaviour_logprobs_match_teacher_forcing(model):
    eng = TorchEngine(model, max_batch=6, seed=3)
    temps = {}
    for i, p in enumerate(_prompts(16)):
        temps[f"r{i}"] = [0.0, 0.7, 1.0, 1.3][i % 4]
        eng.submit(SamplingRequest(f"r{i}", p, 0, max_tokens=5 + 3 * i, temperature=temps[f"r{i}"],
                           top_p=[1.0, 0.9, 0.5][i % 3], top_k=[0, 0, 7, 1][i % 4]))
    out = drain(eng)
    assert len(out) == 16
    worst = 0.0
    for uid, c in out.items():
        ref = teacher_forced_logprobs(model, c.prompt_ids, c.response_ids, temps[uid])
        worst = max(worst, (ref - torch.tensor(c.logprobs)).abs().max().item())
        assert c.token_versions == [0] * len(c.response_ids)
    assert worst <= 1e-4, worst


def test_continuous_batching_matches_each_request_alone(model):
    prompts = _prompts(12, seed=1)
    lengths = [3, 17, 5, 30, 2, 9, 25, 4, 11, 1, 20, 6]
    eng = TorchEngine(model, max_batch=4, seed=0, eos_ids=[])
    for i, p in enumerate(prompts):
        eng.submit(SamplingRequest(f"r{i}", p, 0, max_tokens=lengths[i], temperature=0.0))
    seen_mixed = False
    out = {}
    while eng.has_work():
        before = {s.req.uid: len(s.response) for s in eng.sched.running}
        for c in eng.step():
            out[c.uid] = c
        joined = [s for s in eng.sched.running if s.req.uid not in before]
        # a request joined while another one was mid-generation: not batch-synchronous
        seen_mixed |= bool(joined) and any(n > 0 for n in before.values())
        assert eng.stats().active <= 4
    assert seen_mixed
    for i, p in enumerate(prompts):
        alone = TorchEngine(model, max_batch=1, eos_ids=[])
        alone.submit(SamplingRequest("x", p, 0, max_tokens=lengths[i], temperature=0.0))
        ref = drain(alone)["x"]
        assert out[f"r{i}"].response_ids == ref.response_ids
        assert len(ref.response_ids) == lengths[i] and out[f"r{i}"].finish_reason == "length"
        assert max(abs(a - b) for a, b in zip(out[f"r{i}"].logprobs, ref.logprobs)) < 1e-4


def test_stop_ids_eos_and_top_k_one(model):
    eng = TorchEngine(model, max_batch=8, seed=0, eos_ids=[])
    p = _prompts(1, seed=2)[0]
    eng.submit(SamplingRequest("greedy", p, 0, max_tokens=12, temperature=0.0))
    greedy = drain(eng)["greedy"].response_ids
    # top_k=1 at any temperature is greedy
    eng.submit(SamplingRequest("k1", p, 0, max_tokens=12, temperature=1.5, top_k=1))
    assert drain(eng)["k1"].response_ids == greedy
    # stopping on the 4th greedy token: the stop token is included, finish_reason stop
    stop = greedy[3]
    first = greedy.index(stop)
    eng.submit(SamplingRequest("s", p, 0, max_tokens=12, temperature=0.0, stop_ids=[stop]))
    c = drain(eng)["s"]
    assert c.response_ids == greedy[:first + 1] and c.finish_reason == "stop"
    # the model's EOS always stops
    eos_eng = TorchEngine(model, max_batch=2, eos_ids=[stop])
    eos_eng.submit(SamplingRequest("e", p, 0, max_tokens=12, temperature=0.0))
    assert drain(eos_eng)["e"].finish_reason == "stop"


def test_seeded_sampling_is_deterministic(model):
    runs = []
    for _ in range(2):
        eng = TorchEngine(model, max_batch=8, seed=42)
        for i, p in enumerate(_prompts(8, seed=5)):
            eng.submit(SamplingRequest(f"r{i}", p, 0, max_tokens=10, temperature=1.0, top_p=0.9))
        runs.append({u: c.response_ids for u, c in drain(eng).items()})
    assert runs[0] == runs[1]


def _wire_roundtrip(states):
    out = []
    for s in states:
        d, frames = state_to_wire(s)
        d = msgpack.unpackb(msgpack.packb(d), raw=False)
        out.append(state_from_wire(d, [memoryview(f) for f in frames]))
    return out


@pytest.mark.parametrize("with_kv", [True, False])
def test_migration_continues_identically(model, with_kv):
    prompts = _prompts(6, seed=7)
    ref_eng = TorchEngine(model, max_batch=8, eos_ids=[])
    for i, p in enumerate(prompts):
        ref_eng.submit(SamplingRequest(f"r{i}", p, 0, max_tokens=20, temperature=0.0))
    ref = drain(ref_eng)

    a, b = TorchEngine(model, max_batch=8, eos_ids=[]), TorchEngine(model, max_batch=8, eos_ids=[])
    for i, p in enumerate(prompts):
        a.submit(SamplingRequest(f"r{i}", p, 0, max_tokens=20, temperature=0.0))
    for _ in range(7):
        assert not a.step()
    states = _wire_roundtrip(a.export(["r1", "r4", "r5"]))
    assert all(len(s.response_ids) == 7 for s in states)
    if with_kv:
        assert all(s.kv is not None and s.kv_len == len(s.request.prompt_ids) + 6 for s in states)
    else:
        states = [type(s)(s.request, s.response_ids, s.logprobs, s.token_versions) for s in states]
    b.import_(states)
    b.submit(SamplingRequest("r6", prompts[0], 0, max_tokens=20, temperature=0.0))   # a fresh one joins in the same step
    out = {**drain(a), **drain(b)}
    assert out.pop("r6").response_ids == ref["r0"].response_ids
    assert set(out) == set(ref)
    for uid in ref:
        assert out[uid].response_ids == ref[uid].response_ids, uid
        assert max(abs(x - y) for x, y in zip(out[uid].logprobs, ref[uid].logprobs)) < 1e-4
    want = 0 if with_kv else sum(len(s.request.prompt_ids) + 7 - 1 for s in states)
    assert b.stats().reprefill_tokens == want


def test_interrupt_load_new_version_and_resume(model, tmp_path):
    from safetensors.torch import save_file
    eng = TorchEngine(model, max_batch=8, eos_ids=[])
    new_model = tiny_llama(seed=9)
    path = str(tmp_path / "v1.safetensors")
    save_file({k: v.contiguous() for k, v in new_model.state_dict().items()}, path)
    for i, p in enumerate(_prompts(3, seed=11)):
        eng.submit(SamplingRequest(f"r{i}", p, 0, max_tokens=10, temperature=0.0))
    for _ in range(4):
        eng.step()
    addresses = {k: v.data_ptr() for k, v in eng.weights().items()}
    with pytest.raises(RuntimeError, match="interrupt_all"):
        eng.load_weights(1, path)
    states = eng.interrupt_all()
    assert eng.stats().active == 0 and len(states) == 3
    eng.load_weights(1, path)
    assert eng.stats().version == 1
    eng.import_(states)   # KV was computed by version 0: re-prefilled under version 1
    out = drain(eng)
    for s in states:
        c = out[s.request.uid]
        assert c.token_versions == [0] * 4 + [1] * 6 and c.version == 0
        # the new tokens are those of the new weights, continuing the same prefix
        ref = teacher_forced_logprobs(new_model, c.prompt_ids, c.response_ids, 1.0)[4:]
        assert (ref - torch.tensor(c.logprobs[4:])).abs().max().item() < 1e-4
    assert eng.stats().reprefill_tokens == sum(len(s.request.prompt_ids) + 3 for s in states)
    # and the engine's weights are now exactly the new ones, loaded in place (same storage)
    new_weights = new_model.state_dict()
    for k, v in eng.weights().items():
        assert torch.equal(v, new_weights[k]), k
        assert v.data_ptr() == addresses[k], k


def test_abort_and_bad_input(model):
    eng = TorchEngine(model, max_batch=2)
    eng.submit(SamplingRequest("a", [5, 6], 0, max_tokens=50, temperature=0.0))
    eng.submit(SamplingRequest("b", [6, 7], 0, max_tokens=50, temperature=0.0))
    eng.submit(SamplingRequest("c", [7, 8], 0, max_tokens=50, temperature=0.0))
    eng.step()
    assert eng.stats().active == 2 and eng.stats().queued == 1
    assert eng.abort("a").finish_reason == "abort"
    assert eng.abort("c").response_ids == []
    assert eng.abort("zzz") is None
    assert eng.stats().active == 1 and eng.stats().queued == 0
    with pytest.raises(ValueError, match="already in flight"):
        eng.submit(SamplingRequest("b", [1], 0))
    with pytest.raises(ValueError, match="empty prompt_ids"):
        eng.submit(SamplingRequest("d", [], 0))
    with pytest.raises(ValueError, match="max_seq_len"):
        eng.submit(SamplingRequest("e", [3] * 600, 0))
    with pytest.raises(KeyError, match="zzz"):
        eng.export(["zzz"])
    with pytest.raises(ValueError, match="does not fit"):
        eng.abort("b")
        eng.load_weights(1, {"nope": torch.zeros(1)})


def test_wire_rejects_bad_frames(model):
    eng = TorchEngine(model, max_batch=2)
    eng.submit(SamplingRequest("a", [5, 6, 7], 0, max_tokens=5))
    eng.step()
    d, frames = state_to_wire(eng.export(["a"])[0])
    with pytest.raises(ValueError, match="frames"):
        state_from_wire(d, frames[:-1])
    with pytest.raises(ValueError, match="bytes"):
        state_from_wire(d, [frames[0][:-4]] + frames[1:])
    with pytest.raises(ValueError, match="keys"):
        state_from_wire({"request": {}}, [])
    st = state_from_wire(d, frames)
    kv = st.kv
    # KV may cover a prefix of the tokens (an export mid-prefill), never more, and k and v agree
    for bad in ([(k[:, :, :-1], v[:, :, :-1]) for k, v in kv],                       # head size
                [(k[:1], v[:1]) for k, v in kv],                                      # KV heads
                [(torch.cat([k, k[:, :1]], 1), torch.cat([v, v[:, :1]], 1)) for k, v in kv],   # the last token too
                [(k, v[:, :1]) for k, v in kv]):                                      # k and v differ
        st.kv = bad
        with pytest.raises(ValueError, match="shape"):
            eng.import_([st])
    assert not eng.has_work()


def test_qwen2_model_and_stats():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=128, vocab_size=64, max_position_embeddings=256)).float().eval()
    eng = TorchEngine(m, max_batch=4, seed=1)
    for i, p in enumerate(_prompts(5, seed=3)):
        eng.submit(SamplingRequest(f"q{i}", p, 0, max_tokens=8, temperature=0.8))
    eng.step()
    s = eng.stats()
    assert (s.active, s.queued, s.kv_tokens_capacity) == (4, 1, 4 * 256 * 5 // 4)   # need: 4 requests of 256, +25%
    assert s.kv_tokens_used == sum(len(x.req.prompt_ids) for x in eng.sched.running)
    out = drain(eng)
    for c in out.values():
        ref = teacher_forced_logprobs(m, c.prompt_ids, c.response_ids, 0.8)
        assert (ref - torch.tensor(c.logprobs)).abs().max().item() < 1e-4
    assert eng.stats().generated_tokens == sum(len(c.response_ids) for c in out.values())


def test_random_interleavings_of_submit_abort_export_import(model):
    """Random joins, aborts and migrations between two engines never change a greedy request's output."""
    import random
    rnd = random.Random(0)
    prompts = _prompts(24, seed=13)
    lengths = [rnd.randint(1, 16) for _ in prompts]
    solo = TorchEngine(model, max_batch=24, eos_ids=[])
    for i, p in enumerate(prompts):
        solo.submit(SamplingRequest(f"r{i}", p, 0, max_tokens=lengths[i], temperature=0.0))
    ref = drain(solo)
    engines = [TorchEngine(model, max_batch=5, eos_ids=[]), TorchEngine(model, max_batch=3, eos_ids=[])]
    pending, out, aborted = list(range(24)), {}, set()
    for _ in range(400):
        if not pending and not any(e.has_work() for e in engines):
            break
        act = rnd.random()
        e = rnd.choice(engines)
        if act < 0.3 and pending:
            i = pending.pop(0)
            e.submit(SamplingRequest(f"r{i}", prompts[i], 0, max_tokens=lengths[i], temperature=0.0))
        elif act < 0.4 and e.sched.running:
            uids = [s.req.uid for s in rnd.sample(e.sched.running, k=min(2, len(e.sched.running)))]
            other = engines[1 - engines.index(e)]
            other.import_(_wire_roundtrip(e.export(uids)))
        elif act < 0.43 and e.sched.running:
            aborted.add(e.abort(rnd.choice(e.sched.running).req.uid).uid)
        else:
            for c in e.step():
                out[c.uid] = c
    assert set(out) | aborted == set(ref)
    for uid, c in out.items():
        assert c.response_ids == ref[uid].response_ids, uid
    assert sum(e.stats().reprefill_tokens for e in engines) == 0
