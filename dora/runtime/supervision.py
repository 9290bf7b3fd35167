"""Watching a run's workers: an exit, missed heartbeats, a stall inside one op call, or a raised
exception. A replica the driver calls respawnable (and whose restart budget lasts) is started again
where it was: same inbox endpoint, fresh connections to its neighbours, then the driver reissues
what it held (`on_replica_lost`). Anything else fails the run naming the replica."""

from __future__ import annotations

import collections
import time
from typing import Any

from dora.runtime.errors import RunFailed
from dora.runtime.worker_record import WorkerRecord


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
            c.failure = RunFailed(f"worker {w.label} (node {w.node!r}, replica {w.replica}) {why}{budget}",
                                  w.node, w.replica, traceback, bad_input=w.bad_input and not respawn)
            raise c.failure
        w.lost, w.lost_exited = why, exited   # respawned by check() once no call is in progress

    def _respawn(self, w: WorkerRecord, why: str, exited: bool) -> None:
        """Start replica w again where it was: same inbox endpoint, fresh connections to its neighbours;
        then the driver reissues what the dead replica held (on_replica_lost), onto a live replica."""
        c = self.c
        label, t0 = w.label, time.monotonic()
        if not exited:
            c.backend.kill(label)   # a hung, stalled or failed process goes first
        fresh = self._start_again(w, why)
        c.send_ctrl(label, c.startup.wiring(w.node, w.replica))
        fresh.state = "running"
        g = c.graph
        neighbours = {e.src for e in g.producers(w.node)} | {e.dst for e in g.consumers(w.node)}
        for other in c.workers.values():
            if other.node in neighbours and other.label != label:
                c.send_ctrl(other.label, {"kind": "peer_respawned", "label": label})
        c.managed.replica_respawned(label, w.node, w.replica)
        fresh.lost = None
        if hasattr(c.driver, "on_replica_lost"):
            c.driver.on_replica_lost(w.node, w.replica, why)
        self.respawn_log.append({"replica": label, "why": why.splitlines()[0], "seconds": time.monotonic() - t0,
                                 "ready_at": time.time()})   # wall clock: benchmarks/lifecycle.py times kill -> work again

    def _start_again(self, w: WorkerRecord, why: str) -> WorkerRecord:
        """A fresh process for w's replica, ready (retried within the restart budget)."""
        c, label = self.c, w.label
        while True:
            self.restarts[label] += 1
            # lost until the driver has heard of it: calls made meanwhile (driver hooks run while the
            # control loop pumps) fail fast instead of reaching a process whose state nobody tracks
            fresh = WorkerRecord(w.node, w.replica, last_hb=time.monotonic(), endpoint=w.endpoint, lost=why)
            c.workers[label] = fresh
            c.backend.start([c.launches[label]])
            problem = self._await_ready(fresh, time.monotonic() + c.start_timeout_s)
            if problem is None:
                return fresh
            if self.restarts[label] >= self.max_restarts:   # a replica that cannot start is not retried forever
                c.failure = RunFailed(f"worker {label} (node {w.node!r}, replica {w.replica}) {why}; its respawn "
                                      f"{problem} (after {self.restarts[label]} respawn(s))", w.node, w.replica)
                raise c.failure

    def _await_ready(self, fresh: WorkerRecord, deadline: float) -> str | None:
        """Wait for a respawned replica to report ready; what went wrong if it did not. Other replicas
        that exit meanwhile are marked lost (their own respawn follows), never dropped."""
        c = self.c
        while fresh.state != "ready":
            for lb, how in c.backend.exited():
                if lb == fresh.label:
                    return f"exited during start-up ({how})"
                self.failed(c.workers[lb], how, exited=True)
            if time.monotonic() > deadline:
                c.backend.kill(fresh.label)
                return f"did not come up within {c.start_timeout_s:.0f} s"
            c.pump(50)
        return None
