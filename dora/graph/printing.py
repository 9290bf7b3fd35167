"""`print(graph)`: a graph in a few aligned lines, as torch.fx prints its graphs.

One line per pool, one per node (name = op(inputs), replicas, devices and memory share, pool; non-default edge options in
brackets), one per weights edge, then the async and run sections. Text only: the YAML stays the
round-trip format (dora.graph.yaml_io). It reads the model's objects (dora.graph.model, whose
Graph.__str__ calls format_graph) without importing that module.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dora.graph.op_registry import builtin_ops
from dora.graph.sections import section_specs

EDGE_OPTIONS = ("group_by", "routing", "capacity", "capacity_bytes")


def share_text(memory: float) -> str:
    """A memory share as a percentage: 0.45 -> "45%"."""
    return f"{memory * 100:.4g}%"


def scale_text(n: Any) -> str:
    """How many of a node run and on what: "x2", "x2, 4 devices each" (a TP group per replica),
    "x4 ranks" (a sharded op: one process group of 4 ranks), ", memory 45%" (a declared share of each
    device). Built-in ops only are looked up: printing never imports a user op."""
    spec = builtin_ops().get(n.op) if isinstance(n.op, str) else None
    if spec is not None and spec.sharded and n.replicas != 1:
        text = f"x{n.replicas} ranks"
    else:
        text = f"x{n.replicas}"
    if n.devices != 1:
        text += f", {n.devices} devices each"
    memory = getattr(n, "memory", None)
    if isinstance(memory, (int, float)) and not isinstance(memory, bool):
        text += f", memory {share_text(memory)}"
    return text


def _edge(port: str, e: Any) -> str:
    default = {f.name: f.default for f in dataclasses.fields(e)}
    opts = [f"{k}={getattr(e, k)}" for k in EDGE_OPTIONS if getattr(e, k) != default[k]]
    src = e.src if e.src_port == "out" else f"{e.src}/{e.src_port}"
    return f"{port}={src}" + (f" [{', '.join(opts)}]" if opts else "")


def _table(rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths))).rstrip() for r in rows]


def _section(obj: Any, keys: tuple[str, ...]) -> str:
    return ", ".join(f"{k}={getattr(obj, k)}" for k in keys)


def format_graph(g: Any) -> str:
    """`g`: a dora.graph.model.Graph."""
    lines = [f"graph {g.name}:"]
    if g.pools:
        lines.append(" pools:")
        lines += _table([(name, f"{p.device} x {p.count}") for name, p in g.pools.items()])
    if g.nodes:
        lines.append(" nodes:")
        rows = []
        for name, n in g.nodes.items():
            ins = ", ".join(_edge(port, e) for port, e in n.inputs.items())
            rows.append((f"%{name}", "=", f"{n.op}({ins})", scale_text(n), f"pool {n.pool or '-'}"))
        lines += _table(rows)
    if g.weights:
        lines.append(" weights:")
        lines += _table([(f"%{w.src}", "->", f"%{w.dst}") for w in g.weights])
    lines.append(f" async: {_section(g.async_, tuple(section_specs(type(g.async_))))}")
    lines.append(f" run: {_section(g.run, tuple(section_specs(type(g.run))))}")
    for name, e in getattr(g, "evals", {}).items():
        specs = section_specs(type(e))   # (a set's settings as written: the rest are defaults)
        lines.append(f" eval {name}: {_section(e, tuple(k for k, ps in specs.items() if getattr(e, k) != ps.default))}")
    return "\n".join(lines)
