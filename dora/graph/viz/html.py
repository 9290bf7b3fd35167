"""One self-contained HTML page for a pipeline: inline SVG, CSS and JS, no CDN, works offline.

Hovering a node highlights its edges; clicking a node (or an edge) shows its params and
columns in the side panel.
"""

from __future__ import annotations

import json
from html import escape

from dora.graph.model import Graph
from dora.graph.viz.layout import layered_layout
from dora.graph.viz.svg import svg_python
from dora.graph.viz.view import View, build_view

CSS = """
body{margin:0;font-family:"Helvetica Neue",Helvetica,Arial,sans-serif;color:#1d1d1d;background:#fafaf8}
header{padding:14px 22px 6px}
h1{font-size:19px;margin:0 0 3px}
.sub{color:#666;font-size:13px}
main{display:flex;flex-direction:column;gap:14px;padding:8px 22px 22px}
#figure{background:white;border:1px solid #e2e2dc;border-radius:8px;padding:6px}
#figure svg{display:block;max-width:100%;height:auto;margin:0 auto}
#panel{max-width:760px;background:white;border:1px solid #e2e2dc;border-radius:8px;padding:12px 14px;font-size:13px}
#panel h2{font-size:15px;margin:0 0 6px}
#panel table{border-collapse:collapse;width:100%;margin-top:6px}
#panel td{padding:2px 4px;border-bottom:1px solid #f0f0ec;vertical-align:top;font-family:Menlo,Consolas,monospace;font-size:12px}
#panel td.k{color:#444;white-space:nowrap}
#panel tr.default td{color:#999}
.cols{font-family:Menlo,Consolas,monospace;font-size:12px;color:#333;line-height:1.5}
.pools span{display:inline-block;margin-right:12px}
.swatch{display:inline-block;width:11px;height:11px;border-radius:3px;vertical-align:-1px;margin-right:4px;border:1px solid}
svg .node:hover .card{stroke-width:2.6}
svg.focus .edge,svg.focus .weights{opacity:.18}
svg.focus .edge.hot,svg.focus .weights.hot{opacity:1}
svg .node.sel .card{stroke-width:3}
"""

JS = """
(function(){
const D = JSON.parse(document.getElementById('dora-data').textContent);
const svg = document.querySelector('#figure svg');
const panel = document.getElementById('panel');
const esc = s => String(s).replace(/[&<>"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));
const fmt = v => esc(JSON.stringify(v));
function showNode(name){
  const n = D.nodes[name];
  let h = '<h2>' + esc(name) + '</h2><div class="sub">op <b>' + esc(n.op) + '</b>' +
    (n.pool ? ' &middot; pool <b>' + esc(n.pool) + '</b>' : '') + (n.policy ? ' &middot; policy <b>' + esc(n.policy) + '</b>' : '') +
    ' &middot; ' + esc(n.scale) + '</div>';
  h += '<table>';
  for (const [k, v] of Object.entries(n.params)) h += '<tr><td class="k">' + esc(k) + '</td><td>' + fmt(v) + '</td></tr>';
  for (const [k, v] of Object.entries(n.defaults)) h += '<tr class="default"><td class="k">' + esc(k) + '</td><td>' + fmt(v) + ' (default)</td></tr>';
  h += '</table>';
  if (n.adds.length) h += '<p>adds columns:<br><span class="cols">' + n.adds.map(esc).join(', ') + '</span></p>';
  const ins = D.edges.filter(e => e.dst === name);
  for (const e of ins) h += '<p>input <b>' + esc(e.dst_port) + '</b> from ' + esc(e.src) + (e.group_by ? ' (group by ' + esc(e.group_by) + ')' : '') + ':<br><span class="cols">' + e.columns.map(esc).join(', ') + '</span></p>';
  panel.innerHTML = h;
  svg.querySelectorAll('.node').forEach(g => g.classList.toggle('sel', g.dataset.node === name));
}
function showEdge(g){
  const e = D.edges.find(x => x.src === g.dataset.src && x.dst === g.dataset.dst && x.dst_port === g.dataset.port);
  if (!e) return;
  panel.innerHTML = '<h2>' + esc(e.label) + '</h2>' + (e.group_by ? '<div class="sub">delivers whole groups by ' + esc(e.group_by) + '</div>' : '') +
    '<p>columns on this edge:<br><span class="cols">' + e.columns.map(esc).join(', ') + '</span></p>';
}
function focus(name){
  svg.classList.toggle('focus', !!name);
  svg.querySelectorAll('.edge,.weights').forEach(g => g.classList.toggle('hot', !!name && (g.dataset.src === name || g.dataset.dst === name)));
}
svg.querySelectorAll('.node').forEach(g => {
  g.addEventListener('mouseenter', () => focus(g.dataset.node));
  g.addEventListener('mouseleave', () => focus(null));
  g.addEventListener('click', () => showNode(g.dataset.node));
});
svg.querySelectorAll('.edge').forEach(g => { g.style.cursor = 'pointer'; g.addEventListener('click', () => showEdge(g)); });
// page.html#node=NAME opens with that node selected (links into a figure)
const m = location.hash.match(/^#node=(.+)$/);
if (m && D.nodes[decodeURIComponent(m[1])]) showNode(decodeURIComponent(m[1]));
})();
"""


def _data(view: View) -> dict:
    return {
        "name": view.name,
        "nodes": {n: {"op": v.op, "pool": v.pool, "policy": v.policy, "replicas": v.replicas, "scale": v.scale, "params": v.params,
                      "defaults": v.defaults, "adds": list(v.adds)} for n, v in view.nodes.items()},
        "edges": [{"src": e.src, "dst": e.dst, "dst_port": e.dst_port, "columns": list(e.columns),
                   "group_by": e.group_by, "label": e.label} for e in view.edges],
        "weights": [list(w) for w in view.weights],
    }


def to_html(g: Graph) -> str:
    view = build_view(g)
    svg = svg_python(g, view, layered_layout(view))
    data = json.dumps(_data(view), default=str).replace("</", "<\\/")
    desc = g.description
    pools = "".join(
        f'<span><i class="swatch" style="background:{p.fill};border-color:{p.stroke}"></i>{escape(p.title)}</span>'
        for p in view.pools.values())
    a = g.async_
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(view.name)} - dora pipeline</title>
<style>{CSS}</style></head>
<body>
<header><h1>{escape(view.name)}</h1>
<div class="sub">{escape(str(desc)) + " &middot; " if desc else ""}async <b>{escape(str(a.mode))}</b> (max staleness {escape(str(a.max_staleness))}, rollout batch {escape(str(a.rollout_batch))}, train batch {escape(str(a.train_batch))})</div>
<div class="sub pools">{pools}</div></header>
<main><div id="figure">{svg}</div>
<aside id="panel"><h2>Details</h2><div class="sub">Click a node for its params and columns, or an edge for the columns on it. Hover a node to highlight its edges.</div></aside></main>
<script type="application/json" id="dora-data">{data}</script>
<script>{JS}</script>
</body></html>
"""
