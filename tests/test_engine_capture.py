"""Capture once: the torch engine's decode-graph path (ladder, static buffers, padded rows, the
`graph_captures` counter) driven on CPU through cuda_graphs.run_eagerly, whose "replay" runs the
step again. What only a GPU shows (that a captured CUDA graph replays right, and that its Triton
variants compile once) is in tests/test_engine_gpu.py."""

from __future__ import annotations

import pytest
import torch

from dora.ops.engines.engine import SamplingRequest
from dora.ops.engines.paged.cuda_graphs import ladder, run_eagerly
from dora.ops.engines.torch_engine import TorchEngine
from engine_helpers import drain, teacher_forced_logprobs, tiny_llama

torch.set_num_threads(1)
MAX_BATCH = 6
PROMPTS = [[5, 6, 7], [9] * 20, [11, 12], [3 + i % 50 for i in range(37)], [8, 8]]


@pytest.fixture(scope="module")
def model():
    return tiny_llama(eos=None)


def _graphed(model) -> TorchEngine:
    eng = TorchEngine(model, max_batch=MAX_BATCH, seed=4, eos_ids=[], max_prefill_tokens=16)
    eng.runner.use_graph_capture(run_eagerly)
    return eng


def _run(eng: TorchEngine, prefix: str, n: int = len(PROMPTS), steps: int | None = None):
    for i, p in enumerate(PROMPTS[:n]):
        eng.submit(SamplingRequest(f"{prefix}{i}", p, eng.version, max_tokens=12, temperature=1.0))
    if steps is None:
        return drain(eng)
    for _ in range(steps):
        eng.step()
    return {}


def test_ladder_doubles_to_32_then_climbs_by_16_up_to_max_batch():
    assert ladder(1) == [1] and ladder(6) == [1, 2, 4, 6] and ladder(32) == [1, 2, 4, 8, 16, 32]
    assert ladder(129) == [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128, 129]
    assert ladder(256)[-3:] == [224, 240, 256] and len(ladder(256)) == 20


def test_graph_path_matches_teacher_forcing_and_captures_once(model):
    eng = _graphed(model)
    eng.warm_up()
    once = len(ladder(MAX_BATCH))
    assert eng.stats().graph_captures == once
    _run(eng, "a", steps=1)
    after_one = eng.stats().graph_captures
    _run(eng, "b", n=3, steps=9)            # 3 more join; 5 running rows replay the 6-row graph, 3 the 4-row (padded)
    assert eng.stats().graph_captures == after_one == once
    out = drain(eng)
    worst = max((teacher_forced_logprobs(model, c.prompt_ids, c.response_ids, 1.0) - torch.tensor(c.logprobs))
                .abs().max().item() for c in out.values())
    assert len(out) == len(PROMPTS) + 3 and worst < 1e-4, worst   # padded rows touched no request's KV
    assert eng.stats().graph_captures == once


def test_weight_loads_and_a_sleep_keeping_graphs_capture_nothing_again(model):
    eng = _graphed(model)
    first = _run(eng, "a")
    captured = eng.stats().graph_captures
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    for version in (1, 2):                  # in place: the graphs stay valid
        eng.load_weights(version, weights)
        _run(eng, f"v{version}-")
    assert eng.sleep(keep_graphs=True) == 0 and eng.wake() == 0      # the graphs' memory stayed
    with pytest.raises(RuntimeError, match="woken without weights"):
        eng.submit(SamplingRequest("early", [5], 0))
    eng.load_weights(3, weights)
    again = _run(eng, "a")
    assert eng.stats().graph_captures == captured == len(ladder(MAX_BATCH))
    worst = max((teacher_forced_logprobs(model, c.prompt_ids, c.response_ids, 1.0) - torch.tensor(c.logprobs))
                .abs().max().item() for c in again.values())
    assert worst < 1e-4 and set(again) == set(first)
    assert all(c.token_versions == [3] * len(c.response_ids) for c in again.values())


def test_a_full_sleep_releases_the_memory_and_captures_again(model):
    eng = _graphed(model)
    _run(eng, "a")
    assert eng.sleep() > 0 and eng.wake() > 0
    eng.load_weights(1, {k: v.clone() for k, v in model.state_dict().items()})
    _run(eng, "b")
    assert eng.stats().graph_captures == 2 * len(ladder(MAX_BATCH))


def test_without_graphs_a_keep_graphs_sleep_releases_everything(model):
    eng = TorchEngine(model, max_batch=MAX_BATCH, eos_ids=[])        # CPU: no graphs, nothing pins the memory
    _run(eng, "a")
    assert eng.sleep(keep_graphs=True) > 0 and eng.stats().graph_captures == 0
