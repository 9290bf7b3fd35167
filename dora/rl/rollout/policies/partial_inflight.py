"""partial_inflight: PipelineRL's in-flight weight update. Streaming on the newest version with no
barrier, as partial; at every publish each instance swaps in the new weights while its requests
keep running: they keep the KV their older version computed (no re-prefill, no interruption) and
generate their next tokens with the new weights. Only the weight load stalls the instance. C1 is
broken by design (a trajectory's tokens come from several versions, and its later tokens attend to
KV of an older one): counted. The staleness cap is partial's."""

from __future__ import annotations

from .partial import PartialPolicy


class PartialInflightPolicy(PartialPolicy):
    name = "partial_inflight"
    listing_order = 5

    def on_published(self, version: int) -> None:
        c, m = self.c, self.c.manager
        for name in list(m.instances):
            running = list(m.on_instance[name].values())
            if not running:
                c.dispatch.load(name, version)
                continue
            for r in running:                # (instances that report token versions override this)
                self.seen.setdefault(r.uid, {r.version}).add(version)
            c.dispatch.swap_in_flight(name, version)
