"""partial (Kimi k1.5, AReaL, slime, PipelineRL): streaming on the newest version only; at every
publish every instance interrupts its requests, loads the new weights and resumes them with a
re-prefill (their old-version KV is useless under the new weights). C1 is broken by design: the
versions each resumed request has seen are recorded and the violations counted."""

from __future__ import annotations

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
        c = self.c
        m = c.manager
        for name, inst in m.instances.items():
            states = inst.interrupt_all() if m.on_instance[name] else []
            reqs = {r.uid: r for r in m.forget(name, [s.uid for s in states])}
            c.dispatch.load(name, version)
            for s in states:
                if s.tokens_done > 0:
                    seen = self.seen.setdefault(s.uid, set(s.token_versions or (s.version,)))
                    seen.add(version)
                    c.ledger.count_reprefill(s.prompt_tokens + s.tokens_done)
                s.version = version
                s.has_kv, s.kv_bytes = False, 0
                reqs[s.uid].version = version
            if states:
                m.place(name, [reqs[s.uid] for s in states])
                inst.import_(states)
