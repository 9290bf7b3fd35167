"""How many KV blocks the engine may hold: its memory budget, declared or derived.

- `kv_cache_gb` given: that many GiB of KV, on any device.
- CUDA, not given: `memory_fraction` of the device's total memory, less what this process holds
  (the weights) and the measured workspace (activations of the largest prefill chunk and decode
  batch), and never more than is free now (another process, e.g. a trainer, may hold the rest).
- CPU, not given: enough for max_batch requests of max_seq_len tokens (allocated as used: the
  tensor starts small and doubles).
A budget that cannot hold one request of max_seq_len tokens is refused at start-up.
"""

from __future__ import annotations

import torch

from .kv_cache import bytes_per_block
from .model_spec import ModelSpec

GiB = 2 ** 30


def budget_blocks(spec: ModelSpec, *, block_size: int, dtype: torch.dtype, device: torch.device, max_batch: int,
                  max_seq_len: int, kv_cache_gb: float | None, memory_fraction: float, workspace: int) -> int:
    """Usable blocks (the reserved trash block not included); ValueError with the numbers when too few."""
    per_block = bytes_per_block(spec, block_size, dtype)
    per_request = -(-max_seq_len // block_size)
    if kv_cache_gb is not None:
        if kv_cache_gb <= 0:
            raise ValueError(f"torch engine: kv_cache_gb must be > 0, got {kv_cache_gb}")
        budget, source = int(kv_cache_gb * GiB), f"kv_cache_gb={kv_cache_gb}"
    elif device.type == "cuda":
        if not 0 < memory_fraction <= 1:
            raise ValueError(f"torch engine: memory_fraction must be in (0, 1], got {memory_fraction}")
        free, total = torch.cuda.mem_get_info(device)
        held = torch.cuda.memory_allocated(device)
        budget = min(int(total * memory_fraction) - held, free) - workspace
        source = (f"{memory_fraction:.2f} of {total / GiB:.1f} GiB, less {held / GiB:.2f} GiB held and "
                  f"{workspace / GiB:.2f} GiB workspace ({free / GiB:.1f} GiB free)")
    else:
        return max_batch * per_request
    blocks = max(0, budget) // per_block
    if blocks < per_request:
        raise ValueError(f"torch engine: the KV budget ({source}) holds {blocks * block_size} tokens "
                         f"({per_block} bytes per block of {block_size}); one request of max_seq_len={max_seq_len} "
                         f"tokens needs {per_request * block_size}. Raise kv_cache_gb or lower max_seq_len")
    return int(blocks)


CPU_START_BLOCKS = 64   # the CPU tensor doubles from here as requests need more (the start only saves a few copies)


def initial_blocks(device: torch.device, budget: int) -> int:
    """Blocks to allocate now: all of them on CUDA (graphs hold the tensor's address); on CPU a few,
    the tensor growing as requests need more."""
    if device.type == "cuda":
        return budget
    return min(budget, CPU_START_BLOCKS)
