"""The running batch's KV cache: one left-padded DynamicCache shared by all running requests.

Row i holds request i's KV for all of its tokens but the last (that one is fed in the next
decode step). Rows have different real lengths, so the cache is left-padded and `mask` marks the
real positions. Requests join by concatenating along the batch dim (padding the shorter side
on the left) and leave by index-selecting the remaining rows; padding columns that no row
uses any more are trimmed, so the cache stays as long as its longest request.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class SlabLayer(DynamicLayer):
    """A DynamicLayer that appends into a preallocated slab instead of torch.cat-ing the whole
    cache every decode step (the dominant copy at small model sizes). keys/values are views of
    the first n slots."""

    HEADROOM = 64   # slots added when the slab is full (amortises the copy to once per 64 steps)

    def set(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        b, h, n, d = keys.shape
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.slab_k = keys.new_zeros(b, h, n + self.HEADROOM, d)
        self.slab_v = values.new_zeros(b, h, n + self.HEADROOM, d)
        self.slab_k[:, :, :n] = keys
        self.slab_v[:, :, :n] = values
        self.n = n
        self.keys, self.values = self.slab_k[:, :, :n], self.slab_v[:, :, :n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.set(key_states, value_states)
            return self.keys, self.values
        new = key_states.shape[-2]
        if self.n + new > self.slab_k.shape[2]:
            self.set(self.keys, self.values)
        self.slab_k[:, :, self.n:self.n + new] = key_states
        self.slab_v[:, :, self.n:self.n + new] = value_states
        self.n += new
        self.keys, self.values = self.slab_k[:, :, :self.n], self.slab_v[:, :, :self.n]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.n if self.is_initialized else 0


def _slab_cache(keys: list[torch.Tensor], values: list[torch.Tensor]) -> DynamicCache:
    cache = DynamicCache()
    cache.layers = []
    for k, v in zip(keys, values):
        layer = SlabLayer()
        layer.set(k, v)
        cache.layers.append(layer)
    return cache


class BatchKV:
    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor):
        # keys/values: per layer [B, H, L, D]; mask: [B, L] bool (True = real token)
        self.cache = _slab_cache(keys, values)
        self._set_mask(mask)

    def _set_mask(self, mask: torch.Tensor) -> None:
        self.mask = mask
        self._lengths: torch.Tensor | None = None   # cached per-row real lengths
        self._padded: bool | None = None            # cached "some row is left-padded"

    # ------------------------------------------------------------ views
    @property
    def layers(self):
        return self.cache.layers

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])

    def lengths(self) -> torch.Tensor:
        if self._lengths is None:
            self._lengths = self.mask.sum(dim=1)
        return self._lengths

    def attention_mask(self) -> torch.Tensor | None:
        """The 2-D mask for the model, or None when no row is padded (the model then skips masking)."""
        if self._padded is None:
            self._padded = not bool(self.mask.all())
        return self.mask.long() if self._padded else None

    # ------------------------------------------------------------ construction
    @staticmethod
    def from_rows(rows: list[list[tuple[torch.Tensor, torch.Tensor]]], n_layers: int, heads: int,
                  head_dim: int, dtype: torch.dtype, device: torch.device) -> "BatchKV":
        """Left-pad per-request KV (per layer (k, v) each [H, len, D]) into one batch."""
        lens = [0 if not r else int(r[0][0].shape[-2]) for r in rows]
        width = max(lens, default=0)
        mask = torch.zeros(len(rows), width, dtype=torch.bool, device=device)
        keys, values = [], []
        for layer in range(n_layers):
            k = torch.zeros(len(rows), heads, width, head_dim, dtype=dtype, device=device)
            v = torch.zeros_like(k)
            for i, r in enumerate(rows):
                if lens[i]:
                    k[i, :, width - lens[i]:] = r[layer][0].to(device=device, dtype=dtype)
                    v[i, :, width - lens[i]:] = r[layer][1].to(device=device, dtype=dtype)
            keys.append(k)
            values.append(v)
        for i, n in enumerate(lens):
            mask[i, width - n:] = n > 0
        return BatchKV(keys, values, mask)

    @staticmethod
    def from_cache(cache: DynamicCache, mask: torch.Tensor) -> "BatchKV":
        """Adopt a cache just filled by a left-padded prefill; zero the padded slots so that
        garbage (even NaN from fully masked pad rows) can never leak through a 0 attention weight."""
        b = BatchKV.__new__(BatchKV)
        keep = mask[:, None, :, None]
        b.cache = _slab_cache([torch.where(keep, layer.keys, 0.0) for layer in cache.layers],
                              [torch.where(keep, layer.values, 0.0) for layer in cache.layers])
        b._set_mask(mask)
        return b

    # ------------------------------------------------------------ mutation
    def grew_one(self) -> None:
        """The model appended one real token to every row."""
        lengths, padded = self._lengths, self._padded
        self._set_mask(torch.cat([self.mask, torch.ones(self.rows, 1, dtype=torch.bool, device=self.mask.device)], dim=1))
        self._lengths = None if lengths is None else lengths + 1
        self._padded = padded

    def keep_rows(self, idx: list[int]) -> None:
        sel = torch.tensor(idx, dtype=torch.long, device=self.mask.device)
        self._set_mask(self.mask.index_select(0, sel))
        drop = self._unused_prefix()
        for layer in self.layers:
            layer.set(layer.keys.index_select(0, sel)[:, :, drop:], layer.values.index_select(0, sel)[:, :, drop:])
        self._set_mask(self.mask[:, drop:])

    def extend(self, other: "BatchKV") -> None:
        """Append other's rows after ours."""
        w = max(self.width, other.width)
        a_pad, b_pad = w - self.width, w - other.width
        for la, lb in zip(self.layers, other.layers):
            la.set(torch.cat([_lpad(la.keys, a_pad), _lpad(lb.keys, b_pad)], dim=0),
                   torch.cat([_lpad(la.values, a_pad), _lpad(lb.values, b_pad)], dim=0))
        self._set_mask(torch.cat([_lpad_mask(self.mask, a_pad), _lpad_mask(other.mask, b_pad)], dim=0))

    def row_kv(self, i: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row i's real KV, per layer (k, v) each [H, len, D] (copies)."""
        n = int(self.mask[i].sum())
        return [(layer.keys[i, :, self.width - n:].clone(), layer.values[i, :, self.width - n:].clone())
                for layer in self.layers]

    def _unused_prefix(self) -> int:
        if self.rows == 0:
            return self.width
        used = self.mask.any(dim=0)
        return int(used.float().argmax()) if bool(used.any()) else self.width


def _lpad(t: torch.Tensor, n: int) -> torch.Tensor:
    if n == 0:
        return t
    return torch.cat([t.new_zeros(t.shape[0], t.shape[1], n, t.shape[3]), t], dim=2)


def _lpad_mask(m: torch.Tensor, n: int) -> torch.Tensor:
    if n == 0:
        return m
    return torch.cat([m.new_zeros(m.shape[0], n), m], dim=1)
