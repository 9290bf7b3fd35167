"""RolloutPolicy: what one async mode does at each event the RolloutController receives.

The controller owns the parts (manager, transfer queue, ledger, dispatcher) and the event
order; a policy only decides how prompts are dispatched, and
what happens when an instance frees up, a step ends, weights are published and time passes.
The default is a streaming mode on the newest version that does nothing else.
"""

from __future__ import annotations

from typing import ClassVar



class PolicyRegistry(dict):
    """async.mode value -> RolloutPolicy subclass. `names()` lists the modes in listing order (dora
    validate's did-you-mean, `dora simulate`'s default --modes)."""

    def names(self) -> list[str]:
        return sorted(self, key=lambda n: (self[n].listing_order, n))


POLICIES: PolicyRegistry = PolicyRegistry()


class RolloutPolicy:
    """A mode declares, besides its behaviour, the rules its async settings follow (applied by
    dora.graph.sections.resolve_mode for validation and for the run alike)."""

    name: ClassVar[str] = ""        # the async.mode value; subclasses without one are not modes
    staleness: ClassVar[int | None] = None   # the K this mode always runs with; None: async.max_staleness (>= 1)
    batch_dispatch: ClassVar[bool] = False   # a whole batch at a time: RBS = TBS (else RBS 0 = 1.5 x TBS)
    listing_order: ClassVar[int] = 100       # where the mode stands in listings (then by name)
    colocated: ClassVar[bool] = False        # rollout never runs while the trainer steps, so both can share
                                             # every device (the simulator places it so; a run sleeps replicas
                                             # that share the trainer's devices)

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.name:
            POLICIES[cls.name] = cls

    def __init__(self, controller):
        """`controller`: the RolloutController whose events this policy decides (its parts: manager,
        queue, ledger, dispatch, clock, cfg)."""
        self.c = controller

    def start(self, now: float) -> None:
        """The controller has loaded the first version everywhere."""

    def dispatch(self) -> None:
        self.c.dispatch.stream()

    def instance_drained(self, name: str) -> None:
        """Instance `name` reported completions and now holds no request."""

    def after_step(self) -> None:
        """A training step ended (its metrics are in the ledger)."""

    def on_published(self, version: int) -> None:
        """Version `version` can now be loaded (the dispatcher's newest already says so)."""

    def on_tick(self) -> None:
        """Periodic call from the driver."""

    def batch_taken(self) -> None:
        """The trainer just took a batch (it steps from now until the next publish)."""

    def evaluations_wait(self) -> bool:
        """Are held-out evaluation requests held back now (placed nowhere)? A colocated mode's training
        barrier: the trainer has the devices."""
        return False

    def held(self) -> int:
        """Trajectories this policy holds off every instance (in flight in the accounting)."""
        return 0

    def rebalance(self) -> bool:
        """Re-partition instances across versions now; False if this mode never does."""
        return False

    def spare(self, name: str) -> bool:
        """May instance `name` be lent to a held-out evaluation now (load an older version for it)?
        Streaming: it holds no request and nothing more may be dispatched (R_sum at RBS, the
        staleness room used up, or no prompt left to send) nor is waiting for a host."""
        c = self.c
        d = c.dispatch
        nothing_to_send = c.manager.exhausted or d.room() < c.cfg.group_size
        return not c.manager.on_instance[name] and nothing_to_send and not d.pending_retag and not d.parked

    def token_versions(self, uid: str) -> set[int] | None:
        """Versions that generated `uid`'s tokens when the completion report does not say
        (None: the version it was dispatched with)."""
        return None
