"""SimInstance: a simulated rollout instance (the RolloutInstance protocol of dora.rl.rollout) over a
SimEngine (dora/sim/sim_engine.py: continuous batching, KV admission and preemption, tool waits,
time accounting). It hosts its current version and, with versions_per_instance M > 1, the older
versions of requests still on it (dora/sim/hosted_versions.py: each extra weight copy comes out of
the KV room, each version with running requests reads its weights every decode step); submit,
export, import_ and interrupt_all move requests in and out of the engine."""

from __future__ import annotations

import collections

from dora.rl.rollout.types import InstanceStats, Request, RequestState

from .sim_engine import SimEngine, SimSeq


class SimInstance(SimEngine):
    eval_aborted = None   # held-out evaluation requests aborted here go to this callback (dora/sim/sim_evals.py)

    # -- RolloutInstance -----------------------------------------------------------------------
    def _abort_evals(self, keep: int | None) -> list[str]:
        """As the generate op: evaluation requests of versions other than `keep` never stand in the way."""
        uids = [u for u in (*self.running, *self.queue, *self.waiting)
                if u.startswith("eval:") and (self.running.get(u) or self.queue.get(u) or self.waiting.get(u)).version != keep]
        if uids:
            self._advance()
            for u in uids:
                self._take_out(u, False)
            self._versions_changed()
            if self.eval_aborted is not None:
                self.eval_aborted(uids)
        return uids

    def load_version(self, v: int) -> None:
        problem = self.hv.problem_loading(v)
        if problem and self._abort_evals(v):   # (older evaluation requests decode on while a weight slot allows)
            problem = self.hv.problem_loading(v)
        if problem:
            raise RuntimeError(f"{self.name}: load_version({v}): {problem}")
        self._advance()
        if not self.hv.holds(v):                  # weights already here (a hosted older version): no copy
            t = self.cost.weight_load_s()
            now = self.clock.now()
            self.trace.span("rollout", self.name, f"load v{v}", max(now, self.busy_until),
                            max(now, self.busy_until) + t)
            self._stall(t)
            self.load_s += t
        self.hv.current = v
        self._versions_changed()
        if self.running or self.queue:
            self._admit()                         # a smaller KV room preempts what no longer fits
            self._reschedule()

    def load_version_in_flight(self, v: int) -> None:
        """PipelineRL's update: the weight load stalls the instance, then every request here goes on
        with v, its KV kept (no re-prefill); the tokens it generates from now on are v's."""
        self._advance()
        t = self.cost.weight_load_s()
        now = self.clock.now()
        self.trace.span("rollout", self.name, f"swap v{v}", max(now, self.busy_until), max(now, self.busy_until) + t)
        self._stall(t)
        self.load_s += t
        for s in [*self.running.values(), *self.queue.values(), *self.waiting.values()]:
            fresh = s.uid in self.running and s.done0 == 0 and self.P - s.p0 < 1
            if s.uid in self.running and not fresh:
                s.versions = tuple(sorted({*s.versions, v}))   # its next tokens are v's
            elif fresh:
                s.versions = (v,)                              # admitted, nothing generated yet
            s.version = v
        self.hv.switch_all(v)
        self._versions_changed()

    def submit(self, reqs: list[Request]) -> None:
        self._advance()
        for r in reqs:
            if r.version != self.version:
                raise RuntimeError(f"{self.name}: request {r.uid} has version {r.version}, instance hosts {self.version}")
            self.queue[r.uid] = SimSeq(r.uid, r.group_id, r.version, r.prompt_tokens, r.payload, 0, (), False)
            self.hv.arrive(r.version)
        self._admit()
        self._reschedule()

    def _state(self, s: SimSeq, done: int, has_kv: bool) -> RequestState:
        kv = (s.prompt + s.extra + done) * self.cost.model.kv_bytes_per_token if has_kv else 0
        return RequestState(s.uid, s.group_id, s.version, s.prompt, done, has_kv, kv, s.payload, s.versions,
                            s.ready_at)

    def _take_out(self, u: str, keep_kv: bool) -> RequestState:
        s = self.running.get(u)
        if s is not None:
            done = min(s.turn_end - 1, s.done0 + int(self.P - s.p0))
            self._remove(s)
            self.tokens += done - s.done0
            st = self._state(s, done, keep_kv)
        else:
            s = self.queue.pop(u, None) or self.waiting.pop(u)
            st = self._state(s, s.done0, keep_kv and s.has_kv)
        self.hv.leave(s.version)
        return st

    def export(self, uids: list[str]) -> list[RequestState]:
        self._advance()
        out = [self._take_out(u, True) for u in uids]
        self._versions_changed()
        self._admit()
        self._reschedule()
        return out

    def import_(self, states: list[RequestState]) -> None:
        self._advance()
        kv = 0
        resumed: collections.OrderedDict[str, SimSeq] = collections.OrderedDict()
        for st in states:
            if not self.hv.holds(st.version):
                raise RuntimeError(f"{self.name}: import of {st.uid} at version {st.version}, instance hosts "
                                   f"{sorted(self.hv.hosted())}")
        for st in states:
            s = SimSeq(st.uid, st.group_id, st.version, st.prompt_tokens, st.payload, st.tokens_done,
                       tuple(st.token_versions), st.has_kv, st.resume_at)
            self.hv.arrive(st.version)
            kv += st.kv_bytes
            if s.ready_at is not None:            # between turns: the tool is still running
                s.in_host = True
                self.waiting[s.uid] = s
                self.clock.call_at(s.ready_at, lambda s=s: self._tool_back(s))
                continue
            if s.plan is not None and s.has_kv:   # the tool's output arrived but is not prefilled yet
                s.fresh = s.plan.tool_tokens_pending(s.done0)
            resumed[st.uid] = s
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

    def abort(self, uids: list[str]) -> list[str]:
        """Drop these requests here, as the generate op drops an evaluation's (not reported back); the
        uids it held."""
        here = [u for u in uids if u in self.running or u in self.queue or u in self.waiting]
        if here:
            self._advance()
            for u in here:
                self._take_out(u, False)
            if not self.running:
                self.heap.clear()
            self._versions_changed()
            self._reschedule()
        return here

    def interrupt_all(self) -> list[RequestState]:
        self._advance()   # (held-out evaluation requests stay, as in the generate op)
        out = [self._take_out(u, False) for u in [*self.running, *self.queue, *self.waiting] if not u.startswith("eval:")]
        if not self.running:
            self.heap.clear()   # (else entries of requests taken out are skipped as they come up)
        self._versions_changed()
        self._reschedule()
        return out

    def hosted_versions(self) -> set[int]:
        return self.hv.hosted()

    def stats(self) -> InstanceStats:
        self._advance()
        n = len(self.running)
        used = self.ctx_base + n * self.P
        return InstanceStats(n, len(self.queue), self.slots, used / self.kv_capacity if self.kv_capacity else 0.0,
                             self.busy_until > self.clock.now(), self._step_s() if n else 0.0, len(self.waiting),
                             min(1.0, self.cost.weight_tokens() / self.kv_capacity) if self.hv.limit > 1 else 0.0)
