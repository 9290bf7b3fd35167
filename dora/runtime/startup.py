"""Starting a run's workers and wiring them: the launches, the hello -> config -> ready handshake,
the rendezvous of a sharded op's process group, and each worker's start message (its edges).

Rank 0 of a group gets {"host": its own address, "port": 0}: it binds a free port there and reports
{"kind": "rendezvous", "port"}; the other ranks get their config (with that address) only then, so
no port is guessed for another machine."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import zmq

from dora.runtime import security
from dora.runtime.allocator import tune_malloc
from dora.runtime.backends import get_backend
from dora.runtime.backends.launch_spec import Launch
from dora.runtime.channel import bind_router
from dora.runtime.errors import RunFailed
from dora.runtime.managed_edges import CONTROLLER
from dora.runtime.security import RunKeys
from dora.runtime.worker_record import WorkerRecord


class StartUp:
    def __init__(self, controller):
        """`controller`: the Controller whose workers this starts (its plan, settings and sockets)."""
        self.c = controller
        self.rendezvous: dict[str, dict[str, Any]] = {}   # process group (node) -> {"host", "port"} its rank 0 bound

    def start(self) -> None:
        """Start every worker, wait until each is ready, then wire them (edges and managed edges)."""
        c = self.c
        if c.gpu_problem:
            raise RunFailed(c.gpu_problem)
        if c.run_dir is None:
            c.run_dir = tempfile.mkdtemp(prefix="dora-run-")
        os.makedirs(os.path.join(c.run_dir, "logs"), exist_ok=True)
        c.backend = get_backend(c.backend_name, **c.backend_options)
        tune_malloc()                    # the controller receives managed edges' batches too
        keys = None
        if c.secure or (c.secure is None and getattr(c.backend, "multi_node", False)):
            keys = RunKeys.generate()    # per run; workers get them with their start arguments
            security.install(keys)
        c.zctx = zmq.Context()
        c.ctrl, c.ctrl_endpoint = bind_router(c.zctx, c.backend.host)
        c.managed.open_inbox(c.zctx, c.backend.host, c.plan)
        c.launches = self.launches(keys)   # kept: a respawn starts the same replica again
        c.backend.start(list(c.launches.values()))
        now = time.monotonic()
        for w in c.workers.values():
            w.last_hb = now
        if not self.await_all_ready():
            return
        for w in c.workers.values():
            c.plan.get(w.node, w.replica).endpoint = w.endpoint
        c.managed.connect_outs(c.zctx, c.plan, lambda label: c.workers[label].endpoint)
        for w in c.workers.values():
            c.send_ctrl(w.label, self.wiring(w.node, w.replica))
            w.state = "running"

    def launches(self, keys) -> dict[str, Launch]:
        c = self.c
        return {r.label: Launch(r.node, r.replica, c.ctrl_endpoint, r.env, r.pool, r.kind, r.slot,
                                os.path.join(c.run_dir, "logs", f"{r.node}-{r.replica}.log"),
                                keys=keys and keys.to_dict(), devices=r.devices)
                for r in c.plan.replicas}

    def await_all_ready(self) -> bool:
        """Pump until every worker is ready (False: a stop was requested meanwhile)."""
        c = self.c
        deadline = time.monotonic() + c.start_timeout_s
        while not all(w.state == "ready" for w in c.workers.values()):
            if c.stop_requested:
                return False   # stopped while starting: nothing to checkpoint yet
            if time.monotonic() > min(deadline, c.t_deadline):
                late = [w.label + self.waits_for(w) for w in c.workers.values() if w.state != "ready"]
                raise RunFailed(f"workers not ready within {c.start_timeout_s:.0f} s: {late} "
                                f"(dora run --start-timeout raises the bound; their logs are in {c.run_dir}/logs)")
            c.pump(50)
            c.supervisor.check()
        return True

    def config(self, w: WorkerRecord) -> dict[str, Any]:
        c = self.c
        n, rp = c.graph.nodes[w.node], c.plan.get(w.node, w.replica)
        return {"kind": "config", "op": n.op, "params": c.resolved.params[w.node], "replicas": n.replicas,
                "model": c.graph.model_of(w.node), "device": rp.device, "threads": rp.threads, "seed": c.seed,
                "run_dir": c.run_dir, "async": c.resolved.async_of(w.node).to_dict(), "hb_interval": c.hb_interval,
                "restore": c.restores.pop(w.label, None),   # restored once: a respawned replica starts clean
                "bind": w.endpoint, "hb_timeout": max(30.0, 4 * c.hb_timeout), "live_s": c.live_s,
                "devices": rp.devices, "memory": rp.memory, "rendezvous": self._rendezvous_of(w)}

    def _rendezvous_of(self, w: WorkerRecord) -> dict[str, Any] | None:
        if w.node not in self.c.plan.groups:
            return None
        if w.replica == 0:
            return {"host": w.host or "127.0.0.1", "port": 0}
        return self.rendezvous.get(w.node)   # set before ranks 1.. are configured (on_hello)

    def on_hello(self, w: WorkerRecord, msg: dict[str, Any]) -> None:
        w.pid, w.host = msg.get("pid"), msg.get("host")
        if w.node in self.c.plan.groups and w.replica > 0 and w.node not in self.rendezvous:
            return   # configured once rank 0 has bound its rendezvous port (on_rendezvous)
        w.state = "configured"
        self.c.send_ctrl(w.label, self.config(w))

    def on_rendezvous(self, w: WorkerRecord, event: dict[str, Any]) -> None:
        c = self.c
        if w.node not in c.plan.groups or w.replica != 0 or w.node in self.rendezvous:
            c.rejected_here += 1
            return
        self.rendezvous[w.node] = {"host": str(event["host"]), "port": int(event["port"])}
        for other in c.workers.values():
            if other.node == w.node and other.replica > 0 and other.pid is not None and other.state == "starting":
                other.state, other.last_hb = "configured", time.monotonic()   # its heartbeats start with the config
                c.send_ctrl(other.label, self.config(other))

    def waits_for(self, w: WorkerRecord) -> str:
        if w.node in self.c.plan.groups and w.replica > 0 and w.node not in self.rendezvous:
            return f" (waits for {w.node}[0], rank 0, to bind the group's rendezvous)"
        return "" if w.pid is not None else " (never said hello)"

    def wiring(self, node: str, replica: int = 0) -> dict[str, Any]:
        """The start message of node[replica]: the endpoints of its output edges' consumers and the
        senders of its inputs (managed edges run through the controller)."""
        c = self.c
        g, managed = c.graph, c.managed
        if node in c.plan.groups and replica > 0:
            # ranks 1.. of a process group get their work from rank 0 over the group, not from edges
            return {"kind": "start", "outputs": [], "inputs": [], "is_source": False}
        outputs = []
        for e in g.consumers(node):
            if e.label in managed:
                eps, rt, gb, who = [managed.inbox.endpoint], "round_robin", None, [CONTROLLER]
            else:
                who = [f"{e.dst}[{r}]" for r in range(c.plan.data_replicas(e.dst))]
                eps = [c.workers[label].endpoint for label in who]
                rt, gb = e.routing, e.group_by
            outputs.append({"edge": e.label, "endpoints": eps, "consumers": who, "routing": rt, "group_by": gb,
                            "capacity": e.capacity, "capacity_bytes": e.capacity_bytes})
        inputs = []
        for e in g.producers(node):
            senders = [CONTROLLER] if e.label in managed else [f"{e.src}[{r}]" for r in range(c.plan.data_replicas(e.src))]
            inputs.append({"edge": e.label, "port": e.dst_port, "senders": senders, "capacity": e.capacity,
                           "capacity_bytes": e.capacity_bytes})
        return {"kind": "start", "outputs": outputs, "inputs": inputs, "is_source": not g.nodes[node].inputs}
