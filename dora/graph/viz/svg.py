"""SVG drawing of a pipeline: Graphviz `dot` when installed, else the pure-Python layout.

The pure-Python drawing is the one the HTML page embeds: pools as tinted frames, nodes as
cards (stacked when replicated) in their pool's colour, data edges labelled with the columns
each node adds, the weights edge dashed underneath.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from html import escape

from dora.graph.model import Graph
from dora.graph.viz.layout import LINE_H, Layout, layered_layout
from dora.graph.viz.view import EDGE_COLOR, WEIGHTS_COLOR, View, build_view, edge_caption

FONT = "Helvetica Neue, Helvetica, Arial, sans-serif"


def _a(x: object) -> str:
    return escape(str(x), quote=True)


def _tooltip(view: View, name: str) -> str:
    n = view.nodes[name]
    lines = [f"{n.name}: {n.op}" + (f" on pool {n.pool}" if n.pool else "") + (f", {n.scale}" if n.scale != "x1" else "")]
    lines += [f"{k} = {json.dumps(v)}" for k, v in n.params.items()]
    if n.defaults:
        lines.append("defaults: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in n.defaults.items()))
    if n.adds:
        lines.append("adds: " + ", ".join(n.adds))
    return "\n".join(lines)


def _under_path(x1: float, y1: float, x2: float, y2: float, low: float, r: float = 10.0) -> str:
    """An orthogonal path with rounded corners: down from (x1,y1), across at `low`, up to (x2,y2)."""
    s = -1 if x2 < x1 else 1
    return (f"M{x1:.1f},{y1:.1f} L{x1:.1f},{low - r:.1f} Q{x1:.1f},{low:.1f} {x1 + s * r:.1f},{low:.1f} "
            f"L{x2 - s * r:.1f},{low:.1f} Q{x2:.1f},{low:.1f} {x2:.1f},{low - r:.1f} L{x2:.1f},{y2:.1f}")


def data_edge_paths(view: View, lay: Layout) -> list[tuple[str, float, float, tuple[float, float]]]:
    """Per data edge (in view order): (SVG path, x and y of its caption's first line, the point
    just below the line's middle where a live figure may write on it)."""
    out = []
    low_i = len(view.weights)
    for e in view.edges:
        a, b = lay.boxes[e.src], lay.boxes[e.dst]
        if lay.ranks[e.dst] > lay.ranks[e.src]:
            x1, y1, x2, y2 = a.right + (6 if view.nodes[e.src].replicas > 1 else 0), a.cy, b.x - 1, b.cy
            dx = (x2 - x1) / 2
            d = f"M{x1:.1f},{y1:.1f} C{x1 + dx:.1f},{y1:.1f} {x2 - dx:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"
            # label at the curve's point for t (nearer the target when the edge bends, so the
            # labels of a fan-out separate), lifted above the line
            t = 0.5 if abs(y2 - y1) < 1 else 0.68
            lx = (1 - t) ** 3 * x1 + 3 * (1 - t) ** 2 * t * (x1 + dx) + 3 * (1 - t) * t * t * (x2 - dx) + t ** 3 * x2
            ly = ((1 - t) ** 3 + 3 * (1 - t) ** 2 * t) * y1 + (3 * (1 - t) * t * t + t ** 3) * y2 - 6
            below = ((x1 + x2) / 2, (y1 + y2) / 2 + 14)
        else:   # a data edge going backwards: only in an invalid (cyclic) graph; route it underneath
            low = lay.weights_y[low_i]
            low_i += 1
            d = _under_path(a.cx + 8, a.bottom, b.cx + 8, b.bottom + 2, low)
            lx, ly = (a.cx + b.cx) / 2, low - 6
            below = (lx, low + 13)
        out.append((d, lx, ly, below))
    return out


def weights_edge_path(view: View, lay: Layout, i: int) -> str:
    """The i-th weights edge: down from the trainer, across underneath, up into the generator."""
    s, t = view.weights[i]
    a, b = lay.boxes[s], lay.boxes[t]
    return _under_path(a.cx, a.bottom + (6 if view.nodes[s].replicas > 1 else 0),
                       b.cx, b.bottom + (6 if view.nodes[t].replicas > 1 else 1), lay.weights_y[i])


def svg_python(g: Graph, view: View | None = None, layout: Layout | None = None) -> str:
    """The pipeline as a standalone SVG, laid out in pure Python."""
    view = view or build_view(g)
    lay = layout or layered_layout(view)
    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{lay.width:.0f}" height="{lay.height:.0f}" '
        f'viewBox="0 0 {lay.width:.0f} {lay.height:.0f}" font-family="{FONT}" class="dora-graph">',
        f"<title>{_a(view.name)}</title>",
        "<defs>",
        f'<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        f'<path d="M0,0 L10,5 L0,10 z" fill="{EDGE_COLOR}"/></marker>',
        f'<marker id="arrow-w" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        f'<path d="M0,0 L10,5 L0,10 z" fill="{WEIGHTS_COLOR}"/></marker>',
        "</defs>",
        '<rect x="0" y="0" width="100%" height="100%" fill="white"/>',
    ]
    # pools (behind everything)
    for p, frames in lay.pools.items():
        pv = view.pools[p]
        for box in frames:
            out.append(
                f'<g class="pool" data-pool="{_a(p)}"><rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}" height="{box.h:.1f}" rx="10" '
                f'fill="{pv.fill}" fill-opacity="0.35" stroke="{pv.stroke}" stroke-opacity="0.7" stroke-dasharray="2 3"/>'
                f'<text x="{box.x + 9:.1f}" y="{box.y + 14:.1f}" font-size="10.5" font-weight="600" fill="{pv.stroke}">{_a(pv.title)}</text></g>'
            )
    # data edges
    for e, (d, lx, ly, _) in zip(view.edges, data_edge_paths(view, lay)):
        cap = edge_caption(e)
        tip = f"{e.label}\ncolumns: {', '.join(e.columns)}"
        ly -= (len(cap) - 1) * LINE_H
        out.append(f'<g class="edge" data-src="{_a(e.src)}" data-dst="{_a(e.dst)}" data-port="{_a(e.dst_port)}"><title>{_a(tip)}</title>'
                   f'<path d="{d}" fill="none" stroke="{EDGE_COLOR}" stroke-width="1.4" marker-end="url(#arrow)"/>')
        for i, line in enumerate(cap):
            italic = ' font-style="italic"' if line.startswith("[") else ""
            out.append(f'<text x="{lx:.1f}" y="{ly + i * LINE_H:.1f}" font-size="10" text-anchor="middle" fill="#333"{italic} '
                       f'stroke="white" stroke-width="3" paint-order="stroke">{_a(line)}</text>')
        out.append("</g>")
    # weights edges: dashed, underneath
    for i, (s, t) in enumerate(view.weights):
        a, b = lay.boxes[s], lay.boxes[t]
        low = lay.weights_y[i]
        d = weights_edge_path(view, lay, i)
        out.append(f'<g class="weights" data-src="{_a(s)}" data-dst="{_a(t)}"><title>{_a(f"weights {s} -> {t}: new policy versions")}</title>'
                   f'<path d="{d}" fill="none" stroke="{WEIGHTS_COLOR}" stroke-width="1.6" stroke-dasharray="6 4" marker-end="url(#arrow-w)"/>'
                   f'<text x="{(a.cx + b.cx) / 2:.1f}" y="{low - 5:.1f}" font-size="10.5" text-anchor="middle" font-style="italic" '
                   f'fill="{WEIGHTS_COLOR}" stroke="white" stroke-width="3" paint-order="stroke">weights (policy version v\u2192v+1)</text></g>')
    # nodes on top
    for n, box in lay.boxes.items():
        nv = view.nodes[n]
        out.append(f'<g class="node" id="node-{_a(n)}" data-node="{_a(n)}" style="cursor:pointer"><title>{_a(_tooltip(view, n))}</title>')
        for k in range(min(nv.replicas, 3) - 1, 0, -1):     # replicas drawn as a stack of cards
            off = 3 * k
            out.append(f'<rect x="{box.x + off:.1f}" y="{box.y + off:.1f}" width="{box.w:.1f}" height="{box.h:.1f}" rx="8" '
                       f'fill="{nv.fill}" stroke="{nv.stroke}" stroke-width="1"/>')
        out.append(f'<rect class="card" x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}" height="{box.h:.1f}" rx="8" '
                   f'fill="{nv.fill}" stroke="{nv.stroke}" stroke-width="1.5"/>')
        out.append(f'<text x="{box.cx:.1f}" y="{box.y + 21:.1f}" font-size="13" font-weight="700" text-anchor="middle" fill="#1d1d1d">{_a(n)}</text>')
        out.append(f'<text x="{box.cx:.1f}" y="{box.y + 37:.1f}" font-size="11" text-anchor="middle" fill="#555" font-style="italic">{_a(nv.subtitle)}</text>')
        out.append("</g>")
    # legend
    y = lay.legend_y
    out.append(f'<g class="legend" font-size="10" fill="#444">'
               f'<path d="M{24},{y:.1f} L{54},{y:.1f}" stroke="{EDGE_COLOR}" stroke-width="1.4" marker-end="url(#arrow)"/>'
               f'<text x="60" y="{y + 3.5:.1f}">data (+ columns added)</text>'
               f'<path d="M{190},{y:.1f} L{220},{y:.1f}" stroke="{WEIGHTS_COLOR}" stroke-width="1.6" stroke-dasharray="6 4" marker-end="url(#arrow-w)"/>'
               f'<text x="226" y="{y + 3.5:.1f}">weights</text></g>')
    out.append("</svg>")
    return "\n".join(out)


def svg_graphviz(dot_text: str, timeout_s: float = 20.0) -> str | None:
    """SVG from Graphviz `dot`, or None when dot is not installed or fails."""
    exe = shutil.which("dot")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "-Tsvg"], input=dot_text.encode(), capture_output=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.decode() if r.returncode == 0 else None
