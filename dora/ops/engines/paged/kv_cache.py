"""The KV tensor behind the block pool, and how many blocks a memory budget buys.

One tensor [2, layers, blocks * block_size, kv_heads, head_dim] holds every layer's keys and
values; a layer's keys are the view [slots, kv_heads, head_dim]. It is zero-filled, so a slot
nobody wrote holds finite numbers (a masked attention weight of 0 times them is 0, never NaN).
On CUDA the tensor is allocated once at its full budget (captured graphs hold its address); on
CPU it starts small and doubles up to the budget as requests need it, so a large nominal budget
costs no memory until used.
"""

from __future__ import annotations

import numpy as np
import torch

from .model_spec import ModelSpec


def slots_of(blocks: list[int], start: int, end: int, block_size: int) -> np.ndarray:
    """The cache slots of token positions start..end-1 of a request holding these blocks."""
    pos = np.arange(start, end)
    return np.asarray(blocks, dtype=np.int64)[pos // block_size] * block_size + pos % block_size


def bytes_per_block(spec: ModelSpec, block_size: int, dtype: torch.dtype) -> int:
    return 2 * spec.layers * block_size * spec.kv_heads * spec.head_dim * torch.empty((), dtype=dtype).element_size()


class KVCache:
    def __init__(self, spec: ModelSpec, block_size: int, num_blocks: int, dtype: torch.dtype, device: torch.device):
        self.spec, self.block_size, self.dtype, self.device = spec, block_size, dtype, torch.device(device)
        self.data: torch.Tensor | None = None
        self.allocate(num_blocks)

    @property
    def num_blocks(self) -> int:
        return 0 if self.data is None else self.data.shape[2] // self.block_size

    @property
    def nbytes(self) -> int:
        return 0 if self.data is None else self.data.numel() * self.data.element_size()

    def allocate(self, num_blocks: int) -> None:
        s = self.spec
        self.data = torch.zeros(2, s.layers, num_blocks * self.block_size, s.kv_heads, s.head_dim,
                                dtype=self.dtype, device=self.device)
        self.layers = [(self.data[0, i], self.data[1, i]) for i in range(s.layers)]

    def release(self) -> int:
        freed = self.nbytes
        self.data, self.layers = None, []
        return freed

    def grow(self, num_blocks: int) -> None:
        """A larger tensor holding the same blocks (CPU only: graphs would lose the old address)."""
        old = self.data
        self.allocate(num_blocks)
        self.data[:, :, :old.shape[2]] = old

    def copy_slots(self, src: int, dst: int, n: int) -> None:
        """Block dst's first n slots take block src's (every layer's K and V; one device copy)."""
        bs = self.block_size
        self.data[:, :, dst * bs:dst * bs + n] = self.data[:, :, src * bs:src * bs + n]

    # ------------------------------------------------------------ one request's KV in and out
    def read(self, blocks: list[int], n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first n tokens' KV, per layer (k, v) each [kv_heads, n, head_dim] on the CPU."""
        idx = torch.from_numpy(slots_of(blocks, 0, n, self.block_size)).to(self.device)
        both = self.data.index_select(2, idx).to("cpu")           # [2, layers, n, kv_heads, D]
        return [(both[0, i].transpose(0, 1).contiguous(), both[1, i].transpose(0, 1).contiguous())
                for i in range(self.spec.layers)]

    def write(self, blocks: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
        """Write per-layer (k, v) [kv_heads, n, head_dim] as the first n tokens of blocks; returns n."""
        n = int(kv[0][0].shape[-2]) if kv else 0
        if n == 0:
            return 0
        idx = torch.from_numpy(slots_of(blocks, 0, n, self.block_size)).to(self.device)
        k = torch.stack([layer[0] for layer in kv]).transpose(1, 2)   # [layers, n, kv_heads, D]
        v = torch.stack([layer[1] for layer in kv]).transpose(1, 2)
        both = torch.stack([k, v]).to(device=self.device, dtype=self.dtype)
        self.data.index_copy_(2, idx, both)
        return n
