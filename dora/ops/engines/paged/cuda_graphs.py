"""CUDA graphs of the decode step: one per batch size of a ladder (1, 2, 4, 8, 16, 32, then every 16
rows up to max_batch, as nano-vLLM: 129 running requests replay the 144-row graph, not a 256-row one).

A decode step of n rows copies its rows into a static input buffer (one host-to-device copy),
pads them to the next captured size with rows that write their KV into the trash block and
attend to nothing, and replays that size's graph: one launch instead of one per kernel. The
logits land in a static output buffer. Graphs of every size (and of every weight slot) share one
memory pool, as only one replays at a time. Capture follows PyTorch's recipe: warm-up runs on a
side stream (which also compiles the Triton kernel), then capture into the shared pool.
The graphs hold the addresses of the weights, the KV tensor and these buffers: weights are
loaded in place, a sleep that keeps the graphs keeps all of these (torch_engine.py `sleep`), and a
full sleep drops the graphs with the memory they point to.

`capture(run, pool) -> replay` makes one graph: `capture_cuda` on CUDA. `run_eagerly` is the CPU
stand-in the tests use: its "replay" runs the step again, so the ladder, the static buffers, the
padding and the capture counter run without a GPU (only a GPU shows that the captured graph itself
replays right: tests/test_engine_gpu.py).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .step_inputs import META_COLS

WARMUP_RUNS = 2
POWERS_UP_TO = 32    # the ladder doubles up to here, then climbs in steps of STEP_ROWS
STEP_ROWS = 16


def ladder(max_batch: int) -> list[int]:
    """Captured batch sizes: 1, 2, 4, ... POWERS_UP_TO, then every STEP_ROWS rows, and max_batch."""
    powers = [s for s in (2 ** i for i in range(POWERS_UP_TO.bit_length())) if s < max_batch]
    return powers + list(range(POWERS_UP_TO + STEP_ROWS, max_batch, STEP_ROWS)) + [max_batch]


def capture_cuda(run: Callable[[], None], pool) -> Callable[[], None]:
    """One CUDA graph of `run` (PyTorch's recipe: warm-up runs on a side stream, which also compile
    the Triton kernel, then capture into the shared pool); returns its replay."""
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
    return graph.replay


def run_eagerly(run: Callable[[], None], pool) -> Callable[[], None]:
    """The CPU stand-in for capture_cuda (tests): each replay runs the step."""
    return run


class DecodeGraphs:
    def __init__(self, step: Callable[[torch.Tensor, int], torch.Tensor], *, max_batch: int, width: int,
                 vocab: int, dtype: torch.dtype, device: torch.device, pool, splits_for: Callable[[int], int],
                 capture: Callable = capture_cuda):
        """step(rows, splits) -> logits: the decode forward on the device rows [n, META_COLS + width]."""
        self.sizes = ladder(max_batch)
        pinned = torch.device(device).type == "cuda"
        self.rows = torch.zeros(max_batch, META_COLS + width, dtype=torch.int32, device=device)
        self.staging = torch.zeros(max_batch, META_COLS + width, dtype=torch.int32, pin_memory=pinned)
        self.host: np.ndarray = self.staging.numpy()    # the caller fills host[:n] (batch.fill_decode_rows)
        self.logits = torch.empty(max_batch, vocab, dtype=dtype, device=device)
        self.graphs: dict[int, Callable[[], None]] = {}
        for size in reversed(self.sizes):                # the largest first: the pool is sized once
            self.graphs[size] = capture(self._runner(step, size, splits_for(size)), pool)

    def _runner(self, step, size: int, splits: int) -> Callable[[], None]:
        def run():
            self.logits[:size].copy_(step(self.rows[:size], splits))
        return run

    def replay(self, n: int) -> torch.Tensor:
        """Run the decode of host[:n]; returns logits[:n] (valid until the next replay)."""
        size = next(s for s in self.sizes if s >= n)
        self.host[n:size, :META_COLS] = 0     # padding: token 0 at position 0, KV to slot 0 (trash), no context
        self.rows[:size].copy_(self.staging[:size], non_blocking=True)
        self.graphs[size]()
        return self.logits[:n]
