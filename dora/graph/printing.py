"""`print(graph)`: a graph in a few aligned lines, as torch.fx prints its graphs.

One line per pool, one per node (name = op(inputs), replicas, devices and memory share, pool; non-default edge options in
brackets), one per weights edge, then the async and run sections. With params (`graph.print(params=True)`) each node's
line is followed by its params as written (params="all": every declared param, defaults filled in, for built-in
ops). Text only: the YAML stays the
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


def _policies(g: Any) -> list[str]:
    """With several update nodes, one line per policy: its update, generate and prompt source."""
    from dora.graph.policy_roles import find_policies, is_multi_policy

    specs = {name: builtin_ops().get(n.op) if isinstance(n.op, str) else None for name, n in g.nodes.items()}
    if not is_multi_policy(specs):
        return []
    rows = [(f"%{p.update}:", f"generate {', '.join('%' + x for x in p.generates) or '-'}",
             f"prompts %{p.prompt_source}" if p.prompt_source else "prompts -") for p in find_policies(g, specs)]
    return [" policies:"] + _table(rows)


def _params_lines(n: Any, params: bool | str) -> list[str]:
    """A node's params under its line: as written, or (params="all") every declared one with defaults."""
    given = dict(n.params) if isinstance(n.params, dict) else {}
    spec = builtin_ops().get(n.op) if isinstance(n.op, str) else None
    shown = given
    if params == "all" and spec is not None:
        shown = {k: given.get(k, p.default) for k, p in spec.params.items()} | given
    if not shown:
        return []
    width = max(len(str(k)) for k in shown)
    return [f"      {str(k).ljust(width)}  {v!r}" + ("" if k in given or params != "all" else "  (default)")
            for k, v in shown.items()]


def format_graph(g: Any, params: bool | str = False) -> str:
    """`g`: a dora.graph.model.Graph; params: False, True (as written) or "all" (with defaults)."""
    lines = [f"graph {g.name}:"]
    if g.pools:
        lines.append(" pools:")
        lines += _table([(name, f"{p.device} x {p.count}") for name, p in g.pools.items()])
    if g.nodes:
        lines.append(" nodes:")
        rows = []
        for name, n in g.nodes.items():
            ins = ", ".join(_edge(port, e) for port, e in n.inputs.items())
            own = getattr(n, "model", None)
            model = f"model {', '.join(f'{k}={v}' for k, v in own.items())}" if isinstance(own, dict) else ""
            rows.append((f"%{name}", "=", f"{n.op}({ins})", scale_text(n), f"pool {n.pool or '-'}", model))
        for line, n in zip(_table(rows), g.nodes.values()):
            lines.append(line)
            if params:
                lines += _params_lines(n, params)
    if g.weights:
        lines.append(" weights:")
        lines += _table([(f"%{w.src}", "->", f"%{w.dst}") for w in g.weights])
    lines += _policies(g)
    keys = tuple(k for k in section_specs(type(g.async_)) if k != "policies")
    lines.append(f" async: {_section(g.async_, keys)}")
    policies = getattr(g.async_, "policies", None)
    if isinstance(policies, dict) and policies:
        lines += _table([(f"policy %{u}:", ", ".join(f"{k}={v}" for k, v in (o or {}).items()) if isinstance(o, dict)
                          else repr(o)) for u, o in policies.items()], indent="   ")
    lines.append(f" run: {_section(g.run, tuple(section_specs(type(g.run))))}")
    for name, e in getattr(g, "evals", {}).items():
        specs = section_specs(type(e))   # (a set's settings as written: the rest are defaults)
        lines.append(f" eval {name}: {_section(e, tuple(k for k, ps in specs.items() if getattr(e, k) != ps.default))}")
    return "\n".join(lines)
