"""Column propagation: which columns flow on each data edge.

A node's output carries the union of what arrives on its inputs (the ports its op `carries`:
all by default) plus what its op adds (given its params). Used by validation (needs vs. what flows) and the visualizer (edge
labels). Unknown ops and nodes on cycles make their outputs "unknown" (None), so one
error upstream does not cascade into false "missing column" errors downstream.
"""

from __future__ import annotations

import dataclasses

from dora.graph.model import Edge, Graph
from dora.graph.op_registry import resolve_op
from dora.graph.opspec import OpError, OpSpec, ParamError, fill_params


@dataclasses.dataclass
class Schemas:
    specs: dict[str, OpSpec | None]                  # node -> resolved spec (None: unresolvable)
    params: dict[str, dict | None]                   # node -> filled params (None: invalid)
    out: dict[str, frozenset[str] | None]            # node -> columns on its output (None: unknown)

    def on_edge(self, e: Edge) -> frozenset[str] | None:
        return self.out.get(e.src)

    def added(self, node: str) -> tuple[str, ...]:
        spec, params = self.specs.get(node), self.params.get(node)
        if spec is None:
            return ()
        return spec.added(params if params is not None else {})


def resolve_all(g: Graph) -> tuple[dict[str, OpSpec | None], dict[str, str]]:
    """Resolve every node's op once: (node -> spec or None, node -> error message)."""
    specs: dict[str, OpSpec | None] = {}
    errors: dict[str, str] = {}
    cache: dict[str, OpSpec | str] = {}
    for name, node in g.nodes.items():
        if not isinstance(node.op, str):
            specs[name] = None
            errors[name] = f"'op' must be a string, got {node.op!r}"
            continue
        if node.op not in cache:
            try:
                cache[node.op] = resolve_op(node.op)
            except OpError as e:
                cache[node.op] = str(e)
        r = cache[node.op]
        specs[name] = r if isinstance(r, OpSpec) else None
        if not isinstance(r, OpSpec):
            errors[name] = r
    return specs, errors


def propagate(g: Graph, specs: dict[str, OpSpec | None] | None = None) -> Schemas:
    if specs is None:
        specs, _ = resolve_all(g)
    params: dict[str, dict | None] = {}
    for name, node in g.nodes.items():
        spec = specs.get(name)
        try:
            params[name] = fill_params(spec, node.params) if spec is not None and isinstance(node.params, dict) else None
        except ParamError:
            params[name] = None
    out: dict[str, frozenset[str] | None] = {n: None for n in g.nodes}
    for name in _acyclic_prefix(g):
        spec = specs.get(name)
        if spec is None:
            continue
        cols: set[str] = set()
        # a node missing one of its inputs has its own error; its output is unknown, not empty
        known = all(p.name in g.nodes[name].inputs for p in spec.inputs)
        for port, e in g.nodes[name].inputs.items() if known else ():
            src = out.get(e.src)
            if src is None:
                known = False
                break
            if spec.carries is None or port in spec.carries:
                cols |= src
        if known:
            p = params[name] if params[name] is not None else {k: ps.default for k, ps in spec.params.items()}
            out[name] = frozenset(cols | set(spec.added(p)))
    return Schemas(specs, params, out)


def _acyclic_prefix(g: Graph) -> list[str]:
    return g.acyclic_prefix()
