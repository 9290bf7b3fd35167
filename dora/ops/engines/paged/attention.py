"""Attention over the paged KV cache.

The cache of one layer is `[slots, kv_heads, head_dim]` (slot = block * block_size + offset).
Each layer first writes the new tokens' keys and values at their slots (decoder.py), then attends
with one of two metas:
- DecodeMeta: every query row attends to the first `context_lens[row]` keys of its block table.
  A decode step has one row per sequence; with the Triton kernel (CUDA) a prefill chunk is the
  same thing, one row per token (its context ends at its own position), so the kernel reads
  the blocks in place with no padding and no mask. Without Triton, rows gather their blocks
  and attend in plain torch.
- PrefillMeta (plain torch): the chunk's sequences padded to one batch, each against its keys
  gathered from the cache, with scaled_dot_product_attention and a causal mask shifted by the
  sequence's start.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F


@dataclasses.dataclass
class PrefillMeta:
    slots: torch.Tensor      # [N] long: where each packed token's KV goes
    gather: torch.Tensor     # [S, K] long: the slots of sequence s's keys 0..K-1 (padding: slot 0)
    unpack: torch.Tensor     # [N] long: packed token -> s * q_width + its index in its chunk
    mask: torch.Tensor       # [S, 1, q_width, K] bool: key j visible to query i of sequence s
    q_width: int
    group: int               # query heads per KV head

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float) -> torch.Tensor:
        n, heads, dim = q.shape
        seqs, keys = self.gather.shape
        qp = q.new_zeros(seqs * self.q_width, heads, dim).index_copy_(0, self.unpack, q)
        qp = qp.view(seqs, self.q_width, heads, dim).transpose(1, 2)
        flat = self.gather.view(-1)
        kv_heads = k_cache.shape[1]
        k = _heads_first(k_cache.index_select(0, flat), seqs, keys, kv_heads, dim).repeat_interleave(self.group, dim=1)
        v = _heads_first(v_cache.index_select(0, flat), seqs, keys, kv_heads, dim).repeat_interleave(self.group, dim=1)
        out = F.scaled_dot_product_attention(qp, k, v, attn_mask=self.mask, scale=scale)
        return out.transpose(1, 2).reshape(seqs * self.q_width, heads * dim).index_select(0, self.unpack)


@dataclasses.dataclass
class DecodeMeta:
    slots: torch.Tensor          # [B] long: where each row's new KV goes (padded rows: the trash block)
    block_tables: torch.Tensor   # [B, W] int32: each row's blocks (may be a strided view)
    context_lens: torch.Tensor   # [B] int32: keys to attend, the new one included (padded rows: 0)
    block_size: int
    group: int
    splits: int = 1              # Triton: context partitions per row (more parallelism at small batch)
    triton: bool = False

    def __post_init__(self):
        if not self.triton:      # the torch path's gather index and mask, shared by every layer
            self.gather, self.valid = gather_plan(self.block_tables, self.context_lens, self.block_size)

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float) -> torch.Tensor:
        if self.triton:
            from .triton_decode import paged_decode
            out = paged_decode(q, k_cache, v_cache, self.block_tables, self.context_lens, scale=scale,
                               block_size=self.block_size, splits=self.splits)
        else:
            out = decode_reference(q, k_cache, v_cache, self.gather, self.valid, scale, self.block_size)
        return out.reshape(q.shape[0], -1)


def _heads_first(x: torch.Tensor, rows: int, keys: int, heads: int, dim: int) -> torch.Tensor:
    """Gathered keys in token order (rows * keys * heads * dim values) -> [rows, heads, keys, D]."""
    return x.view(rows, keys, heads, dim).transpose(1, 2)


def gather_plan(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's blocks as one flat index [B * W], and which of their W * bs keys are real [B, 1, 1, W * bs]."""
    width = block_tables.shape[1] * block_size
    valid = torch.arange(width, device=block_tables.device)[None, :] < context_lens[:, None]
    return block_tables.reshape(-1).long(), valid[:, None, None, :]


def decode_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, blocks: torch.Tensor,
                     valid: torch.Tensor, scale: float, block_size: int) -> torch.Tensor:
    """Plain-torch paged decode: gather each row's blocks whole (one copy of block-sized rows), mask
    past its length. [B, H, D] out (a row with no context gets NaN: only captured graphs pad, and
    they run the Triton kernel)."""
    rows, heads, dim = q.shape
    keys, kv_heads = valid.shape[-1], k_cache.shape[1]
    by_block = (-1, block_size * kv_heads * dim)
    k = _heads_first(k_cache.view(by_block).index_select(0, blocks), rows, keys, kv_heads, dim)
    v = _heads_first(v_cache.view(by_block).index_select(0, blocks), rows, keys, kv_heads, dim)
    out = F.scaled_dot_product_attention(q[:, :, None, :], k, v, attn_mask=valid, scale=scale,
                                         enable_gqa=heads != kv_heads)
    return out[:, :, 0, :]
