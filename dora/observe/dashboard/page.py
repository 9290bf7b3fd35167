"""The dashboard page: one self-contained HTML file (inline CSS and JS, no CDN, no network but
its own /api/state), drawn from the state JSON (dora/observe/dashboard/state.py) once a second.

What it draws, and the hooks a test reads:
  #figure      the `dora viz` SVG; on it `text.rate[data-edge=ID]` per edge (batches/s, rows/s,
               MB/s, queued/window; weights: versions published, loads) and `circle.rstate`
               per replica (colour = state)
  #replicas    a table row per replica: state, version, running, queued, KV use, tokens/s
  #timeline    a row per generate replica, `rect.seg[data-version]` coloured by version,
               `path.load` per weight load, `path.mig` per migration (out: up, in: down)
  #curves      reward, tokens/s, staleness (max, mean), step time, rollout-only share, versions live,
               requests migrated (and into fast lanes), multi-turn, prompt tokens (prefilled, prefix hits),
               KV blocks (used, free); a line per policy
  #evals       a chart per held-out set (mean reward and pass@1 against the version evaluated)
  #samples     the latest samples: what the model wrote and what it was scored (training and eval)
  body[data-updates]  how many snapshots were drawn (the page polls every POLL_MS)
"""

from __future__ import annotations

POLL_MS = 1000

CSS = """
*{box-sizing:border-box}
body{margin:0;font-family:"Helvetica Neue",Helvetica,Arial,sans-serif;color:#1d1d1d;background:#fafaf8;font-size:13px}
header{padding:12px 20px 4px;display:flex;flex-wrap:wrap;align-items:baseline;gap:6px 18px}
h1{font-size:19px;margin:0}
h2{font-size:14px;margin:0 0 6px;color:#333}
.sub{color:#666}
.badge{display:inline-block;padding:1px 8px;border-radius:9px;font-size:12px;font-weight:600;color:white;background:#888}
.badge.running{background:#3a8a3a}.badge.starting{background:#c8741f}.badge.finished{background:#3f6fa8}
.badge.failed{background:#b34747}.badge.disconnected{background:#888}
main{display:grid;grid-template-columns:minmax(0,1fr);gap:12px;padding:6px 20px 20px}
section{background:white;border:1px solid #e2e2dc;border-radius:8px;padding:10px 12px;min-width:0}
#figure svg{display:block;max-width:100%;height:auto}
table{border-collapse:collapse;width:100%}
th,td{padding:3px 8px;text-align:right;border-bottom:1px solid #f0f0ec;white-space:nowrap}
th{color:#555;font-weight:600;font-size:12px}
td.l,th.l{text-align:left}
.pill{display:inline-block;padding:0 7px;border-radius:8px;color:white;font-size:11.5px}
.chip{display:inline-block;min-width:26px;padding:0 5px;border-radius:4px;color:white;text-align:center;font-size:11.5px}
.kv{display:inline-block;width:70px;height:8px;background:#eee;border-radius:4px;vertical-align:middle;margin-right:5px;overflow:hidden}
.kv i{display:block;height:100%;background:#7a56a6}
#timeline svg,#curves svg{display:block}
#curves,#evals{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:10px}
#curves h2,#evals h2{grid-column:1/-1;margin:0}
#evals svg{display:block}
#samples td{white-space:normal;vertical-align:top}
#samples td.text{font-family:Menlo,Consolas,monospace;font-size:11.5px;text-align:left;max-width:520px;word-break:break-all}
.chart{border:1px solid #f0f0ec;border-radius:6px;padding:4px}
.legend span{display:inline-block;margin-right:10px}
.empty{color:#999;font-style:italic}
"""

BODY = """
<header><h1 id="title">dora run</h1><span id="status" class="badge">loading</span>
<span class="sub" id="meta"></span><span class="sub" id="age"></span></header>
<main>
<section><h2>Pipeline <span class="sub">(live edge rates: batches/s, rows/s, MB/s, queued/credit window)</span></h2><div id="figure"></div></section>
<section><h2>Replicas</h2><div id="replicas"></div></section>
<section><h2>Policy versions per generate replica <span class="sub">(colour = version hosted;
&#9660; weight load, &#9650;/&#9660; grey: requests migrated out/in)</span></h2><div id="tl-legend" class="legend"></div><div id="timeline"></div></section>
<section id="curves"><h2>Curves (per training step)</h2></section>
<section id="evals"><h2>Held-out evaluation <span class="sub">(per set, against the version evaluated)</span></h2></section>
<section><h2>Latest samples <span class="sub">(RUN_DIR/samples.jsonl)</span></h2><div id="samples"></div></section>
</main>
"""

JS = r"""
(function(){
'use strict';
const POLL_MS = %(poll_ms)d;
const NS = 'http://www.w3.org/2000/svg';
const PALETTE = ['#4e79a7','#f28e2b','#59a14f','#e15759','#76b7b2','#b8a200','#b07aa1','#ff9da7','#9c755f','#6b6ecf'];
const STATE_COLOURS = {running:'#3a8a3a', waiting:'#c9a227', starting:'#c8741f', failed:'#b34747',
                       respawned:'#7a56a6', finished:'#3f6fa8', stopped:'#888'};
const vcol = v => PALETTE[((v %% PALETTE.length) + PALETTE.length) %% PALETTE.length];
const $ = id => document.getElementById(id);
const esc = s => String(s).replace(/[&<>"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));
let drawnSvg = null, updates = 0, lastUpdate = null, stateTime = null, stateStatus = null;

function num(x, d) {
  if (x === null || x === undefined || !isFinite(x)) return '\u2013';
  const a = Math.abs(x);
  if (d === undefined) d = a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : 3;
  return Number(x).toLocaleString('en-US', {minimumFractionDigits: d, maximumFractionDigits: d});
}
function svgEl(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}

function drawHeader(s) {
  const r = s.run;
  $('title').textContent = r.name;
  document.title = r.name + ' \u00b7 dora dashboard';
  const st = $('status');
  st.textContent = r.status; st.className = 'badge ' + r.status;
  let meta = 'mode <b>' + esc(r.mode) + '</b> (K ' + esc(r.max_staleness) + ') \u00b7 step ' + esc(r.step) +
    (r.total_steps ? ' / ' + esc(r.total_steps) : '') + ' \u00b7 ' + num(r.elapsed_s, 0) + ' s' +
    (r.source === 'simulate' ? ' simulated' : '');
  if (r.error) meta += ' \u00b7 <span style="color:#b34747">' + esc(r.error).slice(0, 300) + '</span>';
  $('meta').innerHTML = meta;
}

function drawFigure(s) {
  const fig = $('figure');
  if (drawnSvg !== s.graph.svg) {
    fig.innerHTML = s.graph.svg || '<span class="empty">no pipeline drawing in this run folder</span>';
    drawnSvg = s.graph.svg;
    const svg = fig.querySelector('svg');
    if (svg) svg.appendChild(svgEl('g', {id: 'live'}));
  }
  const live = fig.querySelector('#live');
  if (!live) return;
  while (live.firstChild) live.removeChild(live.firstChild);
  // a live run shows rates now; a finished one its totals and the mean over its wall time
  const over = s.run.status !== 'running' && s.run.status !== 'starting', T = s.run.elapsed_s;
  const per = x => (x === null || x === undefined || !(T > 0)) ? null : x / T;
  for (const e of s.edges) {
    const lines = e.kind === 'weights'
      ? ['v' + num(e.last_version, 0) + ' latest \u00b7 ' + num(e.versions, 0) + ' published \u00b7 ' + num(e.loads, 0) + ' loads']
      : over
      ? [num(e.batches, 0) + ' batches \u00b7 ' + num(e.rows, 0) + ' rows \u00b7 ' + num(e.bytes === null ? null : e.bytes / 1e6) + ' MB',
         'mean ' + num(per(e.batches)) + ' batch/s \u00b7 ' + num(per(e.rows)) + ' rows/s']
      : [num(e.batches_per_s) + ' batch/s \u00b7 ' + num(e.rows_per_s) + ' rows/s',
         num(e.mb_per_s) + ' MB/s \u00b7 queued ' + num(e.queued, 0) + '/' + num(e.window, 0)];
    const t = svgEl('text', {'class': 'rate', 'data-edge': e.id, x: e.anchor[0], y: e.anchor[1], 'font-size': 10,
      'text-anchor': 'middle', fill: e.kind === 'weights' ? '#a23b3b' : '#1f5f99', stroke: 'white', 'stroke-width': 3,
      'paint-order': 'stroke'});
    lines.forEach((line, i) => t.appendChild(svgEl('tspan', {x: e.anchor[0], dy: i ? 12 : 0}, line)));
    live.appendChild(t);
  }
  const byNode = {};
  for (const r of s.replicas) (byNode[r.node] = byNode[r.node] || []).push(r);
  for (const n of s.nodes) {
    const [x, y, w, h] = n.box;
    (byNode[n.name] || []).forEach((r, i) => {
      const c = svgEl('circle', {'class': 'rstate', 'data-replica': r.name, cx: x + 9 + i * 10, cy: y + h - 7, r: 3.6,
        fill: STATE_COLOURS[r.state] || '#888', stroke: 'white', 'stroke-width': 1});
      c.appendChild(svgEl('title', {}, r.name + ': ' + r.state + (r.version !== null ? ', v' + r.version : '')));
      live.appendChild(c);
    });
  }
}

function drawReplicas(s) {
  if (!s.replicas.length) { $('replicas').innerHTML = '<span class="empty">no replicas yet</span>'; return; }
  let h = '<table><tr><th class="l">replica</th><th class="l">op</th><th class="l">state</th><th>version</th>' +
    '<th>running</th><th>queued</th><th class="l">KV use</th><th>tokens/s</th><th>pid</th></tr>';
  for (const r of s.replicas) {
    const kv = r.kv_capacity ? r.kv_used / r.kv_capacity : null;
    h += '<tr data-replica="' + esc(r.name) + '"><td class="l"><b>' + esc(r.name) + '</b></td><td class="l">' + esc(r.op) + '</td>' +
      '<td class="l"><span class="pill" style="background:' + (STATE_COLOURS[r.state] || '#888') + '">' + esc(r.state) + '</span></td>' +
      '<td>' + (r.version === null || r.version === undefined ? '\u2013' : '<span class="chip" style="background:' + vcol(r.version) + '">v' + esc(r.version) + '</span>') + '</td>' +
      '<td>' + num(r.running, 0) + '</td><td>' + num(r.queued, 0) + '</td>' +
      '<td class="l">' + (kv === null ? '\u2013' : '<span class="kv"><i style="width:' + Math.min(100, 100 * kv).toFixed(1) + '%%"></i></span>' + num(100 * kv, 1) + '%%') + '</td>' +
      '<td>' + num(r.tokens_per_s) + '</td><td>' + (r.pid === null || r.pid === undefined ? '\u2013' : esc(r.pid)) + '</td></tr>';
  }
  $('replicas').innerHTML = h + '</table>';
}

function drawTimeline(s) {
  const tl = s.timeline, box = $('timeline');
  if (!tl.rows.length) { box.innerHTML = '<span class="empty">no generate replicas in this run</span>'; $('tl-legend').innerHTML = ''; return; }
  const W = Math.max(480, box.clientWidth || 900), L = 110, R = 14, RH = 24, top = 6;
  const H = top + tl.rows.length * RH + 24;
  let t0 = Infinity;
  for (const row of tl.rows) for (const seg of row.segments) t0 = Math.min(t0, seg[0]);
  if (!isFinite(t0)) t0 = 0;
  const t1 = Math.max(tl.now, t0 + 1e-3);
  const X = t => L + (W - L - R) * (t - t0) / (t1 - t0);
  const svg = svgEl('svg', {width: W, height: H, viewBox: '0 0 ' + W + ' ' + H, 'font-size': 10.5});
  tl.rows.forEach((row, i) => {
    const y = top + i * RH;
    svg.appendChild(svgEl('text', {x: L - 8, y: y + 15, 'text-anchor': 'end', fill: '#333'}, row.policy ? row.policy + ': ' + row.name : row.name));
    svg.appendChild(svgEl('rect', {x: L, y: y + 3, width: W - L - R, height: RH - 6, fill: '#f4f4f1'}));
    for (const [a, b, v] of row.segments) {
      const x = X(a), w = Math.max(1, X(b) - x);
      const r = svgEl('rect', {'class': 'seg', 'data-version': v, 'data-row': row.name, x: x, y: y + 3, width: w, height: RH - 6, fill: vcol(v)});
      r.appendChild(svgEl('title', {}, row.name + ': v' + v + ' from ' + num(a, 1) + ' s to ' + num(b, 1) + ' s'));
      svg.appendChild(r);
      if (w > 24) svg.appendChild(svgEl('text', {x: x + 4, y: y + 15, fill: 'white', 'pointer-events': 'none'}, 'v' + v));
    }
    for (const [t, v] of row.loads) {
      const x = X(t);
      const p = svgEl('path', {'class': 'load', d: 'M' + (x - 4) + ',' + (y) + ' L' + (x + 4) + ',' + y + ' L' + x + ',' + (y + 7) + ' Z', fill: '#222'});
      p.appendChild(svgEl('title', {}, row.name + ': loads v' + v + ' at ' + num(t, 1) + ' s'));
      svg.appendChild(p);
    }
    for (const [t, v, n, peers] of row.migrations) {
      const x = X(t), yb = y + RH - 3;
      const d = n < 0 ? 'M' + (x - 4) + ',' + yb + ' L' + (x + 4) + ',' + yb + ' L' + x + ',' + (yb - 7) + ' Z'
                      : 'M' + (x - 4) + ',' + (yb - 7) + ' L' + (x + 4) + ',' + (yb - 7) + ' L' + x + ',' + yb + ' Z';
      const p = svgEl('path', {'class': 'mig', d: d, fill: '#666'});
      p.appendChild(svgEl('title', {}, row.name + (n < 0 ? ': ' + (-n) + ' v' + v + ' requests migrated out to ' + peers.join(', ')
        : ': took in requests of a migration of ' + n + ' v' + v + ' requests from ' + peers.join(', ')) + ' at ' + num(t, 1) + ' s'));
      svg.appendChild(p);
    }
  });
  const yAxis = top + tl.rows.length * RH + 12;
  for (let k = 0; k <= 5; k++) {
    const t = t0 + (t1 - t0) * k / 5;
    svg.appendChild(svgEl('text', {x: X(t), y: yAxis + 4, 'text-anchor': k === 0 ? 'start' : k === 5 ? 'end' : 'middle', fill: '#777'}, num(t, 0) + ' s'));
  }
  box.innerHTML = '';
  box.appendChild(svg);
  const shown = tl.versions.slice(-14);
  $('tl-legend').innerHTML = (tl.versions.length > shown.length ? '<span class="sub">\u2026</span>' : '') +
    shown.map(v => '<span><span class="chip" style="background:' + vcol(v) + '">v' + v + '</span></span>').join('');
}

const CURVES = [
  ['reward', [['reward_mean', 'reward mean']]],
  ['tokens/s', [['tokens_per_s', 'tokens/s']]],
  ['staleness', [['staleness_max', 'max'], ['staleness_mean', 'mean']]],
  ['step time (s)', [['step_time_s', 'step time']]],
  ['rollout-only share', [['rollout_only_share', 'trainer waiting']]],
  ['versions live', [['versions_live', 'versions']]],
  ['requests moved', [['migrated_requests', 'migrated'], ['fast_lane_requests', 'into fast lanes']]],
  ['multi-turn', [['turns_mean', 'turns mean'], ['tool_wait_s', 'tool wait s']]],
  ['prompt tokens', [['prefill_tokens', 'prefilled'], ['prefix_hit_tokens', 'prefix hits']]],
  ['KV blocks', [['kv_blocks_used', 'used'], ['kv_blocks_free', 'free']]],
];
const LINE_COLOURS = ['#3f6fa8', '#c8741f', '#3c8d4f', '#9b4d9b', '#b03a3a', '#5f6b7a'];

function drawCurves(s) {
  const box = $('curves');
  if (!box.dataset.built) {
    box.dataset.built = '1';
    CURVES.forEach(([title], i) => {
      const d = document.createElement('div');
      d.className = 'chart'; d.id = 'chart-' + i;
      box.appendChild(d);
    });
  }
  const steps = s.steps;
  // a run of several policies: one line per policy and series (each policy's own steps)
  const policies = [...new Set(steps.map(p => p.policy).filter(p => p))];
  CURVES.forEach(([title, plain], i) => {
    const series = policies.length ? policies.flatMap(u => plain.map(([k, label]) => [k, u + ' ' + label, u])) : plain;
    const pts = series.map(([k, , u]) => steps.filter(p => (!u || p.policy === u) && p[k] !== null && p[k] !== undefined && isFinite(p[k])).map(p => [p.step, p[k]]));
    const colours = series.map((x, j) => LINE_COLOURS[(policies.length ? policies.indexOf(x[2]) : j) %% LINE_COLOURS.length]);
    const dashed = series.map((x, j) => policies.length ? j %% plain.length : j);
    const holder = $('chart-' + i);
    holder.innerHTML = '';
    holder.appendChild(lineChart(title, series.map(x => x[1]), pts, 'step', series[0][0], colours, dashed));
  });
}

// one chart: a line per label (colours and dashes: a colour per series unless given, every line but the first dashed)
function lineChart(title, labels, pts, xname, key, colours, dashed) {
    colours = colours || labels.map((_, j) => LINE_COLOURS[j %% LINE_COLOURS.length]);
    dashed = dashed || labels.map((_, j) => j);
    const W = 300, H = 150, L = 44, R = 8, T = 18, B = 20;
    const svg = svgEl('svg', {width: '100%%', height: H, viewBox: '0 0 ' + W + ' ' + H, 'font-size': 10, 'data-curve': key});
    svg.appendChild(svgEl('text', {x: L, y: 12, 'font-weight': 600, fill: '#333'}, title));
    const all = pts.flat();
    if (!all.length) {
      svg.appendChild(svgEl('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle', fill: '#999'}, 'no data'));
    } else {
      let x0 = Math.min(...all.map(p => p[0])), x1 = Math.max(...all.map(p => p[0]));
      let y0 = Math.min(0, ...all.map(p => p[1])), y1 = Math.max(...all.map(p => p[1]));
      if (x1 === x0) x1 = x0 + 1;
      if (y1 === y0) y1 = y0 + 1;
      const X = x => L + (W - L - R) * (x - x0) / (x1 - x0), Y = y => H - B - (H - B - T) * (y - y0) / (y1 - y0);
      svg.appendChild(svgEl('path', {d: 'M' + L + ',' + T + ' L' + L + ',' + (H - B) + ' L' + (W - R) + ',' + (H - B), stroke: '#bbb', fill: 'none'}));
      svg.appendChild(svgEl('text', {x: L - 4, y: T + 4, 'text-anchor': 'end', fill: '#777'}, num(y1)));
      svg.appendChild(svgEl('text', {x: L - 4, y: H - B, 'text-anchor': 'end', fill: '#777'}, num(y0)));
      svg.appendChild(svgEl('text', {x: L, y: H - 5, fill: '#777'}, xname + ' ' + x0));
      svg.appendChild(svgEl('text', {x: W - R, y: H - 5, 'text-anchor': 'end', fill: '#777'}, xname + ' ' + x1));
      pts.forEach((p, j) => {
        if (!p.length) return;
        svg.appendChild(svgEl('polyline', {'class': 'curve', points: p.map(q => X(q[0]).toFixed(1) + ',' + Y(q[1]).toFixed(1)).join(' '),
          fill: 'none', stroke: colours[j], 'stroke-width': 1.6, 'stroke-dasharray': dashed[j] ? '4 3' : ''}));
        const last = p[p.length - 1];
        svg.appendChild(svgEl('text', {x: W - R, y: T + 12 * j, 'text-anchor': 'end', fill: colours[j]}, labels[j] + ' ' + num(last[1])));
      });
    }
    return svg;
}

function drawEvals(s) {
  const box = $('evals'), evals = s.evals || [];
  const sets = [...new Set(evals.map(e => e.set))];
  box.querySelectorAll('.chart,.empty').forEach(x => x.remove());
  if (!sets.length) {
    const d = document.createElement('div'); d.className = 'empty';
    d.textContent = 'no held-out set evaluated yet (declare one under eval: in the pipeline)'; box.appendChild(d); return;
  }
  sets.forEach(name => {
    const rows = evals.filter(e => e.set === name).sort((a, b) => a.version - b.version);
    const series = ['mean_reward', 'pass@1'];
    const pts = series.map(k => rows.filter(e => e[k] !== null && e[k] !== undefined).map(e => [e.version, e[k]]));
    const d = document.createElement('div'); d.className = 'chart'; d.dataset.set = name;
    d.appendChild(lineChart(name, ['mean reward', 'pass@1'], pts, 'version', 'eval/' + name));
    box.appendChild(d);
  });
}

function drawSamples(s) {
  const rows = (s.samples || []).slice().reverse();
  if (!rows.length) { $('samples').innerHTML = '<div class="empty">no sample yet</div>'; return; }
  const cut = (t, n) => { t = t === null || t === undefined ? '' : String(t); return t.length > n ? t.slice(0, n) + '\u2026' : t; };
  let h = '<table><tr><th class="l">kind</th><th>step</th><th>version</th><th class="l">prompt</th><th class="l">response</th><th>reward</th><th class="l">finish</th></tr>';
  rows.forEach(r => {
    h += '<tr class="sample"><td class="l">' + esc(r.kind + (r.set ? ' ' + r.set : '')) + '</td><td>' + esc(r.step) + '</td><td>' + esc(r.version) +
      '</td><td class="text">' + esc(cut(r.prompt, 160)) + '</td><td class="text">' + esc(cut(r.final_turn_text || r.response, 240)) +
      '</td><td>' + num(r.reward) + '</td><td class="l">' + esc(r.finish_reason || '') + '</td></tr>';
  });
  $('samples').innerHTML = h + '</table>';
}

function render(s) {
  drawHeader(s); drawFigure(s); drawReplicas(s); drawTimeline(s); drawCurves(s); drawEvals(s); drawSamples(s);
  updates += 1; lastUpdate = Date.now();
  stateTime = s.run.updated_at ? s.run.updated_at * 1000 : null; stateStatus = s.run.status;
  document.body.dataset.updates = updates;
}

function tickAge() {
  let t = lastUpdate === null ? '' : 'updated ' + ((Date.now() - lastUpdate) / 1000).toFixed(1) + ' s ago';
  // a run that stopped writing its state (killed) still says "running": say how old the state is
  const old = stateTime === null ? 0 : (Date.now() - stateTime) / 1000;
  if ((stateStatus === 'running' || stateStatus === 'starting') && old > 10) t += ' \u00b7 the run last wrote its state ' + num(old, 0) + ' s ago';
  $('age').textContent = t;
}

async function poll() {
  try {
    const r = await fetch('api/state', {cache: 'no-store'});
    if (!r.ok) throw new Error('HTTP ' + r.status);
    render(await r.json());
  } catch (e) {
    const st = $('status');
    st.textContent = 'disconnected'; st.className = 'badge disconnected';
  } finally {
    setTimeout(poll, POLL_MS);
  }
}
setInterval(tickAge, 250);
poll();
})();
"""


def page_html() -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>dora dashboard</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">'
            f"<style>{CSS}</style></head>\n<body>{BODY}<script>{JS % {'poll_ms': POLL_MS}}</script>\n</body></html>\n")
