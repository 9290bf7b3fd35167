"""A name -> function registry, so configs select estimators and losses by name (verl-style).

Unknown names and unknown parameters are ValueErrors that list what is valid, so a typo in a
pipeline YAML surfaces as a readable message instead of a TypeError deep in the math.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._fns: dict[str, Callable[..., Any]] = {}

    def register(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._fns:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._fns[name] = fn
            return fn

        return deco

    def names(self) -> list[str]:
        return sorted(self._fns)

    def get(self, name: str) -> Callable[..., Any]:
        try:
            return self._fns[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}") from None

    def check_params(self, name: str, params: dict[str, Any]) -> None:
        """Raise ValueError naming any keyword in `params` that the function `name` does not take."""
        sig = inspect.signature(self.get(name))
        accepted = {p.name for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY}
        unknown = sorted(set(params) - accepted)
        if unknown:
            raise ValueError(
                f"{self.kind} {name!r} got unknown parameter(s) {unknown}; it takes {sorted(accepted) or 'none'}"
            )
