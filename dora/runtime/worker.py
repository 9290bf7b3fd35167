"""The worker: one per node replica, the same code in a local process and in a Ray actor.

Sockets (one zmq context):
    control  DEALER -> controller ROUTER (identity "node[r]"): config, start, pause, resume,
             stop, call; replies, events, errors, finished go back on it
    heartbeat DEALER -> controller ROUTER (identity "node[r]#hb"), owned by a daemon thread:
             beats every hb_interval; if the controller stops answering for hb_timeout the
             worker exits (no orphans when a controller dies)
    inbox    ROUTER bound on 127.0.0.1 (all input edges; see channel.py)
    outputs  one DEALER per (out edge, consumer replica)

Life: hello -> config (op, params, device) -> op.setup -> ready(endpoint) -> start(wiring)
-> loop -> finished -> stop -> op.teardown -> exit. The loop reads one input batch at a time and
only when every out edge has drained its queue, so back-pressure propagates upstream through
credits; sources are pulled only when every out edge has a credit. An exception in the op is
sent to the controller with its traceback; the worker then waits for stop.

Run: python -m dora.runtime.worker --control tcp://127.0.0.1:PORT --node NAME --replica R
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Iterable

import zmq

from dora.ops.parent_death import die_with_parent
from dora.runtime import security, wire
from dora.runtime.allocator import tune_malloc
from dora.runtime.channel import Delivery, Inbox, OutEdge
from dora.runtime.errors import WireError

#: control calls the worker answers itself (unless the op declares a method of that name):
#: each returns {"pong", "state", "paused", "stats": rows/bytes in and out, rejected count}
BUILTIN_CALLS = ("ping", "pause", "resume", "worker_stats")
CONFIG_TIMEOUT_S = 120.0  # from hello to config: the controller may be starting many workers


def label_of(node: str, replica: int) -> str:
    return f"{node}[{replica}]"


IPC_PATH_MAX = 100   # sun_path holds 104-108 bytes depending on the OS


def ipc_socket_path(folder: str, node: str, replica: int) -> str:
    """Where a replica's inbox socket lives; names too long for a Unix socket path become a hash."""
    path = os.path.join(folder, f"{node}-{replica}.sock")
    if len(path.encode()) > IPC_PATH_MAX:
        path = os.path.join(folder, hashlib.sha1(f"{node}-{replica}".encode()).hexdigest()[:16] + ".sock")
    if len(path.encode()) > IPC_PATH_MAX:
        raise ValueError(f"ipc socket folder {folder!r} is too long for a Unix socket path "
                         f"({IPC_PATH_MAX} bytes); set TMPDIR shorter or DORA_TRANSPORT=tcp")
    return path


def import_impl(path: str) -> type:
    """The class at "pkg.module:Class"."""
    module, _, attr = path.partition(":")
    if not attr:
        raise ImportError(f"op implementation {path!r} is not of the form 'pkg.module:Class'")
    return getattr(importlib.import_module(module), attr)


def op_class(op: str) -> type:
    """The implementation class of an op, through the graph layer's op declarations."""
    from dora.graph.op_registry import resolve_op

    return import_impl(resolve_op(op).impl)


class Heartbeat(threading.Thread):
    def __init__(self, zctx: zmq.Context, endpoint: str, label: str, interval: float, timeout: float, worker: "Worker"):
        super().__init__(name=f"heartbeat-{label}", daemon=True)
        self.sock = zctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.IDENTITY, f"{label}#hb".encode())
        security.client(self.sock)
        self.sock.connect(endpoint)
        self.interval, self.timeout, self.worker = interval, timeout, worker
        self.halt = threading.Event()

    def run(self) -> None:
        last_ack = time.monotonic()
        sent_live = None
        while not self.halt.is_set():
            inbox = self.worker.inbox
            # this thread beats even while the op hangs: the stall report says whether the main thread moves
            msg = {"kind": "hb", "rejected": inbox.rejected if inbox else 0,
                   "stalled_s": self.worker.stalled_s(), "where": self.worker.where}
            live = self.worker.live          # replaced, never mutated, by the main thread
            if live is not sent_live:        # only what changed: an idle worker's beat stays this small
                msg["live"] = sent_live = live
            if self.worker.in_op_since is not None:   # inside an op method now (a long training step, a load)
                msg["busy"] = 1
            self.sock.send(wire.encode_control(msg)[0])
            # one beat per interval: the ack comes back in microseconds, and beating again at once
            # turned heartbeats into a busy loop (hundreds a second per worker, most of the
            # controller's CPU); acks are read while waiting out the rest of the interval
            next_beat = time.monotonic() + self.interval
            while (wait := next_beat - time.monotonic()) > 0 and not self.halt.is_set():
                if self.sock.poll(int(wait * 1000) + 1):
                    while self.sock.poll(0):
                        self.sock.recv()
                    last_ack = time.monotonic()
            if time.monotonic() - last_ack > self.timeout:
                sys.stderr.write(f"dora worker {self.worker.label}: controller silent for {self.timeout:.0f} s; exiting\n")
                sys.stderr.flush()
                os._exit(70)
        self.sock.close(0)


class Worker:
    def __init__(self, control: str, node: str, replica: int, host: str = "127.0.0.1", ipc_dir: str | None = None):
        self.node, self.replica, self.label, self.host = node, replica, label_of(node, replica), host
        self.ipc_dir = ipc_dir  # set: the inbox binds ipc://<ipc_dir>/<node>-<replica>.sock instead of tcp
        tune_malloc()           # before any zmq buffer exists: received batches reuse freed memory
        self.zctx = zmq.Context()
        self.ctrl = self.zctx.socket(zmq.DEALER)
        self.ctrl.setsockopt(zmq.LINGER, 1000)
        self.ctrl.setsockopt(zmq.IDENTITY, self.label.encode())
        security.client(self.ctrl)
        self.ctrl.connect(control)
        self.control_endpoint = control
        self.send_lock = threading.Lock()
        self.inbox: Inbox | None = None
        self.outs: list[OutEdge] = []
        self.op: Any = None
        self.source_iter: Any = None
        self.state = "init"   # init | ready | running | finishing | finished | failed
        self.paused = False
        self.stopping = False
        self.rejects_reported = 0
        self.where = "start"   # the op method running now, for error messages
        self.in_op_since: float | None = None   # inside op code since (None: in the worker's own loop)
        self.progress_at = time.monotonic()     # the last sign of work: an op call returned, or ctx.progress()
        # live counters for the dashboard, sampled by the main thread every live_s seconds and
        # sent by the heartbeat thread when they changed (0 = off)
        self.live: dict[str, Any] | None = None
        self.live_s = 0.0
        self.live_due = 0.0
        self.work = 0          # units of work done (step() that did something)

    # ------------------------------------------------------------ control plane

    def send_ctrl(self, msg: dict[str, Any], buffers: Iterable[Any] = ()) -> None:
        with self.send_lock:  # ctx.report may be called from an op's own threads
            self.ctrl.send_multipart(wire.encode_control(msg, list(buffers)), copy=False)

    def stalled_s(self) -> float:
        """Seconds inside one op call without a sign of progress (0 when not inside op code)."""
        since = self.in_op_since
        return 0.0 if since is None else round(time.monotonic() - max(since, self.progress_at), 3)

    def op_call(self, where: str, fn, *args):
        """Run op code, marking it for the stall watchdog."""
        self.where = where
        self.in_op_since = time.monotonic()
        try:
            return fn(*args)
        finally:
            self.in_op_since = None
            self.progress_at = time.monotonic()

    def mark_progress(self) -> None:
        self.progress_at = time.monotonic()

    def fail(self, where: str, exc: BaseException) -> None:
        self.state = "failed"
        self.send_ctrl({"kind": "error", "where": where, "error": f"{type(exc).__name__}: {exc}",
                        "traceback": traceback.format_exc()})

    def handle_control(self, msg: dict[str, Any], buffers: list[memoryview]) -> None:
        kind = msg["kind"]
        if kind == "stop":
            self.stopping = True
        elif kind == "pause":
            self.paused = True
        elif kind == "resume":
            self.paused = False
        elif kind == "start":
            self.wire_up(msg)
        elif kind == "peer_respawned":   # a replica next to this one was restarted (run controller)
            self.peer_respawned(msg["label"])
        elif kind == "call":
            self.handle_call(msg, buffers)

    def handle_call(self, msg: dict[str, Any], buffers: list[memoryview]) -> None:
        method, args, cid = msg.get("method"), msg.get("args") or {}, msg.get("id")
        try:
            op_methods = getattr(self.op, "control_methods", ())
            if method in BUILTIN_CALLS and method not in op_methods:  # an op's own method wins
                if method in ("pause", "resume"):
                    self.paused = method == "pause"
                result: Any = {"pong": True, "state": self.state, "paused": self.paused, "stats": self.stats()}
            else:
                if self.op is None:
                    raise RuntimeError(f"{self.label} has no op yet (state {self.state})")
                if buffers:
                    args = {**args, "buffers": buffers}
                result = self.op_call(method, self.op.call, method, args)
            out = result.buffers if isinstance(result, wire.WithBuffers) else []
            value = result.value if isinstance(result, wire.WithBuffers) else result
            self.send_ctrl({"kind": "reply", "id": cid, "ok": True, "result": value}, out)
        except Exception as e:
            self.send_ctrl({"kind": "reply", "id": cid, "ok": False, "error": f"{type(e).__name__}: {e}",
                            "traceback": traceback.format_exc()})

    def poll_control(self, timeout_ms: int) -> None:
        if self.ctrl.poll(timeout_ms):
            while True:
                try:
                    frames = self.ctrl.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    return
                try:
                    msg, bufs = wire.decode_control(frames)
                except WireError:
                    continue  # only the controller writes to this socket
                self.handle_control(msg, bufs)

    # ------------------------------------------------------------ setup

    def wait_config(self) -> dict[str, Any]:
        deadline = time.monotonic() + CONFIG_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.ctrl.poll(200):
                msg, _ = wire.decode_control(self.ctrl.recv_multipart(copy=False))
                if msg["kind"] == "config":
                    return msg
                if msg["kind"] == "stop":
                    raise SystemExit(0)
        raise TimeoutError(f"{self.label}: no config from the controller at {self.control_endpoint} within {CONFIG_TIMEOUT_S:.0f} s")

    def setup(self, cfg: dict[str, Any]) -> None:
        from dora.graph.sections import AsyncSettings
        from dora.ops.base import OpContext

        self.live_s = float(cfg.get("live_s") or 0.0)
        cls = op_class(cfg["op"])
        if "torch" in sys.modules:  # only pay for torch if the op uses it
            sys.modules["torch"].set_num_threads(max(1, int(cfg.get("threads", 1))))
        self.op = cls()
        # params arrive resolved (dora.graph.resolve): filled, checked and derived once, by the controller
        ctx = OpContext(node=self.node, op=cfg["op"], replica=self.replica, replicas=cfg["replicas"], params=cfg["params"],
                        model=cfg["model"], device=cfg["device"], threads=cfg["threads"], seed=cfg["seed"],
                        run_dir=cfg["run_dir"], async_=AsyncSettings(**cfg["async"]), restore=cfg["restore"],
                        devices=cfg["devices"], rendezvous=cfg["rendezvous"],
                        report=lambda event: self.send_ctrl({"kind": "event", "event": event}),
                        progress=self.mark_progress)
        self.op.setup(ctx)

    def wire_up(self, msg: dict[str, Any]) -> None:
        assert self.inbox is not None
        for i in msg["inputs"]:
            self.inbox.expect(i["edge"], i["port"], i["senders"], i["capacity"], i["capacity_bytes"])
        for o in msg["outputs"]:
            out = OutEdge(self.zctx, o["edge"], o["endpoints"], self.label, o["routing"], o.get("group_by"),
                          o["capacity"], o["capacity_bytes"])
            out.consumers = o["consumers"]   # replica labels, endpoint by endpoint
            self.outs.append(out)
        if msg["is_source"]:
            self.source_iter = iter(self.op.source())
        self.state = "running"

    def peer_respawned(self, label: str) -> None:
        """Replica `label` was respawned: reset the connections this replica shares with it."""
        for o in self.outs:
            for r, ep in enumerate(o.endpoints):
                if label == o.consumers[r]:
                    o.reset_consumer(r)
        if self.inbox is not None:
            self.inbox.reset_sender(label)

    # ------------------------------------------------------------ data plane

    def stats(self) -> dict[str, Any]:
        return {"in": dict(self.inbox.stats) if self.inbox else {}, "rejected": self.inbox.rejected if self.inbox else 0,
                "reject_samples": list(self.inbox.reject_samples) if self.inbox else [],
                "out": {o.edge: dict(o.stats) for o in self.outs}}

    def sample_live(self) -> None:
        """Counters the controller turns into edge rates and replica state: per out edge
        [batches, rows, bytes sent, batches unacknowledged or queued], work done, the op's own."""
        self.live_due = time.monotonic() + self.live_s
        op_stats = None
        if self.op is not None and self.state != "failed":
            try:
                op_stats = self.op.live_stats()
            except Exception as e:   # a dashboard figure must never stop the run
                op_stats = {"error": f"{type(e).__name__}: {e}"}
        live = {"out": {o.edge: [o.stats["batches"], o.stats["rows"], o.stats["bytes"], sum(o.inflight_n) + len(o.queue)]
                        for o in self.outs},
                "work": self.work, "op": op_stats}
        if live != self.live:
            self.live = live

    def emit(self, batches: Iterable[Any] | None) -> None:
        for b in batches or ():
            for o in self.outs:
                o.put(b)

    def step(self) -> bool:
        """Do one unit of work; True if something happened (then poll without waiting)."""
        flushed = all([o.flush() for o in self.outs])
        if not flushed:
            return False
        if self.state == "finishing":
            for o in self.outs:
                o.send_eos()
            self.state = "finished"
            self.send_ctrl({"kind": "finished", "stats": self.stats()})
            return True
        if self.state != "running":
            return False
        did = False
        if self.source_iter is not None:
            if all(o.has_credit() for o in self.outs):
                try:
                    self.emit([self.op_call("source", next, self.source_iter)])
                except StopIteration:
                    self.source_iter = None
                    self.start_finish()
                return True
        else:
            got = self.inbox.recv()
            if isinstance(got, Delivery):
                self.emit(self.op_call("process", self.op.process, got.batch, got.port))
                self.inbox.ack(got)
                did = True
            elif isinstance(got, WireError):
                if self.rejects_reported < 5:  # the count travels with heartbeats; samples here
                    self.rejects_reported += 1
                    self.send_ctrl({"kind": "rejected", "error": str(got)})
                did = True
            elif got is not None:
                did = True
            else:
                self.inbox.flush_credits()  # out of input: return what we owe before waiting
        if self.op.busy():
            self.emit(self.op_call("poll", self.op.poll))
            did = True
        elif self.source_iter is None and self.inbox.all_eos() and self.state == "running" and not any(o.queue for o in self.outs):
            self.start_finish()
            did = True
        return did

    def start_finish(self) -> None:
        if self.op.busy():  # a source may still have work in flight inside the op
            return
        self.emit(self.op_call("finish", self.op.finish))
        self.state = "finishing"

    def loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.ctrl, zmq.POLLIN)
        poller.register(self.inbox.sock, zmq.POLLIN)
        out_socks: dict[Any, tuple[OutEdge, int]] = {}
        busy = False
        while not self.stopping:
            for o in self.outs:
                for i, s in enumerate(o.socks):
                    if s not in out_socks:
                        out_socks[s] = (o, i)
                        poller.register(s, zmq.POLLIN)
            waiting_on_credit = any(o.queue for o in self.outs)
            want_input = self.state == "running" and not self.paused and not waiting_on_credit
            poller.modify(self.inbox.sock, zmq.POLLIN if want_input and self.source_iter is None else 0)
            if not busy:
                self.inbox.flush_credits()
            events = dict(poller.poll(0 if busy else 100))
            if self.ctrl in events:
                self.poll_control(0)
            for s, (o, i) in out_socks.items():
                if s in events:
                    o.drain_credits(i)
            busy = False
            if self.paused or self.state in ("failed", "finished", "init", "ready") or self.stopping:
                continue
            try:
                busy = self.step()
            except Exception as e:
                self.fail(self.where, e)
            if busy:
                self.work += 1
            if self.live_s and time.monotonic() >= self.live_due:
                self.sample_live()

    def run(self) -> int:
        self.send_ctrl({"kind": "hello", "pid": os.getpid(), "host": self.host})
        cfg = self.wait_config()
        hb = Heartbeat(self.zctx, self.control_endpoint, self.label, cfg.get("hb_interval", 0.25), cfg.get("hb_timeout", 30.0), self)
        hb.start()
        try:
            if cfg.get("bind"):   # a respawned replica takes its predecessor's endpoint: producers reconnect to it
                self.inbox = Inbox(self.zctx, endpoint=cfg["bind"])
            elif self.ipc_dir:
                self.inbox = Inbox(self.zctx, transport="ipc", ipc_path=ipc_socket_path(self.ipc_dir, self.node, self.replica))
            else:
                self.inbox = Inbox(self.zctx, self.host)
            try:
                self.setup(cfg)
                self.state = "ready"
                self.send_ctrl({"kind": "ready", "endpoint": self.inbox.endpoint})
            except Exception as e:
                self.fail("setup", e)
            self.loop()
            if self.op is not None:
                try:
                    self.op.teardown()
                except Exception as e:
                    self.fail("teardown", e)
            return 0
        finally:
            hb.halt.set()
            hb.join(timeout=2)
            for o in self.outs:
                o.close()
            if self.inbox:
                self.inbox.close()
            self.ctrl.close(linger=1000)
            security.release(self.zctx)
            self.zctx.term()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="one dora worker (started by the controller)")
    p.add_argument("--control", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--replica", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--ipc-dir", default=None, help="bind the inbox on ipc:// sockets in this folder instead of tcp")
    a = p.parse_args(argv)
    # a secured run's keys come from the process that started this one (local backend: the environment)
    keys = os.environ.pop("DORA_RUN_KEYS", None)
    if keys:
        security.install(json.loads(keys))
    die_with_parent()   # a kill -9 of dora run takes its workers with it
    # Ctrl-C in a terminal and a scheduler's SIGTERM reach the whole process group: the controller
    # alone decides how a run stops (it checkpoints first, then stops its workers), so they ignore both.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return Worker(a.control, a.node, a.replica, a.host, a.ipc_dir).run()


if __name__ == "__main__":
    sys.exit(main())
