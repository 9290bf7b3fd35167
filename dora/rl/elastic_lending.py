"""Elastic trainer devices in the real runtime (`async.elastic`), driven by the RL driver.

The generate node has spare replicas placed on the trainer's devices (`elastic_spares`, which the
run hands to placement: dora/runtime/placement.py).
They start asleep (no weights, no KV) and are not rollout instances until lent:

    lend      the trainer is idle (no batch sent, none ready, steps remain) and there is rollout
              work: each spare wakes (allocates its weights' memory), RolloutController.lend()
              loads the newest version on it (a real weight load) and fills it like any instance.
    reclaim   a batch is ready for the trainer, BEFORE it is taken and sent: each spare is paused
              (its worker stops stepping the engine, so every completion it reported is delivered
              before the export), RolloutController.reclaim() exports its requests with their KV
              and imports them on other instances of their version (or parks them), the spare
              sleeps (weights and KV released, CUDA cache emptied), and only then does the driver
              send the batch: a spare and the trainer never run at the same time.

Every step is a control call with the driver's timeout. What it costs is charged to the run:
trace spans on the "elastic" row (lend = wake + weight load, reclaim = pause + export/import +
sleep), per-step metrics (elastic_* keys) and summary.json's "elastic" totals.

A spare that dies: while home, its respawn starts asleep and nothing was on it. While lent, the
driver's respawn path applies (its groups are dropped whole as replica_lost and reissued); the new
process wakes and loads the newest version before any dispatch. Dying during a reclaim, what it
could not export is dropped and reissued the same way (RolloutController.reclaim). A checkpoint
at a publish captures a lent spare's in-flight groups like any other (they are open groups).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dora.graph.model import Graph
from dora.graph.policy_roles import find_policies, is_multi_policy
from dora.graph.schema import resolve_all
from dora.graph.settings_check import nodes_with
from dora.rl.replica_instance import ReplicaInstance
from dora.runtime.placement import DEFAULT_POOL, Spares


def elastic_spares(graph: Graph) -> Spares | list[Spares] | None:
    """The spare generate replicas `async.elastic` places on the update node's devices: one per share
    of the trainer's devices a generate replica needs (update replicas x devices // generate devices)
    on a gpu pool; one on a cpu pool (cores are not partitioned: a second spare would only time-share
    the same cores). A graph of several policies: each policy's, on its own trainer's devices (a list).
    None when elastic is off or the graph has not one generate node per update node (validation
    refuses elastic there)."""
    if graph.async_.elastic is not True:
        return None
    specs, _ = resolve_all(graph)
    gens, ups = nodes_with(specs, "generate"), nodes_with(specs, "update")
    if is_multi_policy(specs):
        pairs = [(p.generate, p.update) for p in find_policies(graph, specs)]
        return None if any(g is None for g, _ in pairs) else [_spares_of(graph, g, u) for g, u in pairs]
    if len(gens) != 1 or len(ups) != 1:
        return None
    return _spares_of(graph, gens[0], ups[0])


def _spares_of(graph: Graph, gen_name: str, up_name: str) -> Spares:
    gen, up = graph.nodes[gen_name], graph.nodes[up_name]
    pool = graph.pools.get(up.pool or DEFAULT_POOL)
    if pool is not None and pool.device == "gpu":
        return Spares(gen.name, up.name, (up.replicas * up.devices) // gen.devices)
    return Spares(gen.name, up.name, 1)



@dataclasses.dataclass
class ElasticTotals:
    lends: int = 0
    reclaims: int = 0
    lend_s: float = 0.0            # wake + weight load + first dispatch, summed
    handback_s: float = 0.0        # pause + export/import + sleep, summed: what the trainer waits for
    requests_moved: int = 0
    kv_bytes_moved: int = 0
    bytes_released: int = 0        # weights + KV memory the spares handed back (sleep)
    lent_s: float = 0.0            # time the spares served rollout
    trajectories_finished: int = 0  # completed on a spare while lent
    tokens_generated: int = 0       # their response tokens

    def minus(self, other: "ElasticTotals") -> dict[str, Any]:
        return {k: v - getattr(other, k) for k, v in dataclasses.asdict(self).items()}


class ElasticLending:
    def __init__(self, driver, spares: list[ReplicaInstance]):
        """`driver`: the RLDriver lending its trainer's devices (its rollout controller, trainer feed,
        clock and trace)."""
        self.d, self.spares = driver, spares
        for s in spares:
            s.version = None           # asleep: no weights held
        self.lent = False
        self.busy = False              # inside a lend or reclaim (driver hooks must not re-enter)
        self.lent_at = 0.0
        self.totals = ElasticTotals()
        self._at_last_step = ElasticTotals()

    def owns(self, replica: int) -> bool:
        return any(s.replica == replica for s in self.spares)

    # ------------------------------------------------------------ lend
    def maybe_lend(self) -> None:
        """Called when the trainer has nothing to train: lend if the trainer is idle and rollout has work."""
        d = self.d
        if d.feed.sent is None and self._may_lend():
            self._lend(None)

    def publish(self, version: int) -> None:
        """The trainer published `version`: hand it to the rollout controller, lending the spares at
        the same time when the trainer has trained every batch sent (it publishes after its step),
        so a batch the mode dispatches at this publish spreads over them too."""
        d = self.d
        # (not when this publish is checkpointed: the trainer still writes it, at its train_step)
        if version == d.feed.batches_sent and d.snapshot is None and self._may_lend():
            self._lend(version)
        else:
            d.rc.on_published(version)

    def _may_lend(self) -> bool:
        d, rc = self.d, self.d.rc
        return not (self.lent or self.busy or rc is None or d.done() or d.feed.pending is not None
                    or d.feed.batches_sent >= d.total_steps or rc.trainer_ready() or rc.newest not in d.weight_paths
                    or not (rc.manager.r_sum or d.prompts.waiting))

    def _lend(self, publish: int | None) -> None:
        d, rc = self.d, self.d.rc
        self.busy = True
        try:
            clock = d.clock
            t0 = clock.now()
            for s in self.spares:
                s.wake()
            if publish is None:
                rc.lend(self.spares)    # loads the newest version on each (ReplicaInstance.load_version)
            else:
                rc.on_published(publish, lend=self.spares)
            now = clock.now()
            d.trace.span("elastic", "elastic", "lend", t0, now, version=rc.newest, spares=[s.name for s in self.spares])
            self.lent, self.lent_at = True, now
            self.totals.lends += 1
            self.totals.lend_s += now - t0
        finally:
            self.busy = False

    # ------------------------------------------------------------ reclaim
    def reclaim(self) -> None:
        """The trainer wants its devices back: empty the spares, put them to sleep."""
        if not self.lent or self.busy:
            return
        d, rc = self.d, self.d.rc
        self.busy = True
        try:
            clock = d.clock
            t0 = clock.now()
            for s in self.spares:       # replies come after every event the replica sent before them
                s._call("pause", {})
            d.ctrl.deliver_events()      # ... so its completions reach the rollout controller first
            moved = rc.reclaim()
            released = 0
            for s in self.spares:
                released += s.sleep()
                s._call("resume", {})
            now = clock.now()
            reqs, kv = sum(x for x, _ in moved.values()), sum(y for _, y in moved.values())
            d.trace.span("elastic", "elastic", "reclaim", t0, now, requests=reqs, kv_bytes=kv, bytes_released=released)
            t = self.totals
            t.reclaims += 1
            t.handback_s += now - t0
            t.requests_moved += reqs
            t.kv_bytes_moved += kv
            t.bytes_released += released
            t.lent_s += t0 - self.lent_at
            self.lent = False
            lost = rc.lending.lost_groups
            rc.lending.lost_groups = []
        finally:
            self.busy = False
        if lost:
            d.reissue(lost)

    # ------------------------------------------------------------ a spare died
    def replaced(self, replica: int) -> tuple[list[str], list[int]]:
        """Spare `replica` was respawned (it starts asleep): (group ids to reissue, revoked steps)."""
        inst = next(s for s in self.spares if s.replica == replica)
        inst.version = None
        if not self.lent or inst.name not in self.d.rc.manager.instances:
            return [], []               # home: nothing was on it
        inst.wake()                    # (nothing if it died again: the next respawn comes back here)
        self.d.rc.manager.versions_changed()
        return self.d.rc.instance_replaced(inst.name)   # drops its groups, loads the newest before any dispatch

    # ------------------------------------------------------------ accounting
    def on_finished(self, replica: int, response_tokens: list[int]) -> None:
        if self.owns(replica):
            self.totals.trajectories_finished += len(response_tokens)
            self.totals.tokens_generated += sum(response_tokens)

    def step_metrics(self) -> dict[str, Any]:
        """What elastic did since the last training step (and how often it lent in all)."""
        delta = self.totals.minus(self._at_last_step)
        self._at_last_step = dataclasses.replace(self.totals)
        return {"elastic_lends": delta["lends"], "elastic_handback_s": delta["handback_s"],
                "elastic_lend_s": delta["lend_s"], "elastic_requests_moved": delta["requests_moved"],
                "elastic_kv_bytes_moved": delta["kv_bytes_moved"],
                "elastic_trajectories": delta["trajectories_finished"]}

    def summary(self) -> dict[str, Any]:
        out = dataclasses.asdict(self.totals)
        out["spares"] = [s.name for s in self.spares]
        out["lent_at_end"] = self.lent
        return out
