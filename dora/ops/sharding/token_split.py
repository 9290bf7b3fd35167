"""A training batch split across the ranks of a sharded op by tokens.

Rows stay whole (a trajectory's tokens are on one rank). Rows go longest first to the rank with
the fewest tokens so far (LPT), so every rank does about the same work; each rank keeps its rows
in batch order. Every rank must run the same number of forward/backward passes (FSDP gathers
parameters in each one), so the micro-batch count is the largest over the ranks and a rank with
fewer passes pads with empty ones (zero loss, zero gradient).
"""

from __future__ import annotations

import heapq
from typing import Sequence

from dora.ops.batching import micro_batches


def split_by_tokens(tokens: Sequence[int], ranks: int) -> list[list[int]]:
    """Row indices per rank, balanced by token count; deterministic."""
    if ranks < 1:
        raise ValueError(f"split_by_tokens: ranks must be >= 1, got {ranks}")
    heap = [(0, r) for r in range(ranks)]
    out: list[list[int]] = [[] for _ in range(ranks)]
    for i in sorted(range(len(tokens)), key=lambda i: (-tokens[i], i)):
        load, r = heapq.heappop(heap)
        out[r].append(i)
        heapq.heappush(heap, (load + max(1, int(tokens[i])), r))
    return [sorted(rows) for rows in out]


def micro_batch_count(tokens: Sequence[int], shards: list[list[int]], budget: int) -> int:
    """The passes every rank runs: the most micro-batches any rank's rows need (at least 1)."""
    return max([1] + [len(micro_batches([tokens[i] for i in rows], budget)) for rows in shards if rows])
