"""Rollout configuration: one dataclass for every mode. Each mode is a policy in policies/ (its
behaviour and its K/RBS rules); dora.graph.sections.resolve_mode applies the rules."""

from __future__ import annotations

import dataclasses

from dora.graph.sections import ModeError, resolve_mode

__all__ = ["RolloutConfig", "RolloutConfigError"]


class RolloutConfigError(ValueError):
    pass


@dataclasses.dataclass
class RolloutConfig:
    mode: str = "dora"
    train_batch: int = 8192        # TBS: trajectories per training step (a multiple of group_size)
    rollout_batch: int = 0         # RBS: outstanding trajectories kept dispatched (0 = mode default)
    group_size: int = 16           # G: responses per prompt
    max_staleness: int = 3         # K (dora, partial). sync forces 0, one_step_off forces 1
    # Orchestrator triggers (besides the mandatory one after each training step):
    rebalance_period_s: float = 30.0     # periodic trigger
    kv_pressure: float = 0.92            # any instance above this KV use -> rebalance
    kv_check_s: float = 30.0             # how often tick() polls instance stats for KV pressure
    queue_pressure: float = 0.5          # queued/slots on one instance while a peer of its version idles
    queue_allowance_groups: int = 1      # streaming: an instance gets new groups up to slots + this many groups
    # M: versions one instance may host at once (async.versions_per_instance, declared in dora.graph.model;
    # drivers pass the graph's value, the engine's limit applied). 1 here: an instance the caller says
    # nothing about hosts one version.
    versions_per_instance: int = 1
    fast_lanes: int = -1                 # async.fast_lanes (declared in dora.graph.model): instances lanes may take
    length_aware: bool = True            # queued siblings of a running group of a version at risk start on the newest

    def resolved(self) -> "RolloutConfig":
        """Validate and fill mode-dependent defaults; returns a new config."""
        c = dataclasses.replace(self)
        try:   # the rules `dora validate` applies too
            c.max_staleness, c.rollout_batch = resolve_mode(c.mode, c.max_staleness, c.rollout_batch,
                                                            c.train_batch, c.group_size)
        except ModeError as e:
            raise RolloutConfigError(str(e)) from None
        if c.versions_per_instance < 1:
            raise RolloutConfigError(f"versions_per_instance must be >= 1, got {c.versions_per_instance}")
        if c.fast_lanes < -1:
            raise RolloutConfigError(f"fast_lanes must be >= -1 (-1: as many as measured, 0: none), got {c.fast_lanes}")
        return c
