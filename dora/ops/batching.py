"""Arrow list columns <-> padded tensors, and micro-batching by token budget (row helpers that need
no torch: dora/ops/arrow_rows.py).

Sequence layout for a forward pass over prompt + response (collate): prompts are LEFT-padded
to the batch's longest prompt and responses RIGHT-padded to its longest response, so every
response starts at the same column P and per-token tensors [B, T] line up with the Arrow list
columns (response_ids, behavior_logprobs, advantages, ...) index for index. position_ids are
explicit (count of real tokens before each position), so left padding does not shift positions:
a row's logprobs equal those of the same row run alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import pyarrow as pa
import torch



def pad_lists(rows: Sequence[Sequence[float]], width: int | None = None, dtype=torch.float32, pad=0) -> torch.Tensor:
    """[B, width] tensor, row i = rows[i] then pad (width defaults to the longest row)."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    out = torch.full((len(rows), width), pad, dtype=dtype)
    for i, r in enumerate(rows):
        if len(r):
            out[i, : len(r)] = torch.as_tensor(list(r)[:width], dtype=dtype)
    return out


def response_mask(lengths: Sequence[int], width: int | None = None) -> torch.Tensor:
    width = max(lengths, default=0) if width is None else width
    return (torch.arange(width)[None, :] < torch.as_tensor(list(lengths))[:, None]).to(torch.float32)


def unpad(x: torch.Tensor, lengths: Sequence[int]) -> list[list[float]]:
    """Row i's first lengths[i] values, as Python lists (for an Arrow list column)."""
    x = x.detach().to("cpu", torch.float32)
    return [x[i, :n].tolist() for i, n in enumerate(lengths)]


@dataclasses.dataclass
class PolicyBatch:
    input_ids: torch.Tensor       # [B, P + T]
    attention_mask: torch.Tensor  # [B, P + T]
    position_ids: torch.Tensor    # [B, P + T]
    response_ids: torch.Tensor    # [B, T]
    response_mask: torch.Tensor   # [B, T] float, 1 on real response tokens
    prompt_width: int             # P: responses start at this column

    def to(self, device: str) -> "PolicyBatch":
        return PolicyBatch(**{f.name: (getattr(self, f.name).to(device) if f.name != "prompt_width" else self.prompt_width)
                              for f in dataclasses.fields(self)})


def collate(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], pad_id: int = 0) -> PolicyBatch:
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("collate: every row needs at least one prompt token (the first response token is predicted from it)")
    P = max(len(p) for p in prompt_ids)
    T = max((len(r) for r in response_ids), default=0)
    B = len(prompt_ids)
    ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    att = torch.zeros((B, P + T), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        ids[i, P - len(p): P] = torch.as_tensor(list(p), dtype=torch.long)
        att[i, P - len(p): P] = 1
        if len(r):
            ids[i, P: P + len(r)] = torch.as_tensor(list(r), dtype=torch.long)
            att[i, P: P + len(r)] = 1
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    lengths = [len(r) for r in response_ids]
    return PolicyBatch(ids, att, pos, ids[:, P:].clone(), response_mask(lengths, T), P)


def micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Split row indices into micro-batches whose padded size (rows x longest row) fits `budget` tokens.

    Rows are sorted by length (longest first) so rows of similar length share a micro-batch and
    padding stays small. A row longer than the budget gets a micro-batch of its own.
    """
    if budget <= 0:
        raise ValueError(f"micro_batch_tokens must be positive, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        L = max(1, lengths[i])
        if cur and (len(cur) + 1) * max(longest, L) > budget:
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, L)
    if cur:
        out.append(cur)
    return out
