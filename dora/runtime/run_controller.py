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
import dataclasses
import itertools
import os
import shutil
import tempfile
import time
from typing import Any

import pyarrow as pa
import zmq

from dora.graph.model import Graph
from dora.graph.resolve import Resolved, resolve
from dora.runtime import security, wire
from dora.runtime.allocator import tune_malloc
from dora.runtime.backends import Launch, get_backend
from dora.runtime.channel import Delivery, Inbox, OutEdge, bind_router
from dora.runtime.errors import CallError, ReplicaLost, RunFailed, WireError
from dora.runtime.placement import Inventory, Plan, Spares, gpu_shortfall, plan as make_plan
from dora.runtime.security import RunKeys

CONTROLLER = "controller"  # the sender label of batches the controller forwards on managed edges
# Every wait has a bound; none is a wall-clock limit on the run itself (that is the opt-in deadline_s).
START_TIMEOUT_S = 900.0    # worker start-up: imports, model load, engine start (a large model takes minutes)
STALL_TIMEOUT_S = 600.0    # inside one op call with no sign of progress (see OpContext.progress)


@dataclasses.dataclass
class RunResult:
    ok: bool
    elapsed_s: float
    stats: dict[str, dict[str, Any]]          # "node[r]" -> worker stats at finish (rows/bytes in & out per edge)
    rejected: int                             # wire messages rejected, summed over workers and the controller
    events: list[tuple[str, int, dict]]       # (node, replica, event) when no driver took them
    plan: Plan
    run_dir: str | None = None


@dataclasses.dataclass
class _W:
    node: str
    replica: int
    state: str = "starting"     # starting | configured | ready | running | finished
    pid: int | None = None
    host: str | None = None     # the address it reported in hello (rank 0 of a group binds its rendezvous there)
    endpoint: str | None = None
    last_hb: float = 0.0
    rejected: int = 0
    stalled_s: float = 0.0      # from heartbeats: inside one op call this long without progress
    error: tuple[str, str | None] | None = None   # (what, traceback) the op raised
    lost: str | None = None     # why it is being replaced (respawn pending or under way)
    lost_exited: bool = False
    where: str = "?"            # the op method it is in
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    live: dict[str, Any] | None = None   # the worker's latest live counters (see Worker.sample_live)
    live_at: float = 0.0                 # when they last changed
    in_op: bool = False                  # its last heartbeat came while it was inside an op method

    @property
    def label(self) -> str:
        return f"{self.node}[{self.replica}]"


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
        self.max_restarts = max_restarts   # respawns per replica, for the nodes the driver calls respawnable
        self.restarts: collections.Counter[str] = collections.Counter()
        self._call_depth = 0   # inside call(): a lost replica is only marked; the loop respawns it
        self.respawn_log: list[dict[str, Any]] = []   # {replica, why, seconds until it took work again}
        self.hb_interval, self.hb_timeout, self.start_timeout_s = hb_interval, hb_timeout, start_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.stop_requested: str | None = None   # set (e.g. by a signal handler) to end the run cleanly
        inventory, self.gpu_problem = _inventory(graph, backend)
        self.plan = make_plan(graph, inventory, spares=spares)   # spares: extra replicas on a host's devices
        self.rendezvous: dict[str, dict[str, Any]] = {}   # process group (node) -> {"host", "port"} its rank 0 bound
        self.backend_name, self.backend_options = backend, backend_options or {}
        self._own_run_dir = run_dir is None
        self.run_dir = run_dir
        self.backend: Any = None
        self.zctx: zmq.Context | None = None
        self.workers: dict[str, _W] = {r.label: _W(r.node, r.replica) for r in self.plan.replicas}
        self.managed = self._managed_edges()
        self.failure: RunFailed | None = None
        self.events: collections.deque[tuple[str, int, dict]] = collections.deque()
        self.kept_events: list[tuple[str, int, dict]] = []
        self.replies: dict[int, tuple[dict, list]] = {}
        self.ids = itertools.count(1)
        self.stopping = False
        self.rejected_here = 0
        self.held: dict[str, collections.deque] = {}   # src node -> managed batches (and end-of-stream marks) not yet taken
        # Workers sample live counters every live_s seconds (0 = off); `monitor.tick(controller)`
        # is called from every wait of this thread (it keeps its own pace: the run dashboard's
        # RunState rebuilds its snapshot once a second)
        self.live_s, self.monitor = live_s, monitor

    # ------------------------------------------------------------ public API

    def run(self) -> RunResult:
        t0 = time.monotonic()
        self.t_deadline = t0 + self.deadline_s if self.deadline_s else float("inf")
        ok = False
        try:
            self._start()
            if not self.stop_requested:
                self._loop()
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
        self._send_ctrl(w.label, {"kind": "call", "id": cid, "method": method, "args": args or {}}, buffers)
        deadline = time.monotonic() + timeout
        self._call_depth += 1
        try:
            while cid not in self.replies:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{w.label}.{method}() got no reply within {timeout} s")
                self._pump(20)
                self._check_health()
                if w.lost is not None:
                    raise ReplicaLost(w.label, w.lost)
        finally:
            self._call_depth -= 1
        msg, bufs = self.replies.pop(cid)
        if not msg.get("ok"):
            raise CallError(node, replica, method, msg.get("error", "?"), msg.get("traceback"))
        return wire.WithBuffers(msg.get("result"), bufs) if bufs else msg.get("result")

    def send(self, node: str, replica: int, port: str, batch: pa.RecordBatch, timeout: float = 60.0) -> None:
        """Feed a managed input edge directly: `batch` goes to `node[replica]` on `port`.
        Blocks (pumping control traffic) while the edge has no credit, up to `timeout`."""
        out = self._managed_out(node, port)
        out.put(batch, target=replica)
        self._flush(out, timeout)

    def close(self, node: str, port: str, timeout: float = 60.0) -> None:
        """End-of-stream on a managed input edge (after the driver's last send)."""
        out = self._managed_out(node, port)
        self._flush(out, timeout)
        out.send_eos()

    def endpoint(self, node: str, replica: int) -> str | None:
        return self._worker(node, replica).endpoint

    def rejected(self) -> int:
        """Wire messages rejected so far, over every worker (their heartbeats carry the count) and here."""
        return (sum(w.rejected for w in self.workers.values()) + self.rejected_here
                + (self.inbox.rejected if getattr(self, "inbox", None) else 0))

    def pids(self) -> dict[str, int | None]:
        return {label: w.pid for label, w in self.workers.items()}

    # ------------------------------------------------------------ setup

    def _managed_edges(self) -> dict[str, Any]:
        pairs = list(self.driver.managed_edges()) if self.driver is not None and hasattr(self.driver, "managed_edges") else []
        out = {}
        for src, dst in pairs:
            found = [e for e in self.graph.edges if e.src == src and e.dst == dst]
            if not found:
                raise ValueError(f"driver manages edge {src} -> {dst}, but the graph has no data edge from {src!r} to {dst!r}")
            for e in found:
                out[e.label] = e
        return out

    def _worker(self, node: str, replica: int) -> _W:
        w = self.workers.get(f"{node}[{replica}]")
        if w is None:
            raise ValueError(f"no replica {node}[{replica}] (replicas: {sorted(self.workers)})")
        return w

    def _send_ctrl(self, label: str, msg: dict[str, Any], buffers: list[Any] = ()) -> None:
        self.ctrl.send_multipart([label.encode(), *wire.encode_control(msg, list(buffers))], copy=False)

    def _start(self) -> None:
        if self.gpu_problem:
            raise RunFailed(self.gpu_problem)
        if self.run_dir is None:
            self.run_dir = tempfile.mkdtemp(prefix="dora-run-")
        os.makedirs(os.path.join(self.run_dir, "logs"), exist_ok=True)
        self.backend = get_backend(self.backend_name, **self.backend_options)
        tune_malloc()                    # the controller receives managed edges' batches too
        keys = None
        if self.secure or (self.secure is None and getattr(self.backend, "multi_node", False)):
            keys = RunKeys.generate()    # per run; workers get them with their start arguments
            security.install(keys)
        self.zctx = zmq.Context()
        self.ctrl, self.ctrl_endpoint = bind_router(self.zctx, self.backend.host)
        self.inbox = Inbox(self.zctx, self.backend.host) if self.managed else None
        for e in self.managed.values():
            self.inbox.expect(e.label, e.src, [f"{e.src}[{r}]" for r in range(self.plan.data_replicas(e.src))],
                              e.capacity, e.capacity_bytes)
        self.outs: dict[tuple[str, str], OutEdge] = {}
        launches = [Launch(r.node, r.replica, self.ctrl_endpoint, r.env, r.pool, r.kind, r.slot,
                           os.path.join(self.run_dir, "logs", f"{r.node}-{r.replica}.log"), keys=keys and keys.to_dict(),
                           devices=r.devices)
                    for r in self.plan.replicas]
        self.launches = {ln.label: ln for ln in launches}   # kept: a respawn starts the same replica again
        self.backend.start(launches)
        now = time.monotonic()
        for w in self.workers.values():
            w.last_hb = now
        deadline = now + self.start_timeout_s
        while not all(w.state == "ready" for w in self.workers.values()):
            if self.stop_requested:
                return   # stopped while starting: nothing to checkpoint yet
            if time.monotonic() > min(deadline, self.t_deadline):
                late = [w.label + self._waits_for(w) for w in self.workers.values() if w.state != "ready"]
                raise RunFailed(f"workers not ready within {self.start_timeout_s:.0f} s: {late} "
                                f"(dora run --start-timeout raises the bound; their logs are in {self.run_dir}/logs)")
            self._pump(50)
            self._check_health()
        for w in self.workers.values():
            self.plan.get(w.node, w.replica).endpoint = w.endpoint
        for e in self.managed.values():
            eps = [self.workers[f"{e.dst}[{r}]"].endpoint for r in range(self.plan.data_replicas(e.dst))]
            self.outs[(e.dst, e.dst_port)] = OutEdge(self.zctx, e.label, eps, CONTROLLER, "round_robin", None, e.capacity, e.capacity_bytes)
        for w in self.workers.values():
            self._send_ctrl(w.label, self._wiring(w.node, w.replica))
            w.state = "running"

    def _config(self, w: _W) -> dict[str, Any]:
        n, rp = self.graph.nodes[w.node], self.plan.get(w.node, w.replica)
        return {"kind": "config", "op": n.op, "params": self.resolved.params[w.node], "replicas": n.replicas,
                "model": self.graph.model, "device": rp.device, "threads": rp.threads, "seed": self.seed,
                "run_dir": self.run_dir, "async": self.resolved.async_.to_dict(), "hb_interval": self.hb_interval,
                "restore": self.restores.pop(w.label, None),   # restored once: a respawned replica starts clean
                "bind": w.endpoint, "hb_timeout": max(30.0, 4 * self.hb_timeout), "live_s": self.live_s,
                "devices": rp.devices, "rendezvous": self._rendezvous_of(w)}

    # ------------------------------------------------------------ process groups (sharded ops)
    # Rank 0 of a group gets {"host": its own address, "port": 0}: it binds a free port there and
    # reports {"kind": "rendezvous", "port"}; the other ranks get their config (with that address)
    # only then, so no port is guessed for another machine.

    def _rendezvous_of(self, w: _W) -> dict[str, Any] | None:
        if w.node not in self.plan.groups:
            return None
        if w.replica == 0:
            return {"host": w.host or "127.0.0.1", "port": 0}
        return self.rendezvous.get(w.node)   # set before ranks 1.. are configured (_on_hello)

    def _on_hello(self, w: _W, msg: dict[str, Any]) -> None:
        w.pid, w.host = msg.get("pid"), msg.get("host")
        if w.node in self.plan.groups and w.replica > 0 and w.node not in self.rendezvous:
            return   # configured once rank 0 has bound its rendezvous port (_on_rendezvous)
        w.state = "configured"
        self._send_ctrl(w.label, self._config(w))

    def _on_rendezvous(self, w: _W, event: dict[str, Any]) -> None:
        if w.node not in self.plan.groups or w.replica != 0 or w.node in self.rendezvous:
            self.rejected_here += 1
            return
        self.rendezvous[w.node] = {"host": str(event["host"]), "port": int(event["port"])}
        for other in self.workers.values():
            if other.node == w.node and other.replica > 0 and other.pid is not None and other.state == "starting":
                other.state, other.last_hb = "configured", time.monotonic()   # its heartbeats start with the config
                self._send_ctrl(other.label, self._config(other))

    def _waits_for(self, w: _W) -> str:
        if w.node in self.plan.groups and w.replica > 0 and w.node not in self.rendezvous:
            return f" (waits for {w.node}[0], rank 0, to bind the group's rendezvous)"
        return "" if w.pid is not None else " (never said hello)"

    def _wiring(self, node: str, replica: int = 0) -> dict[str, Any]:
        g = self.graph
        if node in self.plan.groups and replica > 0:
            # ranks 1.. of a process group get their work from rank 0 over the group, not from edges
            return {"kind": "start", "outputs": [], "inputs": [], "is_source": False}
        outputs = []
        for e in g.consumers(node):
            if e.label in self.managed:
                eps, rt, gb, who = [self.inbox.endpoint], "round_robin", None, [CONTROLLER]
            else:
                who = [f"{e.dst}[{r}]" for r in range(self.plan.data_replicas(e.dst))]
                eps = [self.workers[label].endpoint for label in who]
                rt, gb = e.routing, e.group_by
            outputs.append({"edge": e.label, "endpoints": eps, "consumers": who, "routing": rt, "group_by": gb,
                            "capacity": e.capacity, "capacity_bytes": e.capacity_bytes})
        inputs = []
        for e in g.producers(node):
            senders = [CONTROLLER] if e.label in self.managed else [f"{e.src}[{r}]" for r in range(self.plan.data_replicas(e.src))]
            inputs.append({"edge": e.label, "port": e.dst_port, "senders": senders, "capacity": e.capacity,
                           "capacity_bytes": e.capacity_bytes})
        return {"kind": "start", "outputs": outputs, "inputs": inputs, "is_source": not g.nodes[node].inputs}

    # ------------------------------------------------------------ the loop

    def _pump(self, timeout_ms: int) -> None:
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
                w.last_hb = time.monotonic()
                w.rejected = int(msg.get("rejected") or 0)
                w.stalled_s, w.where = float(msg.get("stalled_s") or 0.0), str(msg.get("where") or "?")
                w.in_op = bool(msg.get("busy"))
                if isinstance(msg.get("live"), dict):
                    w.live, w.live_at = msg["live"], w.last_hb
                self.ctrl.send_multipart([ident.encode(), b"ack"])
            return
        w = self.workers.get(ident)
        if w is None:
            self.rejected_here += 1
            return
        w.last_hb = time.monotonic()
        if kind == "hello":
            self._on_hello(w, msg)
        elif kind == "ready":
            w.endpoint, w.state = msg["endpoint"], "ready"
        elif kind == "error":
            if w.error is None and not self.stopping:
                w.error = (f"raised in {msg.get('where')}(): {msg.get('error')}", msg.get("traceback"))
        elif kind == "finished":
            w.state, w.stats = "finished", msg.get("stats") or {}
            w.rejected = int(w.stats.get("rejected", w.rejected))
        elif kind == "reply":
            self.replies[msg.get("id")] = (msg, bufs)
        elif kind == "event":
            event = msg.get("event")
            if isinstance(event, dict) and event.get("kind") == "rendezvous":
                self._on_rendezvous(w, event)
            else:
                self.events.append((w.node, w.replica, event))
        elif kind == "rejected":
            self.events.append((w.node, w.replica, {"kind": "wire_rejected", "error": msg.get("error")}))

    def _check_health(self) -> None:
        if self.failure is not None:
            raise self.failure
        for label, why in self.backend.exited():
            if not self.stopping:
                w = self.workers[label]
                tail = self.backend.log_tail(label) if hasattr(self.backend, "log_tail") else ""
                self._replica_failed(w, why + (f"\n--- last lines of its log ---\n{tail}" if tail else ""), exited=True)
        now = time.monotonic()
        for w in list(self.workers.values()):
            if w.lost is not None:
                continue
            if w.error is not None:   # a raised exception is a bug in op code: a fresh process would raise it again
                self._replica_failed(w, *w.error, respawn=False)
            # before the first heartbeat a worker is importing: the start deadline covers it
            elif w.state != "starting" and now - w.last_hb > self.hb_timeout:
                self._replica_failed(w, f"(pid {w.pid}) missed heartbeats for {now - w.last_hb:.1f} s (hb_timeout "
                                        f"{self.hb_timeout} s): frozen, stopped (SIGSTOP) or starved")
            elif w.stalled_s > self.stall_timeout_s:
                self._replica_failed(w, f"(pid {w.pid}) made no progress for {w.stalled_s:.0f} s inside {w.where}() "
                                        f"(stall timeout {self.stall_timeout_s:.0f} s): the op hangs while its process lives")
        if self._call_depth == 0:   # never from inside a call: the driver's state must not change under it
            for w in [w for w in self.workers.values() if w.lost is not None]:
                self._respawn(w, w.lost, w.lost_exited)

    def _replica_failed(self, w: _W, why: str, traceback: str | None = None, exited: bool = False,
                        respawn: bool = True) -> None:
        """A replica died, froze or stalled: respawn it when the driver allows and its restart budget
        lasts (the driver reissues what it held), else fail the run naming it. One that raised fails the
        run at once (respawn=False), naming the row it raised on."""
        d = self.driver
        may = (respawn and d is not None and hasattr(d, "respawnable") and d.respawnable(w.node)
               and self.restarts[w.label] < self.max_restarts and not self.stopping)
        if not may:
            budget = f" after {self.restarts[w.label]} respawn(s)" if self.restarts[w.label] else ""
            self.failure = RunFailed(f"worker {w.label} (node {w.node!r}, replica {w.replica}) {why}{budget}",
                                     w.node, w.replica, traceback)
            raise self.failure
        w.lost, w.lost_exited = why, exited   # respawned by _check_health once no call is in progress

    def _respawn(self, w: _W, why: str, exited: bool) -> None:
        """Start replica w again where it was: same inbox endpoint, fresh connections to its neighbours;
        then the driver reissues what the dead replica held (on_replica_lost), onto a live replica."""
        label, t0 = w.label, time.monotonic()
        if not exited:
            self.backend.kill(label)   # a hung, stalled or failed process goes first
        while True:
            self.restarts[label] += 1
            # lost until the driver has heard of it: calls made meanwhile (driver hooks run while the
            # control loop pumps) fail fast instead of reaching a process whose state nobody tracks
            fresh = _W(w.node, w.replica, last_hb=time.monotonic(), endpoint=w.endpoint, lost=why)
            self.workers[label] = fresh
            self.backend.start([self.launches[label]])
            problem = self._await_ready(fresh, time.monotonic() + self.start_timeout_s)
            if problem is None:
                break
            if self.restarts[label] >= self.max_restarts:   # a replica that cannot start is not retried forever
                self.failure = RunFailed(f"worker {label} (node {w.node!r}, replica {w.replica}) {why}; its respawn "
                                         f"{problem} (after {self.restarts[label]} respawn(s))", w.node, w.replica)
                raise self.failure
        self._send_ctrl(label, self._wiring(w.node, w.replica))
        fresh.state = "running"
        g = self.graph
        neighbours = {e.src for e in g.producers(w.node)} | {e.dst for e in g.consumers(w.node)}
        for other in self.workers.values():
            if other.node in neighbours and other.label != label:
                self._send_ctrl(other.label, {"kind": "peer_respawned", "label": label})
        if self.inbox is not None:
            self.inbox.reset_sender(label)
        for (dst, _), out in getattr(self, "outs", {}).items():
            if dst == w.node:
                out.reset_consumer(w.replica)
        fresh.lost = None
        if hasattr(self.driver, "on_replica_lost"):
            self.driver.on_replica_lost(w.node, w.replica, why)
        self.respawn_log.append({"replica": label, "why": why.splitlines()[0], "seconds": time.monotonic() - t0,
                                 "ready_at": time.time()})   # wall clock: benchmarks/lifecycle.py times kill -> work again

    def _await_ready(self, fresh: _W, deadline: float) -> str | None:
        """Wait for a respawned replica to report ready; what went wrong if it did not. Other replicas
        that exit meanwhile are marked lost (their own respawn follows), never dropped."""
        while fresh.state != "ready":
            for lb, how in self.backend.exited():
                if lb == fresh.label:
                    return f"exited during start-up ({how})"
                self._replica_failed(self.workers[lb], how, exited=True)
            if time.monotonic() > deadline:
                self.backend.kill(fresh.label)
                return f"did not come up within {self.start_timeout_s:.0f} s"
            self._pump(50)
        return None

    def _flush(self, out: OutEdge, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not out.flush():
            if time.monotonic() > deadline:
                raise TimeoutError(f"edge {out.edge!r}: no credit from its consumer within {timeout} s")
            for i, s in enumerate(out.socks):
                if s.poll(0):
                    out.drain_credits(i)
            self._pump(5)
            self._check_health()

    def _managed_out(self, node: str, port: str) -> OutEdge:
        out = self.outs.get((node, port))
        if out is None:
            raise ValueError(f"{node}.{port} is not fed by a managed edge (managed: {sorted(self.outs)})")
        return out

    def _managed_input(self) -> None:
        """Batches on managed edges go to driver.on_batch in arrival order per source node, but only
        while driver.wants(src) (if it has that method): a held batch keeps its credit, so the
        producer stops once its edge capacity is held here."""
        d = self.driver
        while (got := self.inbox.recv()) is not None:
            if isinstance(got, Delivery):
                self.held.setdefault(got.port, collections.deque()).append(got)  # port holds the src node
            elif isinstance(got, tuple):
                self.held.setdefault(self.managed[got[1]].src, collections.deque()).append(got[1])
        for src, queue in self.held.items():
            while queue and (not isinstance(queue[0], Delivery) or not hasattr(d, "wants") or d.wants(src)):
                item = queue.popleft()
                if isinstance(item, Delivery):
                    d.on_batch(src, item.batch)
                    self.inbox.ack(item)
                else:
                    self._managed_eos(item)
        self.inbox.flush_credits()

    def _managed_eos(self, edge: str) -> None:
        """All producers of a managed edge ended: tell the driver (on_eos), or close it for them."""
        if not all((s, edge) in self.inbox.eos for s in self.inbox.senders[edge]):
            return
        e = self.managed[edge]
        if hasattr(self.driver, "on_eos"):
            self.driver.on_eos(e.src, e.dst)

    def deliver_events(self) -> None:
        """Hand the events received so far to the driver (a driver may call it from inside a hook)."""
        d = self.driver
        while self.events:
            node, r, ev = self.events.popleft()
            if d is not None and hasattr(d, "on_event"):
                d.on_event(node, r, ev)
            else:
                self.kept_events.append((node, r, ev))

    def _sinks_done(self) -> bool:
        sinks = [n for n in self.graph.nodes if not self.graph.consumers(n)]
        return all(w.state == "finished" for w in self.workers.values() if w.node in sinks)

    def _loop(self) -> None:
        d = self.driver
        sinks_done_at = 0.0
        while True:
            self._pump(20)
            self._check_health()
            if self.inbox is not None:
                self._managed_input()
            for out in self.outs.values():
                for i, s in enumerate(out.socks):
                    if s.poll(0):
                        out.drain_credits(i)
                out.flush()
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
            for w in self.workers.values():
                self._send_ctrl(w.label, {"kind": "stop"})
        except zmq.ZMQError:
            pass
        if self.backend is not None:
            self.backend.shutdown(timeout_s=10.0 if graceful else 2.0)
        for out in getattr(self, "outs", {}).values():
            out.close()
        if getattr(self, "inbox", None) is not None:
            self.inbox.close()
        self.ctrl.close(0)
        security.release(self.zctx)
        security.install(None)
        self.zctx.term()
        if graceful and self._own_run_dir and self.run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
