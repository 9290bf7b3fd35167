"""torch, imported at its first use. A module of dora/algos is a registry (names, signatures, param
rules) plus the math: `dora validate` reads the registries (did-you-mean on a loss name, an off-policy
correction's params) and must not pay torch's import (1-2 s) for it; only calling the math loads torch.

    from dora.algos.lazy import torch      # then torch.exp(...), torch.float32 as usual
"""

from __future__ import annotations

import importlib
from types import ModuleType


class LazyModule:
    """Stands for a module until an attribute is read, then imports it and reads it there."""

    def __init__(self, name: str):
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str):
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r} ({'imported' if self._module else 'not imported yet'})>"


torch = LazyModule("torch")
