"""A step's model inputs, built on the host from the scheduled sequences.

Decode rows are one int32 array [rows, 4 + W]: token, position, KV slot, context length, then the
row's block table (W columns). One host-to-device copy moves it all; `decode_meta` cuts the
device copy into the model's inputs (inside a captured graph, the same cuts of a static buffer).
"""

from __future__ import annotations

import numpy as np
import torch

from .attention import DecodeMeta, PrefillMeta
from .kv_cache import slots_of
from .sequence import Seq

META_COLS = 4   # token, position, slot, context length; the block table follows


def decode_width(seqs: list[Seq]) -> int:
    return max(len(s.blocks) for s in seqs)


def fill_decode_rows(seqs: list[Seq], block_size: int, out: np.ndarray) -> None:
    """Write each sequence's row: it feeds its last token at position `context` and writes that
    token's KV there (the scheduler reserved the block)."""
    n = len(seqs)
    pos = [s.context for s in seqs]
    out[:n, 0] = [s.tokens[-1] for s in seqs]
    out[:n, 1] = pos
    out[:n, 2] = [s.blocks[p // block_size] * block_size + p % block_size for s, p in zip(seqs, pos)]
    out[:n, 3] = [p + 1 for p in pos]
    for i, s in enumerate(seqs):
        out[i, META_COLS:META_COLS + len(s.blocks)] = s.blocks


def decode_meta(rows: torch.Tensor, block_size: int, group: int, *, splits: int = 1,
                triton: bool = False) -> tuple[torch.Tensor, torch.Tensor, DecodeMeta]:
    """(token ids, positions, DecodeMeta) from the device copy of the decode rows."""
    meta = DecodeMeta(slots=rows[:, 2].long(), block_tables=rows[:, META_COLS:],
                      context_lens=rows[:, 3].contiguous(), block_size=block_size, group=group,
                      splits=splits, triton=triton)
    return rows[:, 0], rows[:, 1], meta


def prefill_inputs(chunks: list[tuple[Seq, int, int]], block_size: int, group: int, device: torch.device,
                   triton: bool) -> tuple[torch.Tensor, torch.Tensor, DecodeMeta | PrefillMeta]:
    """Pack the chunks' tokens into one row; the token at position p of a sequence attends to that
    sequence's keys 0..p."""
    width = max(end - start for _, start, end in chunks)
    flat = np.concatenate([np.stack([np.asarray(seq.tokens[start:end]), np.arange(start, end),
                                     slots_of(seq.blocks, start, end, block_size),
                                     i * width + np.arange(end - start)])
                           for i, (seq, start, end) in enumerate(chunks)], axis=1)
    on_device = torch.from_numpy(flat).to(device)
    ids, positions, slots = on_device[0], on_device[1], on_device[2]
    if triton:   # a row per token, its seq's block table
        blocks = max(len(seq.blocks) for seq, _, _ in chunks)
        tables = np.zeros((len(chunks), blocks), dtype=np.int32)
        for i, (seq, _, _) in enumerate(chunks):
            tables[i, :len(seq.blocks)] = seq.blocks
        rows = np.repeat(tables, [end - start for _, start, end in chunks], axis=0)
        meta = DecodeMeta(slots=slots, block_tables=torch.from_numpy(rows).to(device),
                          context_lens=(positions + 1).int(), block_size=block_size, group=group, triton=True)
        return ids, positions, meta
    keys = max(end for _, _, end in chunks)
    gather = np.zeros((len(chunks), keys), dtype=np.int64)
    for i, (seq, _, end) in enumerate(chunks):
        gather[i, :end] = slots_of(seq.blocks, 0, end, block_size)
    bounds = torch.tensor([[start, end] for _, start, end in chunks], device=device)
    query = torch.arange(width, device=device)[None, :, None] + bounds[:, 0, None, None]
    key = torch.arange(keys, device=device)[None, None, :]
    mask = (key <= query) & (key < bounds[:, 1, None, None])
    meta = PrefillMeta(slots=slots, gather=torch.from_numpy(gather).to(device), unpack=on_device[3],
                       mask=mask[:, None], q_width=width, group=group)
    return ids, positions, meta
