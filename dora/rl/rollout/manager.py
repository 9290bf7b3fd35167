"""RolloutManager: dispatches version-tagged prompt groups and knows where every request is.

A group's G requests all carry the group's version and go to one instance of that version
(least loaded), so a GRPO group is single-version (C1 at group level) and shares its prompt.
Counts here are by *current* version (the version generating the request now); the
TransferQueue counts by dispatch version.
"""

from __future__ import annotations

import collections
import heapq
from typing import Callable

from .types import Request, RolloutInstance

TakePrompts = Callable[[int], "list[list[Request]]"]


class RolloutManager:
    def __init__(self, instances: list[RolloutInstance], take_prompts: TakePrompts, group_size: int = 1):
        self.instances = {i.name: i for i in instances}
        if len(self.instances) != len(instances):
            raise ValueError("rollout instance names must be unique")
        self.take_prompts = take_prompts
        self.where: dict[str, str] = {}                                   # uid -> instance name
        self.on_instance: dict[str, dict[str, Request]] = {n: {} for n in self.instances}  # insertion-ordered
        self.outstanding: dict[int, int] = collections.defaultdict(int)  # current version -> in flight
        self.exhausted = False                                            # take_prompts returned fewer groups
        self._hosts: dict[int | None, list[str]] | None = None
        self.slots: dict[str, int] = {}                                   # learnt by slots_of()
        self.group_size = group_size                                      # G: an instance takes whole groups
        self.lent: set[str] = set()                                       # trainer devices serving rollout (elastic)
        self.tool_waiting: dict[str, int] = {}                            # instance -> requests in a tool wait (reported)

    # -- queries ------------------------------------------------------------------------------
    @property
    def r_sum(self) -> int:
        return len(self.where)

    def load(self, name: str) -> int:
        return len(self.on_instance[name])

    def decoding_load(self, name: str) -> int:
        """Requests that want a decode slot: those placed here less those waiting on a tool (a
        multi-turn request between turns holds no slot; it still counts in load() and moves with
        the instance's requests)."""
        return max(0, len(self.on_instance[name]) - self.tool_waiting.get(name, 0))

    def slots_of(self, name: str) -> int:
        """An instance's concurrent-request slots, asked once (one stats() call) and kept."""
        s = self.slots.get(name)
        if s is None:
            s = self.slots[name] = max(1, self.instances[name].stats().slots)
        return s

    def hosts(self, version: int) -> list[str]:
        if self._hosts is None:
            h: dict[int | None, list[str]] = collections.defaultdict(list)
            for n, i in self.instances.items():
                h[i.version].append(n)
            self._hosts = h
        return list(self._hosts.get(version, ()))

    def add_instance(self, inst: RolloutInstance, lent: bool = False) -> None:
        """A rollout instance joins the pool (`lent`: a trainer device serving rollout for a while)."""
        if inst.name in self.instances:
            raise ValueError(f"rollout instance {inst.name!r} is already in the pool")
        self.instances[inst.name] = inst
        self.on_instance[inst.name] = {}
        if lent:
            self.lent.add(inst.name)
        self._hosts = None

    def remove_instance(self, name: str) -> None:
        """An instance leaves the pool; it must hold no request."""
        if self.on_instance[name]:
            raise RuntimeError(f"remove_instance({name}): {len(self.on_instance[name])} requests still on it")
        del self.instances[name], self.on_instance[name]
        self.slots.pop(name, None)
        self.tool_waiting.pop(name, None)
        self.lent.discard(name)
        self._hosts = None

    def versions_changed(self) -> None:
        """Call after any load_version: the hosts cache is rebuilt on next use."""
        self._hosts = None

    # -- dispatch -----------------------------------------------------------------------------
    def dispatch(self, version: int, n_groups: int, targets: list[str] | None = None,
                 allowance: int | None = None) -> list[list[Request]]:
        """Take up to n_groups prompt groups, tag them with `version`, submit each group to the
        least loaded instance among `targets` (default: all hosts of `version`). With an
        allowance, an instance gets a group only while its load + G stays within its slots +
        allowance (so new prompts are not parked in queues, tied to an aging version)."""
        names = targets if targets is not None else self.hosts(version)
        if n_groups <= 0 or not names:
            return []
        g, busy = self.group_size, {n: self.decoding_load(n) for n in names}
        if allowance is None:
            heap = [(busy[n], i, n, 1 << 60) for i, n in enumerate(names)]
        else:
            slots = self.slots
            heap = [(busy[n], i, n, slots.get(n, 1) + allowance) for i, n in enumerate(names)
                    if busy[n] + g <= slots.get(n, 1) + allowance]
            n_groups = min(n_groups, sum((cap - load) // g for load, _, _, cap in heap))
        if n_groups <= 0:
            return []
        groups = self.take_prompts(n_groups)
        if len(groups) < n_groups:
            self.exhausted = True
        heapq.heapify(heap)
        per_instance: dict[str, list[Request]] = collections.defaultdict(list)
        for grp in groups:
            if not heap:
                raise RuntimeError("dispatch: no instance has room (capacity miscounted)")
            load, i, name, cap = heap[0]
            for r in grp:
                r.version = version
            per_instance[name].extend(grp)
            if load + len(grp) + g <= cap:
                heapq.heapreplace(heap, (load + len(grp), i, name, cap))
            else:
                heapq.heappop(heap)
        for name, reqs in per_instance.items():
            self._place(name, reqs)
            self.instances[name].submit(reqs)
        return groups

    def _place(self, name: str, reqs: list[Request]) -> None:
        box = self.on_instance[name]
        for r in reqs:
            if r.uid in self.where:
                raise RuntimeError(f"request {r.uid} dispatched twice")
            self.where[r.uid] = name
            box[r.uid] = r
            self.outstanding[r.version] += 1

    def finished(self, uid: str) -> Request | None:
        name = self.where.pop(uid, None)
        if name is None:
            return None
        r = self.on_instance[name].pop(uid)
        self.outstanding[r.version] -= 1
        if not self.outstanding[r.version]:
            del self.outstanding[r.version]
        return r

    # -- moving requests ------------------------------------------------------------------------
    def forget(self, name: str, uids: list[str]) -> list[Request]:
        """Unplace requests taken out of instance `name` (before placing them elsewhere)."""
        box, out = self.on_instance[name], []
        for u in uids:
            r = box.pop(u)
            del self.where[u]
            self.outstanding[r.version] -= 1
            if not self.outstanding[r.version]:
                del self.outstanding[r.version]
            out.append(r)
        return out

    def place(self, name: str, reqs: list[Request]) -> None:
        self._place(name, reqs)
