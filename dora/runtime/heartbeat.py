"""The worker's heartbeat: a daemon thread with its own socket, so a worker whose op hangs (or
computes for minutes) still beats. Each beat carries the stall report (how long the main thread has
been inside one op call without progress), the rejected-message count and, when they changed, the
live counters the dashboard shows. A controller that stops answering for `timeout` seconds ends the
worker: no orphans when a controller dies."""

from __future__ import annotations

import os
import sys
import threading
import time

import zmq

from dora.runtime import security, wire


class Heartbeat(threading.Thread):
    def __init__(self, zctx: zmq.Context, endpoint: str, label: str, interval: float, timeout: float, worker):
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
                   "stalled_s": self.worker.watch.stalled_s(), "where": self.worker.watch.where}
            live = self.worker.live          # replaced, never mutated, by the main thread
            if live is not sent_live:        # only what changed: an idle worker's beat stays this small
                msg["live"] = sent_live = live
            if self.worker.watch.in_op_since is not None:   # inside an op method now (a long training step, a load)
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
