"""The RL driver: runs DORA's rollout control code (dora.runtime.rollout) against real workers.

The controller streams the graph as dataflow, except two edges it hands to this driver:

    dataset -> generate   prompts arrive here; the RolloutController decides which version
                          tags each prompt group and which generate replica runs it
    X -> update           scored trajectories arrive here (X is whatever feeds the trainer:
                          advantage, filter, ...); the TransferQueue decides when the trainer
                          gets exactly TBS of them, whole groups, oldest version first

Generate replicas are RolloutInstances through `ReplicaInstance` (control calls: load_version,
export, import_, interrupt_all, stats). Events from the ops close the loop: `finished` (generate)
-> on_finished, `train_step` -> on_trained + a metrics line, `weights` -> on_published.
With `async.elastic`, spare generate replicas on the trainer's devices serve rollout while the
trainer waits (dora/runtime/elastic_lending.py): lent when the trainer idles, reclaimed before a
batch is taken for it.
The same RolloutController runs in the simulator on a virtual clock (dora/sim).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from typing import Any

import pyarrow as pa

from dora.graph.model import Graph
from dora.graph.resolve import Resolved
from dora.runtime.clock import RealClock
from dora.runtime.elastic_lending import ElasticLending
from dora.runtime.errors import ReplicaLost
from dora.runtime.rollout import (Finished, InstanceStats, Request, RequestState, RolloutConfig, RolloutController,
                                  TraceWriter)
from dora.runtime import run_state
from dora.runtime.wire import WithBuffers

RESPAWNABLE_OPS = ("generate", "reward", "advantage", "filter", "reference")
CALL_TIMEOUT_S = 120.0   # a weight load of a small model on a busy 2-core machine takes seconds, not minutes
STOP_CHECKPOINT_S = 30.0  # a stopped run checkpoints within this, so the whole stop fits in a minute


class RunClock(RealClock):
    """Wall time since the run started: the trace and the control code share this origin."""

    def __init__(self):
        self.origin = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.origin

    def sleep_until(self, t: float) -> None:
        super().sleep_until(t + self.origin)


@dataclasses.dataclass
class RLRoles:
    """Which nodes play which part in an RL graph."""

    dataset: str
    generate: str
    update: str
    trainer_feed: str          # the node whose output feeds the update node

    @staticmethod
    def find(graph: Graph, op_of) -> "RLRoles | None":
        """op_of(node) -> registered op name. None when the graph is not an RL graph (plain dataflow)."""
        gens = [n for n in graph.nodes if op_of(n) == "generate"]
        ups = [n for n in graph.nodes if op_of(n) == "update"]
        if len(gens) != 1 or len(ups) != 1:
            return None
        gen, up = gens[0], ups[0]
        feeds = graph.producers(gen)
        if len(feeds) != 1 or op_of(feeds[0].src) != "dataset":
            return None
        up_feeds = graph.producers(up)
        if len(up_feeds) != 1:
            return None
        return RLRoles(feeds[0].src, gen, up, up_feeds[0].src)


class ReplicaInstance:
    """One generate replica seen by the rollout control code: every method is a control call."""

    def __init__(self, driver: "RLDriver", node: str, replica: int, slots: int):
        self.driver, self.node, self.replica, self.slots = driver, node, replica, slots
        self.name = f"{node}[{replica}]"
        self.version: int | None = 0    # every replica starts from the same seeded version-0 weights

    def _call(self, method: str, args: dict[str, Any], buffers: list[Any] = ()) -> Any:
        """A control call; None if the replica died first. The control code then goes on as if the call
        had done nothing, and the driver reissues whatever the dead replica held (on_replica_lost)."""
        try:
            return self.driver.ctrl.call(self.node, self.replica, method, args, timeout=CALL_TIMEOUT_S, buffers=buffers)
        except ReplicaLost:
            return None

    def load_version(self, v: int) -> None:
        if v == self.version:
            return
        path = self.driver.weight_paths[v]
        clock = self.driver.clock
        t0 = clock.now()
        self._call("load_version", {"version": v, "path": path})
        self.driver.trace.span("rollout", self.name, "load_weights", t0, clock.now(),
                               version=v)
        self.driver.weight_loads += 1
        self.version = v

    def submit(self, reqs: list[Request]) -> None:
        if not reqs:
            return
        rows = []
        for r in reqs:
            row = dict(r.payload)
            row["policy_version"] = r.version
            rows.append(row)
        batch = pa.RecordBatch.from_pylist(rows, schema=self.driver.prompt_schema)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        # over the control channel, so it stays ordered with load_version / export / interrupt_all
        self._call("submit", {}, buffers=[sink.getvalue()])

    def _states(self, result: Any) -> list[RequestState]:
        """Engine states (dora.ops.engines.engine.states_to_wire) as the control code's RequestStates;
        each keeps its own wire dict and raw KV frames as payload, ready for import elsewhere."""
        value, buffers = (result.value, list(result.buffers)) if isinstance(result, WithBuffers) else (result or {}, [])
        out, at = [], 0
        for d, count in zip(value.get("states", []), value.get("frame_counts", [])):
            frames = buffers[at:at + count]
            at += count
            req = d["request"]
            uid = str(req["uid"])
            has_kv = d.get("kv") is not None and d.get("kv_version") == req["version"]
            out.append(RequestState(
                uid=uid, group_id=str(self.driver.payloads[uid]["group_id"]), version=int(req["version"]),
                prompt_tokens=len(req["prompt_ids"]), tokens_done=len(d["response_ids"]), has_kv=has_kv,
                kv_bytes=sum(len(f) for f in frames), payload=(d, frames),
                token_versions=tuple(sorted(set(d["token_versions"])))))
        return out

    def export(self, uids: list[str]) -> list[RequestState]:
        return self._states(self._call("export", {"uids": list(uids)}))

    def interrupt_all(self) -> list[RequestState]:
        return self._states(self._call("interrupt_all", {}))

    def import_(self, states: list[RequestState]) -> None:
        if not states:
            return
        wire_states = [st.payload[0] for st in states]
        frames = [f for st in states for f in st.payload[1]]
        counts = [len(st.payload[1]) for st in states]
        self._call("import_", {"state": {"states": wire_states, "frame_counts": counts}}, buffers=frames)

    def stats(self) -> InstanceStats:
        s = self._call("stats", {}) or {}
        cap = max(1, int(s.get("kv_tokens_capacity") or 0))
        return InstanceStats(active=int(s.get("active", 0)), queued=int(s.get("queued", 0)), slots=self.slots,
                             kv_used_fraction=float(s.get("kv_tokens_used", 0)) / cap)


class RLDriver:
    """Controller driver for RL graphs: the rollout control code on the wall clock."""

    def __init__(self, resolved: Resolved, roles: RLRoles, metrics, progress, trace: TraceWriter | None = None):
        self.graph, self.roles, self.params = resolved.graph, roles, resolved.params
        self.metrics, self.progress = metrics, progress
        self.trace = trace or TraceWriter(enabled=True)
        a = resolved.async_
        self.cfg = RolloutConfig(mode=a.mode, train_batch=a.train_batch, rollout_batch=a.rollout_batch,
                                 group_size=a.group_size, max_staleness=a.max_staleness,
                                 rebalance_period_s=2.0, kv_check_s=1.0).resolved()
        self.total_steps = self.params[roles.update]["steps"]
        self.run_cfg = resolved.run
        self.ctrl = None                       # set by attach()
        self.rc: RolloutController | None = None
        self.clock = RunClock()
        self.prompt_schema: pa.Schema | None = None
        self.prompt_groups: collections.deque[list[Request]] = collections.deque()
        self.payloads: dict[str, dict[str, Any]] = {}      # uid -> prompt row (for migration bookkeeping)
        self.scored: dict[str, dict[str, Any]] = {}        # uid -> scored row waiting for the trainer
        self.scored_schema: pa.Schema | None = None
        self.weight_paths: dict[int, str] = {}
        self.weight_loads = 0
        self.weight_sync: dict[int, tuple] = {}            # version -> (seconds, bytes) of its hand-off
        self.published_at: dict[int, float] = {}           # version -> when its weights event arrived
        self.pending_batch: list[str] | None = None        # uids taken from the TransferQueue, not yet sent
        self.sent_batch: dict[str, Any] | None = None      # what the trainer is training on now
        self.steps_done = 0
        self.batches_sent = 0
        self.filtered_uids: list[str] = []
        self.reward_errors = 0
        self.accounting: dict[str, Any] = {}
        self._done = False
        self.dataset_done = False      # the dataset sent end-of-stream: no more prompts will come
        self.stop_reason = None
        # For whole-run checkpoints (dora/runtime/run_state.py): groups dispatched and not yet trained
        # or dropped, prompt groups taken from each dataset replica, what a resumed run starts from.
        self.open_groups: dict[str, list[str]] = {}
        self.consumed = [0] * self.graph.nodes[roles.dataset].replicas
        self.initial_version = 0
        self.trained_before = 0                      # trajectories trained by earlier segments of this run
        self.trained_here = 0                        # ... and by this one
        self.reissued_groups: set[str] = set()       # in flight at the checkpoint: dispatched again, not re-read
        self.reissued_at_resume = 0
        self.restored_finished: list = []
        self.snapshot = None                         # taken at a checkpoint step's publish, written at its train_step
        self.checkpoints: list[str] = []
        self.checkpoint_log: list[dict[str, Any]] = []   # {step, seconds, bytes} of each checkpoint written
        self.resolved_ops = {n: resolved.op_of(n) for n in self.graph.nodes}
        self.respawns = self.reissued_requests = self.reissue_serial = 0
        self.late_rows = 0                           # scored rows of a retired attempt, dropped on arrival
        self.elastic: ElasticLending | None = None   # async.elastic: set up with the rollout controller

    # ------------------------------------------------------------ controller hooks
    def attach(self, ctrl) -> None:
        self.ctrl = ctrl

    def managed_edges(self) -> list[tuple[str, str]]:
        return [(self.roles.dataset, self.roles.generate), (self.roles.trainer_feed, self.roles.update)]

    def wants(self, src_node: str) -> bool:
        """Flow control for the managed prompt edge: hold the dataset back once enough groups wait."""
        if src_node == self.roles.dataset:
            return len(self.prompt_groups) * self.cfg.group_size < 2 * self.cfg.rollout_batch
        return True

    def on_batch(self, src_node: str, batch: pa.RecordBatch) -> None:
        if src_node == self.roles.dataset:
            self._add_prompts(batch)
        else:
            if self.scored_schema is None:
                self.scored_schema = batch.schema
            for row in batch.to_pylist():
                uid = str(row["uid"])
                if uid not in self.payloads:   # an attempt that was reissued (its replica died): not ours any more
                    self.late_rows += 1
                    continue
                self.scored[uid] = row
        self._maybe_train()

    def on_event(self, node: str, replica: int, ev: dict[str, Any]) -> None:
        kind = ev.get("kind")
        if kind == "finished" and node == self.roles.generate:
            n = len(ev["uids"])
            done = [Finished(str(u), int(rt), tuple(tv) if tv else None)
                    for u, tv, rt in zip(ev["uids"], ev.get("token_versions") or [None] * n,
                                         ev.get("response_tokens") or [0] * n)]
            self._rc().on_finished(f"{node}[{replica}]", done)
            if self.elastic is not None:
                self.elastic.on_finished(replica, [f.response_tokens for f in done])
        elif kind == "weights":
            self.published_at[int(ev["version"])] = self.clock.now()   # the step it ends was over by then
            self.weight_paths[int(ev["version"])] = ev["path"]
            self.weight_sync[int(ev["version"])] = (ev.get("seconds"), ev.get("bytes"))
            version = int(ev["version"])
            if version == self.initial_version:
                return   # the trainer's starting weights (replicas hold v0, or load a resumed version at start)
            if self._checkpoint_due(version):
                self.snapshot = run_state.capture(self, version)   # before any request of this version exists
            if self.elastic is not None:
                self.elastic.publish(version)
            else:
                self._rc().on_published(version)
        elif kind == "train_step":
            self._on_train_step(ev)
        elif kind == "filtered":
            self.filtered_uids += [str(u) for u in ev.get("uids", [])]
            for u in ev.get("uids", []):
                members = self.open_groups.pop(str(self.payloads.get(str(u), {}).get("group_id")), None) or []
                for m in members:
                    self.payloads.pop(m, None)
            revoked = self._rc().on_dropped([str(u) for u in ev.get("uids", [])], reason="filtered")
            if revoked:
                # The batch we were waiting to complete held a dropped group: it went back to the
                # queue whole, and the next take builds one without it. (A batch already sent to
                # the trainer cannot hold one: its rows all came through the filter.)
                self.pending_batch = None
        elif kind == "reward_errors":
            self.reward_errors += len(ev.get("uids", []))
        elif kind == "wire_rejected":   # the first few per worker come with their reason; all are counted
            self.progress.status(f"{node}[{replica}] rejected a message: {ev.get('error')}")
        elif kind == "done" and node == self.roles.update:
            self._done = True
        self._maybe_train()

    def on_eos(self, src_node: str, dst_node: str) -> None:
        # The generate replicas must stay up (they finish what is in flight, and are driven by
        # control calls), so the edge is not closed: the run ends through done().
        if src_node == self.roles.dataset:
            self.dataset_done = True

    def tick(self, now: float) -> None:
        if self.rc is None and (not self._enough_prompts_to_start() or self.initial_version not in self.weight_paths):
            return   # (a resumed run also waits for the trainer to publish the version it resumes at)
        rc = self._rc()
        rc.tick()
        self._maybe_train()
        if (self.dataset_done and not self.prompt_groups and rc.manager.r_sum == 0 and self.pending_batch is None
                and self.sent_batch is None and not rc.trainer_ready() and not self._done):
            # Finite dataset used up: everything generated is trained or accounted as untrained.
            self.stop_reason = f"dataset exhausted after {self.steps_done} of {self.total_steps} steps"
            self.progress.status(self.stop_reason)
            self._done = True

    def _enough_prompts_to_start(self) -> bool:
        # The first dispatch asks for a whole rollout batch; starting earlier would read a
        # momentarily short prompt buffer as an exhausted dataset.
        if self.dataset_done:
            return bool(self.prompt_groups)
        return len(self.prompt_groups) * self.cfg.group_size >= self.cfg.rollout_batch

    def done(self) -> bool:
        return self._done

    def on_stop(self, reason: str) -> None:
        """The run is asked to stop (a signal): dispatch no more, checkpoint what the trainer has trained."""
        self._done = True
        deadline = time.monotonic() + STOP_CHECKPOINT_S
        try:   # bounded: a trainer deep in a long step leaves the last periodic checkpoint as the one to use
            while True:
                # returns once the trainer is between steps; a batch already sent is still trained
                # (it may wait in its inbox): the checkpoint comes after it, so nothing sent is lost
                self.ctrl.call(self.roles.update, 0, "stats", {}, timeout=max(1.0, deadline - time.monotonic()))
                self.ctrl.deliver_events()   # the step it just finished, if any (written and maybe checkpointed)
                if self.sent_batch is None:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the trainer did not finish step {self.steps_done + 1} within {STOP_CHECKPOINT_S:.0f} s")
                time.sleep(0.05)
            if self.steps_done > self.initial_version and (
                    not self.checkpoints or not self.checkpoints[-1].endswith(f"step_{self.steps_done}")):
                self._commit(run_state.capture(self, self.steps_done))
        except Exception as e:
            self.progress.status(f"no checkpoint at stop ({type(e).__name__}: {e}); the last one stands")
        self.stop_reason = f"stopped by {reason} after {self.steps_done} of {self.total_steps} steps"

    # ------------------------------------------------------------ replicas that die (run controller)
    def respawnable(self, node: str) -> bool:
        """Ops that keep nothing across batches can be restarted: what they held is reissued."""
        return self.resolved_ops.get(node) in RESPAWNABLE_OPS

    def on_replica_lost(self, node: str, replica: int, why: str) -> None:
        """Replica node[replica] died and a new process took its place (the run controller calls this
        once it is up): reissue what the dead one held, whole groups, onto live replicas."""
        self.progress.status(f"{node}[{replica}] lost ({why.splitlines()[0][:120]}); respawned, its work reissued")
        self.respawns += 1
        rc = self._rc()
        if node == self.roles.generate and self.elastic is not None and self.elastic.owns(replica):
            gids, revoked = self.elastic.replaced(replica)
        elif node == self.roles.generate:
            name = f"{node}[{replica}]"
            rc.manager.instances[name].version = 0   # the new process holds the seeded initial weights
            gids, revoked = rc.instance_replaced(name)
        else:   # rows in its hands (or queued to it) are gone: every group not wholly scored goes again
            gids = [g for g, uids in self.open_groups.items() if not all(u in self.scored for u in uids)
                    and not (self.sent_batch and uids[0] in set(self.sent_batch["uids"]))]
            revoked = rc.on_dropped([self.open_groups[g][0] for g in gids], reason="replica_lost")
        if revoked:
            self.pending_batch = None
        self._reissue(gids)

    def _reissue(self, gids: list[str]) -> None:
        """Dispatch these groups again, first, as new groups (new group id and uids: rows of the old
        attempt still on their way are recognised and dropped), so C1 and C2 hold."""
        for gid in gids:
            uids = self.open_groups.pop(gid, None)
            if not uids:
                continue
            self.reissue_serial += 1
            new_gid = -self.reissue_serial          # dataset group ids are >= 0: these never collide
            group = []
            for i, u in enumerate(uids):
                row = {**self.payloads.pop(u), "uid": f"{new_gid}-{i}", "group_id": new_gid, "policy_version": 0}
                self.scored.pop(u, None)
                self.payloads[row["uid"]] = row
                group.append(Request(uid=row["uid"], group_id=str(new_gid), version=0,
                                     prompt_tokens=len(row["prompt_ids"]), payload=row))
            self.prompt_groups.appendleft(group)
            self.reissued_groups.add(str(new_gid))
            self.reissued_requests += len(group)
        if gids and self.rc is not None:
            self.rc.manager.exhausted = False
            self.rc.tick()

    def restore(self, state: dict[str, Any], pending: pa.Table | None) -> None:
        """Start from a checkpoint (dora run --resume): see dora/runtime/run_state.py."""
        run_state.restore(self, state, pending)


    def finish(self) -> dict[str, Any]:
        """Account for every dispatched trajectory (called once the run is over)."""
        if not self.accounting:
            # (no rollout controller: the run ended before any dispatch, e.g. a resumed run already complete)
            self.accounting = self.rc.finish() if self.rc is not None else {
                k: 0 for k in ("dispatched", "trained", "in_training_at_end", "finished_untrained", "in_flight_at_end",
                               "lost", "dropped", "c1_violations", "c2_violations", "c3_violations")}
            self.accounting["filtered"] = len(self.filtered_uids)
            self.accounting["reward_errors"] = self.reward_errors
            # a resumed run: this segment's identity holds on its own; these tie it to the earlier ones
            self.accounting["trained_before_resume"] = self.trained_before
            self.accounting["reissued_at_resume"] = self.reissued_at_resume
            self.accounting["trained_total"] = self.trained_before + self.accounting["trained"]
            self.accounting["respawns"] = self.respawns
            self.accounting["reissued_requests"] = self.reissued_requests
            self.accounting["late_rows_dropped"] = self.late_rows
        return self.accounting

    # ------------------------------------------------------------ internals
    def _rc(self) -> RolloutController:
        if self.rc is None:
            gen = self.graph.nodes[self.roles.generate]
            slots = self.params[self.roles.generate]["max_batch"]
            instances = [ReplicaInstance(self, gen.name, r, slots) for r in range(gen.replicas)]
            self.rc = RolloutController(self.cfg, instances, self._take_prompts, self.clock, trace=self.trace,
                                        initial_version=self.initial_version)
            self.rc.restore_finished(self.restored_finished)
            self.rc.start()
            spares = [r.replica for r in self.ctrl.plan.of(gen.name) if r.spare]
            if spares:
                self.elastic = ElasticLending(self, [ReplicaInstance(self, gen.name, r, slots) for r in spares])
        return self.rc

    def _add_prompts(self, batch: pa.RecordBatch) -> None:
        if self.prompt_schema is None:
            schema = batch.schema
            if "policy_version" not in schema.names:
                schema = schema.append(pa.field("policy_version", pa.int64()))
            self.prompt_schema = schema
        groups: dict[Any, list[Request]] = {}
        for row in batch.to_pylist():
            uid = str(row["uid"])
            row.setdefault("policy_version", 0)
            self.payloads[uid] = row
            groups.setdefault(row["group_id"], []).append(
                Request(uid=uid, group_id=str(row["group_id"]), version=0, prompt_tokens=len(row["prompt_ids"]), payload=row))
        self.prompt_groups.extend(groups.values())
        if self.rc is not None and not self.dataset_done:
            # A short buffer earlier was prompts still in transit, not the end of the dataset.
            self.rc.manager.exhausted = False
            self.rc.tick()

    def _take_prompts(self, n_groups: int) -> list[list[Request]]:
        out = []
        while self.prompt_groups and len(out) < n_groups:
            group = self.prompt_groups.popleft()
            gid = group[0].group_id
            self.open_groups[gid] = [r.uid for r in group]
            if gid not in self.reissued_groups:   # the dataset stream position: replica r has group ids r mod R
                self.consumed[int(gid) % len(self.consumed)] += 1
            out.append(group)
        return out

    def _maybe_train(self) -> None:
        if self.rc is None or self.sent_batch is not None or self._done or self.batches_sent >= self.total_steps:
            return   # (after the last step nothing more is taken: the rest is accounted as untrained)
        elastic = self.elastic
        if elastic is not None and elastic.busy:
            return   # (events delivered inside a lend or reclaim come back here)
        if self.pending_batch is None and self.rc.trainer_ready():
            if elastic is not None:
                elastic.reclaim()   # the trainer's devices come back before its batch is taken
            if self.rc.trainer_ready():
                self.pending_batch = [t.uid for t in self.rc.take_batch()]
        if self.pending_batch is None:
            if elastic is not None:
                elastic.maybe_lend()
            return
        # Trajectories are taken when they finish generating; their scored rows trail by the
        # reward/advantage hop. Send once every row of the batch has arrived.
        if any(u not in self.scored for u in self.pending_batch):
            return
        rows = [self.scored.pop(u) for u in self.pending_batch]
        batch = pa.RecordBatch.from_pylist(rows, schema=self.scored_schema)
        self.sent_batch = {"uids": self.pending_batch, "sent_at": time.monotonic(),
                           "reward_mean": _mean(r.get("reward") for r in rows),
                           "tokens": sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows),
                           "response_tokens": [len(r["response_ids"]) for r in rows]}
        self.pending_batch = None
        self.batches_sent += 1
        self.ctrl.send(self.roles.update, 0, "batch", batch, timeout=CALL_TIMEOUT_S)

    def _on_train_step(self, ev: dict[str, Any]) -> None:
        sent = self.sent_batch or {"uids": ev.get("uids", []), "reward_mean": None, "tokens": 0, "response_tokens": []}
        self.sent_batch = None
        step, version = int(ev["step"]), int(ev["version"])
        now = self.clock.now()
        end = self.published_at.pop(version, now)   # the trainer publishes right after its step, then reports it
        self.trace.span("trainer", "update", f"train step {step}", end - float(ev.get("seconds") or 0.0), end,
                        version=version)
        # The rollout controller numbers a step by the trainer version it starts from.
        self._rc().on_trained(version - 1, version, [str(u) for u in ev.get("uids", sent["uids"])])
        sm = self.rc.step_metrics[-1].to_dict() if self.rc.step_metrics else {}
        step_time = float(sm.get("step_time_s") or 0.0) or 1e-9
        lengths = sorted(sent["response_tokens"]) or [0]
        rec = {
            "step": step, "policy_version": version, "reward_mean": sent["reward_mean"],
            "staleness_max": sm.get("staleness_max", 0), "staleness_mean": sm.get("staleness_mean", 0.0),
            "step_time_s": step_time, "rollout_only_s": sm.get("rollout_only_s", 0.0), "tokens": sent["tokens"],
            "tokens_per_s": sent["tokens"] / step_time, "trajectories": len(sent["uids"]),
            "c1_violations": sm.get("c1_violations", 0), "c2_violations": sm.get("c2_violations", 0),
            "c3_violations": sm.get("c3_violations", 0), "versions_live": sm.get("versions_live", 0),
            "migrated_requests": sm.get("migrated_requests", 0), "reprefill_tokens": sm.get("reprefill_tokens", 0),
            "weight_loads": sm.get("weight_loads", 0), "response_len_max": lengths[-1],
            "response_len_median": lengths[len(lengths) // 2], "train_s": ev.get("seconds"),
            "wall_s": now,
            "wire_rejected": self.ctrl.rejected(),
            "respawns": self.respawns, "reissued_requests": self.reissued_requests,
            "weight_sync_s": self.weight_sync.get(version, (None, None))[0],
            "weight_sync_bytes": self.weight_sync.get(version, (None, None))[1],
        }
        if self.elastic is not None:
            rec.update(self.elastic.step_metrics())
        for pool, frac in (sm.get("idle_fraction") or {}).items():
            rec[f"idle_fraction_{pool}"] = frac
        for k, v in (ev.get("metrics") or {}).items():
            rec.setdefault(f"train/{k}" if k in rec else k, v)
        self.metrics.write(rec)
        self.progress.step(rec)
        self.steps_done = step
        self.trained_here += len(sent["uids"])
        for u in sent["uids"]:   # trained: the run forgets them (a long run's memory stays flat)
            gid = str(self.payloads.pop(str(u), {}).get("group_id"))
            self.open_groups.pop(gid, None)
        if self.snapshot is not None and self.snapshot.step == version:
            snap, self.snapshot = self.snapshot, None
            self._commit(snap)

    def _commit(self, snap) -> None:
        t0 = time.monotonic()
        folder = run_state.commit(self, snap, self.run_cfg.keep_checkpoints)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)
        self.checkpoints.append(folder)
        self.checkpoint_log.append({"step": snap.step, "seconds": round(time.monotonic() - t0, 3), "bytes": size})

    def _checkpoint_due(self, version: int) -> bool:
        every = self.run_cfg.save_every
        return version >= self.total_steps or (every > 0 and version % every == 0)


def _mean(values) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None
