"""What the torch engine checks of a request before taking it: a new uid, prompt ids in the
vocabulary, a length that fits the context (refused, never truncated), and imported KV of the
model's shape covering at most the tokens before the last."""

from __future__ import annotations

from ..engine import SequenceState
from .model_spec import ModelSpec


def check_request(uid: str, prompt: list[int], more: int, *, in_flight: bool, vocab: int, max_seq_len: int) -> None:
    """`more`: the positions needed past the prompt (one to generate; for an import, its response)."""
    if in_flight:
        raise ValueError(f"torch engine: request uid {uid!r} is already in flight")
    if len(prompt) + more > max_seq_len:
        raise ValueError(f"torch engine: request {uid!r} needs {len(prompt) + more} positions; "
                         f"max_seq_len is {max_seq_len} (refused, not truncated)")
    if min(prompt) < 0 or max(prompt) >= vocab:
        raise ValueError(f"torch engine: request {uid!r} has token ids outside the vocabulary [0, {vocab})")


def check_kv(st: SequenceState, spec: ModelSpec) -> None:
    uid, n_tokens = st.request.uid, len(st.request.prompt_ids) + len(st.response_ids)
    if len(st.kv) != spec.layers:
        raise ValueError(f"torch engine: KV of {uid!r} has {len(st.kv)} layers, model has {spec.layers}")
    for k, v in st.kv:
        ok = k.dim() == 3 and k.shape[0] == spec.kv_heads and k.shape[2] == spec.head_dim
        if not ok or k.shape != v.shape or k.shape[1] != st.kv_len or st.kv_len > n_tokens - 1:
            raise ValueError(f"torch engine: KV of {uid!r} has shape {tuple(k.shape)}, expected ({spec.kv_heads}, "
                             f"n <= {n_tokens - 1}, {spec.head_dim}) (kv heads, tokens but the last, head dim)")
