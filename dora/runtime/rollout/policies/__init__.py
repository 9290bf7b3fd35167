"""The async modes' behaviour, one file each. A mode is a RolloutPolicy subclass whose `name` is
one of the modes dora.graph.sections declares (with their K/RBS rules); defining it in a module of
this package registers it (every module here is imported)."""

from __future__ import annotations

import importlib
import pkgutil

from .rollout_policy import POLICIES, RolloutPolicy

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["POLICIES", "RolloutPolicy"]
