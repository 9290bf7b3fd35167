"""The gpu lane (`pytest -m gpu`): the torch engine's CUDA checks, what the CPU tests cannot show.
Every test skips without a CUDA device. About 2-3 minutes on one H200 (an estimate: not run on a
GPU yet), most of it the two gpu_single.yaml runs; benchmarks/gpu_day_one.sh runs the lane without
them (-k "not single": its benchmark runs that pipeline itself).

- CUDA graphs: the ladder captured once, and replays that decode exactly what eager steps decode;
- the Triton decode kernel against SDPA, float32 and bfloat16, on CUDA;
- sleep keeping the graphs: nothing captured again, the memory kept; a full sleep releases it and
  captures again; bf16 logprobs within tolerance in every phase (benchmarks/engine_check.py);
- one step of pipelines/gpu_single.yaml in sync mode and one in dora mode (rollout and trainer on
  the one GPU), the engine's counters in the step line.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.engine_check import bf16_errors, check_models, check_prompts
from dora.ops.engines.engine import SamplingRequest
from dora.ops.engines.paged.cuda_graphs import ladder
from dora.ops.engines.torch_engine import TorchEngine
from e2e_audit import RunDir, dora_run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def models():
    return check_models("cuda", hidden=256, layers=4, vocab=1000)


def _greedy(eng: TorchEngine, prompts: list[list[int]], prefix: str) -> dict:
    for i, p in enumerate(prompts):
        eng.submit(SamplingRequest(f"{prefix}{i}", p, eng.version, max_tokens=8 + 3 * i, temperature=0.0))
    out = {}
    while eng.has_work():
        out.update({c.uid: c for c in eng.step()})
    return out


def test_graphs_capture_the_ladder_once_and_replay_what_eager_steps_decode(models):
    fp32 = models[0]
    prompts = check_prompts(1000, n=9, group=4, longest=120)
    graphed = TorchEngine(fp32, max_batch=12, eos_ids=[], max_prefill_tokens=64)
    eager = TorchEngine(fp32, max_batch=12, eos_ids=[], max_prefill_tokens=64, cuda_graphs=False)
    assert graphed.runner.triton and graphed.runner.use_graphs and not eager.runner.use_graphs
    graphed.warm_up()
    assert graphed.stats().graph_captures == len(ladder(12))
    got, want = _greedy(graphed, prompts, "g"), _greedy(eager, prompts, "g")   # 13 requests: every size padded
    assert {u: c.response_ids for u, c in got.items()} == {u: c.response_ids for u, c in want.items()}
    worst = max(abs(a - b) for u in got for a, b in zip(got[u].logprobs, want[u].logprobs))
    assert worst < 1e-4 and graphed.stats().graph_captures == len(ladder(12)), worst   # (batch sizes differ: cuBLAS may too)


def test_triton_kernel_matches_sdpa_on_cuda_in_float32_and_bfloat16():
    pytest.importorskip("triton")
    from test_engine_triton import BF16_CASES, CASES, bf16_errors as kernel_bf16_errors, worst_errors

    errors = worst_errors("cuda")
    assert all(e < 1e-4 for e in errors), dict(zip(map(str, CASES), errors))
    for (kernel, sdpa), case in zip(kernel_bf16_errors("cuda"), BF16_CASES):
        assert kernel <= max(2 * sdpa, 2 ** -7), (case, kernel, sdpa)


def test_sleep_keeping_the_graphs_captures_nothing_again_and_stays_correct(models):
    fp32, bf16 = models
    prompts = check_prompts(1000, n=10, group=6, longest=150)
    host = {k: v.detach().to("cpu") for k, v in fp32.state_dict().items()}
    eng = TorchEngine(bf16, max_batch=16, eos_ids=[], max_prefill_tokens=64, max_seq_len=512, dtype="bfloat16")
    eng.warm_up()
    once = eng.stats().graph_captures
    assert once == len(ladder(16)) and bf16_errors(eng, models, prompts, "a").ok
    held = torch.cuda.memory_allocated()
    assert eng.sleep(keep_graphs=True) == 0 and eng.wake() == 0
    assert torch.cuda.memory_allocated() == held                    # weights, KV, graph pool: all kept
    eng.load_weights(1, host)
    errors = bf16_errors(eng, models, prompts, "b")
    assert errors.ok and eng.stats().graph_captures == once, errors
    freed = eng.sleep()
    assert freed > 0 and torch.cuda.memory_allocated() <= held - freed
    eng.wake()
    eng.load_weights(2, host)
    errors = bf16_errors(eng, models, prompts, "c")
    assert errors.ok and eng.stats().graph_captures == 2 * once, errors   # a full sleep captures again


@pytest.mark.parametrize("mode", ["sync", "dora"])
def test_gpu_single_one_step(tmp_path, mode):
    out = tmp_path / mode
    assert dora_run(out, "gpu_single.yaml", f"async.mode={mode}", "nodes.train.params.steps=1", deadline=150) == 0
    run = RunDir(out)
    assert run.summary["ok"] and run.accounting["lost"] == 0, run.describe()
    (line,) = run.metrics
    assert line["graph_captures"] > 0 and line["kv_blocks_free"] > 0 and line["prefix_hit_tokens"] > 0, line
