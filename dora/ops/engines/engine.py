"""The generation-engine interface: every engine (torch, vllm, simulated) speaks these types.

An engine is driven by one caller (the generate op) in a loop:
    submit(req) ... step() -> finished completions ... load_weights(v, ...) when idle
and can hand in-flight requests to another engine of the same version with
export(uids) -> states -> other.import_(states) (KV cache travels where the engine can).

SequenceState crosses processes as msgpack + raw tensor frames (state_to_wire / state_from_wire);
never pickle.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Iterable

import numpy as np
import torch

FINISH_REASONS = ("stop", "length", "abort")


@dataclasses.dataclass
class SamplingRequest:
    uid: str
    prompt_ids: list[int]
    version: int                     # policy version the request is dispatched on
    max_tokens: int = 128
    temperature: float = 1.0         # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0                   # 0 = off
    stop_ids: list[int] = dataclasses.field(default_factory=list)  # EOS ids of the engine always stop too
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)  # passed through to the Completion
    # multi-turn (agentic): keep_kv parks the finished request's KV until release(uid) or a
    # continuation; continues=<uid of a parked request> whose prompt_ids start with that request's
    # prompt + response adopts its KV and prefills only the new tokens. A request may continue its
    # own uid (the agent loop keeps one uid per trajectory): the parked KV is taken before it queues.
    keep_kv: bool = False
    continues: str | None = None

    def validate(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"request {self.uid!r}: empty prompt_ids")
        if self.max_tokens < 1:
            raise ValueError(f"request {self.uid!r}: max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"request {self.uid!r}: temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"request {self.uid!r}: top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"request {self.uid!r}: top_k must be >= 0, got {self.top_k}")


@dataclasses.dataclass
class Completion:
    uid: str
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]            # behaviour logprob of each sampled token (see docs: Engines)
    token_versions: list[int]        # policy version that sampled each token
    version: int                     # version the request was dispatched on
    finish_reason: str               # stop | length | abort
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class SequenceState:
    """An in-flight request, enough to resume it elsewhere.

    kv: per layer (keys, values), each [kv_heads, kv_len, head_dim], covering the first kv_len
    tokens of prompt_ids + response_ids; None when the engine cannot export KV (the importer
    re-prefills and counts it)."""

    request: SamplingRequest
    response_ids: list[int]
    logprobs: list[float]
    token_versions: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    kv_version: int | None = None    # weights version that computed kv: reused only on an engine at that version

    @property
    def kv_len(self) -> int:
        return 0 if not self.kv else int(self.kv[0][0].shape[-2])


@dataclasses.dataclass
class EngineStats:
    active: int                      # requests in the running batch
    queued: int                      # submitted, not yet admitted
    kv_tokens_used: int
    kv_tokens_capacity: int
    version: int
    reprefill_tokens: int            # tokens prefilled again because an import came without KV
    generated_tokens: int
    prefill_tokens: int = 0          # tokens run through prefill (prefix hits and imported KV excluded)
    prefix_hit_tokens: int = 0       # prompt tokens whose KV was found cached (shared blocks), not computed
    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    parked_requests: int = 0         # finished keep_kv requests holding their KV
    parked_blocks: int = 0
    parked_dropped: int = 0          # parked requests dropped because the pool ran short
    continuation_reprefill_tokens: int = 0   # context a continuation prefilled again: its parked KV was
                                     # gone (dropped, released on a migration) or of another version
    preempted: int = 0               # running requests sent back to the queue for want of KV blocks
    graph_captures: int = 0          # decode graphs captured (CUDA graphs, one per batch size and weight slot):
                                     # flat once warm, across weight loads and sleeps that keep the graphs

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class Engine(abc.ABC):
    """One generation engine holding one policy version at a time (the torch engine: up to
    max_versions, each request running on its own; paged/weight_slots.py)."""

    version: int                     # the newest version: requests of a version not hosted run on it
    max_versions: int = 1            # versions hosted at once (an engine with one set of weights: 1)

    @abc.abstractmethod
    def submit(self, req: SamplingRequest) -> None: ...

    @abc.abstractmethod
    def step(self) -> list[Completion]:
        """One scheduling iteration: admit queued requests, one decode step for all running;
        return the requests that finished in it."""

    @abc.abstractmethod
    def abort(self, uid: str) -> Completion | None:
        """Drop a request; returns its partial completion (finish_reason 'abort') or None if unknown."""

    @abc.abstractmethod
    def export(self, uids: list[str]) -> list[SequenceState]:
        """Remove these requests from this engine and return their state (KV where possible)."""

    @abc.abstractmethod
    def import_(self, states: list[SequenceState]) -> None:
        """Resume exported requests here (same version for KV reuse; otherwise re-prefill)."""

    @abc.abstractmethod
    def interrupt_all(self) -> list[SequenceState]:
        """Export every request (running and queued), leaving the engine idle."""

    @abc.abstractmethod
    def load_weights(self, version: int, weights: dict[str, torch.Tensor] | str) -> None:
        """Switch to `version` (a state dict or a safetensors path). Only when idle (an engine with
        several weight slots: into a slot none of whose requests is in flight, the older versions'
        requests decoding on)."""

    def hosted_versions(self) -> list[int]:
        """The versions whose weights are here now: the newest, and older ones with requests here
        (or held by keep_versions). An older version leaves when its last request leaves."""
        return [self.version]

    def keep_versions(self) -> Iterable[int]:
        """Versions the engine's owner still needs hosted though no request of theirs is in the
        engine (the generate op: multi-turn trajectories waiting on a tool, whose next turn runs on
        their version). The owner replaces this with its own callable."""
        return ()

    @abc.abstractmethod
    def stats(self) -> EngineStats: ...

    def has_work(self) -> bool:
        s = self.stats()
        return s.active + s.queued > 0

    def release(self, uid: str) -> bool:
        """Drop a parked (keep_kv) request's KV; False when nothing is parked under uid. An engine
        that never parks (keeps no KV after a request) has nothing to release."""
        return False

    def sampling_state(self) -> bytes | None:
        """The sampler's RNG state (a resumed run restores it, so it samples what the run would have);
        None for an engine that cannot give one."""
        return None

    def set_sampling_state(self, state: bytes) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot restore a sampling state")

    def sleep(self, keep_graphs: bool = False) -> int:
        """Hand the device memory back (async.elastic): drop the KV cache and the weights; only when
        idle. Returns the bytes released. After wake() the engine holds room for weights but none
        that count: it generates nothing until load_weights(). keep_graphs: keep what captured
        graphs point to (the memory share is this replica's own; see TorchEngine.sleep)."""
        raise NotImplementedError(f"{type(self).__name__} cannot sleep (async.elastic needs an engine that can)")

    def wake(self) -> int:
        """Allocate the weights' memory again after sleep(); returns the bytes allocated."""
        raise NotImplementedError(f"{type(self).__name__} cannot sleep (async.elastic needs an engine that can)")

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- wire format (no pickle)

def _tensor_meta(t: torch.Tensor) -> dict[str, Any]:
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:   # numpy has no bfloat16: ship the raw 16-bit pattern
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def _tensor_from(meta: dict[str, Any], frame: bytes | memoryview) -> torch.Tensor:
    dtype = getattr(torch, meta["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"SequenceState wire: unknown tensor dtype {meta['dtype']!r}")
    shape = [int(s) for s in meta["shape"]]
    raw_dtype = torch.int16 if dtype == torch.bfloat16 else dtype
    itemsize = torch.empty((), dtype=raw_dtype).element_size()
    want = int(np.prod(shape, dtype=np.int64)) * itemsize
    buf = memoryview(frame)
    if buf.nbytes != want:
        raise ValueError(f"SequenceState wire: tensor frame has {buf.nbytes} bytes, dtype/shape {meta} needs {want}")
    t = torch.frombuffer(bytearray(buf), dtype=raw_dtype) if want else torch.empty(0, dtype=raw_dtype)
    t = t.reshape(shape)
    return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t


def state_to_wire(state: SequenceState) -> tuple[dict[str, Any], list[bytes]]:
    """(msgpack-able dict, raw tensor frames). Frame order: layer0 keys, layer0 values, layer1 keys, ..."""
    frames: list[bytes] = []
    kv_meta = None
    if state.kv is not None:
        kv_meta = []
        for k, v in state.kv:
            kv_meta.append([_tensor_meta(k), _tensor_meta(v)])
            frames += [_tensor_bytes(k), _tensor_bytes(v)]
    d = {
        "request": dataclasses.asdict(state.request),
        "response_ids": [int(x) for x in state.response_ids],
        "logprobs": [float(x) for x in state.logprobs],
        "token_versions": [int(x) for x in state.token_versions],
        "kv": kv_meta,
        "kv_version": state.kv_version,
    }
    return d, frames


_STATE_KEYS = {"request", "response_ids", "logprobs", "token_versions", "kv", "kv_version"}


def state_from_wire(d: dict[str, Any], frames: list[bytes | memoryview]) -> SequenceState:
    if not isinstance(d, dict) or set(d) != _STATE_KEYS:
        got = sorted(d) if isinstance(d, dict) else type(d).__name__
        raise ValueError(f"SequenceState wire: expected keys {sorted(_STATE_KEYS)}, got {got}")
    req = SamplingRequest(**d["request"])
    kv = None
    if d["kv"] is not None:
        if len(frames) != 2 * len(d["kv"]):
            raise ValueError(f"SequenceState wire for {req.uid!r}: {len(d['kv'])} KV layers need {2 * len(d['kv'])} frames, got {len(frames)}")
        kv = [(_tensor_from(km, frames[2 * i]), _tensor_from(vm, frames[2 * i + 1])) for i, (km, vm) in enumerate(d["kv"])]
    n = len(d["response_ids"])
    if len(d["logprobs"]) != n or len(d["token_versions"]) != n:
        raise ValueError(f"SequenceState wire for {req.uid!r}: response_ids/logprobs/token_versions lengths differ")
    return SequenceState(req, list(d["response_ids"]), list(d["logprobs"]), list(d["token_versions"]), kv,
                        d["kv_version"] if kv is not None else None)


def states_to_wire(states: list[SequenceState]) -> tuple[dict[str, Any], list[bytes]]:
    """Many states in one message: {'states': [dict...], 'frame_counts': [...]} + concatenated frames."""
    dicts, frames, counts = [], [], []
    for s in states:
        d, f = state_to_wire(s)
        dicts.append(d)
        frames += f
        counts.append(len(f))
    return {"states": dicts, "frame_counts": counts}, frames


def states_from_wire(d: dict[str, Any], frames: list[bytes | memoryview]) -> list[SequenceState]:
    if not isinstance(d, dict) or "states" not in d or "frame_counts" not in d:
        raise ValueError("SequenceState wire: expected {'states': [...], 'frame_counts': [...]}")
    if sum(d["frame_counts"]) != len(frames):
        raise ValueError(f"SequenceState wire: frame_counts sum to {sum(d['frame_counts'])}, got {len(frames)} frames")
    out, i = [], 0
    for sd, c in zip(d["states"], d["frame_counts"]):
        out.append(state_from_wire(sd, frames[i:i + c]))
        i += c
    return out
