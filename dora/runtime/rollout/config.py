"""Rollout configuration: one dataclass for every mode; each mode (policies/) fills its defaults."""

from __future__ import annotations

import dataclasses


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

    def resolved(self) -> "RolloutConfig":
        """Validate and fill mode-dependent defaults; returns a new config."""
        c = dataclasses.replace(self)
        from .policies import MODES, POLICIES     # the policies import this module
        if c.mode not in MODES:
            raise RolloutConfigError(f"unknown rollout mode {c.mode!r}; expected one of {', '.join(MODES)}")
        if c.group_size < 1:
            raise RolloutConfigError(f"group_size must be >= 1, got {c.group_size}")
        if c.train_batch < c.group_size or c.train_batch % c.group_size:
            raise RolloutConfigError(
                f"train_batch ({c.train_batch}) must be a positive multiple of group_size ({c.group_size}): "
                "a step trains whole groups (C2)")
        POLICIES[c.mode].resolve(c)
        if c.rollout_batch < c.train_batch or c.rollout_batch % c.group_size:
            raise RolloutConfigError(
                f"rollout_batch ({c.rollout_batch}) must be a multiple of group_size ({c.group_size}) "
                f"and >= train_batch ({c.train_batch})")
        return c
