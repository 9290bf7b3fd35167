"""RolloutController: the one control code for every mode, driven by events.

Event-driven, no threads, no I/O: time only through `clock`, instances only through the
RolloutInstance protocol. The driver (simulator or real runtime) calls:

    c = RolloutController(config, instances, take_prompts, clock, trace=None)
    c.start()                               # load version 0, first dispatch
    c.on_finished(instance_name, done)      # trajectories completed (uids or Finished records)
    if c.trainer_ready(): batch = c.take_batch()     # exactly TBS trajectories, whole groups
    c.on_trained(step, version_after, consumed_uids) # the step is over (weights not yet served)
    c.on_published(version, lend=())        # new weights can be loaded by rollout instances
    c.on_dropped(uids, reason)              # a filter dropped these groups (e.g. DAPO dynamic sampling)
    c.tick()                                # periodically (every few seconds)
    c.lend(instances) / c.reclaim([names])  # elastic: trainer devices serve rollout while it waits
    c.evals.add(version, requests) ...      # held-out evaluation requests (eval_work.py)
    summary = c.finish()                    # end of run: accounting of every dispatched uid

The parts, one role each: RolloutManager (where every request is), TransferQueue (finished
trajectories, staleness), Ledger (accounting and step metrics), Dispatcher (sending prompts,
loading weights, moving requests), Lending (elastic trainer devices), and the mode's
RolloutPolicy (policies/: what each event means in that mode).
This class fixes the order in which they see each event.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..clock import Clock
from .config import RolloutConfig
from .dispatch import Dispatcher
from .elastic import Lending
from .eval_work import EvalWork
from .ledger import Ledger, StepMetrics
from .manager import RolloutManager
from .policies import POLICIES
from dora.observe.trace import TraceWriter
from .transfer_queue import TransferQueue
from .types import Finished, Request, RolloutInstance, Trajectory

__all__ = ["RolloutController", "StepMetrics"]


class RolloutController:
    def __init__(self, config: RolloutConfig, instances: Sequence[RolloutInstance],
                 take_prompts: Callable[[int], list[list[Request]]], clock: Clock,
                 trace: TraceWriter | None = None, initial_version: int = 0):
        self.cfg = cfg = config.resolved()
        if not instances:
            raise ValueError("RolloutController needs at least one rollout instance")
        self.clock = clock
        self.trace = trace or TraceWriter(enabled=False)
        self.manager = RolloutManager(list(instances), take_prompts, cfg.group_size)
        self.queue = TransferQueue(cfg.train_batch, cfg.group_size, cfg.max_staleness)
        self.queue.next_step = initial_version
        self.ledger = Ledger(cfg.train_batch, cfg.max_staleness, self.queue, self.trace)
        self.dispatch = Dispatcher(cfg, self.manager, self.queue, self.ledger, clock, self.trace, initial_version)
        self.evals = EvalWork(self)          # held-out evaluation requests (eval_work.py), apart from the books
        self.policy = POLICIES[cfg.mode](self)
        self.lending = Lending(self)

    # what drivers and tests read
    @property
    def newest(self) -> int:
        return self.dispatch.newest

    @property
    def step_metrics(self) -> list[StepMetrics]:
        return self.ledger.step_metrics

    @property
    def totals(self) -> dict[str, Any]:
        return self.ledger.totals

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        m, d = self.manager, self.dispatch
        for name in m.instances:
            m.slots_of(name)                     # one stats() per instance: learn its slots
        now = self.clock.now()
        self.ledger.last_step_end = self.ledger.trainer_idle_since = now
        self.policy.start(now)
        for name, inst in m.instances.items():
            if inst.version != d.newest:
                d.load(name, d.newest)
            else:
                d.hosting_since[name] = now
        self._dispatch()

    def finish(self) -> dict[str, Any]:
        """Account for every dispatched trajectory: trained, finished-but-untrained, or in flight."""
        now = self.clock.now()
        for name, inst in self.manager.instances.items():
            self.dispatch.close_span(name, inst.version, now)
        return self.ledger.account(self.manager.r_sum + self.dispatch.held() + self.policy.held())

    # -- events from rollout ----------------------------------------------------------------------
    def on_finished(self, instance_name: str, done: Sequence[str | Finished]) -> None:
        now = self.clock.now()
        ledger, queue = self.ledger, self.queue
        for d in done:
            f = Finished(d) if isinstance(d, str) else d
            r = self.manager.finished(f.uid)
            if r is None:
                ledger.c2_extra += 1         # finished twice or never dispatched here
                continue
            seen = self.policy.token_versions(f.uid)
            if ledger.finished(r.group_id, now) is not None:
                continue                     # the rest of a dropped group: discarded, accounted
            versions = f.token_versions if f.token_versions is not None else (
                tuple(sorted(seen)) if seen else (r.version,))
            gv = queue.group_version.get(r.group_id, r.version)
            queue.put(Trajectory(f.uid, r.group_id, gv, r.prompt_tokens, f.response_tokens,
                                 versions, now, r.payload if f.payload is None else f.payload))
        if self.manager.load(instance_name) == 0:
            self.policy.instance_drained(instance_name)
        self._dispatch()

    def on_tool_waits(self, instance_name: str, waiting: int) -> None:
        """An instance reports how many of its requests wait on a tool now (they hold no decode slot)."""
        if instance_name in self.manager.instances:
            self.manager.tool_waiting[instance_name] = int(waiting)

    def restore_finished(self, trajectories: Sequence[Trajectory]) -> None:
        """A resumed run: trajectories its checkpoint held finished but untrained join the queue as
        though they had just finished, each group whole and with the version it was generated by."""
        groups: dict[str, list[Trajectory]] = {}
        for t in trajectories:
            groups.setdefault(t.group_id, []).append(t)
        for gid, members in groups.items():
            self.ledger.restored(gid, members[0].version, [t.uid for t in members])
            for t in members:
                self.queue.put(t)

    # -- trainer side ---------------------------------------------------------------------------
    def trainer_ready(self) -> bool:
        return self.queue.ready()

    def take_batch(self) -> list[Trajectory]:
        step = self.queue.next_step
        batch = self.queue.take()
        self.ledger.taken_batch(step, batch, self.clock.now())
        self.policy.batch_taken()
        self._dispatch()                     # the room for new dispatches just grew
        return batch

    def on_trained(self, step: int, version_after: int, consumed_uids: Sequence[str]) -> None:
        live = len([v for v, n in self.manager.outstanding.items() if n])
        self.ledger.trained_step(step, version_after, consumed_uids, self.clock.now(), live)
        self.policy.after_step()

    def on_published(self, version: int, lend: Sequence[RolloutInstance] = ()) -> None:
        """`lend`: elastic instances that join at this publish (the trainer just went idle), as
        lend() does, but before the mode reacts to the new version, so a batch dispatched now
        (sync, one_step_off) spreads over them too."""
        if version <= self.dispatch.newest:
            return
        self.dispatch.newest = version
        self.trace.instant("trainer", "publish", f"publish v{version}", self.clock.now())
        if lend:
            self.lending.lend(lend)
        self.policy.on_published(version)
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
        ledger = self.ledger
        revoked: list[int] = []
        for u in uids:
            gid = ledger.group_of.get(u)
            if gid is None:
                ledger.totals["dropped_unknown"] += 1
                continue
            if gid in ledger.dropped_groups:
                continue
            members = ledger.members[gid]
            for step in sorted(ledger.taken, reverse=True):       # in a batch not yet trained: revoke
                if not ledger.taken[step].isdisjoint(members):
                    for s in sorted((s for s in ledger.taken if s >= step), reverse=True):
                        ledger.revoke(s, now)
                        revoked.append(s)
                    break
            ledger.dropped_groups[gid] = reason
            ledger.dispatched_at.pop(gid, None)
            pending = self.dispatch.release_pending(gid)   # retagged, not resubmitted: never generated
            finished = self.queue.drop_group(gid) or []
            ledger.count_dropped(reason, len(finished) + (len(pending) if pending else 0))
            self.trace.instant("trainer", "filter", f"drop {gid}", now, reason=reason, trajectories=len(members))
        self._dispatch()
        return sorted(set(revoked))

    def instance_replaced(self, name: str, reason: str = "replica_lost") -> tuple[list[str], list[int]]:
        """Instance `name` died with its requests and a new process (initial weights) took its place.
        The dead one's groups are dropped whole (members elsewhere are discarded as they finish) and
        counted under `reason`; the new one loads the newest version while empty, before anything is
        dispatched onto it (a switch with requests running would break C1). Returns (group ids,
        revoked steps, as on_dropped); the caller dispatches those groups again as new ones."""
        self.manager.versions_changed()   # the driver marked the new process's weights
        self.evals.aborted(list(self.evals.on[name]))   # (evaluation requests it held: placed again)
        lost = self.manager.forget(name, list(self.manager.on_instance[name]))
        self.dispatch.load(name, self.dispatch.newest)
        gids = sorted({r.group_id for r in lost})
        members = self.ledger.members
        revoked = self.on_dropped([members[g][0] for g in gids if g in members], reason)
        self.ledger.count_dropped(reason, len(lost))   # they will never finish: counted now
        return gids, revoked

    def tick(self) -> None:
        m = self.manager
        self.ledger.sample_idle(len(m.instances), sum(1 for n in m.instances if not m.on_instance[n]))
        self.ledger.sample_wait(self.clock.now())
        self.policy.on_tick()
        self._dispatch()

    def rebalance(self) -> None:
        """Run the orchestrator now (dora mode; a no-op in the others). The triggers call this
        themselves; a driver may also call it, e.g. when a replica joins or leaves."""
        if self.policy.rebalance():
            self._dispatch()

    def lend(self, instances: Sequence[RolloutInstance]) -> None:
        """Elastic: these instances (on trainer devices) serve the newest version until reclaim()."""
        self.lending.lend(instances)
        self._dispatch()

    def reclaim(self, names: Sequence[str] | None = None) -> dict[str, tuple[int, int]]:
        """Elastic: empty the lent instances (or those named; requests move with their KV) and drop
        them from the pool. Returns name -> (requests moved, KV bytes moved)."""
        out = self.lending.reclaim(names)
        self._dispatch()
        return out

    def _dispatch(self) -> None:
        self.dispatch.place_parked()
        if not self.manager.exhausted:
            self.policy.dispatch()
        if self.evals.busy() and not self.policy.evaluations_wait():
            self.evals.fill()                # what training work leaves room for
