"""The driver of a run of several policies: one RLDriver per policy, each hook routed by node.

Each policy (an update node, the generate node it serves, that node's prompt source and its scoring
path: dora/graph/policies.py) gets an RLDriver of its own, with everything a single-policy run has:
its RolloutController (own TransferQueue, Ledger, versions, window K, mode), PromptFeed, TrainerFeed,
weight versions, checkpoints and trainer restarts. This class is what the run controller talks to:

    managed edges   every policy's two (prompt source -> generate, feed -> update)
    batches         to the policy whose prompt source or trainer feed sent them
    events          to the policy of the node that reported them (a node of no policy: the first)
    a lost replica  a generate or update replica: its policy (a trainer restarts that policy alone);
                    any other node: every policy with a data path through it reissues its open
                    groups not wholly scored (the rows it held may have been theirs)

The policies share the run controller, the clock, the trace, metrics.jsonl and the progress output,
each through a view that puts the policy's name on what it writes (dora/rl/policy_views.py).

A policy that has trained its steps while another that takes its trajectories (as prompts, or to be
scored on) still trains goes on rolling out on its last version; what it finishes from then on is
dropped as `after_last_step` (never trained, accounted). A policy whose prompts come only from
policies that will make no more (finished, their finite datasets used up) stops once it has used
what reached it. The run ends when every policy is done.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from dora.graph.policy_roles import feeders, find_policies, prompt_feeders
from dora.graph.resolve import Resolved
from dora.observe.trace import TraceWriter
from dora.rl import replica_loss, run_accounting
from dora.rl.clock import RunClock
from dora.rl.driver import RLDriver
from dora.rl.policy_views import PolicyMetrics, PolicyProgress, PolicyTrace
from dora.rl.roles import RLRoles

AFTER_LAST_STEP = "after_last_step"


class MultiPolicyDriver:
    def __init__(self, resolved: Resolved, roles: dict[str, RLRoles], metrics, progress,
                 trace: TraceWriter | None = None):
        self.graph = resolved.graph
        self.trace = trace or TraceWriter(enabled=True)
        self.clock = RunClock()
        self.metrics, self.progress = metrics, progress
        self.drivers: dict[str, RLDriver] = {
            u: RLDriver(resolved, r, PolicyMetrics(metrics, u), PolicyProgress(progress, u, resolved.params[u]["steps"]),
                        PolicyTrace(self.trace, u), policy=u, clock=self.clock)
            for u, r in roles.items()}
        policies = find_policies(resolved.graph, resolved.specs)
        self.owner = dict(resolved.node_policy)                       # node -> update node of its policy
        self.exposed = {p.update: set(p.exposed) | {p.update} for p in policies}
        self.takes_from = feeders(resolved.graph, policies)           # U -> policies whose trajectories U takes
        self.prompts_from = prompt_feeders(resolved.graph, policies)  # U -> policies whose trajectories are its prompts
        self._by_src = {}
        for u, r in roles.items():
            self._by_src[r.dataset] = self._by_src[r.trainer_feed] = self.drivers[u]
        self.stop_reason: str | None = None
        self.ctrl = None

    # ------------------------------------------------------------ routing
    def _of(self, node: str) -> RLDriver:
        return self.drivers.get(self.owner.get(node, ""), next(iter(self.drivers.values())))

    def attach(self, ctrl) -> None:
        self.ctrl = ctrl
        for d in self.drivers.values():
            d.attach(ctrl)

    def managed_edges(self) -> list[tuple[str, str]]:
        return [e for d in self.drivers.values() for e in d.managed_edges()]

    def wants(self, src_node: str) -> bool:
        d = self._by_src.get(src_node)
        return d.wants(src_node) if d is not None else True

    def on_batch(self, src_node: str, batch: pa.RecordBatch) -> None:
        self._by_src[src_node].on_batch(src_node, batch)

    def on_event(self, node: str, replica: int, ev: dict[str, Any]) -> None:
        self._of(node).on_event(node, replica, ev)

    def on_eos(self, src_node: str, dst_node: str) -> None:
        d = self._by_src.get(src_node)
        if d is not None:
            d.on_eos(src_node, dst_node)

    def tick(self, now: float) -> None:
        for d in self.drivers.values():
            d.tick(now)
        self._serve_after_last_step()
        self._stop_starved()

    def done(self) -> bool:
        return all(d.done() for d in self.drivers.values())

    def on_stop(self, reason: str) -> None:
        for d in self.drivers.values():
            d.on_stop(reason)
        self.stop_reason = "; ".join(f"{u}: {d.stop_reason}" for u, d in self.drivers.items())

    # ------------------------------------------------------------ replicas that die
    def respawnable(self, node: str) -> bool:
        return self._of(node).respawnable(node)

    def why_not_respawned(self, node: str) -> str | None:
        return self._of(node).why_not_respawned(node)

    def before_respawn(self, node: str, why: str) -> dict[str, dict[str, Any]] | None:
        return self._of(node).before_respawn(node, why)

    def on_replica_lost(self, node: str, replica: int, why: str) -> None:
        d = self._of(node)
        if node in (d.roles.update, d.roles.generate):
            return d.on_replica_lost(node, replica, why)
        for u, other in self.drivers.items():   # a node of scoring paths: each policy whose rows it may have held
            if node in self.exposed[u]:
                replica_loss.replaced(other, node, replica, why)

    # ------------------------------------------------------------ policies that finished
    def _live_takers(self, u: str) -> bool:
        return any(u in self.takes_from[q] and not d.done() for q, d in self.drivers.items())

    def _serve_after_last_step(self) -> None:
        """A finished policy whose trajectories a live policy takes keeps rolling out: each group it
        finishes is dropped (never trained), which frees the room its window would otherwise close."""
        for u, d in self.drivers.items():
            if not d.done() or d.rc is None or not self._live_takers(u):
                continue
            rc = d.rc
            gids = [gid for v in list(rc.queue.complete) for gid, _ in rc.queue.complete[v]]
            members = [rc.ledger.members[g] for g in gids if g in rc.ledger.members]
            if members:
                rc.on_dropped([m[0] for m in members], AFTER_LAST_STEP)
                uids = [x for m in members for x in m]
                d.prompts.close(uids)
                d.feed.forget(uids)
                for x in uids:
                    d.feed.scored.pop(x, None)

    def _stop_starved(self) -> None:
        """A policy fed prompts only by policies that will make no more (done, and their own prompts
        used up) runs out of prompts like a finite dataset."""
        for u, d in self.drivers.items():
            sources = [self.drivers[q] for q in self.prompts_from[u]]
            if sources and not d.prompts.dataset_done and all(_dry(s) for s in sources):
                d.prompts.dataset_done = True

    # ------------------------------------------------------------ the end
    def finish(self) -> dict[str, Any]:
        """The run's accounting: each policy's (summary.json `policies`), summed (the top level)."""
        total: dict[str, Any] = {}
        for d in self.drivers.values():
            total = run_accounting.merge(total, d.finish())
        return total


def _dry(d: RLDriver) -> bool:
    """A finished policy that will roll out nothing more: nothing in flight, no prompts left."""
    return (d.done() and d.prompts.dataset_done and not d.prompts.waiting
            and (d.rc is None or d.rc.manager.r_sum == 0))
