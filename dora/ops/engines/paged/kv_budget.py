"""How many KV blocks the engine may hold: what it can use, within its memory budget.

Need: max_batch requests of max_seq_len tokens, plus NEED_HEADROOM (25%) for what holds blocks
without a decode slot (parked multi-turn KV, the prefix cache). A pool is never larger than that:
a small model at 90% of an H200 would otherwise take ~125 GB of KV it cannot use.
- `kv_cache_gb` given: that many GiB of KV, on any device (taken as given, need or not).
- CUDA, not given: the smaller of the need and `memory_fraction` of the device's total memory (the
  replica's declared memory share when it shares the device, dora/graph/device_shares.py; else 0.9),
  less what this process holds (the weights), room for the further weight copies of the versions it
  may host at once (`weight_copies` - 1), and the measured workspace (runner.workspace_bytes:
  activations of the largest prefill chunk and of the decode batch), and never more than is free
  now (another process, e.g. a trainer, may hold the rest).
- CPU, not given: the need (allocated as used: the tensor starts small and doubles); with a
  declared share, also at most that share of the host's memory less the weights (`weight_copies`
  of them) and the workspace.
- Always: at most what keeps one layer's K view below 2^31 elements.
A budget that cannot hold one request of max_seq_len tokens is refused at start-up, with the numbers.
"""

from __future__ import annotations

import math
import os

import torch

from .kv_cache import bytes_per_block
from .model_spec import ModelSpec

GiB = 2 ** 30
CUDA_FRACTION = 0.9   # of a device no one else declared a share of: room for the CUDA context and other processes
# Past the worst case of the running batch (max_batch requests at max_seq_len), room for what holds
# blocks without a decode slot: parked multi-turn KV, and a prefix cache that outlives its requests.
NEED_HEADROOM = 0.25
MAX_VIEW_ELEMENTS = 2 ** 31 - 1   # one layer's K view stays indexable by int32 (kernels, index ops)


def share_bytes(*, total: int, fraction: float, held: int, workspace: int, free: int | None = None) -> int:
    """KV bytes a replica may hold: `fraction` of the device's `total` memory, less what it holds
    already (`held`: its weights) and its `workspace`, and never more than is `free` now."""
    budget = int(total * fraction) - held
    if free is not None:
        budget = min(budget, free)
    return budget - workspace


def host_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def need_blocks(*, max_batch: int, max_seq_len: int, block_size: int) -> int:
    """What the engine can use: max_batch requests of max_seq_len tokens, plus NEED_HEADROOM."""
    per_request = -(-max_seq_len // block_size)
    return math.ceil(max_batch * per_request * (1 + NEED_HEADROOM))


def view_cap_blocks(spec: ModelSpec, block_size: int) -> int:
    """The most blocks one layer's K (or V) view [slots, kv_heads, head_dim] holds below 2^31 elements."""
    return MAX_VIEW_ELEMENTS // (block_size * spec.kv_heads * spec.head_dim)


def cuda_memory(device: torch.device) -> tuple[int, int, int]:
    """(free, total, allocated by this process) bytes of a CUDA device."""
    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total), int(torch.cuda.memory_allocated(device))


def budget_blocks(spec: ModelSpec, *, block_size: int, dtype: torch.dtype, device: torch.device, max_batch: int,
                  max_seq_len: int, kv_cache_gb: float | None, memory_fraction: float | None, workspace: int,
                  weight_bytes: int = 0, weight_copies: int = 1) -> int:
    """Usable blocks (the reserved trash block not included); ValueError with the numbers when too few.
    `memory_fraction`: the replica's share of its device (None: CUDA_FRACTION on CUDA, no cap on CPU);
    `weight_bytes`: what one copy of the engine's weights holds (on CUDA the allocator says what is
    held now); `weight_copies`: the versions hosted at once (each a copy of the weights)."""
    per_block = bytes_per_block(spec, block_size, dtype)
    per_request = -(-max_seq_len // block_size)
    if memory_fraction is not None and not 0 < memory_fraction <= 1:
        raise ValueError(f"torch engine: memory_fraction must be in (0, 1], got {memory_fraction}")
    if kv_cache_gb is not None and kv_cache_gb <= 0:
        raise ValueError(f"torch engine: kv_cache_gb must be > 0, got {kv_cache_gb}")
    need = need_blocks(max_batch=max_batch, max_seq_len=max_seq_len, block_size=block_size)
    if kv_cache_gb is not None:
        blocks, source = int(kv_cache_gb * GiB) // per_block, f"kv_cache_gb={kv_cache_gb}"
    elif device.type == "cuda" or memory_fraction is not None:
        budget, source = _share(device, memory_fraction, weight_bytes, weight_copies, workspace)
        blocks = min(max(0, budget) // per_block, need)
    else:
        blocks = need
    if blocks < per_request:
        raise ValueError(f"torch engine: the KV budget ({source}) holds {blocks * block_size} tokens "
                         f"({per_block} bytes per block of {block_size}); one request of max_seq_len={max_seq_len} "
                         f"tokens needs {per_request * block_size}. Raise kv_cache_gb or the memory share, "
                         "or lower max_seq_len")
    return int(min(blocks, view_cap_blocks(spec, block_size)))


def _share(device: torch.device, memory_fraction: float | None, weight_bytes: int, weight_copies: int,
           workspace: int) -> tuple[int, str]:
    """KV bytes of the replica's memory share, and how they were reckoned (for the error)."""
    more_weights = (weight_copies - 1) * weight_bytes
    if device.type == "cuda":
        fraction = CUDA_FRACTION if memory_fraction is None else memory_fraction
        free, total, allocated = cuda_memory(device)
        held = allocated + more_weights
        budget = share_bytes(total=total, fraction=fraction, held=held, workspace=workspace, free=free - more_weights)
        return budget, (f"{'memory share ' if memory_fraction is not None else ''}{fraction:.2f} of {total / GiB:.1f} "
                        f"GiB, less {held / GiB:.2f} GiB held or kept for {weight_copies} weight copies and "
                        f"{workspace / GiB:.2f} GiB workspace ({free / GiB:.1f} GiB free)")
    total = host_memory()
    budget = share_bytes(total=total, fraction=memory_fraction, held=weight_bytes + more_weights, workspace=workspace)
    return budget, (f"memory share {memory_fraction:.2f} of the host's {total / GiB:.1f} GiB, less "
                    f"{(weight_bytes + more_weights) / GiB:.2f} GiB of weights ({weight_copies} copies) and "
                    f"{workspace / GiB:.2f} GiB workspace")


CPU_START_BLOCKS = 64   # the CPU tensor doubles from here as requests need more (the start only saves a few copies)


def initial_blocks(device: torch.device, budget: int) -> int:
    """Blocks to allocate now: all of them on CUDA (graphs hold the tensor's address); on CPU a few,
    the tensor growing as requests need more."""
    if device.type == "cuda":
        return budget
    return min(budget, CPU_START_BLOCKS)
