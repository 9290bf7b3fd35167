"""Length-aware dispatch: a group whose samples run long has siblings that likely will too.

In a group of an old version whose deadline is at risk (FastLanes.plan), the samples that run are
the ones the trainer will wait for; siblings of theirs still queued without a token (their
instance's slots are taken) would start late, on the version with the least time left. They start
now on the newest version instead, which has the most. Each trajectory keeps one version (C1); the
group keeps its version, its oldest member's, for staleness (C3) and is trained whole (C2). A
measurement toggle: RolloutConfig.length_aware (docs/benchmarks.md has its share of the gain).
"""

from __future__ import annotations

from .dispatch import Dispatcher


def start_siblings_on_newest(d: Dispatcher, versions: set[int]) -> int:
    """Length-aware dispatch: in a group of an old version at risk (`versions`) whose samples run
    (they will be long if theirs are), the siblings still queued without a token start on the
    newest version now, which has the most time left, instead of waiting for a slot of theirs.
    Each trajectory stays on one version (C1); the group keeps its version, the oldest of its
    members, for staleness (C3) and trains whole (C2). Returns the requests moved."""
    m, moved = d.m, 0
    hosts = [n for n in m.hosts(d.newest) if n not in m.lent] if versions else []
    for name, inst in list(m.instances.items()):
        v = inst.version
        waiting = inst.stats().queued if hosts and v in versions and name not in m.lent else 0
        if not waiting:
            continue
        mine = m.requests_of(name, v)
        queued = mine[-waiting:]                             # the most recently placed wait for a slot
        started = {m.on_instance[name][u].group_id for u in mine[:-waiting]}   # (lists: placement order, not hash order)
        uids = [u for u in queued if m.on_instance[name][u].group_id in started]
        if not uids:
            continue
        states = inst.export(uids)
        back = [st for st in states if st.tokens_done]       # (started meanwhile: it stays)
        reqs = {r.uid: r for r in m.forget(name, [st.uid for st in states])}
        if back:
            m.place(name, [reqs[st.uid] for st in back])
            inst.import_(back)
        fresh = [reqs[st.uid] for st in states if not st.tokens_done]
        for r in fresh:
            r.version = d.newest
        if fresh:
            target = min(hosts, key=m.load)
            m.place(target, fresh)
            m.instances[target].submit(fresh)
            moved += len(fresh)
    d.ledger.totals["siblings_started_newest"] += moved
    return moved
