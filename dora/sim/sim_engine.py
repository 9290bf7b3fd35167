"""SimEngine: the simulated continuous-batching engine behind a SimInstance (dora/sim/sim_instance.py).

Event-driven per request completion, not per token: every running sequence advances one token
per decode iteration, so a single progress counter P (tokens per running sequence) describes
them all. A request admitted at P0 with r tokens to go ends at P = P0 + r; a heap of end points
gives the next completion, and the decode rate (1 / decode_step_s(batch, context)) is constant
between events (the context term is refreshed at every event). Prefill, weight loads and KV
imports stall decoding for their duration. KV, as a paged engine (vLLM) does it: a request is
admitted while used KV + its prompt stays under ADMIT_WATERMARK of capacity; KV grows by one token
per running sequence per iteration (used = ctx_base + n * P, so the moment it fills is known in
advance and is an event); when it is full the most recently admitted sequences are preempted
(back to the queue front, counted in `preemptions`): recomputed (re-prefilled when readmitted), or
with `offload_preempted` (SimConfig.kv_offload) their KV is copied to host memory and back when
readmitted, at the host link's rate.
Migrated requests (import_) that do not fit at once wait with their KV parked in host memory;
admitting one later stalls decoding for the host -> GPU copy (`kv_reload_s`, counted in
kv_import_s with the transfers).

Multi-turn (agentic) requests carry a `Turns` plan as payload: at the end of each turn but the
last the sequence leaves the running set (its slot is free), its KV is parked in host memory
while the tool runs (`wait_s` of simulated time, outside the engine), then it queues again with
the tool's output to prefill on top of the reloaded context.

Occupancy (for the bubble metric): while decoding, an instance is busy in proportion to
max(running / slots, KV used / capacity): it is full when either limit is reached, and an
instance decoding one sequence with a nearly empty cache is mostly idle.
"""

from __future__ import annotations

import collections
import heapq
from typing import Callable

from dora.observe.trace import TraceWriter
from dora.rl.rollout.types import Finished

from .virtual_clock import VirtualClock
from .costmodel import CostModel
from .hosted_versions import HostedVersions
from .workload_base import Turns


ADMIT_WATERMARK = 0.95     # admit while used KV + the new prompt stays below this fraction
PREEMPT_TO = 0.98          # when KV is full, preempt down to this fraction


class SimSeq:
    """One request inside a SimEngine: where it is (running, queued, waiting for a tool) and how far."""

    __slots__ = ("uid", "group_id", "version", "prompt", "target", "done0", "p0", "end", "versions", "has_kv",
                 "in_host", "plan", "turn_end", "extra", "fresh", "ready_at")

    def __init__(self, uid, group_id, version, prompt, payload, done0, versions, has_kv, ready_at=None):
        self.uid, self.group_id, self.version, self.prompt = uid, group_id, version, prompt   # version: its weights (C1)
        self.done0, self.versions, self.has_kv = done0, versions, has_kv
        self.in_host = False         # KV parked in host memory (an import that did not fit, a tool wait)
        self.p0 = self.end = 0.0
        self.ready_at = ready_at     # waiting for a tool's output until then (multi-turn)
        if isinstance(payload, Turns):
            self.plan = payload
            self.target = payload.output_tokens
            self.turn_end = payload.turn_end(done0)
            self.extra = payload.tool_tokens_before(done0, waiting=ready_at is not None)
        else:
            self.plan, self.target = None, int(payload)
            self.turn_end, self.extra = self.target, 0
        self.fresh = 0               # tokens to prefill on top of the cached context (a tool's output)

    @property
    def ctx(self) -> int:
        """Tokens in context at admission: prompt, tool outputs so far, response so far."""
        return self.prompt + self.extra + self.done0

    @property
    def payload(self):
        return self.plan if self.plan is not None else self.target


class SimEngine:
    def __init__(self, name: str, cost: CostModel, clock: VirtualClock,
                 on_finished: Callable[[str, list[Finished]], None], trace: TraceWriter | None = None):
        self.name, self.cost, self.clock = name, cost, clock
        self.on_finished = on_finished
        self.trace = trace or TraceWriter(enabled=False)
        self.hv = HostedVersions()                  # versions whose weights it holds (M = hv.limit)
        self.slots = cost.model.max_batch
        self.kv_room = cost.kv_capacity_tokens      # KV tokens with one version's weights
        self._kv_cap = self.kv_room                 # KV tokens now: less one weight copy per extra version
        self.running: dict[str, SimSeq] = {}
        self.waiting: dict[str, SimSeq] = {}       # multi-turn: between turns, waiting for a tool
        self.heap: list[tuple[float, str]] = []
        self.queue: collections.OrderedDict[str, SimSeq] = collections.OrderedDict()
        self.P = 0.0
        self.t_last = 0.0
        self.busy_until = 0.0
        self.ctx_base = 0.0
        self._gen = 0
        # accounting (seconds / tokens)
        self.decode_s = self.prefill_s = self.reprefill_s = self.load_s = self.kv_import_s = 0.0
        self.occupied_s = 0.0        # decode time x occupancy (see the module doc)
        self.tool_reload_s = 0.0     # host -> GPU copies of contexts back from a tool wait
        self.switch_s = 0.0          # elastic: trainer state offloaded before serving rollout
        self.tokens = 0
        self.reprefill_tokens = 0
        self.preemptions = 0
        self.offload_preempted = False   # preempted requests keep their KV in host memory (else recomputed)

    # -- hosted versions ---------------------------------------------------------------------------
    @property
    def version(self) -> int | None:
        return self.hv.current

    @property
    def kv_capacity(self) -> int:
        return self._kv_cap

    @kv_capacity.setter
    def kv_capacity(self, tokens: int) -> None:
        """The KV room with one version hosted (the simulator's and elastic devices' override)."""
        self.kv_room = tokens
        self._versions_changed()

    def _versions_changed(self) -> None:
        """Weights came or left: the KV room follows (what no longer fits is preempted at the next
        admission, as when the cache fills)."""
        extra = max(0, self.hv.count() - 1)
        self._kv_cap = max(1, self.kv_room - extra * self.cost.weight_tokens())

    # -- time ----------------------------------------------------------------------------------
    def _step_s(self) -> float:
        n = len(self.running)
        if len(self.hv.running) > 1:
            return self.cost.decode_step_versions_s(self.hv.running.values(), self.ctx_base + n * self.P)
        return self.cost.decode_step_s(n, self.ctx_base + n * self.P)

    def _advance(self) -> None:
        now = self.clock.now()
        start = max(self.t_last, self.busy_until)
        if self.running and now > start:
            dt = now - start
            dp = dt / self._step_s()
            n = len(self.running)
            a = n / self.slots                                      # slot occupancy
            k0 = (self.ctx_base + n * self.P) / self._kv_cap     # KV occupancy grows linearly
            k1 = k0 + n * dp / self._kv_cap
            if k1 <= a:
                occ = a
            elif k0 >= a:
                occ = (k0 + k1) / 2
            else:
                f = (a - k0) / (k1 - k0)
                occ = f * a + (1 - f) * (a + k1) / 2
            self.occupied_s += dt * min(1.0, occ)
            self.P += dp
            self.decode_s += dt
        self.t_last = now

    def busy_s(self) -> float:
        """Device-seconds of work (per GPU of the instance): decode weighted by occupancy, prefill,
        weight loads, KV moves and reloads."""
        return self.occupied_s + self.prefill_s + self.load_s + self.kv_import_s + self.tool_reload_s + self.switch_s

    def overhead_s(self) -> float:
        """Device-seconds spent on orchestration rather than generation: weight loads, KV moves, switches."""
        return self.load_s + self.kv_import_s + self.switch_s

    def switch(self, seconds: float) -> None:
        """Elastic: a trainer device becomes this instance after `seconds` of moving trainer state."""
        self._advance()
        self._stall(seconds)
        self.switch_s += seconds

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
        p_full = (self._kv_cap - self.ctx_base) / n            # P at which KV is full
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
            self.tokens += s.turn_end - s.done0
            if s.turn_end < s.target:
                self._to_tool(s)
                continue
            self.hv.leave(s.version)
            done.append(Finished(uid, s.target + s.extra, s.versions))
        if done:
            self._versions_changed()
        self._admit()
        self._reschedule()
        if done:
            self.on_finished(self.name, done)

    # -- multi-turn: tool waits ------------------------------------------------------------------
    def _to_tool(self, s: SimSeq) -> None:
        """The turn is over: the slot is freed and the KV parked in host memory while the tool runs."""
        s.done0 = s.turn_end
        s.has_kv = s.in_host = True
        s.ready_at = self.clock.now() + s.plan.wait_after(s.done0)
        self.waiting[s.uid] = s
        self.clock.call_at(s.ready_at, lambda: self._tool_back(s))

    def _tool_back(self, s: SimSeq) -> None:
        if self.waiting.get(s.uid) is not s:      # exported meanwhile: its new instance schedules it
            return
        self._advance()
        del self.waiting[s.uid]
        s.ready_at = None
        tool = s.plan.tool_tokens_after(s.done0)
        s.extra += tool
        s.fresh = tool
        s.turn_end = s.plan.turn_end(s.done0)
        self.queue[s.uid] = s
        self._admit()
        self._reschedule()

    # -- running set ---------------------------------------------------------------------------
    def _remove(self, s: SimSeq) -> None:
        del self.running[s.uid]
        self.hv.stop(s.version)
        self.ctx_base -= s.ctx - s.p0

    def _preempt(self) -> None:
        running = self.running
        limit = PREEMPT_TO * self._kv_cap
        while len(running) > 1 and self.ctx_base + len(running) * self.P > limit:
            s = running[next(reversed(running))]          # the most recently admitted
            done = min(s.turn_end - 1, s.done0 + int(self.P - s.p0))
            self._remove(s)
            self.tokens += done - s.done0
            s.done0, s.fresh = done, 0
            if self.offload_preempted:                    # its KV goes to host memory, back when readmitted
                t = self.cost.kv_reload_s((s.ctx) * self.cost.model.kv_bytes_per_token)
                self._stall(t)
                self.kv_import_s += t
                s.has_kv = s.in_host = True
            else:
                s.has_kv = False
            self.queue[s.uid] = s
            self.queue.move_to_end(s.uid, last=False)
            self.preemptions += 1

    def _admit(self) -> None:
        self._preempt()
        q, running = self.queue, self.running
        limit = ADMIT_WATERMARK * self._kv_cap
        while q and len(running) < self.slots:
            s = next(iter(q.values()))
            ctx = s.ctx
            if running and self.ctx_base + len(running) * self.P + ctx > limit:
                break
            del q[s.uid]
            if s.in_host:
                cost = self.cost.kv_reload_s((ctx - s.fresh) * self.cost.model.kv_bytes_per_token)
                self._stall(cost)
                if s.fresh:
                    self.tool_reload_s += cost
                else:
                    self.kv_import_s += cost
                s.in_host = False
            if not s.has_kv:
                cost = self.cost.prefill_s(ctx)
                self._stall(cost)
                self.prefill_s += cost
                if s.done0:
                    self.reprefill_s += cost
                    self.reprefill_tokens += ctx - s.fresh
            elif s.fresh:
                cost = self.cost.prefill_s(s.fresh, ctx - s.fresh)
                self._stall(cost)
                self.prefill_s += cost
            s.fresh = 0
            if s.target > s.done0 and s.version not in s.versions:
                s.versions = tuple(sorted((*s.versions, s.version)))
            s.p0 = self.P
            s.end = self.P + (s.turn_end - s.done0)
            running[s.uid] = s
            self.hv.start(s.version)
            self.ctx_base += ctx - s.p0
            heapq.heappush(self.heap, (s.end, s.uid))
