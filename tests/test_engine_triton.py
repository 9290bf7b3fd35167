"""The Triton paged-decode kernel against the plain-torch reference, run by Triton's interpreter on
the CPU: GQA groups that are not powers of two, head sizes that need padding, shuffled block
tables, empty (padded) rows, and the split-context reduction; then the whole engine with the
kernel doing every attention (prefill chunks as one row per token, as on CUDA).

In bfloat16 the kernel is checked against SDPA in bfloat16 and both against float32 attention over
the same (bf16-rounded) inputs. Triton's interpreter multiplies the raw bit patterns of bfloat16
operands in tl.dot (triton-lang/triton#11584: the interpreter does not support it), so that run
widens them to float32 first, exactly (bf16 is float32's upper half): only the interpreter's
matmul changes, the kernel is the one the GPU compiles. tests/test_engine_gpu.py runs it on CUDA.

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
BF16_CASES = CASES + [(32, 4, 64, 16, 1)]                          # + the 1.1B llama's attention shape


def worst_errors(device: str = "cpu") -> list[float]:
    """Max |kernel - reference| per case (NaN if a padded row is not zero); on CPU run in the
    interpreter process (tests/test_engine_gpu.py runs it on CUDA)."""
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
        q, k, v, table, lens = (t.to(device) for t in (q, k, v, table, lens))
        got = paged_decode(q, k, v, table, lens, scale=dim ** -0.5, block_size=block_size, splits=splits)
        ref = decode_reference(q, k, v, *gather_plan(table, lens, block_size), dim ** -0.5, block_size)
        padded_ok = torch.equal(got[0], torch.zeros_like(got[0]))     # a padded row attends to nothing
        out.append((got[1:] - ref[1:]).abs().max().item() if padded_ok else float("nan"))
    return out


def widen_bf16_dot_operands() -> None:
    """The interpreter's tl.dot on bfloat16 operands: float32 operands of the same values instead."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    dot = interpreter.InterpreterBuilder.create_dot

    def widened(h):
        if h.dtype.scalar != tl.bfloat16:
            return h
        return interpreter.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return dot(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)
    interpreter.InterpreterBuilder.create_dot = create_dot


def bf16_errors(device: str = "cpu") -> list[list[float]]:
    """Per case, max |kernel - float32 attention| and max |SDPA in bf16 - float32 attention| (NaN if
    a padded row is not zero), on bf16 q, K and V; on CPU run in the interpreter process."""
    import torch

    from dora.ops.engines.paged.attention import decode_reference, gather_plan
    from dora.ops.engines.paged.triton_decode import paged_decode

    out = []
    for heads, kv_heads, dim, block_size, splits in BF16_CASES:
        g = torch.Generator().manual_seed(heads + dim)
        blocks, rows, width = 40, 5, 6
        k = torch.randn(blocks * block_size, kv_heads, dim, generator=g).bfloat16()
        v = torch.randn(blocks * block_size, kv_heads, dim, generator=g).bfloat16()
        table = (torch.randperm(blocks - 1, generator=g)[:rows * width].view(rows, width) + 1).int()
        lens = torch.tensor([0, 1, 17, width * block_size, 33], dtype=torch.int32)
        q = torch.randn(rows, heads, dim, generator=g).bfloat16()
        q, k, v, table, lens = (t.to(device) for t in (q, k, v, table, lens))
        plan = gather_plan(table, lens, block_size)
        got = paged_decode(q, k, v, table, lens, scale=dim ** -0.5, block_size=block_size, splits=splits)
        sdpa = decode_reference(q, k, v, *plan, dim ** -0.5, block_size)
        truth = decode_reference(q.float(), k.float(), v.float(), *plan, dim ** -0.5, block_size)
        padded_ok = got.dtype == torch.bfloat16 and torch.equal(got[0], torch.zeros_like(got[0]))
        kernel = (got[1:].float() - truth[1:]).abs().max().item() if padded_ok else float("nan")
        out.append([kernel, (sdpa[1:].float() - truth[1:]).abs().max().item()])
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
    assert eng.stats().prefix_hit_tokens == 2 * 36, eng.stats()    # 2 blocks shared, the tail of 4 copied
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


def kernel_checks() -> dict[str, list]:
    """Run in the interpreter process: both kernel checks (one process start for the two)."""
    widen_bf16_dot_operands()
    return {"fp32": worst_errors(), "bf16": bf16_errors()}


@pytest.fixture(scope="module")
def kernel():
    return _interpreted("kernel_checks")


def test_kernel_equals_the_torch_reference(kernel):
    errors = kernel["fp32"]
    assert all(e < 1e-5 for e in errors), dict(zip(map(str, CASES), errors))


def test_kernel_in_bf16_is_as_close_to_float32_as_sdpa_in_bf16(kernel):
    """Both round q.k and p.v to bf16 (8 bits of mantissa); the kernel accumulates in float32,
    so its error is at most SDPA's bf16 error plus the output's own rounding (outputs are below 4:
    half a bf16 step is 2^-7 there)."""
    for (kernel_err, sdpa), case in zip(kernel["bf16"], BF16_CASES):
        assert kernel_err <= max(2 * sdpa, 2 ** -7), (case, kernel_err, sdpa)


def test_engine_on_the_kernel_matches_teacher_forcing():
    assert _interpreted("engine_worst_logprob_error") < 1e-4
