"""RolloutPolicy: what one async mode does at each event the RolloutController receives.

The controller owns the parts (manager, transfer queue, ledger, dispatcher) and the event
order; a policy only decides how prompts are dispatched, and
what happens when an instance frees up, a step ends, weights are published and time passes.
The default is a streaming mode on the newest version that does nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from ..config import RolloutConfig
    from ..rollout_controller import RolloutController

POLICIES: dict[str, type["RolloutPolicy"]] = {}


class RolloutPolicy:
    name: ClassVar[str] = ""        # the async.mode value (declared in dora.graph.sections); subclasses without one are not modes

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.name:
            POLICIES[cls.name] = cls

    def __init__(self, controller: "RolloutController"):
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

    def rebalance(self) -> bool:
        """Re-partition instances across versions now; False if this mode never does."""
        return False

    def token_versions(self, uid: str) -> set[int] | None:
        """Versions that generated `uid`'s tokens when the completion report does not say
        (None: the version it was dispatched with)."""
        return None
