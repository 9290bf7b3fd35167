"""OpContext for tests that drive an op directly: params filled and derived as a run resolves them
(dora.graph.resolve), async settings as a mode resolves them."""

from __future__ import annotations

from typing import Any

from dora.graph.op_registry import resolve_op
from dora.graph.opspec import fill_params
from dora.graph.sections import AsyncSettings
from dora.ops.base import OpContext


def op_context(op: str, params: dict[str, Any] | None = None, *, node: str | None = None,
               async_: dict[str, Any] | None = None, replica: int = 0, replicas: int = 1,
               model: dict[str, Any] | None = None, **kw: Any) -> OpContext:
    filled = fill_params(resolve_op(op), dict(params or {}))
    if filled.get("temperature", 0) is None:
        filled["temperature"] = 1.0   # no generate node to inherit from: logprobs at T = 1
    return OpContext(node=node or op, op=op, replica=replica, replicas=replicas, params=filled,
                     model=dict(model or {}), async_=AsyncSettings(**(async_ or {})), **kw)
