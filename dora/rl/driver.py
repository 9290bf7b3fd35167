"""The RL driver: runs DORA's rollout control code (dora.rl.rollout) against real workers.

The controller streams the graph as dataflow, except two edges it hands to this driver:

    dataset -> generate   prompts arrive here (PromptFeed); the RolloutController decides which
                          version tags each prompt group and which generate replica runs it
    X -> update           scored trajectories arrive here (X is whatever feeds the trainer:
                          advantage, filter, ...); the TransferQueue decides when the trainer
                          gets exactly TBS of them, whole groups, oldest version first

Generate replicas are RolloutInstances through `ReplicaInstance` (control calls: load_version,
export, import_, interrupt_all, stats). Events from the ops close the loop: `finished` (generate)
-> on_finished, `train_step` -> on_trained + a metrics line, `weights` -> on_published.
With `async.elastic`, spare generate replicas on the trainer's devices serve rollout while the
trainer waits (dora/rl/elastic_lending.py): lent when the trainer idles, reclaimed before a
batch is taken for it. Generate replicas that share a device with the trainer by declared memory
shares sleep while it steps in a mode with K = 0 (dora/rl/shared_devices.py).
Checkpoints and resume: dora/rl/run_state.py. A trainer that dies restarts itself from the last
checkpoint (dora/rl/trainer_restart.py); the accounting sums its segments (dora/rl/run_accounting.py).
The same RolloutController runs in the simulator on a virtual clock (dora/sim).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from dora.graph.policy_roles import policy_dir
from dora.graph.resolve import Resolved
from dora.observe.trace import TraceWriter
from dora.rl import replica_loss, rollout_start, run_accounting, run_state, trainer_restart
from dora.rl.clock import RunClock
from dora.rl.evaluation import Evaluations
from dora.rl.elastic_lending import ElasticLending
from dora.rl.prompt_feed import PromptFeed
from dora.rl.replica_instance import CALL_TIMEOUT_S, ReplicaInstance
from dora.rl.roles import RLRoles
from dora.rl.shared_devices import SharedDevices
from dora.rl.rollout import Finished, RolloutConfig, RolloutController
from dora.rl.row_failures import RowFailures
from dora.rl.step_record import write_step
from dora.rl.length_trace import length_trace_path
from dora.rl.multiturn_reports import MultiTurnReports, turn_trace_path
from dora.rl.trainer_feed import TrainerFeed
from dora.runtime.errors import RunFailed

RESPAWNABLE_OPS = ("generate", "reward", "reward_model", "judge", "advantage", "filter", "reference",   # (and the trainer: restarted)
                   "to_prompts", "frontier")


class RLDriver:
    """Controller driver for RL graphs: the rollout control code on the wall clock."""

    def __init__(self, resolved: Resolved, roles: RLRoles, metrics, progress, trace: TraceWriter | None = None,
                 *, policy: str | None = None, clock: RunClock | None = None):
        self.graph, self.roles, self.params = resolved.graph, roles, resolved.params
        self.metrics, self.progress = metrics, progress
        self.trace = trace or TraceWriter(enabled=True)
        self.policy = policy   # in a run of several, the update node of this one (dora/rl/policies_driver.py)
        a = resolved.async_ if policy is None else resolved.policies[policy]
        self.cfg = RolloutConfig(mode=a.mode, train_batch=a.train_batch, rollout_batch=a.rollout_batch,
                                 group_size=a.group_size, max_staleness=a.max_staleness,
                                 versions_per_instance=a.versions_per_instance, fast_lanes=a.fast_lanes,
                                 rebalance_period_s=2.0, kv_check_s=1.0).resolved()
        self.total_steps = self.params[roles.update]["steps"]
        self.run_cfg = resolved.run
        self.ctrl = None                       # set by attach()
        self.rc: RolloutController | None = None
        self.clock = clock or RunClock()
        self.multiturn = MultiTurnReports(self.clock, self.trace, turn_trace_path(metrics), length_trace_path(metrics, policy))
        self.prompts = PromptFeed(self.graph.nodes[roles.dataset].replicas, self.cfg.group_size, self.cfg.rollout_batch)
        self.feed = TrainerFeed(resolved.run.samples_per_step)
        self.weight_paths: dict[int, str] = {}
        self.weight_loads = 0
        self.weight_sync: dict[int, tuple] = {}            # version -> (seconds, bytes) of its hand-off
        self.published_at: dict[int, float] = {}           # version -> when its weights event arrived
        self.steps_done = 0
        self.filtered_uids: list[str] = []
        self.row_failures = RowFailures(judged="judge" in map(resolved.op_of, self.graph.nodes))
        self.accounting: dict[str, Any] = {}
        self._done = False
        self.stop_reason = None
        # checkpoints and resume (dora/rl/run_state.py)
        # trained_before: trajectories trained by earlier segments of this run; trained_here: by this one
        self.initial_version = self.trained_before = self.trained_here = self.reissued_at_resume = 0
        self.restored_finished: list = []
        self.snapshot = None                         # taken at a checkpoint step's publish, written at its train_step
        self.checkpoints: list[str] = []
        self.checkpoint_log: list[dict[str, Any]] = []   # {step, seconds, bytes} of each checkpoint written
        self.resolved_ops = {n: resolved.op_of(n) for n in self.graph.nodes}
        self.respawns = 0
        self.restarts = trainer_restart.TrainerRestarts()
        self.reused_instances: list[ReplicaInstance] = []   # the generate replicas, across trainer restarts
        self.elastic: ElasticLending | None = None   # async.elastic: set up with the rollout controller
        self.shared: SharedDevices | None = None     # replicas on the trainer's devices that sleep while it steps
        self.evaluations = Evaluations.of(self, resolved.evals, metrics)   # held-out sets (dora/rl/evaluation.py)

    # ------------------------------------------------------------ controller hooks
    def attach(self, ctrl) -> None:
        self.ctrl = ctrl

    @property
    def files_dir(self) -> str:   # (its trained.jsonl, checkpoints, weight versions)
        return self.ctrl.run_dir if self.policy is None else policy_dir(self.ctrl.run_dir, self.policy)

    def managed_edges(self) -> list[tuple[str, str]]:
        return [(self.roles.dataset, self.roles.generate), (self.roles.trainer_feed, self.roles.update)]

    def wants(self, src_node: str) -> bool:
        return self.prompts.wants() if src_node == self.roles.dataset else True

    def on_batch(self, src_node: str, batch: pa.RecordBatch) -> None:
        if src_node == self.roles.dataset:
            self.prompts.add(batch)
            if self.rc is not None and not self.prompts.dataset_done and not (self._done and self.evaluations.sets):
                # (a short buffer was prompts in transit; after the last step: none while evaluations finish)
                self.rc.manager.exhausted = False
                self.rc.tick()
        else:
            self.feed.add(batch, self.prompts.is_open)
        self._maybe_train()

    def on_event(self, node: str, replica: int, ev: dict[str, Any]) -> None:
        kind = ev.get("kind")
        if node == self.roles.generate:   # multi-turn reports: tool waits, parked-KV counters
            self.multiturn.on_event(f"{node}[{replica}]", ev, self.rc)
        self.evaluations.on_event(ev)   # (eval_finished, eval_aborted)
        if kind == "finished" and node == self.roles.generate:
            self._on_finished(node, replica, ev)
        elif kind in ("weights", "train_step") and trainer_restart.stale(self, ev):
            self.progress.status(f"ignored a dead trainer's late {kind} event")
        elif kind == "weights":
            self._on_weights(ev)
        elif kind == "train_step":
            self._on_train_step(ev)
        elif kind == "filtered":   # a filter's dropped groups, or a judge's skipped ones (reason judge_error)
            reason = str(ev.get("reason") or "filtered")
            uids = [str(u) for u in ev.get("uids", []) if str(u) not in self.restarts.abandoned]
            self.filtered_uids += uids if reason == "filtered" else []
            self.prompts.close(uids)
            self.feed.forget(uids)
            if uids and self._rc().on_dropped(uids, reason=reason):
                # The batch being completed held a dropped group: it went back whole, the next take
                # builds one without it (a batch sent to the trainer cannot: its rows passed the filter).
                self.feed.pending = None
        elif kind in RowFailures.KINDS:   # rows an op reported rather than failing the run (on_error)
            self.row_failures.add(kind, ev)
        elif kind == "wire_rejected":   # the first few per worker come with their reason; all are counted
            self.progress.status(f"{node}[{replica}] rejected a message: {ev.get('error')}")
        elif kind == "done" and node == self.roles.update:
            self._done = True
        self._maybe_train()

    def on_eos(self, src_node: str, dst_node: str) -> None:
        # (the edge stays open: generate replicas finish what is in flight; the run ends through done())
        if src_node == self.roles.dataset:
            self.prompts.dataset_done = True

    def tick(self, now: float) -> None:
        if self.restarts.restarting or self.rc is None and (not self.prompts.enough_to_start() or self.initial_version not in self.weight_paths):
            return   # (a resumed run also waits for the trainer to publish the version it resumes at)
        rc = self._rc()
        rc.tick()
        self.evaluations.tick()
        self._maybe_train()
        stuck = self.feed.overdue(self.clock.now(), self.ctrl.stall_timeout_s)
        if stuck is not None:
            raise RunFailed(stuck)
        if (self.prompts.dataset_done and not self.prompts.waiting and rc.manager.r_sum == 0
                and self.feed.pending is None and self.feed.sent is None and not rc.trainer_ready() and not self._done):
            # Finite dataset used up: everything generated is trained or accounted as untrained.
            self.stop_reason = f"dataset exhausted after {self.steps_done} of {self.total_steps} steps"
            self.progress.status(self.stop_reason)
            self._done = True

    def done(self) -> bool:   # (a stop signal ends the run at once: on_stop)
        return self._done and self.evaluations.training_done()   # the held-out evaluations out finish (bounded)

    def on_stop(self, reason: str) -> None:
        """The run is asked to stop (a signal): dispatch no more, checkpoint what the trainer has trained."""
        self._done = True
        run_state.checkpoint_at_stop(self)
        self.stop_reason = f"stopped by {reason} after {self.steps_done} of {self.total_steps} steps"

    # ------------------------------------------------------------ replicas that die (run controller)
    def respawnable(self, node: str) -> bool:
        """Ops that keep nothing across batches can be restarted: what they held is reissued. The
        trainer restarts from the last checkpoint (dora/rl/trainer_restart.py)."""
        if node == self.roles.update:
            return trainer_restart.not_possible(self) is None
        return self.resolved_ops.get(node) in RESPAWNABLE_OPS

    def why_not_respawned(self, node: str) -> str | None:
        return trainer_restart.not_possible(self) if node == self.roles.update else None

    def before_respawn(self, node: str, why: str) -> dict[str, dict[str, Any]] | None:
        """The trainer died: back to the last checkpoint; what its new ranks restore from."""
        return trainer_restart.prepare(self, why) if node == self.roles.update else None

    def on_replica_lost(self, node: str, replica: int, why: str) -> None:
        """Replica node[replica] died and a new process took its place (the run controller calls this
        once it is up): reissue what the dead one held, whole groups, onto live replicas."""
        if node == self.roles.update:
            return trainer_restart.restarted(self, why)
        replica_loss.replaced(self, node, replica, why)

    def reissue(self, gids: list[str]) -> None:
        """Dispatch these groups again, first, as new groups (PromptFeed.reissue)."""
        if self.prompts.reissue(gids, forget=lambda uid: self.feed.scored.pop(uid, None)) and self.rc is not None:
            self.rc.manager.exhausted = False
            self.rc.tick()

    def restore(self, state: dict[str, Any], pending: pa.Table | None) -> None:
        """Start from a checkpoint (dora run --resume): see dora/rl/run_state.py."""
        run_state.restore(self, state, pending)

    def finish(self) -> dict[str, Any]:
        """Account for every dispatched trajectory (called once the run is over)."""
        if not self.accounting:
            self.accounting = run_accounting.account(self)
        return self.accounting

    # ------------------------------------------------------------ internals
    def _rc(self) -> RolloutController:
        if self.rc is None:
            self.rc = rollout_start.start_rollout(self)
        return self.rc

    def _on_finished(self, node: str, replica: int, ev: dict[str, Any]) -> None:
        n = len(ev["uids"])
        done = [Finished(str(u), int(rt), tuple(tv) if tv else None)
                for u, tv, rt in zip(ev["uids"], ev.get("token_versions") or [None] * n,
                                     ev.get("response_tokens") or [0] * n)
                if str(u) not in self.restarts.abandoned]   # (interrupted at a trainer restart: accounted)
        if not done:
            return
        self.feed.finished_on(f"{node}[{replica}]", [f.uid for f in done])
        self._rc().on_finished(f"{node}[{replica}]", done)
        if self.elastic is not None:
            self.elastic.on_finished(replica, [f.response_tokens for f in done])

    def _on_weights(self, ev: dict[str, Any]) -> None:
        version = int(ev["version"])
        self.published_at[version] = self.clock.now()   # the step it ends was over by then
        self.weight_paths[version] = ev["path"]
        self.weight_sync[version] = (ev.get("seconds"), ev.get("bytes"))
        if version == self.initial_version:
            return   # the trainer's starting weights (replicas hold v0, or load a resumed version at start)
        if run_state.checkpoint_due(version, self.total_steps, self.run_cfg.save_every):
            self.snapshot = run_state.capture(self, version)   # before any request of this version exists
        self.evaluations.published(version)   # (before the mode hears of it: sync evaluates before the batch)
        if self.elastic is not None:
            self.elastic.publish(version)
        elif self.shared is not None:
            self.shared.publish(version)
        else:
            self._rc().on_published(version)

    def _maybe_train(self) -> None:
        feed = self.feed
        if (self.rc is None or feed.sent is not None or self._done or feed.batches_sent >= self.total_steps
                or self.restarts.restarting):
            return   # (after the last step nothing more is taken: the rest is accounted as untrained)
        elastic = self.elastic
        if elastic is not None and elastic.busy:
            return   # (events delivered inside a lend or reclaim come back here)
        if feed.pending is None and self.rc.trainer_ready():
            if elastic is not None:
                elastic.reclaim()   # the trainer's devices come back before its batch is taken
            if self.rc.trainer_ready():
                feed.pending = [t.uid for t in self.rc.take_batch()]
        if feed.pending is None:
            if elastic is not None:
                elastic.maybe_lend()
            return
        batch = feed.complete_batch()
        if batch is not None:
            if self.shared is not None:
                self.shared.before_step()   # the trainer's devices are its own while it steps
            self.ctrl.send(self.roles.update, 0, "batch", batch, timeout=CALL_TIMEOUT_S)

    def _on_train_step(self, ev: dict[str, Any]) -> None:
        sent = self.feed.trained(ev.get("uids", []))
        step, version = int(ev["step"]), int(ev["version"])
        now = self.clock.now()
        end = self.published_at.pop(version, now)   # the trainer publishes right after its step, then reports it
        self.trace.span("trainer", "update", f"train step {step}", end - float(ev.get("seconds") or 0.0), end,
                        version=version)
        # The rollout controller numbers a step by the trainer version it starts from.
        self._rc().on_trained(version - 1, version, [str(u) for u in ev.get("uids", sent["uids"])])
        write_step(self, step, version, sent, ev, now)   # (metrics.jsonl, samples.jsonl, the progress line)
        self.steps_done = step
        self.trained_here += len(sent["uids"])
        trainer_restart.remember_trained(self, step, sent["uids"])   # until a checkpoint covers the step
        self.prompts.close(sent["uids"])   # trained: the run forgets them (a long run's memory stays flat)
        if self.snapshot is not None and self.snapshot.step == version:
            snap, self.snapshot = self.snapshot, None
            if run_state.commit_timed(self, snap):
                trainer_restart.checkpointed(self, snap.step)
