"""One request inside the paged engine: its tokens, what it sampled, and where its KV lives.

Invariant: KV is computed for tokens[:computed] and written in `blocks` (token i at block
blocks[i // block_size], offset i % block_size). A decoding sequence has computed ==
len(tokens) - 1: its last token is fed to the next decode step, which writes that token's KV and
samples the next one. Prefill brings computed up to len(tokens) - 1 (the "context").
"""

from __future__ import annotations

import dataclasses

import torch

from ..engine import Completion, SamplingRequest, SequenceState


@dataclasses.dataclass(eq=False)
class Seq:
    req: SamplingRequest
    stops: frozenset[int]
    response: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list)   # prompt + response
    slot: int = 0                 # the weight slot (version) that computes this request
    blocks: list[int] = dataclasses.field(default_factory=list)
    hashes: list[int] = dataclasses.field(default_factory=list)   # chained hashes of its full blocks, in order
    sealed: int = 0               # leading blocks known computed to the prefix cache
    computed: int = 0
    pending_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None   # imported KV, written at admission
    adopt: "Seq | None" = None    # the parked request whose blocks this continuation takes over
    reprefill: bool = False       # its context is computed again (imported without usable KV)
    lost_parked: bool = False     # a continuation whose parked KV was gone: its context is computed again
    kv_version: int | None = None  # the version that computed its KV (parked requests)

    def __post_init__(self):
        if not self.tokens:
            self.tokens = list(self.req.prompt_ids) + list(self.response)

    @property
    def uid(self) -> str:
        return self.req.uid

    @property
    def context(self) -> int:
        """Tokens whose KV must exist before the next decode step."""
        return len(self.tokens) - 1

    def blocks_needed(self, block_size: int) -> int:
        """Blocks covering every token, the last included (its KV is written by the next decode)."""
        return -(-len(self.tokens) // block_size)

    def finish_reason(self, max_seq_len: int) -> str | None:
        if self.response and self.response[-1] in self.stops:
            return "stop"
        if len(self.response) >= self.req.max_tokens or len(self.tokens) >= max_seq_len:
            return "length"
        return None

    def completion(self, reason: str) -> Completion:
        return Completion(self.uid, list(self.req.prompt_ids), list(self.response), list(self.logprobs),
                          list(self.versions), self.req.version, reason, self.req.meta)

    def state(self, kv, kv_version: int | None) -> SequenceState:
        return SequenceState(self.req, list(self.response), list(self.logprobs), list(self.versions), kv,
                             kv_version if kv is not None else None)
