"""Elastic devices: trainer devices that wait for a batch serve rollout, then come back.

`lend(instances)`: the driver hands over rollout instances built on the trainer's devices (it has
paid for freeing their memory and resharding the weights). They join the pool as extra instances
of the newest version, outside the orchestrator's partition; requests queued beyond their slots
on other instances of that version move to them at once (batch modes have a whole batch queued),
then dispatch fills them like any instance.

`reclaim()`: the batch is ready and the trainer wants its devices back. Every request on a lent
instance is exported with its KV and imported by the least-loaded instance of its version (one
that is empty loads the version if none hosts it; otherwise the request waits, parked with its KV
in host memory, counted in flight). Returns what moved, per lent instance, so the driver can
charge the hand-back. A request the instance does not export is lost with it (it died: a live
instance exports all it holds once its completions are delivered): its group is dropped whole as
`replica_lost` and its id left in `lost_groups` for the driver to dispatch again.
"""

from __future__ import annotations

from typing import Sequence

from .types import RolloutInstance


class Lending:
    def __init__(self, controller):
        """`controller`: the RolloutController this part belongs to (its manager, dispatcher, ledger)."""
        self.c = controller
        self.lost_groups: list[str] = []     # groups a reclaimed instance could not hand back

    def lend(self, instances: Sequence[RolloutInstance]) -> None:
        c, m, d = self.c, self.c.manager, self.c.dispatch
        for inst in instances:
            m.add_instance(inst, lent=True)
            m.slots_of(inst.name)
            d.load(inst.name, d.newest)
        v = d.newest
        lent = [i.name for i in instances]
        for n in m.hosts(v):
            excess = m.load(n) - m.slots_of(n)
            if n not in m.lent and excess > 0:
                room = [x for x in lent if m.load(x) < m.slots_of(x)]
                if not room:
                    break
                d.migrate(n, m.requests_of(n, v)[-excess:], room)

    def reclaim(self, names: Sequence[str] | None = None) -> dict[str, tuple[int, int]]:
        """Empty every lent instance (or those named) and take it out of the pool: name -> (requests,
        KV bytes) moved."""
        c, m, d = self.c, self.c.manager, self.c.dispatch
        out: dict[str, tuple[int, int]] = {}
        lost: list = []
        now = c.clock.now()
        for name in sorted(m.lent if names is None else set(names) & set(m.lent)):
            inst = m.instances[name]
            uids = list(m.on_instance[name])
            moved = kv = 0
            if uids:
                states = inst.export(uids)
                reqs = m.forget(name, [s.uid for s in states])
                d.park(reqs, states)
                moved, kv = len(states), sum(s.kv_bytes for s in states)
                c.ledger.count_migration(moved, kv)
                lost += m.forget(name, list(m.on_instance[name]))
            d.close_span(name, inst.version, now)
            m.remove_instance(name)
            out[name] = (moved, kv)
        if lost:   # dropped once every lent instance is out of the pool (on_dropped dispatches)
            gids = sorted({r.group_id for r in lost})
            c.on_dropped([c.ledger.members[g][0] for g in gids if g in c.ledger.members], "replica_lost")
            c.ledger.count_dropped("replica_lost", len(lost))
            self.lost_groups += gids
        d.place_parked()
        c.trace.instant("orchestrator", "elastic", "reclaim", now,
                        requests=sum(x for x, _ in out.values()), kv_bytes=sum(y for _, y in out.values()))
        return out

    @property
    def active(self) -> bool:
        return bool(self.c.manager.lent)

