"""partial (AReaL-style streaming; also slime's): streaming on the newest version only, no
training barrier; at every publish every instance interrupts its requests, loads the new weights
and resumes them with a re-prefill (their old-version KV is useless under the new weights: AReaL
pauses its servers and recomputes it). C1 is broken by design: the versions each resumed request
has seen are recorded and the violations counted.

AReaL's staleness cap (eta) is async.max_staleness: a request is admitted only while the
trajectories dispatched and not yet trained fit in the steps that may still train them
(TransferQueue.dispatch_room: AReaL's N_r <= (i + eta + 1) B), and a step takes its batch only when
no group older than K steps would be left behind, counted by the version of a trajectory's oldest
tokens. The other partial modes (partial_colocated, partial_inflight) share this policy's
interrupt-and-resume parts."""

from __future__ import annotations

from ..types import Request, RequestState
from .rollout_policy import RolloutPolicy


class PartialPolicy(RolloutPolicy):
    name = "partial"
    listing_order = 2

    def __init__(self, controller):
        super().__init__(controller)
        self.seen: dict[str, set[int]] = {}     # uid -> versions that generated its tokens so far

    def token_versions(self, uid: str) -> set[int] | None:
        return self.seen.pop(uid, None)

    def on_published(self, version: int) -> None:
        for name in list(self.c.manager.instances):
            reqs, states = self.interrupt(name)
            self.c.dispatch.load(name, version)
            self.resume(name, reqs, states, version)

    def interrupt(self, name: str) -> tuple[dict[str, Request], list[RequestState]]:
        """Stop every request on instance `name`, keeping its tokens so far (out of the manager's books)."""
        m = self.c.manager
        states = m.instances[name].interrupt_all() if m.on_instance[name] else []
        return {r.uid: r for r in m.forget(name, [s.uid for s in states])}, states

    def resume(self, name: str, reqs: dict[str, Request], states: list[RequestState], version: int) -> None:
        """Resume interrupted requests on `name` under `version`: their KV is dropped (prefilled again,
        counted) and the versions their tokens came from recorded (C1)."""
        c = self.c
        for s in states:
            if s.tokens_done > 0:
                seen = self.seen.setdefault(s.uid, set(s.token_versions or (s.version,)))
                seen.add(version)
                c.ledger.count_reprefill(s.prompt_tokens + s.tokens_done)
            s.version = version
            s.has_kv, s.kv_bytes = False, 0
            reqs[s.uid].version = version
        if states:
            c.manager.place(name, [reqs[s.uid] for s in states])
            c.manager.instances[name].import_(states)
