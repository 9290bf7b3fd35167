"""Fast lanes: an old version's stragglers decode in small batches on instances of their own.

The trainer waits for the oldest version's last requests (C1 keeps them on their version, C3
bounds how late they may be trained); those requests decode at the speed of the batch they share.
A decode iteration has a fixed part (18 ms of ~45 ms at a full batch in the simulator's cost model)
plus a part per running request and per token of context, so the same request runs 1.5-3x faster
on an instance holding a few requests. A fast lane is such an instance: when a version's requests
could miss their deadline, the orchestrator gives that version lanes (instances taken from the
newest version's share, never below what keeps the trainer fed), its requests move into them with
their KV (no re-prefill) and spread evenly, and the VersionPacker neither packs them back nor mixes
the newest version in beside them. Every number comes from measurements:

  at risk   version v's latest-dispatched request in flight, if it took as long as the longest
            generation measured (dispatch to finish, last 2K steps), would end after v's deadline
            (Deadlines: from the trainer's own pace);
  how thin  v's requests must decode sigma = needed / left times faster: the SpeedModel, fitted to
            the iteration times instances report, turns that into requests per lane (no lanes if
            even one request per instance could not make it: that costs throughput and still
            misses);
  how many  the newest version keeps at least the instances that decode what the trainer consumes
            (the last step's generated tokens per trainer step time over the per-instance decode
            rate measured now), and lanes never number more than async.fast_lanes (-1: no cap).

`plan()` says which versions get lanes and how thin; the Orchestrator places them
(Orchestrator.rebalance's `spread`). Requests moved into lanes are counted per step
(StepMetrics.fast_lane_requests).
"""

from __future__ import annotations

import math

from .deadlines import Deadlines
from .speed import SpeedModel


class FastLanes:
    def __init__(self, controller, deadlines: Deadlines, speed: SpeedModel, cap: int = -1):
        """`controller`: the RolloutController (its manager, clock, ledger, dispatcher); `cap`: at most
        this many instances serve as lanes at once (-1: as many as measured, 0: none)."""
        self.c, self.deadlines, self.speed, self.cap = controller, deadlines, speed, cap

    def plan(self) -> tuple[dict[int, int], int, int]:
        """(version -> requests per lane for the versions that need lanes, the newest version's
        floor of instances, the most instances lanes may take: -1 for no cap)."""
        if self.cap == 0:
            return {}, 1, 0
        c, m, dl = self.c, self.c.manager, self.deadlines
        longest = dl.longest_generation()
        if longest <= 0:
            return {}, 1, self.cap
        now, newest, sent = c.clock.now(), c.dispatch.newest, c.ledger.dispatched_at
        latest: dict[int, float] = {}
        hosts: dict[int, list] = {}
        rates: list[float] = []
        for n, inst in m.instances.items():
            st = inst.stats()
            self.speed.observe(st)
            if inst.version == newest and st.active and st.step_s > 0 and n not in m.lent:
                rates.append(st.active / st.step_s)
            for v in m.versions_on[n]:                   # M = 1: the instance's own version
                if v == newest:
                    continue
                hosts.setdefault(v, []).append(st)
                t0 = max(sent.get(r.group_id, 0.0) for r in m.on_instance[n].values() if r.version == v)
                latest[v] = max(latest.get(v, 0.0), t0)
        out: dict[int, int] = {}
        for v, t0 in latest.items():
            left, need = dl.deadline(v) - now, t0 + longest - now
            if need <= left:
                continue
            sigma = need / left if left > 0 else float("inf")
            busy = [st for st in hosts[v] if st.active]
            if not busy:
                continue
            batch = sum(st.active for st in busy) / len(busy)
            step = sum(st.step_s for st in busy) / len(busy)
            out[v] = self.speed.batch_for(batch, step if step > 0 else 1.0, sigma)
        pace, last = dl.pace(), c.ledger.step_metrics[-1:]
        floor = 1
        if out and rates and pace and last:
            floor = math.ceil(last[0].response_tokens / pace / (sum(rates) / len(rates)))
        return out, floor, self.cap
