"""The pipeline drawing plus where things are on it, for pages that write on the figure
(the run dashboard puts live edge rates and replica states on it).

    figure(graph) -> {"svg", "width", "height", "nodes": [...], "edges": [...]}

The SVG is exactly `dora viz`'s pure-Python drawing; each node carries its box and each edge
(data and weights) an `anchor`: a free point below its line.
"""

from __future__ import annotations

from typing import Any

from dora.graph.model import Graph
from dora.graph.viz.layout import layered_layout
from dora.graph.viz.svg import data_edge_paths, svg_python
from dora.graph.viz.view import build_view


def weights_label(src: str, dst: str) -> str:
    """The identity of a weights edge (data edges use Edge.label)."""
    return f"{src} => {dst} (weights)"


def figure(g: Graph) -> dict[str, Any]:
    view = build_view(g)
    lay = layered_layout(view)
    nodes = [{"name": n, "op": v.op, "pool": v.pool, "replicas": v.replicas,
              "box": [round(lay.boxes[n].x, 1), round(lay.boxes[n].y, 1), round(lay.boxes[n].w, 1), round(lay.boxes[n].h, 1)]}
             for n, v in view.nodes.items()]
    edges = [{"id": e.label, "kind": "data", "src": e.src, "dst": e.dst, "port": e.dst_port,
              "anchor": [round(below[0], 1), round(below[1], 1)]}
             for e, (_, _, _, below) in zip(view.edges, data_edge_paths(view, lay))]
    for i, (s, t) in enumerate(view.weights):
        x = (lay.boxes[s].cx + lay.boxes[t].cx) / 2
        edges.append({"id": weights_label(s, t), "kind": "weights", "src": s, "dst": t, "port": "weights",
                      "anchor": [round(x, 1), round(lay.weights_y[i] + 13, 1)]})
    return {"svg": svg_python(g, view, lay), "width": round(lay.width), "height": round(lay.height),
            "nodes": nodes, "edges": edges}
