"""SimInstance: a simulated continuous-batching engine implementing RolloutInstance.

Event-driven per request completion, not per token: every running sequence advances one token
per decode iteration, so a single progress counter P (tokens per running sequence) describes
them all. A request admitted at P0 with r tokens to go ends at P = P0 + r; a heap of end points
gives the next completion, and the decode rate (1 / decode_step_s(batch, context)) is constant
between events (the context term is refreshed at every event). Prefill, weight loads and KV
imports stall decoding for their duration. KV, as a paged engine (vLLM) does it: a request is
admitted while used KV + its prompt stays under ADMIT_WATERMARK of capacity; KV grows by one token
per running sequence per iteration (used = ctx_base + n * P, so the moment it fills is known in
advance and is an event); when it is full the most recently admitted sequences are preempted
(recompute: back to the queue front, re-prefilled when readmitted; counted in `preemptions`).
Migrated requests (import_) that do not fit at once wait with their KV parked in host memory;
admitting one later stalls decoding for the host -> GPU copy (`kv_reload_s`, counted in
kv_import_s with the transfers).
"""

from __future__ import annotations

import collections
import heapq
from typing import Callable

from dora.runtime.rollout.trace import TraceWriter
from dora.runtime.rollout.types import Finished, InstanceStats, Request, RequestState

from .virtual_clock import VirtualClock
from .costmodel import CostModel


ADMIT_WATERMARK = 0.95     # admit while used KV + the new prompt stays below this fraction
PREEMPT_TO = 0.98          # when KV is full, preempt down to this fraction


class _Seq:
    __slots__ = ("uid", "group_id", "prompt", "target", "done0", "p0", "end", "versions", "has_kv", "in_host")

    def __init__(self, uid, group_id, prompt, target, done0, versions, has_kv):
        self.uid, self.group_id, self.prompt, self.target = uid, group_id, prompt, target
        self.done0, self.versions, self.has_kv = done0, versions, has_kv
        self.in_host = False         # KV parked in host memory (an import that did not fit)
        self.p0 = self.end = 0.0


class SimInstance:
    def __init__(self, name: str, cost: CostModel, clock: VirtualClock,
                 on_finished: Callable[[str, list[Finished]], None], trace: TraceWriter | None = None):
        self.name, self.cost, self.clock = name, cost, clock
        self.on_finished = on_finished
        self.trace = trace or TraceWriter(enabled=False)
        self.version: int | None = None
        self.slots = cost.model.max_batch
        self.kv_capacity = cost.kv_capacity_tokens
        self.running: dict[str, _Seq] = {}
        self.heap: list[tuple[float, str]] = []
        self.queue: collections.OrderedDict[str, _Seq] = collections.OrderedDict()
        self.P = 0.0
        self.t_last = 0.0
        self.busy_until = 0.0
        self.ctx_base = 0.0
        self._gen = 0
        # accounting (seconds / tokens)
        self.decode_s = self.prefill_s = self.reprefill_s = self.load_s = self.kv_import_s = 0.0
        self.tokens = 0
        self.reprefill_tokens = 0
        self.preemptions = 0

    # -- time ----------------------------------------------------------------------------------
    def _step_s(self) -> float:
        n = len(self.running)
        return self.cost.decode_step_s(n, self.ctx_base + n * self.P)

    def _advance(self) -> None:
        now = self.clock.now()
        start = max(self.t_last, self.busy_until)
        if self.running and now > start:
            dt = now - start
            self.P += dt / self._step_s()
            self.decode_s += dt
        self.t_last = now

    def _stall(self, seconds: float) -> None:
        self.busy_until = max(self.busy_until, self.clock.now()) + seconds

    def _reschedule(self) -> None:
        self._gen += 1
        heap, running = self.heap, self.running
        while heap and (heap[0][1] not in running or running[heap[0][1]].end != heap[0][0]):
            heapq.heappop(heap)
        if not heap:
            return
        step = self._step_s()
        dp = heap[0][0] - self.P
        n = len(running)
        p_full = (self.kv_capacity - self.ctx_base) / n            # P at which KV is full
        if n > 1 and p_full - self.P < dp:
            dp = p_full - self.P
        t = max(self.clock.now(), self.busy_until) + max(0.0, dp) * step
        gen = self._gen
        self.clock.call_at(t, lambda: self._wake(gen))

    def _wake(self, gen: int) -> None:
        if gen != self._gen:
            return
        self._advance()
        done: list[Finished] = []
        heap, running = self.heap, self.running
        while heap:
            end, uid = heap[0]
            s = running.get(uid)
            if s is None or s.end != end:
                heapq.heappop(heap)
                continue
            if end > self.P + 1e-6:
                break
            heapq.heappop(heap)
            self._remove(s)
            self.tokens += s.target - s.done0
            done.append(Finished(uid, s.target, s.versions))
        self._admit()
        self._reschedule()
        if done:
            self.on_finished(self.name, done)

    # -- running set ---------------------------------------------------------------------------
    def _remove(self, s: _Seq) -> None:
        del self.running[s.uid]
        self.ctx_base -= s.prompt + s.done0 - s.p0

    def _preempt(self) -> None:
        running = self.running
        limit = PREEMPT_TO * self.kv_capacity
        while len(running) > 1 and self.ctx_base + len(running) * self.P > limit:
            s = running[next(reversed(running))]          # the most recently admitted
            done = min(s.target - 1, s.done0 + int(self.P - s.p0))
            self._remove(s)
            self.tokens += done - s.done0
            s.done0, s.has_kv = done, False
            self.queue[s.uid] = s
            self.queue.move_to_end(s.uid, last=False)
            self.preemptions += 1

    def _admit(self) -> None:
        self._preempt()
        q, running = self.queue, self.running
        limit = ADMIT_WATERMARK * self.kv_capacity
        while q and len(running) < self.slots:
            s = next(iter(q.values()))
            need = s.prompt + s.done0
            if running and self.ctx_base + len(running) * self.P + need > limit:
                break
            del q[s.uid]
            if s.in_host:
                cost = self.cost.kv_reload_s((s.prompt + s.done0) * self.cost.model.kv_bytes_per_token)
                self._stall(cost)
                self.kv_import_s += cost
                s.in_host = False
            if not s.has_kv:
                ctx = s.prompt + s.done0
                cost = self.cost.prefill_s(ctx)
                self._stall(cost)
                self.prefill_s += cost
                if s.done0:
                    self.reprefill_s += cost
                    self.reprefill_tokens += ctx
            if s.target > s.done0 and self.version not in s.versions:
                s.versions = tuple(sorted((*s.versions, self.version)))
            s.p0 = self.P
            s.end = self.P + (s.target - s.done0)
            running[s.uid] = s
            self.ctx_base += s.prompt + s.done0 - s.p0
            heapq.heappush(self.heap, (s.end, s.uid))

    # -- RolloutInstance -----------------------------------------------------------------------
    def load_version(self, v: int) -> None:
        if self.running or self.queue:
            raise RuntimeError(f"{self.name}: load_version({v}) while {len(self.running)} running and "
                               f"{len(self.queue)} queued requests (export or interrupt them first)")
        self._advance()
        t = self.cost.weight_load_s()
        now = self.clock.now()
        self.trace.span("rollout", self.name, f"load v{v}", max(now, self.busy_until), max(now, self.busy_until) + t)
        self._stall(t)
        self.load_s += t
        self.version = v

    def submit(self, reqs: list[Request]) -> None:
        self._advance()
        for r in reqs:
            if r.version != self.version:
                raise RuntimeError(f"{self.name}: request {r.uid} has version {r.version}, instance hosts {self.version}")
            self.queue[r.uid] = _Seq(r.uid, r.group_id, r.prompt_tokens, int(r.payload), 0, (), False)
        self._admit()
        self._reschedule()

    def _state(self, s: _Seq, done: int, has_kv: bool) -> RequestState:
        kv = (s.prompt + done) * self.cost.model.kv_bytes_per_token if has_kv else 0
        return RequestState(s.uid, s.group_id, self.version, s.prompt, done, has_kv, kv, s.target, s.versions)

    def export(self, uids: list[str]) -> list[RequestState]:
        self._advance()
        out = []
        for u in uids:
            s = self.running.get(u)
            if s is not None:
                done = min(s.target - 1, s.done0 + int(self.P - s.p0))
                self._remove(s)
                self.tokens += done - s.done0
                out.append(self._state(s, done, True))
            else:
                s = self.queue.pop(u)
                out.append(self._state(s, s.done0, s.has_kv))
        self._admit()
        self._reschedule()
        return out

    def import_(self, states: list[RequestState]) -> None:
        self._advance()
        kv = 0
        resumed: collections.OrderedDict[str, _Seq] = collections.OrderedDict()
        for st in states:
            if st.version != self.version:
                raise RuntimeError(f"{self.name}: import of {st.uid} at version {st.version}, instance hosts {self.version}")
            resumed[st.uid] = _Seq(st.uid, st.group_id, st.prompt_tokens, int(st.payload), st.tokens_done,
                                   tuple(st.token_versions), st.has_kv)
            kv += st.kv_bytes
        # in-flight work resumes first, in the order it was running (oldest admitted first)
        resumed.update(self.queue)
        self.queue = resumed
        if kv:
            t = self.cost.kv_transfer_s(kv)
            self._stall(t)
            self.kv_import_s += t
        self._admit()
        for st in states:                  # what did not fit waits with its KV in host memory
            s = self.queue.get(st.uid)
            if s is not None and s.has_kv:
                s.in_host = True
        self._reschedule()

    def interrupt_all(self) -> list[RequestState]:
        self._advance()
        out = []
        for s in list(self.running.values()):
            done = min(s.target - 1, s.done0 + int(self.P - s.p0))
            self._remove(s)
            self.tokens += done - s.done0
            out.append(self._state(s, done, False))
        for s in self.queue.values():
            out.append(self._state(s, s.done0, False))
        self.queue.clear()
        self.heap.clear()
        self._reschedule()
        return out

    def stats(self) -> InstanceStats:
        self._advance()
        n = len(self.running)
        used = self.ctx_base + n * self.P
        return InstanceStats(n, len(self.queue), self.slots, used / self.kv_capacity if self.kv_capacity else 0.0,
                             self.busy_until > self.clock.now())
