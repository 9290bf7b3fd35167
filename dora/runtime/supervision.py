"""Watching a run's workers: an exit, missed heartbeats, a stall inside one op call, or a raised
exception. A replica the driver calls respawnable (and whose restart budget lasts) is started again
where it was: same inbox endpoint, fresh connections to its neighbours, then the driver reissues
what it held (`on_replica_lost`). The ranks of a process group (a sharded op) go together: one lost
rank takes the others down, and all start again at once (a fresh rendezvous). Before the new
processes start, `driver.before_respawn(node, why)` may prepare and name what each restores from
(label -> its OpContext.restore). Anything else fails the run naming the replica: a raised exception
at once, but for a rank of a process group, whose peer's death may be what it raised on (it is given
PEER_DEATH_GRACE_S for that death to be seen)."""

from __future__ import annotations

import collections
import time
from typing import Any

from dora.runtime.errors import RunFailed
from dora.runtime.worker_record import WorkerRecord

GROUP_LOST = "its process group lost"   # why the other ranks of a process group go with a lost one
# A rank of a process group that raises may have raised because a peer died inside a collective they
# shared (gloo: "Connection reset by peer"); its report can arrive before the backend sees the peer's
# exit. Its error fails the run only if no peer is found lost this long after it: the local backend
# sees an exit at its next poll, Ray within its actor-death notice.
PEER_DEATH_GRACE_S = 5.0


class Supervisor:
    def __init__(self, controller, max_restarts: int):
        """`controller`: the Controller whose workers this watches (its backend, workers, driver)."""
        self.c = controller
        self.max_restarts = max_restarts   # respawns per replica, for the nodes the driver calls respawnable
        self.restarts: collections.Counter[str] = collections.Counter()
        self.respawn_log: list[dict[str, Any]] = []   # {replica, why, seconds until it took work again}

    def check(self) -> None:
        """Raise the run's failure, mark lost replicas, and respawn them when no call is in progress."""
        c = self.c
        if c.failure is not None:
            raise c.failure
        for label, why in c.backend.exited():
            if not c.stopping:
                tail = c.backend.log_tail(label) if hasattr(c.backend, "log_tail") else ""
                self.failed(c.workers[label], why + (f"\n--- last lines of its log ---\n{tail}" if tail else ""), exited=True)
        now = time.monotonic()
        for w in list(c.workers.values()):
            if w.lost is not None:
                continue
            if w.error is not None:   # a raised exception is a bug in op code: a fresh process would raise it again
                if self._group_of(w) and now - w.error_at < PEER_DEATH_GRACE_S:
                    continue   # (unless a peer's death broke their collective: its exit, seen a moment later, is the cause)
                self.failed(w, *w.error, respawn=False)
            # before the first heartbeat a worker is importing: the start deadline covers it
            elif w.state != "starting" and now - w.last_hb > c.hb_timeout:
                self.failed(w, f"(pid {w.pid}) missed heartbeats for {now - w.last_hb:.1f} s (hb_timeout "
                               f"{c.hb_timeout} s): frozen, stopped (SIGSTOP) or starved")
            elif w.stalled_s > c.stall_timeout_s:
                self.failed(w, f"(pid {w.pid}) made no progress for {w.stalled_s:.0f} s inside {w.where}() "
                               f"(stall timeout {c.stall_timeout_s:.0f} s): the op hangs while its process lives")
        if c.call_depth == 0:   # never from inside a call: the driver's state must not change under it
            for w in [w for w in c.workers.values() if w.lost is not None]:
                self._respawn(w, w.lost, w.lost_exited)

    def failed(self, w: WorkerRecord, why: str, traceback: str | None = None, exited: bool = False,
               respawn: bool = True) -> None:
        """A replica died, froze or stalled: respawn it when the driver allows and its restart budget
        lasts (the driver reissues what it held), else fail the run naming it. One that raised fails the
        run at once (respawn=False), naming the row it raised on."""
        c = self.c
        d = c.driver
        may = (respawn and d is not None and hasattr(d, "respawnable") and d.respawnable(w.node)
               and self.restarts[w.label] < self.max_restarts and not c.stopping)
        if not may:
            budget = f" after {self.restarts[w.label]} respawn(s)" if self.restarts[w.label] else ""
            refusal = d.why_not_respawned(w.node) if respawn and hasattr(d, "why_not_respawned") else None
            budget += f" (not restarted: {refusal})" if refusal else ""
            c.failure = RunFailed(f"worker {w.label} (node {w.node!r}, replica {w.replica}) {why}{budget}",
                                  w.node, w.replica, traceback, bad_input=w.bad_input and not respawn)
            raise c.failure
        w.lost, w.lost_exited = why, exited   # respawned by check() once no call is in progress
        for mate in self._group_of(w):        # its process group cannot go on without it
            if mate.lost is None:
                mate.lost, mate.lost_exited = f"{GROUP_LOST} {w.label}", False

    def _group_of(self, w: WorkerRecord) -> list[WorkerRecord]:
        """The other ranks of w's process group (none for a replica of its own)."""
        c = self.c
        if w.node not in c.plan.groups:
            return []
        return [x for x in c.workers.values() if x.node == w.node and x.label != w.label]

    def _respawn(self, w: WorkerRecord, why: str, exited: bool) -> None:
        """Start replica w again where it was (with the rest of its process group): same inbox
        endpoint, fresh connections to its neighbours; then the driver reissues what the dead replica
        held (on_replica_lost), onto a live replica."""
        c = self.c
        if c.workers.get(w.label) is not w:
            return   # respawned already, with its process group
        t0 = time.monotonic()
        lost = [w] + self._group_of(w)
        w, why = next(((x, x.lost) for x in lost if not x.lost.startswith(GROUP_LOST)), (w, why))   # (the first to die)
        for x in lost:
            if not (x.lost_exited or (x is lost[0] and exited)):
                c.backend.kill(x.label)   # a hung, stalled or failed process goes first
        restores = c.driver.before_respawn(w.node, why) if hasattr(c.driver, "before_respawn") else None
        fresh = self._start_again(lost, why, restores or {})
        g = c.graph
        neighbours = {e.src for e in g.producers(w.node)} | {e.dst for e in g.consumers(w.node)}
        for f in fresh:
            c.send_ctrl(f.label, c.startup.wiring(f.node, f.replica))
            f.state = "running"
        for f in fresh:
            for other in c.workers.values():
                if other.node in neighbours and other.label != f.label:
                    c.send_ctrl(other.label, {"kind": "peer_respawned", "label": f.label})
            c.managed.replica_respawned(f.label, f.node, f.replica)
            f.lost = None
        if hasattr(c.driver, "on_replica_lost"):
            c.driver.on_replica_lost(w.node, w.replica, why)
        self.respawn_log.append({"replica": w.label, "why": why.splitlines()[0], "seconds": time.monotonic() - t0,
                                 "ready_at": time.time()})   # wall clock: benchmarks/lifecycle.py times kill -> work again

    def _start_again(self, lost: list[WorkerRecord], why: str, restores: dict) -> list[WorkerRecord]:
        """Fresh processes for these replicas (one, or a whole process group), ready (retried within
        the restart budget). `restores`: label -> what the new process restores from."""
        c, first = self.c, lost[0]
        while True:
            fresh = []
            for w in lost:
                self.restarts[w.label] += 1
                # lost until the driver has heard of it: calls made meanwhile (driver hooks run while the
                # control loop pumps) fail fast instead of reaching a process whose state nobody tracks
                f = WorkerRecord(w.node, w.replica, last_hb=time.monotonic(), endpoint=w.endpoint, lost=why)
                c.workers[w.label].succeeded_by(f)   # (the record of the process that died, or of a failed retry)
                c.workers[w.label] = f
                fresh.append(f)
            c.restores.update(restores)                 # (config() takes each once)
            c.startup.rendezvous.pop(first.node, None)  # a process group binds a new one
            c.backend.start([c.launches[f.label] for f in fresh])
            problem = self._await_ready(fresh, time.monotonic() + c.start_timeout_s)
            if problem is None:
                return fresh
            if self.restarts[first.label] >= self.max_restarts:   # a replica that cannot start is not retried forever
                c.failure = RunFailed(f"worker {first.label} (node {first.node!r}, replica {first.replica}) {why}; its "
                                      f"respawn {problem} (after {self.restarts[first.label]} respawn(s))",
                                      first.node, first.replica)
                raise c.failure

    def _await_ready(self, fresh: list[WorkerRecord], deadline: float) -> str | None:
        """Wait for respawned replicas to report ready; what went wrong if one did not (the others
        are then stopped too). Other replicas that exit meanwhile are marked lost (their own respawn
        follows), never dropped."""
        c = self.c
        labels = {f.label for f in fresh}
        problem = None
        while problem is None and not all(f.state == "ready" for f in fresh):
            for lb, how in c.backend.exited():
                if lb in labels:
                    problem = f"{lb} exited during start-up ({how})"
                else:
                    self.failed(c.workers[lb], how, exited=True)
            if problem is None and time.monotonic() > deadline:
                problem = f"did not come up within {c.start_timeout_s:.0f} s"
            if problem is None:
                c.pump(50)
        if problem is not None:
            for f in fresh:
                c.backend.kill(f.label)
        return problem
