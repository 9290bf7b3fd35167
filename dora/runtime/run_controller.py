"""The controller: plans placement, starts workers through a backend, wires channels, watches
heartbeats, and runs until every sink has finished (or the driver says done).

One process, one thread, one zmq ROUTER for all control traffic (workers' control and
heartbeat sockets connect to it). Edges named by the driver as managed go through the
controller: producers send them to the controller's own inbox, the driver sees each batch in
`on_batch(src_node, batch)` and forwards with `send(node, replica, port, batch)`.

Driver protocol (any object with these methods; all optional except done):
    managed_edges() -> list[(src_node, dst_node)]
    on_batch(src_node, batch)                 a batch produced on a managed edge
    on_event(node, replica, event: dict)      an op's ctx.report(event)
    wants(src_node) -> bool                   False holds batches from src (their credits too), so
                                              the producer stops when its edge capacity is held
    on_eos(src_node, dst_node)                every producer of a managed edge sent end-of-stream;
                                              a managed edge's consumer sees end-of-stream only when
                                              the driver calls close(dst, port) after its last send
    tick(now: float)                          called every loop iteration (~every 50 ms or sooner)
    done() -> bool                            True ends the run (workers are stopped)

Failure: a worker exception, exit, or missed heartbeats raises RunFailed naming the
replica (and its traceback); every wait has a deadline; shutdown kills what did not exit.
"""

from __future__ import annotations

import collections
import itertools
import shutil
import time
from typing import Any

import pyarrow as pa
import zmq

from dora.graph.model import Graph
from dora.graph.resolve import Resolved, resolve
from dora.runtime import security, wire
from dora.runtime.errors import CallError, ReplicaLost, RunFailed, WireError
from dora.runtime.managed_edges import ManagedEdges
from dora.runtime.placement import Inventory, Spares, gpu_shortfall, plan as make_plan
from dora.runtime.final_stats import collect_final_stats
from dora.runtime.startup import StartUp
from dora.runtime.supervision import Supervisor
from dora.runtime.worker_record import RunResult, WorkerRecord

# Every wait has a bound; none is a wall-clock limit on the run itself (that is the opt-in deadline_s).
START_TIMEOUT_S = 900.0    # worker start-up: imports, model load, engine start (a large model takes minutes)
STALL_TIMEOUT_S = 600.0    # inside one op call with no sign of progress (see OpContext.progress)


def _inventory(graph: Graph, backend: str) -> tuple[Inventory, str | None]:
    """The devices a run plans on, and why this machine cannot hold them (local backend only: on
    Ray the placement groups find GPUs anywhere in the cluster)."""
    if backend != "local" or not any(p.device == "gpu" for p in graph.pools.values()):
        return Inventory.planned(graph), None
    machine = Inventory.detect()
    problem = gpu_shortfall(graph, machine)
    return (Inventory.planned(graph) if problem else machine), problem


class Controller:
    def __init__(self, graph: Graph, backend: str = "local", driver: Any = None, run_dir: str | None = None,
                 seed: int = 0, deadline_s: float | None = None, hb_interval: float = 0.25, hb_timeout: float = 5.0,
                 start_timeout_s: float = START_TIMEOUT_S, stall_timeout_s: float = STALL_TIMEOUT_S,
                 backend_options: dict[str, Any] | None = None, resolved: Resolved | None = None,
                 restores: dict[str, dict[str, Any]] | None = None, secure: bool | None = None,
                 max_restarts: int = 0, live_s: float = 0.5, monitor: Any = None, spares: Spares | None = None):
        self.graph, self.driver, self.seed, self.deadline_s = graph, driver, seed, deadline_s
        # the settings every replica gets (params filled and derived, async after the mode's rules)
        self.resolved = resolved or resolve(graph)
        self.restores = restores or {}   # replica label -> its part of the checkpoint a resumed run starts from
        self.secure = secure             # CURVE on every socket (None: when the backend spans machines)
        self.call_depth = 0              # inside call(): a lost replica is only marked; the loop respawns it
        self.hb_interval, self.hb_timeout, self.start_timeout_s = hb_interval, hb_timeout, start_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.stop_requested: str | None = None   # set (e.g. by a signal handler) to end the run cleanly
        inventory, self.gpu_problem = _inventory(graph, backend)
        self.plan = make_plan(graph, inventory, spares=spares)   # spares: extra replicas on a host's devices
        self.backend_name, self.backend_options = backend, backend_options or {}
        self._own_run_dir = run_dir is None
        self.run_dir = run_dir
        self.backend: Any = None
        self.zctx: zmq.Context | None = None
        self.workers: dict[str, WorkerRecord] = {r.label: WorkerRecord(r.node, r.replica) for r in self.plan.replicas}
        self.managed = ManagedEdges(graph, driver)
        self.startup = StartUp(self)
        self.supervisor = Supervisor(self, max_restarts)
        self.failure: RunFailed | None = None
        self.events: collections.deque[tuple[str, int, dict]] = collections.deque()
        self.kept_events: list[tuple[str, int, dict]] = []
        self.replies: dict[int, tuple[dict, list]] = {}
        self.ids = itertools.count(1)
        self.stopping = False
        self.rejected_here = 0
        # workers sample live counters every live_s seconds (0 = off); `monitor.tick(controller)` is
        # called from every wait of this thread (the run dashboard's RunState keeps its own pace)
        self.live_s, self.monitor = live_s, monitor

    # ------------------------------------------------------------ public API

    def run(self) -> RunResult:
        t0 = time.monotonic()
        self.t_deadline = t0 + self.deadline_s if self.deadline_s else float("inf")
        ok = False
        try:
            self.startup.start()
            if not self.stop_requested:
                self._loop()
            collect_final_stats(self)   # exact totals for the result and the dashboard's last snapshot
            ok = True
            return self._result(ok, time.monotonic() - t0)
        finally:
            self._shutdown(graceful=ok)

    def call(self, node: str, replica: int, method: str, args: dict[str, Any] | None = None, timeout: float = 30.0,
             buffers: list[Any] = ()) -> Any:
        """Invoke a control method on one replica (op.call, or the worker built-ins ping/stats/pause/resume).

        Returns the op's result (a wire.WithBuffers when it sent raw buffers); raises CallError
        if the op raised, ReplicaLost if the replica died first (it will be respawned once no call
        is in progress), RunFailed if the run failed meanwhile, TimeoutError after `timeout`.
        """
        w = self._worker(node, replica)
        if w.lost is not None:
            raise ReplicaLost(w.label, w.lost)
        cid = next(self.ids)
        self.send_ctrl(w.label, {"kind": "call", "id": cid, "method": method, "args": args or {}}, buffers)
        deadline = time.monotonic() + timeout
        self.call_depth += 1
        try:
            while cid not in self.replies:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{w.label}.{method}() got no reply within {timeout} s")
                self.pump(20)
                self.supervisor.check()
                if w.lost is not None:
                    raise ReplicaLost(w.label, w.lost)
        finally:
            self.call_depth -= 1
        msg, bufs = self.replies.pop(cid)
        if not msg.get("ok"):
            raise CallError(node, replica, method, msg.get("error", "?"), msg.get("traceback"))
        return wire.WithBuffers(msg.get("result"), bufs) if bufs else msg.get("result")

    def send(self, node: str, replica: int, port: str, batch: pa.RecordBatch, timeout: float = 60.0) -> None:
        """Feed a managed input edge directly: `batch` goes to `node[replica]` on `port`.
        Blocks (pumping control traffic) while the edge has no credit, up to `timeout`."""
        self.managed.send(node, replica, port, batch, timeout, self._wait)

    def close(self, node: str, port: str, timeout: float = 60.0) -> None:
        """End-of-stream on a managed input edge (after the driver's last send)."""
        self.managed.close(node, port, timeout, self._wait)

    def endpoint(self, node: str, replica: int) -> str | None:
        return self._worker(node, replica).endpoint

    def rejected(self) -> int:
        """Wire messages rejected so far, over every worker (their heartbeats carry the count) and here."""
        inbox = self.managed.inbox
        return sum(w.rejected for w in self.workers.values()) + self.rejected_here + (inbox.rejected if inbox else 0)

    @property
    def respawn_log(self) -> list[dict[str, Any]]:
        return self.supervisor.respawn_log

    def pids(self) -> dict[str, int | None]:
        return {label: w.pid for label, w in self.workers.items()}

    def deliver_events(self) -> None:
        """Hand the events received so far to the driver (a driver may call it from inside a hook)."""
        d = self.driver
        while self.events:
            node, r, ev = self.events.popleft()
            if d is not None and hasattr(d, "on_event"):
                d.on_event(node, r, ev)
            else:
                self.kept_events.append((node, r, ev))

    # ------------------------------------------------------------ start-up (dora/runtime/startup.py)

    def _worker(self, node: str, replica: int) -> WorkerRecord:
        w = self.workers.get(f"{node}[{replica}]")
        if w is None:
            raise ValueError(f"no replica {node}[{replica}] (replicas: {sorted(self.workers)})")
        return w

    def send_ctrl(self, label: str, msg: dict[str, Any], buffers: list[Any] = ()) -> None:
        self.ctrl.send_multipart([label.encode(), *wire.encode_control(msg, list(buffers))], copy=False)

    # ------------------------------------------------------------ the loop

    def pump(self, timeout_ms: int) -> None:
        """Handle every control message waiting (waiting up to timeout_ms for the first)."""
        if self.monitor is not None:
            self.monitor.tick(self)
        if not self.ctrl.poll(timeout_ms):
            return
        while True:
            try:
                frames = self.ctrl.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            ident = frames[0].bytes.decode(errors="replace")
            try:
                msg, bufs = wire.decode_control(frames[1:])
            except WireError:
                self.rejected_here += 1
                continue
            self._on_ctrl(ident, msg, bufs)

    def _on_ctrl(self, ident: str, msg: dict[str, Any], bufs: list[memoryview]) -> None:
        kind = msg["kind"]
        if kind == "hb":
            w = self.workers.get(ident.removesuffix("#hb"))
            if w is not None:
                w.on_heartbeat(msg, time.monotonic())
                self.ctrl.send_multipart([ident.encode(), b"ack"])
            return
        w = self.workers.get(ident)
        if w is None:
            self.rejected_here += 1
            return
        w.last_hb = time.monotonic()
        if kind == "hello":
            self.startup.on_hello(w, msg)
        elif kind in ("ready", "finished") or (kind == "error" and not self.stopping):
            w.on_report(msg)
        elif kind == "reply":
            self.replies[msg.get("id")] = (msg, bufs)
        elif kind == "event":
            event = msg.get("event")
            if isinstance(event, dict) and event.get("kind") == "rendezvous":
                self.startup.on_rendezvous(w, event)
            else:
                self.events.append((w.node, w.replica, event))
        elif kind == "rejected":
            self.events.append((w.node, w.replica, {"kind": "wire_rejected", "error": msg.get("error")}))

    def _wait(self) -> None:
        """One short wait of a blocking call: control traffic handled, health checked."""
        self.pump(5)
        self.supervisor.check()

    def _sinks_done(self) -> bool:
        sinks = [n for n in self.graph.nodes if not self.graph.consumers(n)]
        return all(w.state == "finished" for w in self.workers.values() if w.node in sinks)

    def _loop(self) -> None:
        d = self.driver
        sinks_done_at = 0.0
        while True:
            self.pump(20)
            self.supervisor.check()
            self.managed.pump()
            self.deliver_events()
            if d is not None and hasattr(d, "tick"):
                d.tick(time.monotonic())
            if d is not None and d.done():
                return
            if self._sinks_done():
                # upstream replicas sent EOS before their "finished" report; wait briefly for those
                # reports so every replica's final stats are in the result
                sinks_done_at = sinks_done_at or time.monotonic()
                if all(w.state == "finished" for w in self.workers.values()) or time.monotonic() - sinks_done_at > 5.0:
                    return
            if self.stop_requested:
                if d is not None and hasattr(d, "on_stop"):
                    d.on_stop(self.stop_requested)   # e.g. stop dispatch and checkpoint, workers still up
                    self.deliver_events()            # what the trainer reported meanwhile (its last step)
                return
            if time.monotonic() > self.t_deadline:
                unfinished = sorted(w.label for w in self.workers.values() if w.state != "finished")
                raise RunFailed(f"run exceeded its deadline of {self.deadline_s:.0f} s; unfinished replicas: {unfinished}")

    # ------------------------------------------------------------ the end

    def _result(self, ok: bool, elapsed: float) -> RunResult:
        stats = {w.label: w.stats for w in self.workers.values()}
        return RunResult(ok, elapsed, stats, self.rejected(), self.kept_events, self.plan, self.run_dir)

    def _shutdown(self, graceful: bool) -> None:
        self.stopping = True
        if self.zctx is None:
            return
        try:
            try:
                for w in self.workers.values():
                    self.send_ctrl(w.label, {"kind": "stop"})
            except zmq.ZMQError:
                pass
            if self.backend is not None:
                self.backend.shutdown(timeout_s=10.0 if graceful else 2.0)
        except KeyboardInterrupt:
            # a second signal during the graceful wait means "at once": kill what is left, then go on
            if self.backend is not None:
                self.backend.shutdown(timeout_s=0.0)
            raise
        finally:
            # whatever interrupted the above, close every socket without linger: a context left to the
            # garbage collector would block the interpreter's exit on messages to dead workers
            self.managed.close_all()
            self.ctrl.close(0)
            security.release(self.zctx)
            security.install(None)
            self.zctx.destroy(linger=0)
        if graceful and self._own_run_dir and self.run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
