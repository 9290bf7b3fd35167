"""The Triton paged-decode kernel against the plain-torch reference, run by Triton's interpreter on
the CPU: GQA groups that are not powers of two, head sizes that need padding, shuffled block
tables, empty (padded) rows, and the split-context reduction.

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


def test_kernel_equals_the_torch_reference():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([root, os.path.join(root, "tests"), os.environ.get("PYTHONPATH", "")])}
    code = "import json, test_engine_triton as t; print(json.dumps(t.worst_errors()))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(e < 1e-5 for e in errors), dict(zip(map(str, CASES), errors))
