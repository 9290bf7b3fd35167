"""The engine's weight slots: which policy version each holds, where a request runs, where a new
version goes, and when a version leaves.

A torch engine hosts up to `max_versions` versions (the run's async.versions_per_instance), one
per weight slot (runner.py WeightSlot), all decoding over the one KV pool.
- A request runs on the slot holding its dispatched version (imported KV: the version that
  computed it) when one does, else on the newest version (partial rollout: a request interrupted
  on v resumes on v+1, and its token_versions say so).
- A new version goes into a slot none of whose requests is in flight (`busy`): an idle slot still
  holding weights first (loaded in place), then a free slot, then a new slot while fewer than
  max_versions exist. Loading v+1 thus leaves the requests running on v untouched; with
  max_versions = 1 it is the classic rule: load only when idle.
- A version other than the newest leaves once its slot is not busy: no request of it in flight,
  none held by the engine's owner (a multi-turn trajectory waiting on a tool takes its next turn
  on its own version). Its slot becomes free and, off CUDA, its weights' memory is released (the
  CPU KV tensor grows into it). On CUDA the slot keeps its storage: the KV pool is allocated once
  at start with room left for max_versions weight copies (kv_budget.py), and the captured decode
  graphs hold the weights' addresses, so releasing it would hand the memory to nothing in this
  replica and cost a graph capture at the next load.
"""

from __future__ import annotations

from typing import Iterable

import torch

from . import hf_weights as W
from .runner import ModelRunner, WeightSlot
from .scheduler import Scheduler


class WeightSlots:
    def __init__(self, runner: ModelRunner, max_versions: int, *, release_memory: bool):
        if max_versions < 1:
            raise ValueError(f"torch engine: max_versions must be >= 1, got {max_versions}")
        self.runner, self.max_versions, self.release_memory = runner, int(max_versions), release_memory
        self.latest = 0                  # the slot of the newest version

    @property
    def slots(self) -> list[WeightSlot]:
        return self.runner.slots

    def route(self, version: int | None) -> int:
        for i, slot in enumerate(self.slots):
            if slot.version is not None and slot.version == version:
                return i
        return self.latest

    def hosted(self) -> list[int]:
        return sorted(s.version for s in self.slots if s.version is not None)

    def holding(self, versions: Iterable[int]) -> set[int]:
        want = set(versions)
        return {i for i, s in enumerate(self.slots) if s.version is not None and s.version in want}

    def busy(self, sched: Scheduler, keep: Iterable[int]) -> set[int]:
        """Slots with a request in flight, or holding a version in `keep` (versions the engine's
        owner still needs: Engine.keep_versions)."""
        return {s.slot for s in sched.in_flight()} | self.holding(keep)

    def load(self, version: int, weights: dict[str, torch.Tensor] | str, sched: Scheduler, keep: Iterable[int]) -> None:
        self.retire_idle(sched, keep)
        counts = f"{sched.active} running and {len(sched.waiting)} queued requests"
        index = self._slot_to_load(self.busy(sched, keep), counts)
        slot = self.slots[index]
        slot.version = None                # (a failed load leaves the slot holding no version)
        if W.weight_bytes(slot.model) == 0:   # a slot whose version left (its memory released)
            W.allocate(slot.model, self.runner.shapes)
        W.load_into(slot.model, weights)   # in place: the slot's captured graphs stay valid
        slot.version, self.latest = int(version), index

    def _slot_to_load(self, busy: set[int], counts: str) -> int:
        idle = [i for i in range(len(self.slots)) if i not in busy]
        holding = [i for i in idle if self.slots[i].version is not None]
        if holding:
            return min(holding, key=lambda i: self.slots[i].version)
        if idle:
            return idle[0]
        if len(self.slots) < self.max_versions:
            self.runner.new_slot()
            return len(self.slots) - 1
        raise RuntimeError(f"torch engine: cannot load a new version: all {self.max_versions} weight slot(s) hold "
                           f"versions with requests in flight ({counts}); switch only when idle or after interrupt_all()")

    def retire_idle(self, sched: Scheduler, keep: Iterable[int]) -> None:
        """Free every slot but the newest that is not busy, and the parked KV its weights computed
        (no continuation could use it)."""
        if len(self.slots) == 1:
            return
        busy = self.busy(sched, keep)
        for i, slot in enumerate(self.slots):
            if i != self.latest and i not in busy and slot.version is not None:
                slot.version = None
                if self.release_memory:
                    W.release(slot.model)
                sched.release_parked_on(i)

    def release_all(self) -> int:
        """sleep(): drop every slot but one and that one's weights; returns the bytes released."""
        freed = sum(W.weight_bytes(s.model) for s in self.slots)
        del self.slots[1:]
        self.latest = 0
        W.release(self.slots[0].model)
        self.slots[0].version = None
        return freed

    def unhost_all(self) -> None:
        """sleep() keeping the graphs: every slot keeps its storage (the graphs hold its address) and
        holds no version; the next load goes into slot 0, in place."""
        for slot in self.slots:
            slot.version = None
        self.latest = 0

    def weight_bytes(self) -> int:
        return sum(W.weight_bytes(s.model) for s in self.slots)
