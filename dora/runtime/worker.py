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
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Iterable

import zmq

from dora.graph.diagnostics import BadInput
from dora.ops.parent_death import die_with_parent
from dora.runtime import security, wire
from dora.runtime.allocator import tune_malloc
from dora.runtime.channel import Delivery, Inbox, OutEdge
from dora.runtime.errors import WireError
from dora.runtime.heartbeat import Heartbeat
from dora.runtime.op_watch import OpWatch, live_counters, worker_stats
from dora.runtime.worker_setup import bind_inbox, make_op, wait_config

#: control calls the worker answers itself (unless the op declares a method of that name):
#: each returns {"pong", "state", "paused", "stats": rows/bytes in and out, rejected count}
BUILTIN_CALLS = ("ping", "pause", "resume", "worker_stats")


def label_of(node: str, replica: int) -> str:
    return f"{node}[{replica}]"


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
        self.watch = OpWatch()   # which op method runs, and since when without progress (the stall watchdog)
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

    def fail(self, where: str, exc: BaseException) -> None:
        self.state = "failed"
        if isinstance(exc, BadInput):   # the user's data, named by the message: no traceback
            self.send_ctrl({"kind": "error", "where": where, "error": str(exc), "bad_input": True})
            return
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
                result: Any = {"pong": True, "state": self.state, "paused": self.paused, "stats": worker_stats(self.inbox, self.outs)}
            else:
                if self.op is None:
                    raise RuntimeError(f"{self.label} has no op yet (state {self.state})")
                if buffers:
                    args = {**args, "buffers": buffers}
                result = self.watch.call(method, self.op.call, method, args)
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
            self.send_ctrl({"kind": "finished", "stats": worker_stats(self.inbox, self.outs)})
            return True
        if self.state != "running":
            return False
        did = False
        if self.source_iter is not None:
            if all(o.has_credit() for o in self.outs):
                try:
                    self.emit([self.watch.call("source", next, self.source_iter)])
                except StopIteration:
                    self.source_iter = None
                    self.start_finish()
                return True
        elif self.accepts_input():   # (an op that holds all it may reads nothing: back-pressure)
            got = self.inbox.recv()
            if isinstance(got, Delivery):
                self.emit(self.watch.call("process", self.op.process, got.batch, got.port))
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
            self.emit(self.watch.call("poll", self.op.poll))
            did = True
        elif self.source_iter is None and self.inbox.all_eos() and self.state == "running" and not any(o.queue for o in self.outs):
            self.start_finish()
            did = True
        return did

    def accepts_input(self) -> bool:
        """Whether the op takes input now (Operator.accepts_input; an op without the method always does)."""
        accepts = getattr(self.op, "accepts_input", None)
        return self.op is not None and (accepts is None or bool(accepts()))

    def start_finish(self) -> None:
        if self.op.busy():  # a source may still have work in flight inside the op
            return
        self.emit(self.watch.call("finish", self.op.finish))
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
            want_input = self.state == "running" and not self.paused and not waiting_on_credit and self.accepts_input()
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
                self.fail(self.watch.where, e)
            if busy:
                self.work += 1
            if self.live_s and time.monotonic() >= self.live_due:
                self.live_due = time.monotonic() + self.live_s
                live = live_counters(self.op if self.state != "failed" else None, self.outs, self.work)
                if live != self.live:
                    self.live = live   # replaced, never mutated: the heartbeat thread sends it

    def run(self) -> int:
        self.send_ctrl({"kind": "hello", "pid": os.getpid(), "host": self.host})
        cfg = wait_config(self.ctrl, self.label, self.control_endpoint)
        hb = Heartbeat(self.zctx, self.control_endpoint, self.label, cfg.get("hb_interval", 0.25), cfg.get("hb_timeout", 30.0), self)
        hb.start()
        try:
            self.inbox = bind_inbox(self.zctx, cfg, self.host, self.ipc_dir, self.node, self.replica)
            try:
                self.live_s = float(cfg.get("live_s") or 0.0)
                self.op = make_op(cfg, self.node, self.replica, report=lambda event: self.send_ctrl({"kind": "event", "event": event}),
                                  progress=self.watch.progress)
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
