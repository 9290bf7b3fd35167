"""The Triton paged-decode kernel against the plain-torch reference, run by Triton's interpreter on
the CPU: GQA groups that are not powers of two, head sizes that need padding, shuffled block
tables, empty (padded) rows, and the split-context reduction; then the whole engine with the
kernel doing every attention (prefill chunks as one row per token, as on CUDA).

Triton picks interpreter mode when it is imported, so the kernel runs in a fresh process with
TRITON_INTERPRET=1 (another test of the session may have imported triton already)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")
pytestmark = pytest.mark.triton
CASES = [(4, 2, 16, 16, 1), (9, 3, 24, 16, 4), (8, 8, 64, 8, 2)]   # heads, kv_heads, head size, block size, splits


def worst_errors() -> list[float]:
    """Run in the interpreter process: max |kernel - reference| per case (NaN if a padded row is not zero)."""
    import torch

    from dora.ops.engines.paged.attention import decode_reference, gather_plan
    from dora.ops.engines.paged.triton_decode import paged_decode

    out = []
    for heads, kv_heads, dim, block_size, splits in CASES:
        g = torch.Generator().manual_seed(heads + dim)
        blocks, rows, width = 40, 5, 6
        k = torch.randn(blocks * block_size, kv_heads, dim, generator=g)
        v = torch.randn(blocks * block_size, kv_heads, dim, generator=g)
        table = (torch.randperm(blocks - 1, generator=g)[:rows * width].view(rows, width) + 1).int()
        lens = torch.tensor([0, 1, 17, width * block_size, 33], dtype=torch.int32)
        q = torch.randn(rows, heads, dim, generator=g)
        got = paged_decode(q, k, v, table, lens, scale=dim ** -0.5, block_size=block_size, splits=splits)
        ref = decode_reference(q, k, v, *gather_plan(table, lens, block_size), dim ** -0.5, block_size)
        padded_ok = torch.equal(got[0], torch.zeros_like(got[0]))     # a padded row attends to nothing
        out.append((got[1:] - ref[1:]).abs().max().item() if padded_ok else float("nan"))
    return out


def engine_worst_logprob_error() -> float:
    """Run in the interpreter process: the engine with attention='triton' on a group sharing a prompt
    (chunked prefill, prefix hits) and a few others; max |logprob - teacher forcing|."""
    import torch

    from dora.ops.engines.engine import SamplingRequest
    from dora.ops.engines.torch_engine import TorchEngine
    from engine_helpers import drain, teacher_forced_logprobs, tiny_llama

    model = tiny_llama()
    eng = TorchEngine(model, max_batch=6, seed=2, eos_ids=[], attention="triton", max_prefill_tokens=24)
    shared = [(7 * i) % 60 + 3 for i in range(37)]
    prompts = [shared] * 3 + [[5, 6, 7], [9] * 20, [11, 12]]
    for i, p in enumerate(prompts):
        eng.submit(SamplingRequest(f"r{i}", p, 0, max_tokens=5, temperature=1.0))
    out = drain(eng)
    assert eng.stats().prefix_hit_tokens == 2 * 32, eng.stats()
    return max((teacher_forced_logprobs(model, c.prompt_ids, c.response_ids, 1.0) - torch.tensor(c.logprobs))
               .abs().max().item() for c in out.values())


def _interpreted(call: str):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([root, os.path.join(root, "tests"), os.environ.get("PYTHONPATH", "")])}
    code = f"import json, test_engine_triton as t; print(json.dumps(t.{call}()))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_kernel_equals_the_torch_reference():
    errors = _interpreted("worst_errors")
    assert all(e < 1e-5 for e in errors), dict(zip(map(str, CASES), errors))


def test_engine_on_the_kernel_matches_teacher_forcing():
    assert _interpreted("engine_worst_logprob_error") < 1e-4
