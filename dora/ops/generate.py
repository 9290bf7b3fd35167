"""The generate operator: prompt rows in, trajectory rows out, through a generation engine.

process() only submits (one SamplingRequest per row); the worker calls poll() while busy() and each
poll() runs one engine step and emits the rows that finished in it, so short responses leave
while long ones are still decoding. Every input column is passed through: the row travels in
the request's meta (so it also survives export/import to another replica).

Control methods (the rollout orchestrator drives these through the controller):
    load_version(version, path)   weights file from the update op; makes it the current version.
                                  A replica hosts up to its engine's max_versions versions (the run's
                                  async.versions_per_instance, which resolve makes 1 on vllm): with 1,
                                  only when idle / after interrupt_all; with more, older versions'
                                  requests stay and finish on their own weights (the caller keeps the
                                  versions needed within max_versions). An older version's weights leave
                                  when its last request here finishes or is exported. Replies carry
                                  `hosted` (the versions whose weights are here after the call).
    export(uids) -> states        removes them here; wire-safe (msgpack dict + raw KV frames)
    import_(state, buffers)       resume states exported by a replica (KV reused at the same version)
    interrupt_all() -> states     export everything (partial rollout before a version switch)
    abort(uids) -> {"aborted": [...]}, stats() -> dict
    sleep() / wake()              hand the device's memory back (KV and weights) to the trainer
                                  (async.elastic; a device shared in sync mode) / take it again
                                  (load_version follows)
A replica with index >= the node's replica count is an elastic spare placed on the trainer's
devices (dora/runtime/placement.py): it starts asleep and never receives broadcasts (it loads the
version's file when lent).
With `weight_sync: broadcast` a WeightReceiver (dora/ops/weights/broadcast.py, rank replica + 1)
receives every version the trainer broadcasts into host memory; load_version then takes the
version from memory (waiting up to BROADCAST_WAIT_S for it) and falls back to the file path
otherwise. Torch engine only (vLLM loads files).
Each poll that finishes requests reports {"kind": "finished", "uids": [...], "version": v,
"hosted": [...]} per dispatched version, so the orchestrator can track outstanding work and the
versions still hosted here.
C1 across turns: a trajectory waiting on a tool takes its next turn on its own version, so that
version stays hosted while it waits (AgentLoop.waiting_versions -> Engine.keep_versions), and
load_version refuses a version that would leave no room for it (always when max_versions is 1).
Rows with an `eval_set` column are held-out evaluation requests (dora/ops/eval_requests.py): run on
their own version with the set's sampling, reported in `eval_finished` events instead of emitted,
and aborted (`eval_aborted`) rather than ever holding up a load_version (the weight slots it needs)
or a sleep; interrupt_all leaves them be.
max_turns > 1: multi-turn rollouts with tools (dora/ops/multiturn/agent_loop.py): a request is a
trajectory of model turns and tool observations under one uid; the rows get the multi-turn columns
and the `finished` event per-trajectory lists (agent_loop.event_fields).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Iterable

import pyarrow as pa

from dora.graph.builtin_ops import ENGINE_COUNTERS, ENGINE_GAUGES, MULTITURN_COLUMNS
from dora.graph.columns import COLUMNS
from dora.ops.base import Operator, OpContext, WithBuffers
from dora.ops.engines.engine import Completion, Engine, SamplingRequest, states_from_wire, states_to_wire
from dora.ops.eval_data import is_eval
from dora.ops.eval_requests import EvalRequests
from dora.ops.multiturn.agent_loop import AgentLoop, event_fields, trajectory_columns
from dora.ops.generate_settings import check_params, devices_problem   # (the declarations name them there)
from dora.ops.weights.broadcast import WeightReceiver

__all__ = ["GenerateOp", "check_params", "devices_problem", "make_engine", "stop_token_ids"]

OUTPUT_COLUMNS = ("response_ids", "response_text", "behavior_logprobs", "token_versions", "policy_version",
                  "finish_reason")
# The trainer reports a version only after broadcasting it, so it is normally here at once;
# past this wait the replica loads the version's file instead.
BROADCAST_WAIT_S = 10.0
STEP_S_EMA = 0.2      # weight of the newest iteration in stats()' step_s (about the last five)


class IterationTimes:
    """The engine iteration's time, averaged over the last few that had work (stats() `step_s`: the
    rollout control code fits how decode time grows with the batch from it; 0: not measured yet)."""

    def __init__(self):
        self.step_s = 0.0

    def record(self, seconds: float, working: bool) -> None:
        if working:
            self.step_s = seconds if not self.step_s else STEP_S_EMA * seconds + (1 - STEP_S_EMA) * self.step_s


class GenerateOp(Operator):
    control_methods = ("submit", "load_version", "export", "import_", "interrupt_all", "stats", "abort", "snapshot",
                       "sleep", "wake")

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        p = ctx.params
        # weights from the run seed (identical to the trainer's start); sampling differs per replica
        self.engine, self.tokenizer = make_engine(p, ctx.model, device=ctx.device, model_seed=ctx.seed,
                                                  sample_seed=ctx.seed * 1000 + ctx.replica + 1,
                                                  run_dir=ctx.run_dir, label=ctx.label, devices=ctx.devices,
                                                  memory=ctx.memory, max_versions=ctx.async_.versions_per_instance)
        self.max_versions = self.engine.max_versions     # vllm: 1, whatever the run asks
        self.stop_ids = stop_token_ids(p["stop"], self.tokenizer, ctx.label)
        self.sampling = {k: p[k] for k in ("temperature", "top_p", "top_k", "max_tokens")}
        self.agent = AgentLoop(self.engine, self.tokenizer, p, self.stop_ids) if p["max_turns"] > 1 else None
        if self.agent is not None:
            self.engine.keep_versions = self.agent.waiting_versions
        self.out_columns = OUTPUT_COLUMNS + (MULTITURN_COLUMNS if self.agent is not None else ())
        self.in_fields: dict[str, pa.Field] = {}   # pass-through columns seen so far, in order
        self.in_flight: set[str] = set()           # uids submitted or imported here, not yet finished or handed on
        self.counters_reported = dict.fromkeys(ENGINE_COUNTERS, 0)
        self.waits_reported: set[str] = set()      # uids in a tool wait at the last `tool_waits` event
        self.iterations = IterationTimes()         # seconds per engine iteration lately (stats() step_s)
        self.evals = EvalRequests(self)            # held-out evaluation requests (dora/ops/eval_requests.py)
        if p["weight_sync"] == "broadcast" and not ctx.run_dir:
            raise ValueError(f"{ctx.label}: weight_sync: broadcast needs a run_dir (the rendezvous file is there)")
        self.receiver = None
        if p["weight_sync"] == "broadcast" and not ctx.elastic_spare:
            keep = ctx.async_.max_staleness + 2
            self.receiver = WeightReceiver(ctx.files_dir, ctx.replica + 1, ctx.device, keep=keep, label=ctx.label)
        self.loads_by_source = {"file": 0, "broadcast": 0}
        if ctx.restore and ctx.restore.get("sampling_state"):
            self.engine.set_sampling_state(ctx.restore["sampling_state"])
        if ctx.elastic_spare:   # the trainer's devices are the trainer's until the driver lends them
            self.engine.sleep()

    # ------------------------------------------------------------------ data
    def process(self, batch: pa.RecordBatch, port: str) -> Iterable[pa.RecordBatch]:
        for name in ("uid", "prompt_ids"):
            if name not in batch.schema.names:
                raise ValueError(f"{self.ctx.label}: input batch lacks column {name!r}; it has {batch.schema.names}")
        for f in batch.schema if "eval_set" not in batch.schema.names else ():   # (training rows' types only)
            if f.name not in self.out_columns:
                self.in_fields.setdefault(f.name, f)
        rows = batch.to_pylist()
        for row in rows:   # check the whole batch before submitting any of it
            if not row["prompt_ids"]:
                raise ValueError(f"{self.ctx.label}: row uid={row['uid']!r} has empty prompt_ids")
        for row in rows:
            version = row.get("policy_version")
            version = self.engine.version if version is None else int(version)
            uid, prompt_ids = str(row["uid"]), [int(t) for t in row["prompt_ids"]]
            passed = {k: v for k, v in row.items() if k not in self.out_columns}
            if is_eval(row):
                self.evals.start(uid, prompt_ids, version, passed)
                continue
            if self.agent is not None:
                self.agent.start(uid, prompt_ids, version, passed)
            else:
                self.engine.submit(SamplingRequest(uid=uid, prompt_ids=prompt_ids, version=version, stop_ids=self.stop_ids,
                                                   meta={"row": passed}, **self.sampling))
            self.in_flight.add(uid)   # (after: a request the engine refused is not held here)
        return ()

    def busy(self) -> bool:
        return self.engine.has_work() or (self.agent is not None and self.agent.has_work())

    def poll(self) -> Iterable[pa.RecordBatch]:
        t0, working = time.perf_counter(), self.engine.has_work()
        done = [c for c in self.engine.step() if c.finish_reason != "abort"]
        self.iterations.record(time.perf_counter() - t0, working)
        if self.agent is not None:   # finished turns go on to tools; only ended trajectories come back
            done = self.agent.advance(done)
            self._report_waits()
        done = self.evals.take_finished(done)   # (reported, never emitted)
        self.in_flight.difference_update(c.uid for c in done)
        if not done:
            return ()
        by_version: dict[int, list] = {}
        for c in done:
            by_version.setdefault(c.version, []).append(c)
        engine = self._engine_report()
        hosted = self.engine.hosted_versions()
        for v, cs in by_version.items():
            # distinct token versions and lengths ride along so the orchestrator can check C1
            # and count tokens without waiting for the row to reach the trainer
            event = {"kind": "finished", "uids": [c.uid for c in cs], "version": v,
                     "token_versions": [sorted(set(c.token_versions)) for c in cs],
                     "response_tokens": [len(c.response_ids) for c in cs], "hosted": hosted}
            if self.agent is not None:
                event.update(event_fields(cs))
            event.update(engine)
            engine.update(dict.fromkeys(ENGINE_COUNTERS, 0))   # (counted once per poll)
            self.ctx.report(event)
        return [self.rows(done)]

    def _report_waits(self) -> None:
        """A `tool_waits` event whenever the set of trajectories waiting on a tool changed: the
        orchestrator does not count them as decoding load, and the trace draws each wait."""
        now = set(self.agent.waiting)
        if now != self.waits_reported:
            old, self.waits_reported = self.waits_reported, now
            self.ctx.report({"kind": "tool_waits", "waiting": len(now), "started": sorted(now - old),
                             "ended": sorted(old - now)})

    def _engine_report(self) -> dict[str, int]:
        """The engine's counters since the last report and its gauges now (the driver's ledger puts
        them in each step's metrics)."""
        st = self.engine.stats().to_dict()
        now = {k: int(st.get(k, 0)) for k in ENGINE_COUNTERS}
        last, self.counters_reported = self.counters_reported, now
        return {**{k: now[k] - last[k] for k in ENGINE_COUNTERS}, **{k: int(st.get(k, 0)) for k in ENGINE_GAUGES}}

    def rows(self, done: list[Completion]) -> pa.RecordBatch:
        out = []
        for c in done:
            row = dict(c.meta.get("row", {}))
            row.update(response_ids=c.response_ids, response_text=self.tokenizer.decode(c.response_ids, skip_special_tokens=True),
                       behavior_logprobs=c.logprobs, token_versions=c.token_versions, policy_version=c.version,
                       finish_reason=c.finish_reason)
            if self.agent is not None:
                row.update(trajectory_columns(c, self.tokenizer))
            out.append(row)
        # pass-through columns keep their input type; rows imported from another replica may
        # bring columns this one never saw: well-known names get their fixed type, others inferred
        names = list(dict.fromkeys(k for r in out for k in r if k not in self.out_columns))
        arrays, fields = [], []
        for name in names + list(self.out_columns):
            values = [r.get(name) for r in out]
            f = self.in_fields.get(name)
            typ = f.type if f is not None else COLUMNS.get(name)
            arr = pa.array(values, type=typ)
            arrays.append(arr)
            fields.append(f if f is not None else pa.field(name, arr.type))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))

    # ------------------------------------------------------------------ control
    def load_version(self, version: int, path: str) -> dict[str, Any]:
        if self.agent is not None:   # (multi-turn: evaluation trajectories waiting on a tool must not hold a version)
            self.evals.abort_others(int(version), f"version {version} loaded")
        waiting = self.agent.waiting_versions() if self.agent is not None else set()
        if waiting and (self.max_versions == 1 or len(waiting | {int(version)}) > self.max_versions):
            # C1 across turns: their next turn must run on their version, which must stay hosted
            raise RuntimeError(f"{self.ctx.label}: load_version({version}) while {len(self.agent.waiting)} trajectories "
                               f"of versions {sorted(waiting)} wait on a tool and this replica hosts at most "
                               f"{self.max_versions} version(s) (their next turn must run on their version); "
                               "export or interrupt them first")
        t0 = time.perf_counter()
        source, weights = "file", path
        if self.receiver is not None:
            try:
                weights, source = self.receiver.get(int(version), BROADCAST_WAIT_S), "broadcast"
            except (TimeoutError, RuntimeError) as e:   # not arrived, or the receiver failed: the file has it
                print(f"{self.ctx.label}: loading version {version} from {path}: {e}", file=sys.stderr, flush=True)
        self.evals.load_weights(int(version), weights)   # (aborts older evaluations only if it needs their slot)
        self.loads_by_source[source] += 1
        return {"version": int(version), "seconds": time.perf_counter() - t0, "source": source,
                "hosted": self.engine.hosted_versions()}

    def submit(self, buffers: list) -> dict[str, Any]:
        """Prompt rows as an Arrow IPC stream over the control channel. The orchestrator submits
        this way so that a submit and a later load_version / export / interrupt_all reach this
        replica in the order they were issued (data and control sockets are not ordered together)."""
        n = 0
        for buf in buffers:
            for batch in pa.ipc.open_stream(pa.py_buffer(buf)):
                self.process(batch, "prompts")
                n += batch.num_rows
        return {"submitted": n}

    def export(self, uids: list[str]):
        # A uid the orchestrator still counts here may have finished a moment ago (its `finished`
        # event is on the way): it is not exported, and the caller sees it missing from the states.
        held = [u for u in map(str, uids) if u in self.in_flight]
        self.in_flight.difference_update(held)
        states = (self.agent or self.engine).export(held)   # a multi-turn one may be waiting on a tool
        if self.agent is not None:
            self._report_waits()
        return self._states_reply(states)

    def _states_reply(self, states: list) -> WithBuffers:
        """Exported states (KV as raw frames, never pickled) and the versions still hosted here."""
        value, frames = states_to_wire(states)
        value["hosted"] = self.engine.hosted_versions()
        return WithBuffers(value, frames)

    def interrupt_all(self):
        # the training requests; evaluation ones stay (a load that needs their weight slot aborts them)
        held, self.in_flight = list(self.in_flight), set()
        states = (self.agent or self.engine).export(held) if self.evals.version_of else (self.agent or self.engine).interrupt_all()
        if self.agent is not None:
            self._report_waits()
        return self._states_reply(states)

    def import_(self, state: dict[str, Any], buffers: list | None = None) -> dict[str, Any]:
        states = states_from_wire(state, list(buffers or []))
        (self.agent or self.engine).import_(states)
        self.in_flight.update(s.request.uid for s in states)
        if self.agent is not None:
            self._report_waits()
        return {"imported": [s.request.uid for s in states], "hosted": self.engine.hosted_versions()}

    def abort(self, uids: list[str]) -> dict[str, Any]:
        gone = self.evals.abort([str(u) for u in uids])
        aborted = gone + [u for u in map(str, uids) if u not in gone and (self.agent.abort(u) if self.agent is not None
                                                 else self.engine.abort(u) is not None)]
        self.in_flight.difference_update(aborted)
        if self.agent is not None:
            self._report_waits()
        return {"aborted": aborted}

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = self.engine.stats().to_dict()
        out.update(hosted=self.engine.hosted_versions(), max_versions=self.max_versions, step_s=self.iterations.step_s)
        if self.agent is not None:   # trajectories whose tools are running (they hold no decode slot)
            out["tool_waiting"] = len(self.agent.waiting)
            out["tool_failures"] = self.agent.tool_failures()
        return out

    def sleep(self, keep_graphs: bool = False) -> dict[str, Any]:
        """Release the KV cache and the weights (only when nothing is in flight here); keep_graphs:
        keep what the engine's captured graphs point to (TorchEngine.sleep)."""
        t0 = time.perf_counter()
        self.evals.abort_others(None, "sleep")
        if self.in_flight:
            raise RuntimeError(f"{self.ctx.label}: sleep() with {len(self.in_flight)} requests in flight; export them first")
        freed = self.engine.sleep(keep_graphs=bool(keep_graphs))
        return {"seconds": time.perf_counter() - t0, "bytes": freed}

    def wake(self) -> dict[str, Any]:
        """Allocate the weights' memory again; a load_version must follow before any request."""
        t0 = time.perf_counter()
        allocated = self.engine.wake()
        return {"seconds": time.perf_counter() - t0, "bytes": allocated}

    def snapshot(self) -> dict[str, Any]:
        """This replica's part of a run checkpoint: the sampler's RNG state (None if the engine has none)."""
        return {"sampling_state": self.engine.sampling_state()}

    def live_stats(self) -> dict[str, Any]:
        return self.stats()

    def teardown(self) -> None:
        if getattr(self, "agent", None) is not None:
            self.agent.close()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()


def stop_token_ids(stop: list[str], tokenizer, label: str) -> list[int]:
    """The `stop` param's strings as token ids: each must be exactly one token of the tokenizer."""
    ids = []
    for s in stop:
        enc = tokenizer.encode(s, add_special_tokens=False)
        if len(enc) != 1:
            raise ValueError(f"{label}: stop string {s!r} is {len(enc)} tokens {enc}; generate stops on "
                             "single-token strings only (use a string that is one token)")
        ids.append(int(enc[0]))
    return ids


def make_engine(params: dict[str, Any], model_cfg: dict[str, Any], *, device: str = "cpu", model_seed: int = 0,
                sample_seed: int = 0, run_dir: str | None = None, label: str = "generate",
                devices: int = 1, memory: float | None = None, max_versions: int = 1) -> tuple[Engine, Any]:
    """(engine, tokenizer) for the generate op's params and the pipeline's model section; `devices` > 1
    is a tensor-parallel group (vllm only: validation refuses it for the torch engine); `memory` the
    replica's declared share of its device, which sizes the engine's KV pool; `max_versions` the
    versions the torch engine hosts at once (vllm holds one set of weights)."""
    from dora.ops.models import load_policy

    if params["engine"] == "vllm":
        from dora.ops.engines.vllm_engine import VllmEngine
        return VllmEngine.from_model_cfg(model_cfg, max_batch=params["max_batch"], model_seed=model_seed,
                                         sample_seed=sample_seed, run_dir=run_dir, label=label,
                                         tensor_parallel_size=devices, dtype=params["dtype"], memory_share=memory)
    from dora.ops.engines.torch_engine import TorchEngine
    model, tok = load_policy(model_cfg, "cpu", seed=model_seed)   # the engine copies the weights onto `device`
    return TorchEngine(model, version=0, max_batch=params["max_batch"], seed=sample_seed, device=device,
                       dtype=params["dtype"], kv_cache_gb=params["kv_cache_gb"], memory_fraction=memory,
                       max_versions=max_versions), tok
