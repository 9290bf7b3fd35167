"""The async modes, one file each. A mode is a RolloutPolicy subclass with a `name`: defining it in
a module of this package registers it (every module here is imported), with its rules (K, RBS) and
its behaviour. The async section's `mode` takes its names from POLICIES (dora.graph.sections), so
a new mode is one new file here."""

from __future__ import annotations

import importlib
import pkgutil

from .rollout_policy import POLICIES, RolloutPolicy

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["POLICIES", "RolloutPolicy"]
