"""KV sized by need: the pool is the smaller of the memory share and what max_batch requests of
the longest context need (+ NEED_HEADROOM), never a K view past 2^31 elements, and the block pool
builds millions of blocks without a loop over them; the prefill workspace is measured at the
largest chunk the scheduler sends. The CUDA arithmetic runs here with the device's numbers given."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dora.ops.engines.paged import kv_budget
from dora.ops.engines.paged.blocks import BlockPool
from dora.ops.engines.paged.kv_budget import GiB, MAX_VIEW_ELEMENTS, budget_blocks, need_blocks
from dora.ops.engines.paged.kv_cache import bytes_per_block
from dora.ops.engines.paged.model_spec import ModelSpec
from dora.ops.engines.torch_engine import TorchEngine
from engine_helpers import tiny_llama

# the 1.1B-class llama of benchmarks/engine_gpu.py: 22 layers, 4 KV heads of 64
SPEC = ModelSpec(arch="llama", hidden=2048, layers=22, heads=32, kv_heads=4, head_dim=64, intermediate=5632,
                 vocab=32000, max_positions=4096, rms_eps=1e-5, qkv_bias=False, o_bias=False, tie_embeddings=False)
H200 = (140 * GiB, 141 * GiB, 2 * GiB)     # free, total, allocated by this process (its weights)


def _cuda_budget(monkeypatch, memory=H200, spec=SPEC, **kw) -> int:
    monkeypatch.setattr(kv_budget, "cuda_memory", lambda device: memory)
    args = dict(block_size=16, dtype=torch.bfloat16, device=torch.device("cuda"), max_batch=256, max_seq_len=2048,
                kv_cache_gb=None, memory_fraction=None, workspace=GiB)
    return budget_blocks(spec, **{**args, **kw})


def test_a_big_device_gets_what_the_batch_needs_not_its_whole_share(monkeypatch):
    need = need_blocks(max_batch=256, max_seq_len=2048, block_size=16)
    assert need == 256 * 128 * 5 // 4
    assert _cuda_budget(monkeypatch) == need                               # 0.9 of 141 GiB would be 5.6M blocks
    per_block = bytes_per_block(SPEC, 16, torch.bfloat16)
    share = int(141 * GiB * 0.05) - 2 * GiB - GiB                          # a 5% share holds fewer blocks than that
    assert _cuda_budget(monkeypatch, memory_fraction=0.05) == share // per_block < need


def test_a_share_too_small_for_one_request_is_refused_with_the_numbers(monkeypatch):
    with pytest.raises(ValueError, match=r"memory share 0\.02 of 141\.0 GiB, less 2\.00 GiB held .* 1\.00 GiB "
                                         r"workspace .* holds 0 tokens .* max_seq_len=2048 tokens needs 2048"):
        _cuda_budget(monkeypatch, memory_fraction=0.02)


def test_no_k_view_passes_2_to_the_31_elements(monkeypatch):
    small = dataclasses.replace(SPEC, layers=2)                            # 125 GB of its KV: 3.8M blocks
    blocks = _cuda_budget(monkeypatch, spec=small, max_batch=4096, max_seq_len=4096)   # need: 1.3M
    per_view = 16 * SPEC.kv_heads * SPEC.head_dim
    assert blocks == MAX_VIEW_ELEMENTS // per_view and blocks * per_view < 2 ** 31


def test_the_block_pool_builds_millions_of_blocks_and_hands_out_never_held_ones_first():
    pool = BlockPool(4_000_000, 16)
    assert (pool.free_count, pool.used_count) == (3_999_999, 0)
    a, b = pool.take(3), pool.take(2)
    assert (a, b) == ([1, 2, 3], [4, 5])
    pool.register(1, 111, (0,) * 16, ready=True)
    pool.release(a)                        # freed: 3, 2, 1 (the tail first), 1 still findable
    assert pool.take(2) == [6, 7]          # never-held blocks first: the freed keep their prefix
    assert pool.match([111], [(0,) * 16]) == ([1], False)
    pool.share(1)
    assert pool.used_count == 5 and pool.free_count == 3_999_999 - 5
    pool.grow(4_000_010)
    assert pool.free_count == 4_000_009 - 5


def test_the_workspace_is_measured_at_the_largest_chunk_the_scheduler_sends():
    eng = TorchEngine(tiny_llama(), max_batch=4, max_seq_len=512, max_prefill_tokens=1200)
    chunks = eng.runner.largest_chunk(1200)
    assert [end - start for _, start, end in chunks] == [511, 511, 178]
    blocks = [b for seq, _, _ in chunks for b in seq.blocks]
    assert len(blocks) == len(set(blocks)) and 0 not in blocks
    assert sum(e - s for _, s, e in eng.runner.largest_chunk(10_000)) == 4 * 511    # no more than max_batch hold
