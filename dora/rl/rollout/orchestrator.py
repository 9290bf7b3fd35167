"""Load-balancing orchestrator: the paper's Algorithm 1 over RolloutInstances.

rebalance():
 1. plan the injection for the newest version (RBS - R_sum, bounded by the staleness room);
 2. targets DP_w = round(D * R_w / sum R) by largest remainder, where R_w = requests in flight
    on version w (plus the planned injection for the newest);
 3. shrink versions above target: release their least-loaded instances, migrating the
    released instances' requests (with KV) to the remaining instances OF THE SAME VERSION, never
    below the instances those requests need to run at once (their slots and their KV: see
    room_needed).
    A version with requests in flight always keeps >= 1 instance: rounding can give it 0,
    but its work is never dropped or stranded; it keeps one instance until drained;
 4. grow versions below target (newest first) from the free instances (weight-transfer map:
    instance -> version), then give any instance left free to the newest version;
 5. intra-version balance: move requests queued beyond an instance's slots to same-version
    instances with free slots (the most recently submitted first: they are the ones queued).
Legacy filling (new prompts into idle slots of older versions) is done by the controller.
"""

from __future__ import annotations

import collections
import math

from .dispatch import Dispatcher
from .manager import RolloutManager


def partition(total: int, load: dict[int, int]) -> dict[int, int]:
    """DP_w = round(total * R_w / sum R), rounded by largest remainder so the sum is `total`;
    every version with load > 0 gets >= 1 while total allows (oldest first beyond that)."""
    live = {v: n for v, n in load.items() if n > 0}
    if not live or total <= 0:
        return {}
    s = sum(live.values())
    exact = {v: total * n / s for v, n in live.items()}
    out = {v: math.floor(x) for v, x in exact.items()}
    left = total - sum(out.values())
    for v in sorted(live, key=lambda v: (out[v] - exact[v], v))[:left]:
        out[v] += 1
    # never zero for a version with work: take from the largest (newest on ties)
    for v in sorted(live):
        if out[v] == 0:
            donor = max((w for w in out if out[w] > 1), key=lambda w: (out[w], w), default=None)
            if donor is None:
                break
            out[donor] -= 1
            out[v] = 1
    return out


class Orchestrator:
    """Decides; the Dispatcher does (weight loads, migrations)."""

    def __init__(self, manager: RolloutManager, dispatcher: Dispatcher, limit: int = 1, kv_limit: float = 0.92,
                 evaluating: set[str] | None = None):
        self.m, self.d, self.limit = manager, dispatcher, limit   # limit: M, versions per instance
        self.kv_limit = kv_limit                                  # KV use an instance is kept below (kv_pressure)
        self.evaluating = evaluating if evaluating is not None else set()   # claimed for held-out evaluation
        self.slots_of = manager.slots_of
        self.migrate = dispatcher.migrate

    def rebalance(self, newest: int, inject: int, spread: dict[int, int] | None = None,
                  newest_floor: int = 1, lanes_cap: int = -1) -> dict[str, int]:
        """`spread`: versions whose stragglers need fast lanes (FastLanes.plan) -> at most this many
        requests per instance for them, on instances taken from the newest version's share but never
        below `newest_floor` instances (what keeps the trainer fed), and never more instances for
        them all than `lanes_cap` (-1: no cap)."""
        m = self.m
        # lent trainer devices (elastic) are extra instances of the newest version, outside the partition
        # (and instances loaded for a held-out evaluation stay outside it until the evaluation is done)
        regular = {n: i for n, i in m.instances.items() if n not in m.lent and n not in self.evaluating}
        load = dict(m.outstanding)
        for n in m.lent:
            v = m.instances[n].version
            load[v] = load.get(v, 0) - m.load(n)
        for n, inst in regular.items():     # M > 1: an older version's requests beside the current one
            for w, k in m.versions_on[n].items():   # ride on their instance, outside the partition
                if w != inst.version:
                    load[w] -= k
        if inject:
            load[newest] = load.get(newest, 0) + inject
        targets = partition(len(regular), load) or {newest: len(regular)}
        spread = {v: b for v, b in (spread or {}).items() if load.get(v, 0) > 0 and v != newest}
        urgent = list(spread)
        # deadline: a version the trainer must drain in time gets instances enough for small
        # batches (faster tokens), oldest (earliest deadline) first, taken from the newest
        # version's share but never below newest_floor
        room = targets.get(newest, 0) - max(1, newest_floor)
        if lanes_cap >= 0:
            room = min(room, lanes_cap - sum(targets.get(v, 0) for v in spread))
        want: dict[int, int] = {}
        for v, b in sorted(spread.items()):
            have = targets.get(v, 0)
            want[v] = max(have, min(-(-load[v] // b), have + max(0, room)))
            if want[v] > have:        # room > 0 here, so the newest version holds these instances
                room -= want[v] - have
                targets[newest] -= want[v] - have
                targets[v] = want[v]
        hosts: dict[int | None, list[str]] = collections.defaultdict(list)
        for n, inst in regular.items():
            hosts[inst.version].append(n)
        free: list[str] = []
        for v, names in list(hosts.items()):
            if v is None or load.get(v, 0) == 0:
                free.extend(names)          # nothing in flight on this version: free to reassign
                hosts[v] = []
                continue
            keep_n = max(1, targets.get(v, 0), self.room_needed(v, names, load[v]))
            if v in want:             # near its deadline: keep the instances its small batches need
                keep_n = min(len(names), max(keep_n, want[v]))
            extra = len(names) - keep_n
            if extra <= 0:
                continue
            names.sort(key=m.load)
            release, keep = names[:extra], names[extra:]
            for n in release:
                self.migrate(n, m.requests_of(n, v), keep)
            hosts[v] = keep
            free.extend(release)
        moves: dict[str, int] = {}
        for v in sorted(targets, reverse=True):
            need = targets[v] - len(hosts[v])
            if need <= 0:
                continue
            free.sort(key=lambda n: m.instances[n].version != v)   # already on v: no load needed
            fit = [n for n in free if self.can_take(n, v)]
            for n in fit[:need]:
                if m.instances[n].version != v:
                    moves[n] = v
                hosts[v].append(n)
                free.remove(n)
        for n in free:
            if m.instances[n].version != newest and self.can_take(n, newest):
                moves[n] = newest
        for n, v in moves.items():
            self.d.load(n, v)
        self.balance_within_versions(urgent)
        return moves

    def room_needed(self, v: int, names: list[str], requests: int) -> int:
        """Instances version v's requests need to run at once: their slots, and their KV below
        kv_pressure (each instance's KV use counted for v in proportion to its requests of v).
        Shrinking below that consolidates stragglers into queues (a long context waits for KV,
        parked in host memory), which delays the very drain the trainer waits on."""
        m = self.m
        slots = max(self.slots_of(n) for n in names)
        kv = 0.0
        for n in names:
            here = m.load(n)
            if here:
                kv += m.instances[n].stats().kv_used_fraction * m.versions_on[n][v] / here
        return max(-(-requests // slots), math.ceil(kv / self.kv_limit - 1e-9))

    def can_take(self, name: str, v: int) -> bool:
        """May instance `name` make v its current version? The versions of the requests on it, all
        older than v, and v number <= M (with M = 1: it holds no request of another version)."""
        here = set(self.m.versions_on[name]) - {v}
        return len(here) < self.limit and all(w < v for w in here)

    def balance_within_versions(self, even: tuple | list = ()) -> int:
        """Move queued-beyond-slots requests to same-version peers with free slots; for versions
        in `even` (urgent ones), even out the loads completely (running requests move with KV)."""
        m, moved = self.m, 0
        hosts: dict[int | None, list[str]] = collections.defaultdict(list)
        for n, inst in m.instances.items():
            hosts[inst.version].append(n)
        for v, names in hosts.items():
            if v is None or len(names) < 2:
                continue
            if v in even:
                total = sum(m.load(n) for n in names)
                cap = -(-total // len(names))
                under = [n for n in names if m.load(n) < cap]
                for n in sorted(names, key=m.load, reverse=True):
                    k = m.load(n) - cap
                    if k <= 0 or not under:
                        break
                    moved += self.migrate(n, m.requests_of(n, v)[-k:], under, lane=True)   # into fast lanes
                    under = [u for u in under if m.load(u) < cap]
                continue
            # requests in a tool wait hold no slot: they neither make an instance over nor fill one
            busy = {n: m.decoding_load(n) for n in names}
            over = [(n, busy[n] - self.slots_of(n)) for n in names if busy[n] > self.slots_of(n)]
            under = [n for n in names if busy[n] < self.slots_of(n)]
            if not over or not under:
                continue
            room = sum(self.slots_of(n) - busy[n] for n in under)
            for n, excess in sorted(over, key=lambda x: -x[1]):
                k = min(excess, room)
                if k <= 0:
                    break
                uids = m.requests_of(n, v)[-k:]
                moved += self.migrate(n, uids, under)
                room -= k
        return moved
