"""Paged decode attention in Triton: each row's single query attends to its keys read in place
from the block-paged cache (no gather, no copy), with an online softmax.

One program handles one (row, KV head, context split): the G query heads sharing that KV head are
one [G, D] tile, so each key and value is loaded once for all of them. With `splits` > 1 a row's
context is cut into that many ranges (flash-decoding) and a small reduction merges the partial
results by their log-sum-exp; this keeps the GPU busy when the batch is small and contexts long.
Padded rows (context length 0) produce zeros. Only Triton APIs present in Triton 3.6.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64   # keys per loop iteration


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, lse_ptr, scale,
                   stride_qb, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_tb,
                   stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                   GROUP: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
                   PRECISION: tl.constexpr):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(lens_ptr + row)
    per_split = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, length)

    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q = tl.load(q_ptr + row * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)

    m = tl.full([G_PAD], float("-inf"), tl.float32)
    total = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        ok = offs < hi
        block = tl.load(table_ptr + row * stride_tb + offs // BLOCK_SIZE, mask=ok, other=0)
        slot = block.to(tl.int64) * BLOCK_SIZE + offs % BLOCK_SIZE
        k = tl.load(k_ptr + slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :],
                    mask=ok[:, None] & d_ok[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        total = total * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + slot[:, None] * stride_vs + kv_head * stride_vh + d[None, :],
                    mask=ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new

    seen = total > 0
    out = acc / tl.where(seen, total, 1.0)[:, None]
    lse = tl.where(seen, m + tl.log(tl.where(seen, total, 1.0)), float("-inf"))
    tl.store(out_ptr + row * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :],
             out, mask=g_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + row * stride_lb + heads * stride_lh + split, lse, mask=g_ok)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, *, scale: float, block_size: int, splits: int = 1) -> torch.Tensor:
    """q [B, H, D]; k_cache/v_cache [slots, KVH, D]; block_tables [B, W] int32 (row stride free, unit
    column stride); context_lens [B] int32. Returns [B, H, D] in q's dtype."""
    rows, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    assert block_tables.stride(1) == 1 and q.stride(2) == 1 and k_cache.stride(2) == 1 and v_cache.stride(2) == 1
    out = torch.empty(rows, heads, splits, dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(rows, heads, splits, dtype=torch.float32, device=q.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _decode_kernel[(rows, kv_heads, splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, lse, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        block_tables.stride(0), out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
        GROUP=group, G_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=dim,
        D_PAD=max(16, triton.next_power_of_2(dim)), BLOCK_SIZE=block_size, BLOCK_N=BLOCK_N, SPLITS=splits,
        PRECISION=precision)
    if splits == 1:
        return out[:, :, 0].to(q.dtype)
    weights = torch.softmax(lse, dim=-1).nan_to_num(0.0)     # all splits empty (padded row): weight 0
    return (weights[..., None] * out).sum(dim=2).to(q.dtype)
