"""TransferQueue: completed trajectories wait here for the trainer; staleness is enforced here.

Accounting is per dispatch version w (the version the group was dispatched with; in partial
mode that is the version of its oldest tokens). Version w data may be trained at trainer
versions w..w+K (C3). Step s is taken at trainer version s (steps are numbered from 0 and
version s+1 is what step s produces). So after the batch of step N is taken, every group of
version <= N-K must be gone, and in general, for every later step j, the untrained groups of
version <= j-K must fit into the (j-N) batches still to be taken before j is over.

What blocks while the oldest version drains: the *trainer*. `ready()` is false while taking TBS
trajectories now (oldest complete groups first) would leave a group that could no longer be
trained within K. The manager, in turn, never dispatches more to version u than the steps up to
u+K can take (`dispatch_room`), so the wait always ends once the stragglers finish.
"""

from __future__ import annotations

import collections
from typing import Iterable

from .types import Trajectory


class TransferQueue:
    def __init__(self, train_batch: int, group_size: int, max_staleness: int):
        self.tbs, self.g, self.k = train_batch, group_size, max_staleness
        self.untrained: dict[int, int] = collections.defaultdict(int)   # version -> dispatched, not yet taken
        self.complete: dict[int, collections.deque] = collections.defaultdict(collections.deque)  # version -> group ids
        self.complete_count: dict[int, int] = collections.defaultdict(int)  # version -> trajectories in complete groups
        self.partial: dict[str, list[Trajectory]] = {}                 # group id -> finished members so far
        self.group_version: dict[str, int] = {}
        self.next_step = 0                                               # N: trainer version of the next batch
        self.c1_violations = self.c2_violations = self.c3_violations = 0

    # -- inputs -------------------------------------------------------------------------------
    def on_dispatched(self, group_id: str, version: int, n: int) -> None:
        if n != self.g:
            self.c2_violations += 1
        self.untrained[version] += n
        self.group_version[group_id] = version
        self.partial[group_id] = []

    def retag(self, group_id: str, version: int) -> None:
        """An unstarted group (no token generated yet) moves to a newer version."""
        old = self.group_version[group_id]
        self.untrained[old] -= self.g
        if not self.untrained[old]:
            del self.untrained[old]
        self.untrained[version] += self.g
        self.group_version[group_id] = version

    def put(self, traj: Trajectory) -> None:
        members = self.partial.get(traj.group_id)
        if members is None:      # finished twice, or never dispatched
            self.c2_violations += 1
            return
        members.append(traj)
        if len(members) == self.g:
            del self.partial[traj.group_id]
            v = self.group_version[traj.group_id]
            self.complete[v].append((traj.group_id, members))
            self.complete_count[v] += self.g

    # -- staleness-aware readiness ------------------------------------------------------------
    def dispatch_room(self, version: int) -> int:
        """How many more trajectories version `version` may get without risking C3: for every
        u >= version, untrained(<= u) must fit into the steps N..u+K that can still take it."""
        room = None
        cum = 0
        for u in sorted(set(self.untrained) | {version}):
            cum += self.untrained.get(u, 0)
            if u < version:
                continue
            r = (u + self.k - self.next_step + 1) * self.tbs - cum
            room = r if room is None else min(room, r)
        return max(0, room)

    def _plan(self) -> dict[int, int] | None:
        """Trajectories to take per version (oldest complete first), or None if not allowed now."""
        budget, plan = self.tbs, {}
        for v in sorted(self.complete_count):
            c = self.complete_count[v]
            if c and budget:
                take = min(c, budget)
                plan[v] = take
                budget -= take
        if budget:
            return None
        n = self.next_step
        # after this take, untrained(<= j-K) must fit in the (j-N) batches left before step j ends
        cum = 0
        for v in sorted(self.untrained):
            cum += self.untrained[v] - plan.get(v, 0)
            if cum and cum > (v + self.k - n) * self.tbs:
                return None
        return plan

    def ready(self) -> bool:
        return self._plan() is not None

    def blocked_by_staleness(self) -> bool:
        """TBS complete trajectories are here but taking them would strand an old group."""
        return sum(self.complete_count.values()) >= self.tbs and self._plan() is None

    def take(self) -> list[Trajectory]:
        """Exactly TBS trajectories in whole groups, oldest version first, for step next_step."""
        plan = self._plan()
        if plan is None:
            raise RuntimeError("TransferQueue.take() called while not ready()")
        out: list[Trajectory] = []
        for v, n in plan.items():
            dq = self.complete[v]
            for _ in range(n // self.g):
                gid, members = dq.popleft()
                del self.group_version[gid]
                out.extend(members)
            self.complete_count[v] -= n
            self.untrained[v] -= n
            if not self.complete_count[v] and not dq:
                del self.complete_count[v], self.complete[v]
            if not self.untrained[v]:
                del self.untrained[v]
        step = self.next_step
        for t in out:
            if step - t.version > self.k or step < t.version:
                self.c3_violations += 1
            if len(t.versions) > 1:
                self.c1_violations += 1
        self.next_step += 1
        return out

    # -- dropping (filters such as DAPO dynamic sampling) and revoking a taken batch ----------
    def drop_group(self, group_id: str) -> list[Trajectory] | None:
        """Remove a whole group that a filter dropped: its G trajectories leave the untrained
        count (so the room for replacement prompts grows) and its finished members are returned
        (members still generating are the caller's to discard when they finish). None if the
        group is unknown here (never dispatched, or already taken)."""
        v = self.group_version.pop(group_id, None)
        if v is None:
            return None
        members = self.partial.pop(group_id, None)
        if members is None:                        # complete: find it in its version's deque
            dq = self.complete[v]
            for i, (gid, ms) in enumerate(dq):
                if gid == group_id:
                    del dq[i]
                    members = ms
                    break
            else:
                raise RuntimeError(f"group {group_id} has a version but is neither partial nor complete")
            self.complete_count[v] -= self.g
            if not self.complete_count[v] and not dq:
                del self.complete_count[v], self.complete[v]
        self.untrained[v] -= self.g
        if not self.untrained[v]:
            del self.untrained[v]
        return members

    def untake(self, batch: list[Trajectory], step: int) -> None:
        """Undo take() of the latest step (its batch was not trained): the groups go back,
        ahead of anything of their version, and the counters take() moved are restored."""
        if step != self.next_step - 1:
            raise RuntimeError(f"untake(step {step}): only the latest taken step ({self.next_step - 1}) can be revoked")
        self.next_step = step
        groups: dict[str, list[Trajectory]] = {}
        for t in batch:
            groups.setdefault(t.group_id, []).append(t)
            if step - t.version > self.k or step < t.version:
                self.c3_violations -= 1
            if len(t.versions) > 1:
                self.c1_violations -= 1
        for gid, members in reversed(list(groups.items())):
            v = members[0].version
            self.group_version[gid] = v
            self.untrained[v] += len(members)
            self.complete[v].appendleft((gid, members))
            self.complete_count[v] += len(members)

    # -- state --------------------------------------------------------------------------------
    def versions_untrained(self) -> list[int]:
        return sorted(v for v, n in self.untrained.items() if n)

    def untrained_total(self) -> int:
        return sum(self.untrained.values())

    def waiting(self) -> int:
        return sum(self.complete_count.values()) + sum(len(m) for m in self.partial.values())

    def unfinished_groups(self) -> Iterable[str]:
        return self.partial.keys()
