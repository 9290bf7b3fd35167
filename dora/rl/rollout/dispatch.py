"""Dispatcher: what the policies do to instances: send prompt groups, load weights, move
unstarted groups to a newer version, fill idle slots of older versions.

It keeps the newest published version and the groups it holds off-instance (retagged, waiting for
a host of the newest version); the policies decide when each action happens.
"""

from __future__ import annotations

import collections
from typing import Callable

from ..clock import Clock
from .config import RolloutConfig
from .ledger import Ledger
from .manager import RolloutManager
from dora.observe.trace import TraceWriter
from .transfer_queue import TransferQueue
from .types import Request, RequestState


class Dispatcher:
    def __init__(self, cfg: RolloutConfig, manager: RolloutManager, queue: TransferQueue, ledger: Ledger,
                 clock: Clock, trace: TraceWriter, newest: int):
        self.cfg, self.m, self.queue, self.ledger, self.clock, self.trace = cfg, manager, queue, ledger, clock, trace
        self.newest = newest
        self.allowance = cfg.queue_allowance_groups * cfg.group_size
        self.pending_retag: list[list[Request]] = []   # unstarted groups moved to the newest version
        self.parked: list[tuple[Request, RequestState]] = []  # taken off a leaving instance, no host of their version yet
        self.hosting_since: dict[str, float] = {}      # instance -> since when it hosts its version (trace)

    def held(self) -> int:
        """Trajectories dispatched but on no instance (retagged and waiting for a newest host, or
        parked with their KV in host memory until an instance hosts their version)."""
        return sum(len(x) for x in self.pending_retag) + len(self.parked)

    def park(self, reqs: list[Request], states: list[RequestState]) -> None:
        by_uid = {r.uid: r for r in reqs}
        self.parked.extend((by_uid[s.uid], s) for s in states)

    def place_parked(self) -> None:
        """Parked requests go to the least-loaded instance holding their version, or to an empty
        instance that then loads it."""
        if not self.parked:
            return
        m = self.m
        left, per = [], collections.defaultdict(list)
        for req, st in self.parked:
            hosts = [n for n in m.holders(st.version) if n not in m.lent]
            if not hosts:
                # (an instance this pass already chose holds requests once they are placed: not empty)
                empty = [n for n, i in m.instances.items() if n not in m.lent and not m.on_instance[n] and n not in per]
                if not empty:
                    left.append((req, st))
                    continue
                self.load(empty[0], st.version)
                hosts = [empty[0]]
            name = min(hosts, key=lambda n: m.load(n) + len(per[n]))
            per[name].append((req, st))
        self.parked = left
        for name, pairs in per.items():
            m.place(name, [r for r, _ in pairs])
            m.instances[name].import_([st for _, st in pairs])

    def release_pending(self, group_id: str) -> list[Request] | None:
        """Take a retagged, not yet resubmitted group out (a filter dropped it): never generated."""
        grp = next((g for g in self.pending_retag if g[0].group_id == group_id), None)
        if grp is not None:
            self.pending_retag.remove(grp)
        return grp

    # -- sending ------------------------------------------------------------------------------
    def room(self) -> int:
        """Trajectories the newest version may get now (R_sum up to RBS, staleness room)."""
        room = min(self.cfg.rollout_batch - self.m.r_sum, self.queue.dispatch_room(self.newest))
        return max(0, room - room % self.cfg.group_size)

    def send(self, version: int, n_groups: int, targets: list[str] | None = None,
             allowance: int | None = None) -> int:
        groups = self.m.dispatch(version, n_groups, targets, allowance)
        now = self.clock.now()
        for grp in groups:
            self.ledger.sent(grp, version, now)
        return len(groups)

    def stream(self) -> None:
        """Streaming: keep R_sum at RBS on the newest version, within the staleness room, each
        instance filled up to its slots + the allowance (new prompts are not parked in queues)."""
        g = self.cfg.group_size
        room = self.room()
        if room >= g:
            hosts = self.m.hosts(self.newest)
            if hosts:
                self.send(self.newest, room // g, hosts, self.allowance)

    def whole_batch(self) -> None:
        """Batch barrier: a whole batch once nothing is in flight, every instance on the newest
        version; if filters dropped groups of the batch being built, only their replacements."""
        cfg, m = self.cfg, self.m
        owed = -self.queue.untrained_total() % cfg.train_batch
        n = owed or cfg.train_batch
        if m.r_sum or self.queue.dispatch_room(self.newest) < n:
            return
        for name, inst in m.instances.items():   # barrier: everyone is empty; all move to newest
            if inst.version != self.newest:
                self.load(name, self.newest)
        self.send(self.newest, n // cfg.group_size)

    def legacy_fill(self, can_start: Callable[[int], bool]) -> None:
        """Older versions get new prompts only into idle slots, and only while a request started
        now would be done before the version's deadline (`can_start`)."""
        cfg, m, g = self.cfg, self.m, self.cfg.group_size
        if m.exhausted:
            return
        for v in sorted({i.version for i in m.instances.values() if i.version is not None}):
            if v >= self.newest or not can_start(v):
                continue
            # free slots are idle only where the engine admits at once: no queue (KV not the limit)
            idle = [n for n in m.hosts(v) if n not in m.lent and m.decoding_load(n) + g <= m.slots_of(n)
                    and self.m.instances[n].stats().queued == 0]
            slots = sum(m.slots_of(n) - m.decoding_load(n) for n in idle)
            n = min(slots, self.queue.dispatch_room(v)) // g
            if n > 0:
                self.send(v, n, idle, self.allowance)

    # -- moving unstarted groups to a newer version ---------------------------------------------
    def retag_unstarted(self, version: int) -> None:
        """Groups still waiting in an old version's queue have generated nothing: moving them to
        the new version keeps C1 (every token will come from `version`) and keeps them out of the
        drain the trainer waits on. Only whole groups move; anything that started goes back."""
        m, g = self.m, self.cfg.group_size
        for name, inst in m.instances.items():
            if inst.version is None or inst.version >= version or not m.on_instance[name]:
                continue
            queued = inst.stats().queued
            if queued < g:
                continue
            # the current version's requests: an older hosted version's could leave with its weights
            uids = m.requests_of(name, inst.version)[-queued:]
            states = inst.export(uids)
            reqs = {r.uid: r for r in m.forget(name, [s.uid for s in states])}
            by_group: dict[str, list] = {}
            for st in states:
                by_group.setdefault(st.group_id, []).append(st)
            back, moved = [], []
            for gid, sts in by_group.items():
                if (len(sts) == g and gid not in self.ledger.dropped_groups
                        and all(st.tokens_done == 0 for st in sts) and self.queue.dispatch_room(version) >= g):
                    self.queue.retag(gid, version)
                    self.ledger.dispatched_at[gid] = self.clock.now()     # its staleness clock restarts
                    grp = [reqs[st.uid] for st in sts]
                    for r in grp:
                        r.version = version
                    moved.append(grp)
                else:
                    back.extend(sts)
            if back:
                m.place(name, [reqs[st.uid] for st in back])
                inst.import_(back)
            self.ledger.totals["retagged_requests"] += sum(len(x) for x in moved)
            self.pending_retag.extend(moved)

    def place_pending_retag(self) -> None:
        """Submit retagged groups to hosts of the newest version once it has some."""
        m = self.m
        hosts = m.hosts(self.newest)
        if not self.pending_retag or not hosts:
            return
        loads = {n: m.load(n) for n in hosts}
        per: dict[str, list[Request]] = {}
        for grp in self.pending_retag:
            if grp[0].version != self.newest:     # another version was published meanwhile
                self.queue.retag(grp[0].group_id, self.newest)
                for r in grp:
                    r.version = self.newest
            n = min(loads, key=loads.__getitem__)
            per.setdefault(n, []).extend(grp)
            loads[n] += len(grp)
        self.pending_retag = []
        for n, reqs in per.items():
            m.place(n, reqs)
            m.instances[n].submit(reqs)

    def migrate(self, src: str, uids: list[str], dests: list[str], lane: bool = False) -> int:
        """Move requests of one version from src to the least-loaded of dests (each holds that version);
        `lane`: they move into fast lanes (counted as such)."""
        m = self.m
        if not uids or not dests:
            return 0
        version = m.on_instance[src][uids[0]].version
        assert all(m.on_instance[src][u].version == version for u in uids), "migration of several versions at once"
        assert all(version in m.hosted(d) for d in dests), "migration across versions"
        states = m.instances[src].export(uids)
        reqs = {r.uid: r for r in m.forget(src, [s.uid for s in states])}
        loads = {d: m.decoding_load(d) - m.slots_of(d) for d in dests}
        per: dict[str, list] = collections.defaultdict(list)
        for s in states:
            d = min(loads, key=loads.__getitem__)
            per[d].append(s)
            loads[d] += 1
        kv = 0
        for d, ss in per.items():
            m.place(d, [reqs[s.uid] for s in ss])
            m.instances[d].import_(ss)
            kv += sum(s.kv_bytes for s in ss)
        now = self.clock.now()
        self.trace.instant("orchestrator", "migrations", f"migrate v{version}", now,
                           src=src, dests=sorted(per), requests=len(states), kv_bytes=kv)
        self.ledger.count_migration(len(states), kv, lane)
        return len(states)

    # -- weights ------------------------------------------------------------------------------------
    def load(self, name: str, version: int) -> None:
        inst = self.m.instances[name]
        now = self.clock.now()
        self.close_span(name, inst.version, now)
        inst.load_version(version)
        self.m.versions_changed()
        self.hosting_since[name] = self.clock.now()
        self.ledger.count_load()
        self.trace.instant("orchestrator", "weights", f"load v{version}", now, instance=name)

    def swap_in_flight(self, name: str, version: int) -> None:
        """PipelineRL's update: instance `name` loads `version` and every request on it goes on under
        it, keeping the KV older weights computed (RolloutInstance.load_version_in_flight)."""
        inst = self.m.instances[name]
        now = self.clock.now()
        self.close_span(name, inst.version, now)
        inst.load_version_in_flight(version)
        self.m.switch_version(name, version)
        self.hosting_since[name] = self.clock.now()
        self.ledger.count_load()
        self.trace.instant("orchestrator", "weights", f"swap in flight v{version}", now, instance=name)

    def close_span(self, name: str, version: int | None, now: float) -> None:
        since = self.hosting_since.pop(name, None)
        if since is not None and version is not None:
            self.trace.span("rollout", name, f"v{version}", since, now, version=version)
