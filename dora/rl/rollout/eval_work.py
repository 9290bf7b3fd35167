"""EvalWork: held-out evaluation requests, a low-priority kind of request the rollout control code
places where training work leaves room. The driver adds each evaluation's requests, tagged with the
version they evaluate (dora/rl/evaluation.py); this part decides where they run.

- An evaluation of version v runs only on instances whose current version is v (every token of it
  comes from v's weights), never on lent trainer devices.
- It fills idle slots first: an instance takes at most its slots less its training requests less
  the evaluation requests already there, so it never queues ahead of training work.
- Once the driver marks it due (a newer evaluation began, training ended, or the mode evaluates
  between steps), it also queues behind training work, up to a slot-load per instance.
- When no instance hosts v, an instance the mode has no use for now (`RolloutPolicy.spare`: no
  training request on it and nothing to dispatch to it) is claimed and loads v, as legacy versions'
  work is given idle instances. The mode takes it back whenever it wants it: a load_version there
  aborts the evaluation requests (the generate op reports them, `aborted`), which wait here again.

Nothing here touches the books of training work (manager, queue, ledger): evaluation requests are
never counted as dispatched, trained or dropped, so C1-C3 accounting is the same with or without them.
"""

from __future__ import annotations

import collections

from .types import Request


class EvalWork:
    def __init__(self, controller):
        self.c = controller
        self.pending: dict[int, list[Request]] = {}              # version -> not on any instance, in order
        self.placed: dict[str, tuple[str, Request]] = {}         # uid -> (instance, request)
        self.on: dict[str, set[str]] = collections.defaultdict(set)   # instance -> its evaluation uids
        self.due: set[int] = set()
        self.claimed: set[str] = set()                            # instances loaded with a version for evaluation
        self.claims = 0

    # -- what the driver says ---------------------------------------------------------------------
    def add(self, version: int, reqs: list[Request], due: bool = False) -> None:
        self.pending.setdefault(version, []).extend(reqs)
        if due:
            self.due.add(version)

    def make_due(self, up_to: int | None = None) -> None:
        """Evaluations of versions <= up_to (None: all) stop waiting for idle slots."""
        self.due |= {v for v in self.versions() if up_to is None or v <= up_to}

    def finished(self, uids: list[str]) -> None:
        for u in uids:
            where = self.placed.pop(u, None)
            if where is not None:
                self.on[where[0]].discard(u)

    def aborted(self, uids: list[str]) -> None:
        """The instance dropped these (a load, an interrupt, a version it no longer hosts): placed again."""
        back: dict[int, list[Request]] = {}
        for u in uids:
            where = self.placed.pop(u, None)
            if where is not None:
                self.on[where[0]].discard(u)
                back.setdefault(where[1].version, []).append(where[1])
        for v, reqs in back.items():
            self.pending[v] = reqs + self.pending.get(v, [])

    def withdraw(self, name: str) -> list[str]:
        """Take the evaluation requests on instance `name` back to wait here (the mode needs it empty:
        a colocated training barrier); the uids, for the caller to abort there."""
        uids = sorted(self.on[name])
        self.aborted(uids)
        return uids

    def cancel(self, uids: set[str]) -> dict[str, list[str]]:
        """Give these requests up (their evaluation was abandoned): instance -> those placed there,
        for the caller to abort."""
        for v in list(self.pending):
            self.pending[v] = [r for r in self.pending[v] if r.uid not in uids]
        out: dict[str, list[str]] = {}
        for u in uids & set(self.placed):
            name, _ = self.placed.pop(u)
            self.on[name].discard(u)
            out.setdefault(name, []).append(u)
        return out

    def busy(self) -> bool:
        return bool(self.placed) or any(self.pending.values())

    def versions(self) -> set[int]:
        return {v for v, r in self.pending.items() if r} | {r.version for _, r in self.placed.values()}

    # -- placing ------------------------------------------------------------------------------------
    def fill(self) -> None:
        m = self.c.manager
        live = self.versions()   # (in place: the orchestrator holds this set)
        self.claimed.intersection_update({n for n in m.instances if m.instances[n].version in live})
        for v in sorted(self.pending):
            if not self.pending[v]:
                del self.pending[v]
                continue
            hosts = [n for n, i in m.instances.items() if i.version == v and n not in m.lent]
            if not hosts and v in self.due:
                hosts = self._claim(v)
            for n in sorted(hosts, key=lambda n: m.decoding_load(n) + len(self.on[n])):
                self._place(n, v)

    def _room(self, name: str, version: int) -> int:
        m = self.c.manager
        slots, mine = m.slots_of(name), len(self.on[name])
        idle = slots - m.decoding_load(name) - mine
        return max(idle, slots - mine if version in self.due else 0)

    def _place(self, name: str, version: int) -> None:
        n = min(self._room(name, version), len(self.pending[version]))
        if n <= 0:
            return
        reqs, self.pending[version] = self.pending[version][:n], self.pending[version][n:]
        for r in reqs:
            self.placed[r.uid] = (name, r)
            self.on[name].add(r.uid)
        self.c.manager.instances[name].submit(reqs)

    def _claim(self, version: int) -> list[str]:
        """An instance the mode can spare loads `version` for its due evaluation. It stays out of the
        mode's partition until the evaluations of that version end; one at a time while training
        goes on (the rollout gives up at most one instance to evaluation), any spare one after."""
        m = self.c.manager
        if self.claimed and not m.exhausted:
            return []
        spare = [n for n in m.instances if n not in m.lent and not self.on[n] and n not in self.claimed
                 and self.c.policy.spare(n)]
        if not spare:
            return []
        name = spare[0]
        self.c.dispatch.load(name, version)
        self.claimed.add(name)
        self.claims += 1
        return [name]
