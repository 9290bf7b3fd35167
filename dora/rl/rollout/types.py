"""Data the rollout control code exchanges with rollout instances, and the instance protocol.

One `RolloutInstance` = one data-parallel rollout group (one generate replica in the real
runtime, one `SimInstance` in the simulator). It hosts up to M policy versions at once
(`async.versions_per_instance`): its current `version`, which new requests are submitted on, and
the older versions of requests still running there. Each request decodes on its own version's
weights (C1); an older version's weights leave the instance when its last request there leaves
(finishes or is exported).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence, runtime_checkable


@dataclasses.dataclass(slots=True)
class Request:
    """One trajectory to generate: one of the G responses of prompt group `group_id`."""

    uid: str
    group_id: str
    version: int                 # the policy version that must generate every token (C1)
    prompt_tokens: int
    payload: Any = None          # opaque: the Arrow row in the real runtime, the target length in the sim


@dataclasses.dataclass(slots=True)
class RequestState:
    """An in-flight request taken out of an instance (export / interrupt_all), ready to resume."""

    uid: str
    group_id: str
    version: int                 # version of the tokens generated so far (and of the KV, if any)
    prompt_tokens: int
    tokens_done: int             # response tokens generated so far
    has_kv: bool = False         # KV came along: the importer need not re-prefill
    kv_bytes: int = 0
    payload: Any = None
    token_versions: tuple[int, ...] = ()   # distinct versions that generated tokens so far
    resume_at: float | None = None         # multi-turn: between turns, the tool's output is due then (clock time)


@dataclasses.dataclass(slots=True)
class InstanceStats:
    active: int                  # requests decoding now
    queued: int                  # submitted, waiting for a slot / KV
    slots: int                   # max concurrent requests (max_num_seqs)
    kv_used_fraction: float      # 0..1
    loading: bool = False        # a weight load is still in progress
    step_s: float = 0.0          # measured seconds per decode iteration now (0: idle or not reported)
    tool_waiting: int = 0        # multi-turn requests waiting on a tool (placed here, holding no slot)
    version_kv_fraction: float = 0.0   # share of the KV room one more hosted version's weights would take (0: not known)


@dataclasses.dataclass(slots=True)
class Finished:
    """A completed trajectory as reported to `RolloutController.on_finished`."""

    uid: str
    response_tokens: int = 0
    token_versions: tuple[int, ...] | None = None   # distinct versions of its tokens (C1 check)
    payload: Any = None          # the generated row (real runtime); replaces the request's payload

    @staticmethod
    def from_token_versions(uid: str, token_versions: Sequence[int], payload: Any = None) -> "Finished":
        """Build from the per-token `token_versions` column of a generated row."""
        return Finished(uid, len(token_versions), tuple(sorted(set(int(v) for v in token_versions))), payload)


@dataclasses.dataclass(slots=True)
class Trajectory:
    """A finished trajectory waiting in / taken from the TransferQueue."""

    uid: str
    group_id: str
    version: int                 # version the group was dispatched with (its behaviour policy)
    prompt_tokens: int
    response_tokens: int
    versions: tuple[int, ...]    # distinct versions that generated its tokens (len > 1 breaks C1)
    finished_at: float
    payload: Any = None


@runtime_checkable
class RolloutInstance(Protocol):
    """What the control code may do to a rollout group. Calls may block (RPCs in the real
    runtime); the control code assumes nothing happened until a call returns, and nothing more
    than its return value says."""

    name: str
    version: int | None          # the current version: new requests are submitted on it

    def load_version(self, v: int) -> None:
        """Make v the current version. With M = 1 the caller guarantees the instance holds no
        requests. With M > 1, requests of older versions may stay and keep decoding on their own
        weights; the caller guarantees that v and the versions of the requests here number <= M."""

    def submit(self, reqs: list[Request]) -> None:
        """Queue requests; each req.version == self.version."""

    def export(self, uids: list[str]) -> list[RequestState]:
        """Remove these in-flight requests and return their state (with KV where possible)."""

    def import_(self, states: list[RequestState]) -> None:
        """Resume requests (no re-prefill when has_kv); each state's version is the current
        version or one hosted here (the version of a request still here)."""

    def interrupt_all(self) -> list[RequestState]:
        """Stop every training request in flight (partial mode), keeping the tokens so far; held-out
        evaluation requests stay."""

    def abort(self, uids: list[str]) -> list[str]:
        """Drop these requests (held-out evaluation requests), nothing kept and nothing reported;
        the uids that were here."""

    def load_version_in_flight(self, v: int) -> None:
        """Make v the current version of the instance AND of every request on it, which goes on
        decoding with v's weights over the KV its older version computed (PipelineRL's in-flight
        update, partial_inflight mode: breaks C1 by design)."""

    def stats(self) -> InstanceStats:
        ...
