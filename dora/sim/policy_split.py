"""Two policies on one shared rollout pool: how the pool's instances are split between them
(`dora simulate --policy ... --policy ...`, dora/sim/two_policies.py).

Each policy runs its own RolloutController (its own versions, staleness window, TransferQueue) and
trainer; each holds a base share of the pool, and the rest float between them through the
controllers' lend / reclaim calls (the ones elastic lending uses: a reclaimed instance's requests move
with their KV to the holder's other instances of their version; a lent one loads the new holder's
newest weights, a weight load the cost model charges).

    static  the floating instances are split evenly once and never move (what two generate nodes of
            fixed replica counts give a real run today)
    load    after every training step of either policy, the floating instances are re-partitioned in
            proportion to each policy's outstanding work: its requests in flight times its measured
            mean response length (Algorithm 1's DP_w = round(D * R_w / sum R), across policies); a
            policy keeps what it holds when the target does not move an instance
"""

from __future__ import annotations

import dataclasses

from dora.rl.rollout import RolloutController

from .hosted_versions import HostedVersions
from .sim_instance import SimInstance

SPLITS = ("static", "load")


@dataclasses.dataclass
class Holding:
    """What one policy holds of the floating instances, and for how long (instance-seconds)."""

    lent: list[SimInstance] = dataclasses.field(default_factory=list)
    instance_s: float = 0.0


class PolicySplit:
    def __init__(self, controllers: dict[str, RolloutController], floating: list[SimInstance], how: str, clock):
        if how not in SPLITS:
            raise ValueError(f"split {how!r}: expected one of {', '.join(SPLITS)}")
        self.c, self.floating, self.how, self.clock = controllers, floating, how, clock
        self.hold = {u: Holding() for u in controllers}
        self.moves = 0
        self.since = clock.now()
        self.done: set[str] = set()      # policies that trained all their steps: no work to serve

    def start(self) -> None:
        """The first split: evenly, in policy order."""
        names = list(self.c)
        share = {u: len(self.floating) // len(names) + (1 if i < len(self.floating) % len(names) else 0)
                 for i, u in enumerate(names)}
        self._apply(share)

    def rebalance(self) -> None:
        if self.how == "static" or not self.floating:
            return
        work = {u: 0.0 if u in self.done else c.manager.r_sum * _mean_response(c) for u, c in self.c.items()}
        total = sum(work.values())
        if total <= 0:
            return
        raw = {u: len(self.floating) * w / total for u, w in work.items()}
        target = {u: int(r) for u, r in raw.items()}
        for u in sorted(raw, key=lambda x: raw[x] - target[x], reverse=True)[:len(self.floating) - sum(target.values())]:
            target[u] += 1   # largest remainder
        if any(target[u] != len(self.hold[u].lent) for u in target):
            self._apply(target)

    def _apply(self, target: dict[str, int]) -> None:
        self._account()
        held = {i.name for h in self.hold.values() for i in h.lent}
        free: list[SimInstance] = [i for i in self.floating if i.name not in held]   # (none held yet at the start)
        for u, h in self.hold.items():   # the policies over target hand back the least loaded ...
            if len(h.lent) > target[u]:
                m = self.c[u].manager
                h.lent.sort(key=lambda i: m.load(i.name), reverse=True)
                give, h.lent = h.lent[target[u]:], h.lent[:target[u]]
                self.c[u].reclaim([i.name for i in give])
                for inst in give:        # ... an instance changing policy holds none of the new one's weights
                    inst.hv = HostedVersions(inst.hv.limit)
                    self.moves += 1
                free += give
        for u, h in self.hold.items():    # ... and the policies under target take them
            need = target[u] - len(h.lent)
            if need > 0 and free:
                got, free = free[:need], free[need:]
                self.c[u].lend(got)
                h.lent += got

    def _account(self) -> None:
        now = self.clock.now()
        for h in self.hold.values():
            h.instance_s += len(h.lent) * (now - self.since)
        self.since = now

    def shares(self) -> dict[str, float]:
        """Time-averaged floating instances each policy held."""
        self._account()
        span = max(1e-9, self.clock.now())
        return {u: h.instance_s / span for u, h in self.hold.items()}


def _mean_response(c: RolloutController) -> float:
    """The policy's mean generated tokens per trajectory over its steps so far (1 before any)."""
    sm = c.step_metrics
    n = sum(m.trajectories for m in sm)
    return sum(m.response_tokens for m in sm) / n if n else 1.0
