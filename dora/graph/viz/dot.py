"""Graphviz DOT text for a pipeline (pools as clusters, weights edges dashed)."""

from __future__ import annotations

import json

from dora.graph.model import Graph
from dora.graph.viz.view import EDGE_COLOR, WEIGHTS_COLOR, View, build_view, edge_caption

FONT = "Helvetica"


def _q(s: object) -> str:
    """A DOT double-quoted string; newlines become DOT's centred line breaks."""
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _node_line(view: View, n: str, show_pool: bool = False) -> str:
    nv = view.nodes[n]
    sub = f"{nv.subtitle} \u00b7 pool {nv.pool}" if show_pool and nv.pool else nv.subtitle
    label = f"<<b>{_html(n)}</b><br/><font point-size=\"9\"><i>{_html(sub)}</i></font>>"
    tip = "\n".join([f"{nv.name}: {nv.op}"] + [f"{k} = {json.dumps(v)}" for k, v in nv.params.items()])
    periph = ' peripheries=2' if nv.replicas > 1 else ""
    return (f'  {_q(n)} [label={label} fillcolor="{nv.fill}" color="{nv.stroke}"{periph} '
            f"tooltip={_q(tip)}];")


def _html(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_dot(g: Graph, view: View | None = None) -> str:
    view = view or build_view(g)
    lines = [
        f"digraph {_q(view.name)} {{",
        f'  graph [rankdir=LR fontname="{FONT}" fontsize=10 nodesep=0.45 ranksep=0.7 bgcolor="white" label={_q(view.name + " (async: " + view.async_mode + ")")} labelloc=b];',
        f'  node [shape=box style="rounded,filled" fontname="{FONT}" fontsize=11 penwidth=1.4 margin="0.18,0.08"];',
        f'  edge [fontname="{FONT}" fontsize=9 color="{EDGE_COLOR}" fontcolor="#333333" arrowsize=0.7];',
    ]
    pooled = set()
    for i, (p, pv) in enumerate(view.pools.items()):
        if not pv.nodes or not pv.contiguous:
            continue    # a cluster would pull other nodes' edges through it; the colour says the pool
        lines.append(f"  subgraph {_q('cluster_' + p)} {{")
        lines.append(f'    label={_q(pv.title)} style="rounded,dashed,filled" fillcolor="{pv.fill}66" color="{pv.stroke}" fontcolor="{pv.stroke}" fontsize=10;')
        for n in pv.nodes:
            lines.append("  " + _node_line(view, n))
            pooled.add(n)
        lines.append("  }")
    for n in view.nodes:
        if n not in pooled:     # no frame says its pool: the label does
            lines.append(_node_line(view, n, show_pool=True))
    for e in view.edges:
        label = "\n".join(edge_caption(e))
        tip = f"{e.label}: {', '.join(e.columns)}"
        lines.append(f"  {_q(e.src)} -> {_q(e.dst)} [label={_q(label)} tooltip={_q(tip)}];")
    for s, t in view.weights:
        lines.append(f'  {_q(s)} -> {_q(t)} [style=dashed color="{WEIGHTS_COLOR}" fontcolor="{WEIGHTS_COLOR}" label="weights" constraint=false penwidth=1.5];')
    lines.append("}")
    return "\n".join(lines) + "\n"
