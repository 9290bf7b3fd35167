"""Multi-version instances (async.versions_per_instance M > 1): where versions go.

With M = 1 an instance serves one version and the Orchestrator partitions instances among the
versions in flight (Algorithm 1): an old version's last requests hold whole instances while their
batch drains. With M > 1 an instance keeps an older version's requests decoding on their own
weights (C1) while it takes the newest version as current, so those stragglers share instances
with the newest version's requests instead:

 1. pack: each older version's requests move with their KV onto the fewest instances that already
    hold that version and have free slots for them (the instances holding fewest of them move
    first), so that the others drop that version's weights (and the KV room and weight reads they
    cost);
 2. mix: an instance whose current version is older takes the newest as current (load_version,
    its requests stay) once its own requests leave a slot free and the versions it would then host
    number <= M; an instance holding stragglers that are being sped up (DoraPolicy.spread: their
    deadline is near) keeps their small batch and does not mix;
 3. an instance whose versions already number M and do not include the newest keeps serving its
    current version (legacy filling) until its oldest version's last request leaves.
"""

from __future__ import annotations

from .dispatch import Dispatcher
from .manager import RolloutManager


class VersionPacker:
    def __init__(self, manager: RolloutManager, dispatcher: Dispatcher, limit: int, kv_limit: float,
                 evaluating: set[str] | None = None):
        self.m, self.d, self.limit, self.kv_limit = manager, dispatcher, limit, kv_limit
        self.evaluating = evaluating if evaluating is not None else set()   # loaded for a held-out evaluation
        self.urgent: set[int] = set()        # versions whose stragglers are being sped up (last rebalance)

    def rebalance(self, newest: int, spread: dict[int, int]) -> dict[str, int]:
        """`spread`: versions whose stragglers must be sped up (DoraPolicy.spread); their holders
        keep their small batches (they do not mix)."""
        self.urgent = set(spread)
        self.pack(newest, self.kv_limit)
        return self.mix(newest)

    def free_slots(self, name: str) -> int:
        return max(0, self.m.slots_of(name) - self.m.decoding_load(name))

    def pack(self, newest: int, kv_limit: float) -> int:
        """Step 1; returns the requests moved. A destination takes requests only into free slots and
        while its KV use, plus theirs (the source's KV use per running request), stays <= kv_limit."""
        m, moved = self.m, 0
        regular = [n for n in m.instances if n not in m.lent]
        kv: dict[str, float] = {}
        per_req: dict[str, float] = {}
        for v in sorted(w for w in m.outstanding if w < newest):
            holders = sorted((n for n in regular if m.versions_on[n][v]), key=lambda n: m.versions_on[n][v])
            for n in holders:
                if n not in kv:
                    st = m.instances[n].stats()
                    kv[n], per_req[n] = st.kv_used_fraction, st.kv_used_fraction / max(1, st.active)
            for i, src in enumerate(holders[:-1]):
                k = m.versions_on[src][v]
                need = k * per_req[src]
                dests = [d for d in holders[i + 1:] if self.free_slots(d) > 0 and kv[d] + need <= kv_limit]
                if not dests or k > sum(self.free_slots(d) for d in dests):
                    continue
                moved += self.d.migrate(src, m.requests_of(src, v), dests)
                for d in dests:             # spread evenly by migrate; charge the KV evenly too
                    kv[d] += need / len(dests)
                kv[src] -= need
        return moved

    def kv_fits(self, name: str) -> bool:
        """Is mixing worth its KV? Once one more version's weights take their share of the room
        (InstanceStats.version_kv_fraction), every version the instance would then host gets an
        equal share of what is left below kv_limit: the requests here, of len(versions) versions,
        may use at most len(versions) / (len(versions) + 1) of it, so that the newest version
        gets at least one version's share (with M = 2: half)."""
        st = self.m.instances[name].stats()
        here = max(1, len(self.m.versions_on[name]))
        room = self.kv_limit * (1 - st.version_kv_fraction)
        return st.kv_used_fraction <= room * here / (here + 1)

    def mix(self, newest: int) -> dict[str, int]:
        """Step 2: instance -> newest, for each instance that took it."""
        m, moves = self.m, {}
        for n, inst in list(m.instances.items()):
            if inst.version == newest or n in m.lent or n in self.evaluating:
                continue
            here = set(m.versions_on[n])
            if len(here | {newest}) > self.limit or here & self.urgent:
                continue
            if here and self.free_slots(n) == 0:
                continue                     # its own requests still fill it
            if here and newest not in here and not self.kv_fits(n):
                continue
            self.d.load(n, newest)
            moves[n] = newest
        return moves
