"""The async modes, one file each. A mode is a RolloutPolicy subclass with a `name`; defining it
in a module of this package is all it takes to register it (every module here is imported)."""

from __future__ import annotations

import importlib
import pkgutil

from .base import POLICIES, RolloutPolicy

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")

MODES = tuple(sorted(POLICIES, key=lambda name: POLICIES[name].order))

__all__ = ["MODES", "POLICIES", "RolloutPolicy"]
