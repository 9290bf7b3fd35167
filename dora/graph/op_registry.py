"""The op registry: the built-in ops by name (dora/graph/builtin_ops.py) and user ops by import
path ("pkg.module:Class" with a class attribute `spec`). Kept apart from the declarations
(dora/graph/opspec.py) so that declaring an op never needs the registry."""

from __future__ import annotations

import importlib

from dora.graph.builtin_ops import BUILTIN_OPS
from dora.graph.opspec import OpError, OpSpec, did_you_mean


def builtin_ops() -> dict[str, OpSpec]:
    return BUILTIN_OPS


def resolve_op(name: str) -> OpSpec:
    """The declaration of a built-in op (by name) or a user op ("pkg.module:Class").

    Raises OpError naming what is wrong and what would be right.
    """
    builtins = builtin_ops()
    if name in builtins:
        return builtins[name]
    if ":" not in name:
        hint = did_you_mean(name, sorted(builtins)) or f"built-in ops are {sorted(builtins)}; user ops are 'pkg.module:Class'"
        raise OpError(f"unknown op {name!r} ({hint})")
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # any import failure is the user's op's problem; say which
        raise OpError(f"user op {name!r}: cannot import module {module_name!r}: {type(e).__name__}: {e}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        hint = did_you_mean(attr, [a for a in dir(module) if not a.startswith("_")])
        raise OpError(f"user op {name!r}: module {module_name!r} has no attribute {attr!r}" + (f" ({hint})" if hint else ""))
    spec = getattr(cls, "spec", None)
    if not isinstance(spec, OpSpec):
        raise OpError(
            f"user op {name!r}: class {attr} has no class attribute `spec` of type dora.graph.opspec.OpSpec "
            f"(declare its ports and params: spec = OpSpec(name=..., doc=..., inputs=(PortSpec('in', needs=(...)),), adds=(...), params={{...}}, impl={name!r}))"
        )
    return spec
