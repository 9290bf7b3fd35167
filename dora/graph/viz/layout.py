"""A layered left-to-right layout in pure Python (so SVG/HTML need no Graphviz).

Sugiyama-style, small: rank = longest data path from a source; order within a rank by a
few barycenter sweeps (fewer crossings); columns as wide as their widest node, gaps as wide
as the edge labels that cross them. Weights edges are routed below everything.
"""

from __future__ import annotations

import dataclasses

from dora.graph.viz.view import View, edge_caption

NAME_PX = 7.6       # px per character, 13px bold sans
SMALL_PX = 6.3      # px per character, 11px sans
LABEL_PX = 5.9      # px per character, 10px sans
NODE_H = 50
V_GAP = 46
MARGIN = 24
POOL_PAD = 12
POOL_TITLE = 20
LINE_H = 12


@dataclasses.dataclass
class Box:
    x: float
    y: float
    w: float
    h: float

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def cy(self) -> float:
        return self.y + self.h / 2

    @property
    def right(self) -> float:
        return self.x + self.w

    @property
    def bottom(self) -> float:
        return self.y + self.h


@dataclasses.dataclass
class Layout:
    width: float
    height: float
    boxes: dict[str, Box]
    ranks: dict[str, int]
    pools: dict[str, list[Box]]   # frames per pool (several when its nodes are not adjacent)
    weights_y: list[float]        # the y of each weights edge's lowest point
    legend_y: float


def node_width(view: View, name: str) -> float:
    n = view.nodes[name]
    return max(96.0, len(n.name) * NAME_PX + 34, len(n.subtitle) * SMALL_PX + 34)


def _ranks(view: View) -> dict[str, int]:
    names = list(view.nodes)
    preds: dict[str, list[str]] = {n: [] for n in names}
    for e in view.edges:
        preds[e.dst].append(e.src)
    indeg = {n: len(set(preds[n])) for n in names}
    ready = [n for n in names if indeg[n] == 0]
    order: list[str] = []
    succ: dict[str, list[str]] = {n: [] for n in names}
    for e in view.edges:
        if e.dst not in succ[e.src]:
            succ[e.src].append(e.dst)
    while ready:
        n = ready.pop(0)
        order.append(n)
        for d in succ[n]:
            indeg[d] -= 1
            if indeg[d] == 0:
                ready.append(d)
    order += [n for n in names if n not in order]    # nodes on cycles: declaration order
    rank: dict[str, int] = {}
    for n in order:
        placed = [rank[p] for p in preds[n] if p in rank]
        rank[n] = max(placed) + 1 if placed else 0
    return rank


def _order_layers(view: View, rank: dict[str, int]) -> list[list[str]]:
    layers: list[list[str]] = [[] for _ in range(max(rank.values(), default=-1) + 1)]
    for n in view.nodes:                       # declaration order first
        layers[rank[n]].append(n)
    # keep a pool's nodes next to each other inside a layer, so pool frames do not overlap
    pool_index = {p: i for i, p in enumerate(view.pools)}
    for layer in layers:
        layer.sort(key=lambda n: pool_index.get(view.nodes[n].pool, len(pool_index)))
    nbrs: dict[str, list[str]] = {n: [] for n in view.nodes}
    for e in view.edges:
        nbrs[e.dst].append(e.src)
        nbrs[e.src].append(e.dst)
    for sweep in range(4):
        rng = range(1, len(layers)) if sweep % 2 == 0 else range(len(layers) - 2, -1, -1)
        for i in rng:
            ref = layers[i - 1] if sweep % 2 == 0 else layers[i + 1]
            pos = {n: k for k, n in enumerate(ref)}
            here = {n: k for k, n in enumerate(layers[i])}

            def bary(n: str) -> float:
                ps = [pos[m] for m in nbrs[n] if m in pos]
                return sum(ps) / len(ps) if ps else here[n]

            layers[i].sort(key=lambda n: (bary(n), pool_index.get(view.nodes[n].pool, len(pool_index))))
    return layers


def layered_layout(view: View) -> Layout:
    rank = _ranks(view)
    layers = _order_layers(view, rank)
    widths = {n: node_width(view, n) for n in view.nodes}
    # horizontal gap after each layer: room for the widest edge label leaving it
    gaps = [70.0] * len(layers)
    for e in view.edges:
        r = rank[e.src]
        if rank[e.dst] > r:
            text = max((len(s) for s in edge_caption(e)), default=0)
            span = rank[e.dst] - r
            gaps[r] = max(gaps[r], (text * LABEL_PX + 34 + 2 * (POOL_PAD + 6)) / span)   # clear of pool frames
    in_pool = any(v.pool for v in view.nodes.values())
    top = MARGIN + (POOL_TITLE + POOL_PAD if in_pool else 0)
    heights = [len(layer) * NODE_H + (len(layer) - 1) * (V_GAP + (POOL_TITLE if in_pool else 0)) for layer in layers]
    tallest = max(heights, default=NODE_H)
    boxes: dict[str, Box] = {}
    x = MARGIN + (POOL_PAD if in_pool else 0)
    for i, layer in enumerate(layers):
        col_w = max((widths[n] for n in layer), default=0)
        y = top + (tallest - heights[i]) / 2
        for n in layer:
            boxes[n] = Box(x + (col_w - widths[n]) / 2, y, widths[n], NODE_H)
            y += NODE_H + V_GAP + (POOL_TITLE if in_pool else 0)
        x += col_w + gaps[i]
    pools: dict[str, list[Box]] = {}
    for p, pv in view.pools.items():
        # one frame around the pool when that encloses only its nodes, else one frame per node
        groups = [pv.nodes] if pv.contiguous else [[n] for n in pv.nodes]
        for members in ([boxes[n] for n in grp if n in boxes] for grp in groups):
            if not members:
                continue
            x0 = min(b.x for b in members) - POOL_PAD
            y0 = min(b.y for b in members) - POOL_PAD - POOL_TITLE
            x1 = max(b.right for b in members) + POOL_PAD + 6    # room for the replica stack
            y1 = max(b.bottom for b in members) + POOL_PAD + 6
            pools.setdefault(p, []).append(Box(x0, y0, x1 - x0, y1 - y0))
    frames = [b for fs in pools.values() for b in fs]
    bottom = max([b.bottom + 6 for b in boxes.values()] + [b.bottom for b in frames] + [top])
    back_edges = [e for e in view.edges if rank[e.dst] <= rank[e.src]]
    weights_y = [bottom + 34 + 26 * i for i in range(len(view.weights) + len(back_edges))]
    low = weights_y[-1] + 18 if weights_y else bottom
    right = max([b.right for b in boxes.values()] + [b.right for b in frames] + [MARGIN])
    legend_y = low + 26
    return Layout(max(right + MARGIN, 330), legend_y + 16, boxes, rank, pools, weights_y, legend_y)
