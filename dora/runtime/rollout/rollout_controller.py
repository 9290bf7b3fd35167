"""RolloutController: the one control code for all four modes, driven by events.

Event-driven, no threads, no I/O: time only through `clock`, instances only through the
RolloutInstance protocol. The driver (simulator or real runtime) calls:

    c = RolloutController(config, instances, take_prompts, clock, trace=None)
    c.start()                               # load version 0, first dispatch
    c.on_finished(instance_name, done)      # trajectories completed (uids or Finished records)
    if c.trainer_ready(): batch = c.take_batch()     # exactly TBS trajectories, whole groups
    c.on_trained(step, version_after, consumed_uids) # the step is over (weights not yet served)
    c.on_published(version)                 # new weights can be loaded by rollout instances
    c.on_dropped(uids, reason)              # a filter dropped these groups (e.g. DAPO dynamic sampling)
    c.tick()                                # periodically (every few seconds)
    summary = c.finish()                    # end of run: accounting of every dispatched uid

Modes are policies over the same parts (see config.RolloutConfig):
  sync          K=0, RBS=TBS, batch barrier: dispatch TBS for version v, wait, train, publish v+1
  one_step_off  K=1, RBS=TBS, batch barrier: batch t+1 generated (with v_t) while step t trains
  partial       K, RBS>TBS streaming on the newest version only; at every publish all instances
                interrupt, load v+1 and resume with a re-prefill (C1 broken by design, counted)
  dora          K, RBS>TBS streaming, several versions live, Orchestrator re-partitions and
                migrates same-version requests with KV; legacy filling into idle slots
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Sequence

from ..clock import Clock
from .config import RolloutConfig
from .manager import RolloutManager
from .orchestrator import Orchestrator
from .trace import TraceWriter
from .transfer_queue import TransferQueue
from .types import Finished, Request, RolloutInstance, Trajectory


@dataclasses.dataclass
class StepMetrics:
    step: int
    policy_version: int            # version produced by this step
    trajectories: int
    tokens: int                    # prompt + response tokens trained
    step_time_s: float             # since the previous step ended (or start)
    rollout_only_s: float          # trainer idle, waiting for data, before this step
    staleness_max: int
    staleness_mean: float
    c1_violations: int
    c2_violations: int
    c3_violations: int
    versions_live: int             # versions with requests in flight at step end
    migrated_requests: int         # during this step's interval
    reprefill_tokens: int
    weight_loads: int
    idle_fraction: dict[str, float]  # per pool: rollout (sampled at ticks), trainer
    dropped: int = 0               # trajectories dropped by filters during this step's interval

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class RolloutController:
    def __init__(self, config: RolloutConfig, instances: Sequence[RolloutInstance],
                 take_prompts: Callable[[int], list[list[Request]]], clock: Clock,
                 trace: TraceWriter | None = None, initial_version: int = 0):
        self.cfg = config.resolved()
        if not instances:
            raise ValueError("RolloutController needs at least one rollout instance")
        self.clock = clock
        self.trace = trace or TraceWriter(enabled=False)
        self.manager = RolloutManager(list(instances), take_prompts)
        self.manager._group_size_hint = self.cfg.group_size
        self.queue = TransferQueue(self.cfg.train_batch, self.cfg.group_size, self.cfg.max_staleness)
        self.queue.next_step = initial_version
        self.orch = Orchestrator(self.manager, clock, self.trace, self._load, self._count_migration)
        self._allowance = self.cfg.queue_allowance_groups * self.cfg.group_size
        self.newest = initial_version
        self.step_metrics: list[StepMetrics] = []
        self._uid_versions: dict[str, set[int]] = {}   # partial: versions seen by resumed requests
        self._taken: dict[int, set[str]] = {}           # step -> uids handed to the trainer
        self._batches: dict[int, tuple[list[Trajectory], float]] = {}   # step -> (batch, trainer wait)
        self._hosting_since: dict[str, float] = {}
        self._trainer_idle_since: float | None = None
        self._last_step_end = self._last_rebalance = self._last_kv_check = 0.0
        self._c2_extra = 0                               # unknown / double completions, trained twice
        self._dispatched = self._trained = 0
        self._pending_retag: list[list[Request]] = []   # unstarted groups moved to the newest version
        self._retagged = 0
        self._members: dict[str, list[str]] = {}        # group id -> uids, until trained (kept if dropped)
        self._group_of: dict[str, str] = {}             # uid -> group id, until trained (kept if dropped)
        self._dropped_groups: dict[str, str] = {}       # group id -> reason (members may still be generating)
        self.dropped: collections.Counter[str] = collections.Counter()   # reason -> trajectories dropped
        self._dropped_interval = 0
        self.urgent_batch = self.cfg.urgent_batch_tight  # until K steps tell (see _adapt_urgent_batch)
        self._dispatched_at: dict[str, float] = {}       # group id -> dispatch (or retag) time
        self._gen_max: list[float] = [0.0]               # per step interval: longest dispatch -> finish
        # interval counters (reset at each step end)
        self._migrated = self._reprefill = self._loads = 0
        self._idle_samples = self._idle_hits = 0
        self.totals = {"migrated_requests": 0, "migrated_kv_bytes": 0, "reprefill_tokens": 0,
                       "weight_loads": 0, "rebalances": 0, "retagged_requests": 0, "rollout_only_s": 0.0,
                       "dropped_unknown": 0}

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        for name in self.manager.instances:
            self.orch.slots_of(name)             # one stats() per instance: learn its slots
        now = self.clock.now()
        self._last_step_end = self._last_rebalance = self._last_kv_check = now
        self._trainer_idle_since = now
        for name, inst in self.manager.instances.items():
            if inst.version != self.newest:
                self._load(name, self.newest)
            else:
                self._hosting_since[name] = now
        self._dispatch()

    def finish(self) -> dict[str, Any]:
        """Account for every dispatched trajectory: trained, finished-but-untrained, or in flight."""
        now = self.clock.now()
        for name, inst in self.manager.instances.items():
            self._close_span(name, inst.version, now)
        in_flight = self.manager.r_sum + sum(len(x) for x in self._pending_retag)
        waiting = self.queue.waiting()
        in_training = sum(len(u) for u in self._taken.values())
        dropped = sum(self.dropped.values())
        lost = self._dispatched - self._trained - waiting - in_flight - in_training - dropped
        return {"dispatched": self._dispatched, "trained": self._trained, "in_training_at_end": in_training,
                "finished_untrained": waiting, "in_flight_at_end": in_flight, "lost": lost,
                "dropped": dropped, "dropped_by_reason": dict(self.dropped),
                "c1_violations": self.queue.c1_violations,
                "c2_violations": self.queue.c2_violations + self._c2_extra + max(0, lost),
                "c3_violations": self.queue.c3_violations, **self.totals}

    # -- events from rollout ----------------------------------------------------------------------
    def on_finished(self, instance_name: str, done: Sequence[str | Finished]) -> None:
        now = self.clock.now()
        for d in done:
            f = Finished(d) if isinstance(d, str) else d
            r = self.manager.finished(f.uid)
            if r is None:
                self._c2_extra += 1          # finished twice or never dispatched here
                continue
            seen = self._uid_versions.pop(f.uid, None)
            t0 = self._dispatched_at.get(r.group_id)
            if t0 is not None and now - t0 > self._gen_max[-1]:
                self._gen_max[-1] = now - t0
            reason = self._dropped_groups.get(r.group_id)
            if reason is not None:               # the rest of a dropped group: discard, account
                self._count_dropped(reason, 1)
                continue
            versions = f.token_versions if f.token_versions is not None else (
                tuple(sorted(seen)) if seen else (r.version,))
            gv = self.queue.group_version.get(r.group_id, r.version)
            self.queue.put(Trajectory(f.uid, r.group_id, gv, r.prompt_tokens, f.response_tokens,
                                      versions, now, r.payload if f.payload is None else f.payload))
        inst = self.manager.instances[instance_name]
        if (self.manager.load(instance_name) == 0 and inst.version != self.newest
                and self.cfg.multi_version):
            self._load(instance_name, self.newest)     # an idle old-version instance joins the newest
        self._dispatch()

    def restore_finished(self, trajectories: Sequence[Trajectory]) -> None:
        """A resumed run: trajectories its checkpoint held finished but untrained join the queue as
        though they had just finished, each group whole and with the version it was generated by."""
        groups: dict[str, list[Trajectory]] = {}
        for t in trajectories:
            groups.setdefault(t.group_id, []).append(t)
        for gid, members in groups.items():
            self.queue.on_dispatched(gid, members[0].version, len(members))
            self._dispatched += len(members)
            self._members[gid] = [t.uid for t in members]
            for t in members:
                self._group_of[t.uid] = gid
                self.queue.put(t)

    # -- trainer side ---------------------------------------------------------------------------
    def trainer_ready(self) -> bool:
        return self.queue.ready()

    def take_batch(self) -> list[Trajectory]:
        now = self.clock.now()
        step = self.queue.next_step
        batch = self.queue.take()
        waited = now - self._trainer_idle_since if self._trainer_idle_since is not None else 0.0
        self.totals["rollout_only_s"] += waited
        self._trainer_idle_since = None
        self._taken[step] = {t.uid for t in batch}
        self._batches[step] = (batch, waited, now)
        self._dispatch()                     # the room for new dispatches just grew
        return batch

    def on_trained(self, step: int, version_after: int, consumed_uids: Sequence[str]) -> None:
        now = self.clock.now()
        taken = self._taken.pop(step, None)
        c2 = 0
        if taken is None:
            c2 += 1
            taken = set()
        consumed = list(consumed_uids)
        if len(set(consumed)) != len(consumed) or set(consumed) != taken:
            c2 += 1
        self._c2_extra += c2
        self._trained += len(consumed)
        for u in consumed:
            self._forget_uid(u)
        batch, waited, _ = self._batches.pop(step, ([], 0.0, now))
        stal = [step - t.version for t in batch] or [0]
        m = StepMetrics(
            step=step, policy_version=version_after, trajectories=len(batch),
            tokens=sum(t.prompt_tokens + t.response_tokens for t in batch),
            step_time_s=now - self._last_step_end, rollout_only_s=waited,
            staleness_max=max(stal), staleness_mean=sum(stal) / len(stal),
            c1_violations=sum(1 for t in batch if len(t.versions) > 1),
            c2_violations=c2 + (0 if len(batch) == self.cfg.train_batch else 1),
            c3_violations=sum(1 for s in stal if s > self.cfg.max_staleness or s < 0),
            versions_live=len([v for v, n in self.manager.outstanding.items() if n]),
            migrated_requests=self._migrated, reprefill_tokens=self._reprefill, weight_loads=self._loads,
            idle_fraction={"rollout": self._idle_hits / self._idle_samples if self._idle_samples else 0.0,
                           "trainer": waited / max(1e-9, now - self._last_step_end)},
            dropped=self._dropped_interval)
        self.step_metrics.append(m)
        self._migrated = self._reprefill = self._loads = self._idle_samples = self._idle_hits = 0
        self._dropped_interval = 0
        self._last_step_end = now
        self._gen_max.append(0.0)
        del self._gen_max[:-2 * self.cfg.max_staleness - 2]
        self._trainer_idle_since = now
        if self.cfg.multi_version:
            self._adapt_urgent_batch()
            self._rebalance()                # trigger 1: after every training step

    def on_published(self, version: int) -> None:
        if version <= self.newest:
            return
        self.newest = version
        self.trace.instant("trainer", "publish", f"publish v{version}", self.clock.now())
        if self.cfg.interrupt_on_publish:
            self._interrupt_and_resume(version)
        elif self.cfg.multi_version:
            self._retag_unstarted(version)
            self._rebalance()
        else:                                # batch modes: idle instances move to the new weights
            for name, inst in self.manager.instances.items():
                if self.manager.load(name) == 0 and inst.version != version:
                    self._load(name, version)
        self._dispatch()

    def on_dropped(self, uids: Sequence[str], reason: str) -> list[int]:
        """Trajectories a filter dropped on the way to the trainer (DAPO dynamic sampling drops
        whole groups whose rewards are all equal). The WHOLE group of each uid is dropped: its
        finished members leave the TransferQueue now, members still generating are discarded
        when they finish; none is ever trained. They are accounted under `dropped` (per reason)
        in finish(), not as lost or C2 violations, and the freed room is refilled with new
        prompts (streaming modes: R_sum and the staleness room grow; batch modes: the missing
        trajectories are dispatched once the batch in flight is done), so every step still
        trains exactly TBS.

        Returns the steps whose batches were revoked: a batch handed out by take_batch() but
        not yet trained that holds a dropped group goes back to the queue whole (every later
        taken-untrained batch too). The driver must discard those batches and call
        take_batch() again once trainer_ready(). So never name uids of a batch the trainer is
        already training (a filter sits before the trainer). Unknown uids (never dispatched,
        already trained) are counted in totals["dropped_unknown"]."""
        now = self.clock.now()
        revoked: list[int] = []
        for u in uids:
            gid = self._group_of.get(u)
            if gid is None:
                self.totals["dropped_unknown"] += 1
                continue
            if gid in self._dropped_groups:
                continue
            members = self._members[gid]
            for step in sorted(self._taken, reverse=True):       # in a batch not yet trained: revoke
                if not self._taken[step].isdisjoint(members):
                    for s in sorted((s for s in self._taken if s >= step), reverse=True):
                        self._revoke(s)
                        revoked.append(s)
                    break
            self._dropped_groups[gid] = reason
            self._dispatched_at.pop(gid, None)
            pending = next((grp for grp in self._pending_retag if grp[0].group_id == gid), None)
            if pending is not None:              # retagged, not resubmitted yet: never generated
                self._pending_retag.remove(pending)
            finished = self.queue.drop_group(gid) or []
            self._count_dropped(reason, len(finished) + (len(pending) if pending else 0))
            self.trace.instant("trainer", "filter", f"drop {gid}", now, reason=reason, trajectories=len(members))
        self._dispatch()
        return sorted(set(revoked))

    def instance_replaced(self, name: str, reason: str = "replica_lost") -> tuple[list[str], list[int]]:
        """Instance `name` died with its requests and a new process (initial weights) took its place.
        The dead one's groups are dropped whole (members elsewhere are discarded as they finish) and
        counted under `reason`; the new one loads the newest version while empty, before anything is
        dispatched onto it (a switch with requests running would break C1). Returns (group ids,
        revoked steps, as on_dropped); the caller dispatches those groups again as new ones."""
        lost = self.manager.forget(name, list(self.manager.on_instance[name]))
        self._load(name, self.newest)
        gids = sorted({r.group_id for r in lost})
        revoked = self.on_dropped([self._members[g][0] for g in gids if g in self._members], reason)
        self._count_dropped(reason, len(lost))   # they will never finish: counted now
        return gids, revoked

    def tick(self) -> None:
        now = self.clock.now()
        m = self.manager
        self._idle_samples += len(m.instances)
        self._idle_hits += sum(1 for n in m.instances if not m.on_instance[n])
        if self.cfg.multi_version:
            if now - self._last_rebalance >= self.cfg.rebalance_period_s or self._pressure():
                self._rebalance()            # trigger 3 (periodic) / trigger 2 (KV or queue pressure)
        self._dispatch()

    def rebalance(self) -> None:
        """Run the orchestrator now (dora mode; a no-op in the others). The triggers call this
        themselves; a driver may also call it, e.g. when a replica joins or leaves."""
        if self.cfg.multi_version:
            self._rebalance()
            self._dispatch()

    # -- internals ------------------------------------------------------------------------------
    def _forget_uid(self, uid: str) -> None:
        """A trained uid: its group is trained whole, so the group's entry goes too."""
        gid = self._group_of.pop(uid, None)
        if gid is not None:
            self._members.pop(gid, None)
            self._dispatched_at.pop(gid, None)

    def _adapt_urgent_batch(self) -> None:
        """Straggler spreading trades pool throughput for drain speed. Speed is what counts once
        the long tail takes longer to generate than the staleness window lasts in wall time
        (max dispatch -> finish time over the last 2K steps >= K x the trainer's step time, waits
        excluded: they are what this avoids): then an urgent version is spread thin
        (urgent_batch_tight); otherwise throughput counts more (urgent_batch)."""
        cfg, k = self.cfg, max(1, self.cfg.max_staleness)
        recent = self.step_metrics[-k:]
        if len(recent) < k:
            return
        window = sum(m.step_time_s - m.rollout_only_s for m in recent)   # the trainer's own pace
        tail = max(self._gen_max)          # over the last 2K steps: one short tail must not relax it
        self.urgent_batch = cfg.urgent_batch_tight if tail >= window else cfg.urgent_batch

    def _count_dropped(self, reason: str, n: int) -> None:
        if n:
            self.dropped[reason] += n
            self._dropped_interval += n

    def _revoke(self, step: int) -> None:
        """A taken, untrained batch goes back to the queue (see on_dropped)."""
        batch, waited, taken_at = self._batches.pop(step)
        del self._taken[step]
        self.queue.untake(batch, step)
        self.totals["rollout_only_s"] -= waited
        self._trainer_idle_since = taken_at - waited
        self.trace.instant("trainer", "filter", f"revoke batch of step {step}", self.clock.now())

    def _pressure(self) -> bool:
        """Trigger 2. Utilisation: an instance holds more than (1 + queue_pressure) x its slots
        while another instance of its version has free slots (from our own counts, no RPC).
        KV: an instance's kv_used_fraction > kv_pressure (stats() RPCs, at most every kv_check_s)."""
        m, cfg, orch = self.manager, self.cfg, self.orch
        hot: set[int | None] = set()
        cold: set[int | None] = set()
        for n, inst in m.instances.items():
            load, slots = len(m.on_instance[n]), orch.slots_of(n)
            if load > (1 + cfg.queue_pressure) * slots:
                hot.add(inst.version)
            elif load < slots:
                cold.add(inst.version)
        if hot & cold:
            return True
        now = self.clock.now()
        if now - self._last_kv_check >= cfg.kv_check_s:
            self._last_kv_check = now
            if any(i.stats().kv_used_fraction > cfg.kv_pressure for i in m.instances.values()):
                return True
        return False

    def _rebalance(self) -> None:
        self._last_rebalance = self.clock.now()
        self.totals["rebalances"] += 1
        t0 = self.clock.now()
        moves = self.orch.rebalance(self.newest, self._room() + sum(len(x) for x in self._pending_retag),
                                    self.queue.next_step, self.cfg.max_staleness, self.urgent_batch,
                                    self.cfg.urgent_slack_steps)
        self._place_pending_retag()
        if moves:
            self.trace.instant("orchestrator", "rebalance", "rebalance", t0, moves=dict(moves))
        self._legacy_fill()

    def _room(self) -> int:
        """Trajectories the newest version may get now (R_sum up to RBS, staleness room)."""
        room = min(self.cfg.rollout_batch - self.manager.r_sum, self.queue.dispatch_room(self.newest))
        return max(0, room - room % self.cfg.group_size)

    def _dispatch(self) -> None:
        cfg, m, g = self.cfg, self.manager, self.cfg.group_size
        if m.exhausted:
            return
        if cfg.batch_barrier:
            # a whole batch once nothing is in flight; if filters dropped groups of the batch
            # being built, only the replacements for them (DAPO-style dynamic sampling)
            owed = -self.queue.untrained_total() % cfg.train_batch
            n = owed or cfg.train_batch
            if m.r_sum or self.queue.dispatch_room(self.newest) < n:
                return
            for name, inst in m.instances.items():   # barrier: everyone is empty; all move to newest
                if inst.version != self.newest:
                    self._load(name, self.newest)
            self._send(self.newest, n // g)
            return
        room = self._room()
        if room >= g:
            hosts = m.hosts(self.newest)
            if hosts:
                self._send(self.newest, room // g, hosts, self._allowance)

    def _send(self, version: int, n_groups: int, targets: list[str] | None = None,
              allowance: int | None = None) -> int:
        groups = self.manager.dispatch(version, n_groups, targets, allowance)
        for grp in groups:
            gid = grp[0].group_id
            self.queue.on_dispatched(gid, version, len(grp))
            self._dispatched += len(grp)
            self._members[gid] = [r.uid for r in grp]
            self._dispatched_at[gid] = self.clock.now()
            for r in grp:
                self._group_of[r.uid] = gid
        return len(groups)

    def _legacy_fill(self) -> None:
        """Older versions get new prompts only into idle slots, and only while they have at least
        `legacy_min_slack_steps` steps left before their data would become too stale."""
        cfg, m, g = self.cfg, self.manager, self.cfg.group_size
        if m.exhausted:
            return
        for v in sorted({i.version for i in m.instances.values() if i.version is not None}):
            if v >= self.newest or v + cfg.max_staleness - self.queue.next_step < cfg.legacy_min_slack_steps:
                continue
            idle = [n for n in m.hosts(v) if m.load(n) + g <= self.orch.slots_of(n)]
            if cfg.legacy_kv_max < 1:       # free slots are not idle when the KV cache is the limit
                idle = [n for n in idle if self._kv_room(n, cfg.legacy_kv_max)]
            slots = sum(self.orch.slots_of(n) - m.load(n) for n in idle)
            n = min(slots, self.queue.dispatch_room(v)) // g
            if n > 0:
                self._send(v, n, idle, self._allowance)

    def _kv_room(self, name: str, limit: float) -> bool:
        st = self.manager.instances[name].stats()
        return st.queued == 0 and st.kv_used_fraction < limit

    def _retag_unstarted(self, version: int) -> None:
        """Groups still waiting in an old version's queue have generated nothing: moving them to
        the new version keeps C1 (every token will come from `version`) and keeps them out of the
        drain the trainer waits on. Only whole groups move; anything that started goes back."""
        m, g = self.manager, self.cfg.group_size
        for name, inst in m.instances.items():
            if inst.version is None or inst.version >= version or not m.on_instance[name]:
                continue
            queued = inst.stats().queued
            if queued < g:
                continue
            uids = list(m.on_instance[name])[-queued:]
            states = inst.export(uids)
            reqs = {r.uid: r for r in m.forget(name, [s.uid for s in states])}
            by_group: dict[str, list] = {}
            for st in states:
                by_group.setdefault(st.group_id, []).append(st)
            back, moved = [], []
            for gid, sts in by_group.items():
                if (len(sts) == g and gid not in self._dropped_groups and all(st.tokens_done == 0 for st in sts)
                        and self.queue.dispatch_room(version) >= g):
                    self.queue.retag(gid, version)
                    self._dispatched_at[gid] = self.clock.now()     # its staleness clock restarts
                    grp = [reqs[st.uid] for st in sts]
                    for r in grp:
                        r.version = version
                    moved.append(grp)
                else:
                    back.extend(sts)
            if back:
                m.place(name, [reqs[st.uid] for st in back])
                inst.import_(back)
            self._retagged += sum(len(x) for x in moved)
            self.totals["retagged_requests"] += sum(len(x) for x in moved)
            self._pending_retag.extend(moved)

    def _place_pending_retag(self) -> None:
        """Submit retagged groups to hosts of the newest version once it has some."""
        m = self.manager
        hosts = m.hosts(self.newest)
        if not self._pending_retag or not hosts:
            return
        loads = {n: m.load(n) for n in hosts}
        per: dict[str, list[Request]] = {}
        for grp in self._pending_retag:
            if grp[0].version != self.newest:     # another version was published meanwhile
                self.queue.retag(grp[0].group_id, self.newest)
                for r in grp:
                    r.version = self.newest
            n = min(loads, key=loads.__getitem__)
            per.setdefault(n, []).extend(grp)
            loads[n] += len(grp)
        self._pending_retag = []
        for n, reqs in per.items():
            m.place(n, reqs)
            m.instances[n].submit(reqs)

    def _interrupt_and_resume(self, version: int) -> None:
        m = self.manager
        for name, inst in m.instances.items():
            states = inst.interrupt_all() if m.on_instance[name] else []
            reqs = {r.uid: r for r in m.forget(name, [s.uid for s in states])}
            self._load(name, version)
            for s in states:
                if s.tokens_done > 0:
                    seen = self._uid_versions.setdefault(s.uid, set(s.token_versions or (s.version,)))
                    seen.add(version)
                    self._reprefill += s.prompt_tokens + s.tokens_done
                    self.totals["reprefill_tokens"] += s.prompt_tokens + s.tokens_done
                s.version = version
                s.has_kv, s.kv_bytes = False, 0       # old-version KV is useless under new weights
                reqs[s.uid].version = version
            if states:
                m.place(name, [reqs[s.uid] for s in states])
                inst.import_(states)

    def _load(self, name: str, version: int) -> None:
        inst = self.manager.instances[name]
        now = self.clock.now()
        self._close_span(name, inst.version, now)
        inst.load_version(version)
        self.manager.versions_changed()
        self._hosting_since[name] = self.clock.now()
        self._loads += 1
        self.totals["weight_loads"] += 1
        self.trace.instant("orchestrator", "weights", f"load v{version}", now, instance=name)

    def _close_span(self, name: str, version: int | None, now: float) -> None:
        since = self._hosting_since.pop(name, None)
        if since is not None and version is not None:
            self.trace.span("rollout", name, f"v{version}", since, now, version=version)

    def _count_migration(self, n: int, kv_bytes: int) -> None:
        self._migrated += n
        self.totals["migrated_requests"] += n
        self.totals["migrated_kv_bytes"] += kv_bytes
