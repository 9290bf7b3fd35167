"""The pipeline's `async:` and `run:` sections: their declarations as ParamSpecs, and the mode rules.

AsyncConfig and RunConfig (dora.graph.model) declare each setting once, as a dataclass field made
by `opspec.setting`; `section_specs` reads those fields back as ParamSpecs, so YAML keys,
validation and `dora ops` all come from the one declaration.

The modes are the RL layer's rollout policies: `async.mode` takes its names from MODES_FROM (the
policy registry, imported by path like an op's impl, when a pipeline is checked), and each policy
declares its rules (a fixed K or none, whole-batch dispatch). `resolve_async` applies them (sync
forces K = 0, one_step_off K = 1, a rollout batch of 0 takes the mode's default) and checks the
group arithmetic. Its result, AsyncSettings, is what ops, the RL driver and the rollout control
code see: never the section as written.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from dora.graph.opspec import ParamSpec, import_object

MODES_FROM = "dora.rl.rollout.policies:POLICIES"   # async.mode names: the rollout policies

_TYPES = {"int": "int", "float": "float", "bool": "bool", "str": "str", "list": "list", "dict": "dict"}


@functools.lru_cache(maxsize=None)
def section_specs(cls: type) -> dict[str, ParamSpec]:
    """The ParamSpecs a section dataclass declares (fields made by `setting`), in field order."""
    specs: dict[str, ParamSpec] = {}
    for f in dataclasses.fields(cls):
        if "doc" not in f.metadata:
            continue   # bookkeeping fields such as loc
        annotation = str(f.type).replace(" ", "")
        optional = annotation.endswith("|None")
        base = annotation.removesuffix("|None").split("[")[0]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        extra = {k: v for k, v in f.metadata.items() if k != "doc"}
        if "choices" in extra:
            extra["choices"] = tuple(extra["choices"])
        specs[f.name] = ParamSpec(f.name, _TYPES[base] + ("?" if optional else ""), default, f.metadata["doc"], **extra)
    return specs


class ModeError(ValueError):
    """Async settings that the mode cannot run; `key` names the setting to fix."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(message)


@dataclasses.dataclass(frozen=True)
class AsyncSettings:
    """The async section after the mode's rules: what every consumer of async settings reads."""

    mode: str = "sync"
    max_staleness: int = 0        # K as the mode runs it
    rollout_batch: int = 32       # RBS as the mode runs it (trajectories)
    train_batch: int = 32         # TBS (trajectories)
    group_size: int | None = None  # G, from the dataset node; None: batches arrive as whole groups
    versions_per_instance: int = 1  # M as the run uses it (dora.graph.resolve: 1 where the engine hosts one version)
    fast_lanes: int = -1           # async.fast_lanes: instances fast lanes may take (-1: as measured, 0: none)
    policy: str | None = None     # the update node of this policy in a graph with several (dora/graph/policies.py)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resolve_mode(mode: str, max_staleness: int, rollout_batch: int, train_batch: int, group_size: int) -> tuple[int, int]:
    """(K, RBS) as `mode` runs them; ModeError when the mode cannot run these numbers.

    The one place these rules are applied (each mode declares its own on its policy): validation,
    the RL driver and the simulator all call it.
    """
    policies = import_object(MODES_FROM)
    if mode not in policies:
        raise ModeError("mode", f"unknown rollout mode {mode!r}; expected one of {', '.join(policies.names())}")
    policy = policies[mode]
    if group_size < 1:
        raise ModeError("group_size", f"group_size must be >= 1, got {group_size}")
    if train_batch < group_size or train_batch % group_size:
        fit = max(group_size, train_batch - train_batch % group_size)
        raise ModeError("train_batch", f"train_batch {train_batch} is not a multiple of group_size {group_size}: "
                                       f"a step trains whole groups (C2); use {fit}")
    if policy.staleness is None and max_staleness < 1:
        raise ModeError("max_staleness", f"mode {mode} needs max_staleness >= 1 (it overlaps rollout with "
                                         f"training), got {max_staleness}; use mode sync for K = 0")
    k = max_staleness if policy.staleness is None else policy.staleness
    if policy.batch_dispatch:
        return k, train_batch
    rbs = rollout_batch or train_batch + train_batch // 2
    if rbs < train_batch or rbs % group_size:
        raise ModeError("rollout_batch", f"rollout_batch {rbs} must be a multiple of group_size {group_size} "
                                         f"and >= train_batch {train_batch}")
    return k, rbs


def resolve_async(cfg: Any, group_size: int | None) -> AsyncSettings:
    """AsyncSettings for an AsyncConfig and the dataset's group size (None: no dataset node)."""
    k, rbs = resolve_mode(cfg.mode, cfg.max_staleness, cfg.rollout_batch, cfg.train_batch, group_size or 1)
    return AsyncSettings(cfg.mode, k, rbs, cfg.train_batch, group_size, cfg.versions_per_instance, cfg.fast_lanes)
