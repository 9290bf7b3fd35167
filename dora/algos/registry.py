"""A name -> function registry, so configs select estimators and losses by name (verl-style).

Unknown names and unknown parameters are ValueErrors that list what is valid, so a typo in a
pipeline YAML surfaces as a readable message instead of a TypeError deep in the math. An entry may
declare `rules` for its params' values (a function of the keyword params, defaults filled, raising
ValueError): check_params runs them without touching a tensor, so `dora validate` catches a bad value
without importing torch.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._fns: dict[str, Callable[..., Any]] = {}
        self._rules: dict[str, Callable[..., None]] = {}

    def register(self, name: str, rules: Callable[..., None] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._fns:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._fns[name] = fn
            if rules is not None:
                self._rules[name] = rules
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
        """Raise ValueError naming any keyword in `params` that the function `name` does not take, or a
        value its declared rules refuse."""
        sig = inspect.signature(self.get(name))
        keywords = [p for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY]
        unknown = sorted(set(params) - {p.name for p in keywords})
        if unknown:
            raise ValueError(
                f"{self.kind} {name!r} got unknown parameter(s) {unknown}; it takes {sorted(p.name for p in keywords) or 'none'}"
            )
        if name in self._rules:
            self._rules[name](**{**{p.name: p.default for p in keywords if p.default is not p.empty}, **params})
