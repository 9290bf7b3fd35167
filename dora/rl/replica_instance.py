"""A generate replica as the rollout control code sees it (a RolloutInstance): every method is a
control call to the replica's generate op, through the run controller. `driver` is the RLDriver
that owns it: its controller, clock, trace, the published weights and the prompt feed.

Versions (dora/rl/rollout/types.py): the replica hosts up to `max_versions` at once (the run's
async.versions_per_instance, which dora.graph.resolve makes 1 where an engine hosts one version). `version` is the current one; `hosted` the versions whose weights the replica reported at
its last reply (load_version, import_, stats): the current one and older ones with requests
there. An older version leaves the replica when its last request there finishes or is exported;
the replica's `finished` events carry `hosted` too (the control code may refresh from them with
`saw_hosted`)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from dora.rl.rollout import InstanceStats, Request, RequestState
from dora.runtime.errors import ReplicaLost
from dora.runtime.wire import WithBuffers

CALL_TIMEOUT_S = 120.0   # a weight load of a small model on a busy 2-core machine takes seconds, not minutes


class ReplicaInstance:
    """One generate replica seen by the rollout control code: every method is a control call."""

    def __init__(self, driver, node: str, replica: int, slots: int, max_versions: int = 1):
        self.driver, self.node, self.replica, self.slots = driver, node, replica, slots
        self.max_versions = max_versions
        self.name = f"{node}[{replica}]"
        self.version: int | None = 0    # every replica starts from the same seeded version-0 weights
        self.hosted: tuple[int, ...] = (0,)

    def _call(self, method: str, args: dict[str, Any], buffers: list[Any] = ()) -> Any:
        """A control call; None if the replica died first. The control code then goes on as if the call
        had done nothing, and the driver reissues whatever the dead replica held (on_replica_lost)."""
        try:
            return self.driver.ctrl.call(self.node, self.replica, method, args, timeout=CALL_TIMEOUT_S, buffers=buffers)
        except ReplicaLost:
            return None

    def load_version(self, v: int) -> None:
        """With max_versions > 1 older versions' requests stay and finish on their own weights."""
        if v == self.version:
            return
        path = self.driver.weight_paths[v]
        clock = self.driver.clock
        t0 = clock.now()
        got = self._call("load_version", {"version": v, "path": path})
        self.driver.trace.span("rollout", self.name, "load_weights", t0, clock.now(),
                               version=v)
        self.driver.weight_loads += 1
        self.version = v
        self.saw_hosted(got)

    def saw_hosted(self, reply: Any) -> None:
        """Take the hosted versions a reply or `finished` event of the replica reports."""
        if isinstance(reply, dict) and reply.get("hosted") is not None:
            self.hosted = tuple(int(v) for v in reply["hosted"])

    def sleep(self, keep_graphs: bool = False) -> int:
        """Hand the device's memory back (the engine's KV and weights; nothing may be in flight here):
        it then holds no version. keep_graphs: keep what the engine's captured graphs point to (its
        memory share is its own). Bytes released."""
        clock = self.driver.clock
        t0 = clock.now()
        got = self._call("sleep", {"keep_graphs": keep_graphs} if keep_graphs else {}) or {}
        self.version, self.hosted = None, ()
        self.driver.trace.span("rollout", self.name, "sleep", t0, clock.now(), bytes=got.get("bytes"))
        return int(got.get("bytes") or 0)

    def wake(self) -> int:
        """Take the device's memory again; a load_version must follow before any request. Bytes allocated."""
        clock = self.driver.clock
        t0 = clock.now()
        got = self._call("wake", {}) or {}
        self.driver.trace.span("rollout", self.name, "wake", t0, clock.now(), bytes=got.get("bytes"))
        return int(got.get("bytes") or 0)

    def submit(self, reqs: list[Request]) -> None:
        if not reqs:
            return
        rows = []
        for r in reqs:
            row = dict(r.payload)
            row["policy_version"] = r.version
            rows.append(row)
        # (held-out evaluation requests carry their set's columns: their own schema, inferred)
        schema = None if "eval_set" in rows[0] else self.driver.prompts.schema
        batch = pa.RecordBatch.from_pylist(rows, schema=schema)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        # over the control channel, so it stays ordered with load_version / export / interrupt_all
        self._call("submit", {}, buffers=[sink.getvalue()])

    def _states(self, result: Any) -> list[RequestState]:
        """Engine states (dora.ops.engines.engine.states_to_wire) as the control code's RequestStates;
        each keeps its own wire dict and raw KV frames as payload, ready for import elsewhere."""
        value, buffers = (result.value, list(result.buffers)) if isinstance(result, WithBuffers) else (result or {}, [])
        self.saw_hosted(value)
        out, at = [], 0
        for d, count in zip(value.get("states", []), value.get("frame_counts", [])):
            frames = buffers[at:at + count]
            at += count
            req = d["request"]
            uid = str(req["uid"])
            has_kv = d.get("kv") is not None and d.get("kv_version") == req["version"]
            out.append(RequestState(
                uid=uid, group_id=self.driver.prompts.group_of(uid), version=int(req["version"]),
                prompt_tokens=len(req["prompt_ids"]), tokens_done=len(d["response_ids"]), has_kv=has_kv,
                kv_bytes=sum(len(f) for f in frames), payload=(d, frames),
                token_versions=tuple(sorted(set(d["token_versions"])))))
        return out

    def abort(self, uids: list[str]) -> list[str]:
        """Drop these requests here (an abandoned held-out evaluation's); the uids it held."""
        return list((self._call("abort", {"uids": list(uids)}) or {}).get("aborted", []))

    def export(self, uids: list[str]) -> list[RequestState]:
        return self._states(self._call("export", {"uids": list(uids)}))

    def interrupt_all(self) -> list[RequestState]:
        return self._states(self._call("interrupt_all", {}))

    def import_(self, states: list[RequestState]) -> None:
        """Each state's version is the current one or one hosted here (it then resumes on that
        version, its KV reused); a state of a version not hosted here resumes on the current one."""
        if not states:
            return
        wire_states = [st.payload[0] for st in states]
        frames = [f for st in states for f in st.payload[1]]
        counts = [len(st.payload[1]) for st in states]
        self.saw_hosted(self._call("import_", {"state": {"states": wire_states, "frame_counts": counts}}, buffers=frames))

    def load_version_in_flight(self, v: int) -> None:
        """partial_inflight (PipelineRL): the requests here go on under v over the KV their older
        version computed. Done with the calls a replica has: interrupt everything (tokens and KV
        kept), load v, import them back as v's with their KV marked v's, so the engine reuses it
        instead of prefilling again (an engine with an in-place swap would skip the KV's round trip
        through host memory; the simulator charges only the weight load)."""
        states = self.interrupt_all()
        self.load_version(v)
        for st in states:
            wire = st.payload[0]
            wire["request"] = {**wire["request"], "version": v}
            if wire.get("kv") is not None:
                wire["kv_version"] = v
            st.version = v
        self.import_(states)

    def stats(self) -> InstanceStats:
        s = self._call("stats", {}) or {}
        self.saw_hosted(s)
        cap = max(1, int(s.get("kv_tokens_capacity") or 0))
        return InstanceStats(active=int(s.get("active", 0)), queued=int(s.get("queued", 0)), slots=self.slots,
                             kv_used_fraction=float(s.get("kv_tokens_used", 0)) / cap,
                             step_s=float(s.get("step_s") or 0.0), tool_waiting=int(s.get("tool_waiting", 0)))
