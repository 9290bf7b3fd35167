"""Sandboxes started ahead of their calls, so a call does not wait for bubblewrap's namespaces and
the interpreter's start-up (benchmarks/tool_latency.py measures both ways).

A WarmPool keeps up to `size` confined children waiting on stdin (sandbox.start: confined first,
payload second). take() hands one over, or starts one on the spot when none is ready, and wakes
the pool's starter thread to replace it. Every child is started by that one long-lived thread:
bubblewrap's --die-with-parent follows the thread that started it, so a child started by a
short-lived thread would die with it. A child that died while idle is dropped, never handed out.
close() ends the thread and kills the idle children (the tool's close; at interpreter exit too).
"""

from __future__ import annotations

import atexit
import collections
import threading
import weakref

from dora.ops.tools import sandbox


class WarmPool:
    def __init__(self, limits: sandbox.Limits, size: int):
        self.limits, self.size = limits, size
        self.idle: collections.deque[sandbox.Started] = collections.deque()
        self.cv = threading.Condition()
        self.state = {"closed": False}   # shared with the finalizer (which must not hold self)
        self.cold_starts = self.warm_starts = 0
        self.thread = threading.Thread(target=self._keep_warm, name="dora-sandbox-starter", daemon=True)
        if size > 0:
            self.thread.start()
        self._finalizer = weakref.finalize(self, _shut, self.cv, self.idle, self.state)
        atexit.register(self._finalizer)

    def take(self) -> sandbox.Started:
        with self.cv:
            while self.idle:
                s = self.idle.popleft()
                if s.alive():
                    self.warm_starts += 1
                    self.cv.notify_all()
                    return s
                s.discard()
            self.cold_starts += 1
            self.cv.notify_all()
        return sandbox.start(self.limits)

    def close(self) -> None:
        self._finalizer()

    def _keep_warm(self) -> None:
        while True:
            with self.cv:
                while not self.state["closed"] and len(self.idle) >= self.size:
                    self.cv.wait()
                if self.state["closed"]:
                    return
            try:
                s = sandbox.start(self.limits)
            except Exception:   # the next call starts its own and reports the problem
                return
            with self.cv:
                if self.state["closed"]:
                    s.discard()
                    return
                self.idle.append(s)


def _shut(cv: threading.Condition, idle: collections.deque, state: dict) -> None:
    with cv:
        state["closed"] = True
        while idle:
            idle.popleft().discard()
        cv.notify_all()
