"""Mermaid flowchart text for a pipeline (renders in GitHub markdown and mermaid.live)."""

from __future__ import annotations

import re

from dora.graph.model import Graph
from dora.graph.viz.view import WEIGHTS_COLOR, View, build_view, edge_caption


def _id(name: str) -> str:
    """Mermaid ids must be plain words; keep them readable and unique per name."""
    return "n_" + re.sub(r"[^A-Za-z0-9_]", "_", name)


def _text(s: str) -> str:
    return s.replace('"', "#quot;")


def to_mermaid(g: Graph, view: View | None = None) -> str:
    view = view or build_view(g)
    lines = ["flowchart LR"]
    pooled = set()
    for p, pv in view.pools.items():
        if not pv.nodes or not pv.contiguous:
            continue    # the fill colour still says the pool
        lines.append(f'  subgraph pool_{_id(p)}["{_text(pv.title)}"]')
        for n in pv.nodes:
            lines.append(f'    {_id(n)}["<b>{_text(n)}</b><br/><i>{_text(view.nodes[n].subtitle)}</i>"]')
            pooled.add(n)
        lines.append("  end")
        lines.append(f"  style pool_{_id(p)} fill:{pv.fill},stroke:{pv.stroke},stroke-dasharray:3 3")
    for n, nv in view.nodes.items():
        if n not in pooled:
            lines.append(f'  {_id(n)}["<b>{_text(n)}</b><br/><i>{_text(nv.subtitle)}</i>"]')
    for e in view.edges:
        label = "<br/>".join(edge_caption(e))
        lines.append(f'  {_id(e.src)} -->|"{_text(label)}"| {_id(e.dst)}' if label else f"  {_id(e.src)} --> {_id(e.dst)}")
    k = len(view.edges)
    for s, t in view.weights:
        lines.append(f'  {_id(s)} -.->|"weights"| {_id(t)}')
        lines.append(f"  linkStyle {k} stroke:{WEIGHTS_COLOR},stroke-width:1.6px")
        k += 1
    for n, nv in view.nodes.items():
        lines.append(f"  style {_id(n)} fill:{nv.fill},stroke:{nv.stroke},stroke-width:1.5px")
    return "\n".join(lines) + "\n"
