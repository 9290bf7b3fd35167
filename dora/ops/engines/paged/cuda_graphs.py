"""CUDA graphs of the decode step: one per batch size of a ladder (1, 2, 4, ... max_batch).

A decode step of n rows copies its rows into a static input buffer (one host-to-device copy),
pads them to the next captured size with rows that write their KV into the trash block and
attend to nothing, and replays that size's graph: one launch instead of one per kernel. The
logits land in a static output buffer. Graphs of every size (and of every weight slot) share one
memory pool, as only one replays at a time. Capture follows PyTorch's recipe: warm-up runs on a
side stream (which also compiles the Triton kernel), then capture into the shared pool.
The graphs hold the addresses of the weights, the KV tensor and these buffers: weights are
loaded in place, and sleep() drops the graphs with the memory they point to.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .step_inputs import META_COLS

WARMUP_RUNS = 2


def ladder(max_batch: int) -> list[int]:
    sizes, s = [], 1
    while s < max_batch:
        sizes.append(s)
        s *= 2
    return sizes + [max_batch]


class DecodeGraphs:
    def __init__(self, step: Callable[[torch.Tensor, int], torch.Tensor], *, max_batch: int, width: int,
                 vocab: int, dtype: torch.dtype, device: torch.device, pool, splits_for: Callable[[int], int]):
        """step(rows, splits) -> logits: the decode forward on the device rows [n, META_COLS + width]."""
        self.sizes = ladder(max_batch)
        self.rows = torch.zeros(max_batch, META_COLS + width, dtype=torch.int32, device=device)
        self.staging = torch.zeros(max_batch, META_COLS + width, dtype=torch.int32, pin_memory=True)
        self.host: np.ndarray = self.staging.numpy()    # the caller fills host[:n] (batch.fill_decode_rows)
        self.logits = torch.empty(max_batch, vocab, dtype=dtype, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        for size in reversed(self.sizes):                # the largest first: the pool is sized once
            self.graphs[size] = self._capture(step, size, splits_for(size), pool)

    def _capture(self, step, size: int, splits: int, pool) -> torch.cuda.CUDAGraph:
        def run():
            self.logits[:size].copy_(step(self.rows[:size], splits))

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            run()
        torch.cuda.synchronize()
        return graph

    def replay(self, n: int) -> torch.Tensor:
        """Run the decode of host[:n]; returns logits[:n] (valid until the next replay)."""
        size = next(s for s in self.sizes if s >= n)
        self.host[n:size, :META_COLS] = 0     # padding: token 0 at position 0, KV to slot 0 (trash), no context
        self.rows[:size].copy_(self.staging[:size], non_blocking=True)
        self.graphs[size].replay()
        return self.logits[:n]
