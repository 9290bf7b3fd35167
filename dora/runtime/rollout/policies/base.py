"""RolloutPolicy: what one async mode does at each event the RolloutController receives.

The controller owns the parts (manager, transfer queue, ledger, dispatcher) and the event
order; a policy only decides: its config defaults (`resolve`), how prompts are dispatched, and
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
    name: ClassVar[str] = ""        # the async.mode value; subclasses without one are not modes
    order: ClassVar[int] = 99       # position among the modes in tables (baselines first)

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.name:
            POLICIES[cls.name] = cls

    @classmethod
    def resolve(cls, cfg: "RolloutConfig") -> None:
        """Fill this mode's defaults into `cfg` (a copy) and reject what it cannot run.
        Streaming default: K >= 1 and RBS = 1.5 x TBS."""
        from ..config import RolloutConfigError
        if cfg.max_staleness < 1:
            raise RolloutConfigError(f"max_staleness must be >= 1 in mode {cfg.mode}, got {cfg.max_staleness}")
        if cfg.rollout_batch == 0:
            cfg.rollout_batch = cfg.train_batch + cfg.train_batch // 2

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
