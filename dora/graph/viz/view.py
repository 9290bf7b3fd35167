"""What every drawing shows, computed once: node labels, pool colours, edge column labels.

The drawings (DOT, Mermaid, SVG, HTML) differ only in syntax; they all read this view, so
they agree on what a pipeline looks like.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dora.graph.model import Graph
from dora.graph.policy_roles import find_policies, is_multi_policy, node_policies
from dora.graph.printing import scale_text
from dora.graph.schema import propagate, resolve_all

# Muted, print-friendly fill/stroke pairs, one per pool (in declaration order).
PALETTE = [
    ("#dbe8f6", "#3f6fa8"),   # blue
    ("#fbe3cc", "#c8741f"),   # orange
    ("#dcefd9", "#4b8b45"),   # green
    ("#e8def3", "#7a56a6"),   # purple
    ("#f8dada", "#b34747"),   # red
    ("#d9f0ef", "#2f8a85"),   # teal
]
NO_POOL = ("#f3f3f1", "#6b6b6b")
WEIGHTS_COLOR = "#a23b3b"
EDGE_COLOR = "#4d4d4d"


@dataclasses.dataclass
class NodeView:
    name: str
    op: str
    pool: str | None
    replicas: int
    fill: str
    stroke: str
    params: dict[str, Any]          # as written
    defaults: dict[str, Any]        # the op's defaults not overridden
    adds: tuple[str, ...]
    scale: str = "x1"               # dora.graph.printing.scale_text: replicas, ranks, devices each
    policy: str | None = None       # a graph of several policies: the update node of this node's

    @property
    def subtitle(self) -> str:
        times = "\u00d7"
        text = self.op if self.scale == "x1" else f"{self.op} {times}{self.scale[1:]}"
        return f"{text} \u00b7 {self.policy}" if self.policy and self.policy != self.name else text


@dataclasses.dataclass
class EdgeView:
    src: str
    dst: str
    dst_port: str
    new_columns: tuple[str, ...]    # columns the source node adds (what is new on this edge)
    columns: tuple[str, ...]        # every column that flows on the edge
    group_by: str | None
    label: str                      # the edge's identity, e.g. "reward/out -> advantage.scored"


@dataclasses.dataclass
class PoolView:
    name: str
    device: str
    count: int
    fill: str
    stroke: str
    nodes: list[str]
    contiguous: bool = True    # no other node sits on a data path between two of its nodes

    @property
    def title(self) -> str:
        return f"pool {self.name} \u00b7 {self.device} \u00d7 {self.count}"


@dataclasses.dataclass
class View:
    name: str
    nodes: dict[str, NodeView]
    edges: list[EdgeView]
    weights: list[tuple[str, str]]
    pools: dict[str, PoolView]
    async_mode: str


def build_view(g: Graph) -> View:
    specs, _ = resolve_all(g)
    sch = propagate(g, specs)
    colours = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(g.pools)}
    policy_of = node_policies(g, find_policies(g, specs)) if is_multi_policy(specs) else {}
    nodes: dict[str, NodeView] = {}
    for n, node in g.nodes.items():
        fill, stroke = colours.get(node.pool, NO_POOL) if node.pool else NO_POOL
        spec = specs.get(n)
        params = node.params if isinstance(node.params, dict) else {}
        defaults = {k: p.default for k, p in spec.params.items() if k not in params} if spec else {}
        replicas = node.replicas if isinstance(node.replicas, int) else 1
        devices = node.devices if isinstance(node.devices, int) else 1
        nodes[n] = NodeView(n, str(node.op), node.pool, replicas, fill, stroke, dict(params), defaults, sch.added(n),
                            scale_text(dataclasses.replace(node, replicas=replicas, devices=devices)), policy_of.get(n))
    edges = []
    for e in g.edges:
        if e.src not in g.nodes:
            continue
        cols = sch.on_edge(e)
        edges.append(EdgeView(e.src, e.dst, e.dst_port, sch.added(e.src), tuple(sorted(cols)) if cols else (),
                              e.group_by if isinstance(e.group_by, str) else None, e.label))
    pools = {}
    for p, pool in g.pools.items():
        members = [n for n, node in g.nodes.items() if node.pool == p]
        pools[p] = PoolView(p, str(pool.device), pool.count, *colours[p], members, _contiguous(edges, members))
    weights = [(w.src, w.dst) for w in g.weights if w.src in g.nodes and w.dst in g.nodes]
    return View(str(g.name), nodes, edges, weights, pools, str(g.async_.mode))


def wrap_columns(cols: tuple[str, ...] | list[str], per_line: int = 2) -> list[str]:
    """Column names as short lines for an edge label."""
    cols = list(cols)
    return [", ".join(cols[i:i + per_line]) for i in range(0, len(cols), per_line)] or []


def edge_caption(e: EdgeView) -> list[str]:
    """The lines printed on a data edge: the columns new on it, then the grouping if any."""
    lines = [("+ " if i == 0 else "") + line for i, line in enumerate(wrap_columns(e.new_columns))]
    if e.group_by:
        lines.append(f"[group by {e.group_by}]")
    return lines


def _contiguous(edges: list[EdgeView], members: list[str]) -> bool:
    """True when no non-member is both reachable from a member and reaches a member: only
    then can one frame enclose the pool's nodes without also enclosing others."""
    succ: dict[str, set[str]] = {}
    pred: dict[str, set[str]] = {}
    for e in edges:
        succ.setdefault(e.src, set()).add(e.dst)
        pred.setdefault(e.dst, set()).add(e.src)

    def reach(start: list[str], nxt: dict[str, set[str]]) -> set[str]:
        seen: set[str] = set()
        todo = list(start)
        while todo:
            for m in nxt.get(todo.pop(), ()):
                if m not in seen:
                    seen.add(m)
                    todo.append(m)
        return seen

    between = reach(members, succ) & reach(members, pred)
    return not (between - set(members))
