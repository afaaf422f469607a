// The HTML memory page: one self-contained file (Chart.js, CSS, script and the report's
// JSON inline; no network), see docs/memory.md.
//
// The data goes in a <script type="application/json"> with '<', '>' and '&' written as
// \u003c, \u003e, \u0026 (they can only occur inside JSON strings), so no name can end the
// element; the page's script builds every element from data with textContent.
#include "remat/error.h"
#include "remat/profile.h"

namespace remat {

namespace detail {
// src: the generated chartjs_source.cpp (CMakeLists.txt)
bool chartjs_available();
std::string chartjs_source();
std::string chartjs_license();
}  // namespace detail

namespace {

const char* const kStyle = R"css(
body { font: 14px/1.4 system-ui, sans-serif; margin: 16px 24px; color: #222; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 22px 0 6px; }
p.note { color: #555; margin: 2px 0 8px; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 8px; border-bottom: 1px solid #e4e4e4; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; cursor: pointer; user-select: none; position: sticky; top: 0; }
th[aria-sort="ascending"]::after { content: " \25B2"; }
th[aria-sort="descending"]::after { content: " \25BC"; }
td.t, th.t { text-align: left; }
tr.sel td { background: #fff3c4; }
tr.hl td { background: #ffe1a8; }
.layer { color: #1a5fb4; cursor: pointer; text-decoration: underline dotted; }
#policies button { margin-right: 6px; padding: 3px 10px; border: 1px solid #aaa; background: #fafafa; border-radius: 3px; cursor: pointer; }
#policies button.on { background: #1a5fb4; color: #fff; border-color: #1a5fb4; }
.row { display: flex; gap: 16px; align-items: flex-start; }
.chart { position: relative; flex: 1 1 auto; min-width: 0; height: 420px; }
.small { height: 340px; }
#live { flex: 0 0 460px; max-height: 460px; overflow: auto; border: 1px solid #ddd; padding: 6px; }
#live h3, #host-live h3 { font-size: 14px; margin: 0 0 4px; }
#host-live { margin-top: 8px; border: 1px solid #ddd; padding: 6px; max-width: 620px; }
#host-live th { position: static; }
#live table { table-layout: fixed; width: 100%; }
#live td.t { white-space: normal; overflow-wrap: anywhere; }
#live tr > :nth-child(1) { width: 30%; } #live tr > :nth-child(2) { width: 30%; }
#live tr > :nth-child(3) { width: 22%; } #live tr > :nth-child(4) { width: 18%; }
.scroll { max-height: 420px; max-width: 100%; overflow: auto; border: 1px solid #ddd; display: inline-block; }
#policy-table td.t { white-space: normal; min-width: 8em; max-width: 18em; }
#policy-table th { white-space: normal; }
#peak-value { font-weight: 600; }
.phase { display: inline-block; width: 12px; height: 12px; vertical-align: middle; margin: 0 3px 0 10px; border: 1px solid #ccc; }
)css";

const char* const kScript = R"js(
(function () {
  'use strict';
  const T = { start: performance.now() };
  const R = JSON.parse(document.getElementById('remat-data').textContent);
  const SERIES_COLORS = {
    parameter: '#4e79a7', gradient: '#f28e2b', optimizer_state: '#e15759', activation: '#76b7b2',
    recomputed: '#59a14f', workspace: '#edc948', temporary: '#b07aa1', input: '#9c755f'
  };
  const HOST_COLOR = '#6a3d9a', HOST_LABEL = 'pinned host memory (offloaded)';
  const PHASE_COLORS = {
    setup: 'rgba(0,0,0,0)', forward: 'rgba(78,121,167,0.10)', recompute: 'rgba(89,161,79,0.22)',
    backward: 'rgba(225,87,89,0.10)', optimizer: 'rgba(176,122,161,0.14)'
  };
  // Twelve colours; past twelve policies the lines repeat them dashed (policyStyle).
  const POLICY_COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf',
                         '#7f7f7f', '#bcbd22', '#393b79', '#ad494a'];
  function policyStyle(i) {
    return { col: POLICY_COLORS[i % POLICY_COLORS.length], dash: i >= POLICY_COLORS.length ? [6, 3] : [] };
  }
  // A byte axis on round binary steps (1, 2 or 5 times a power of ten of GiB, MiB or KiB)
  // from 0 to a little above `top`.
  function byteAxis(top, title) {
    top = Math.max(1, top);
    const unit = top >= 2 ** 30 ? 2 ** 30 : top >= 2 ** 20 ? 2 ** 20 : 1024;
    const raw = top / unit / 6, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((v) => v >= raw) * unit;
    return { min: 0, max: Math.ceil(top * 1.04 / step) * step, ticks: { stepSize: step, callback: (v) => fmtBytes(v) },
             title: { display: true, text: title } };
  }
  const $ = (id) => document.getElementById(id);
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function fmtBytes(b) {
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let v = Math.abs(b), i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; ++i; }
    return (b < 0 ? '-' : '') + (i === 0 ? String(v) : v.toFixed(2)) + ' ' + u[i];
  }
  function fmtFlops(f) {
    if (f >= 1e12) return (f / 1e12).toFixed(2) + ' TFLOP';
    if (f >= 1e9) return (f / 1e9).toFixed(2) + ' GFLOP';
    if (f >= 1e6) return (f / 1e6).toFixed(2) + ' MFLOP';
    return f.toFixed(0) + ' FLOP';
  }
  const exact = (b) => Number(b).toLocaleString('en-US') + ' bytes';
  function layerMatches(owner, layer) { return owner === layer || owner.startsWith(layer + '.'); }
  // The layer a tensor's owner belongs to: the owner itself, or for a parameter
  // ("blk.0.fc1.weight") the longest layer name it extends.
  const layerNames = new Set();
  for (const p of R.policies) for (const l of p.layers) layerNames.add(l.name);
  function layerOf(owner) {
    for (let o = owner; o; o = o.includes('.') ? o.slice(0, o.lastIndexOf('.')) : '') if (layerNames.has(o)) return o;
    return owner;
  }

  const state = { policy: 0, layer: null, hover: null };
  const policies = R.policies;
  document.title = 'remat memory: ' + (R.title || 'profile');
  $('title').textContent = R.title || 'remat memory profile';

  // ---- sortable tables -------------------------------------------------------------------
  // cols: [{label, key(row) -> sort value, cell(row) -> text, left}]
  function sortableTable(table, cols, rows, onRow, rowKey) {
    table.textContent = '';
    const thead = el('thead'), tr = el('tr');
    const body = el('tbody');
    let sortCol = -1, dir = 1;
    cols.forEach((c, i) => {
      const th = el('th', c.label, c.left ? 't' : '');
      th.addEventListener('click', () => {
        dir = sortCol === i ? -dir : (c.left ? 1 : -1);
        sortCol = i;
        for (const h of tr.children) h.removeAttribute('aria-sort');
        th.setAttribute('aria-sort', dir > 0 ? 'ascending' : 'descending');
        render();
      });
      tr.appendChild(th);
    });
    thead.appendChild(tr);
    table.appendChild(thead);
    table.appendChild(body);
    function render() {
      const order = rows.map((r, i) => i);
      if (sortCol >= 0) {
        const k = cols[sortCol].key;
        order.sort((a, b) => {
          const x = k(rows[a]), y = k(rows[b]);
          return (x < y ? -1 : x > y ? 1 : a - b) * dir;
        });
      }
      body.textContent = '';
      for (const i of order) {
        const r = rows[i], row = el('tr');
        row.dataset.key = rowKey(r, i);
        cols.forEach((c) => {
          const td = el('td', null, c.left ? 't' : '');
          const v = c.cell(r);
          if (v instanceof Node) td.appendChild(v); else td.textContent = v;
          if (c.title) td.title = c.title(r);
          row.appendChild(td);
        });
        if (onRow) row.addEventListener('click', () => onRow(r, i));
        body.appendChild(row);
      }
      table.dispatchEvent(new Event('rendered'));
    }
    render();
    return render;
  }

  // ---- the policy table ------------------------------------------------------------------
  // A policy's name, with its precision when not fp32 (memprof --precision fp32,bf16).
  const pname = (p) => (p.precision && p.precision !== 'fp32' ? p.policy + ' ' + p.precision : p.policy);
  const cats = Object.keys(policies[0].peak_by_category);
  const pcols = [
    { label: 'policy', left: true, key: (p) => pname(p), cell: (p) => pname(p) },
    { label: 'peak allocated', key: (p) => p.peak_bytes, cell: (p) => fmtBytes(p.peak_bytes), title: (p) => exact(p.peak_bytes) }
  ].concat(cats.map((c) => ({
    label: c, key: (p) => p.peak_by_category[c], cell: (p) => fmtBytes(p.peak_by_category[c]),
    title: (p) => exact(p.peak_by_category[c])
  }))).concat([
    { label: 'peak reserved', key: (p) => p.peak_reserved_bytes, cell: (p) => fmtBytes(p.peak_reserved_bytes) }
  ]).concat(policies.some((p) => p.host_peak_bytes > 0) ? [
    // The host tier of offloading policies (POLICY+offload): the pinned pool's peak.
    { label: 'pinned host peak', key: (p) => p.host_peak_bytes || 0, cell: (p) => fmtBytes(p.host_peak_bytes || 0),
      title: (p) => exact(p.host_peak_bytes || 0) }
  ] : []).concat([
    { label: 'recomputed layers', key: (p) => p.recomputed_layers, cell: (p) => p.recomputed_layers },
    { label: 'recompute FLOPs', key: (p) => p.recompute_flops, cell: (p) => fmtFlops(p.recompute_flops) },
    { label: 'share of step', key: (p) => p.recompute_flops / Math.max(1, p.step_flops),
      cell: (p) => (100 * p.recompute_flops / Math.max(1, p.step_flops)).toFixed(1) + '%' }
  ]);
  const policyTable = $('policy-table');
  sortableTable(policyTable, pcols, policies, (p, i) => selectPolicy(i), (p, i) => i);
  policyTable.addEventListener('rendered', markPolicyRow);
  function markPolicyRow() {
    for (const r of policyTable.tBodies[0].rows) r.classList.toggle('sel', Number(r.dataset.key) === state.policy);
  }

  // ---- the timeline ----------------------------------------------------------------------
  const buttons = $('policies');
  policies.forEach((p, i) => {
    const b = el('button', pname(p));
    b.addEventListener('click', () => selectPolicy(i));
    buttons.appendChild(b);
  });
  const legend = $('phase-legend');
  for (const ph of ['forward', 'recompute', 'backward', 'optimizer']) {
    const s = el('span', null, 'phase');
    s.style.background = PHASE_COLORS[ph];
    legend.appendChild(s);
    legend.appendChild(document.createTextNode(ph));
  }

  const timelinePlugin = {
    id: 'rematTimeline',
    beforeDatasetsDraw(chart) {
      const tl = policies[state.policy].timeline;
      if (!tl) return;
      const { ctx, chartArea: a, scales: { x } } = chart;
      ctx.save();
      for (const ph of tl.phases) {
        const c = PHASE_COLORS[ph[0]];
        if (!c) continue;
        ctx.fillStyle = c;
        const x0 = Math.max(a.left, x.getPixelForValue(ph[1])), x1 = Math.min(a.right, x.getPixelForValue(ph[2]));
        ctx.fillRect(x0, a.top, Math.max(1, x1 - x0), a.bottom - a.top);
      }
      if (state.layer && tl.layer_spans[state.layer]) {
        ctx.fillStyle = 'rgba(255,140,0,0.35)';
        for (const s of tl.layer_spans[state.layer]) {
          const x0 = x.getPixelForValue(s[1]), x1 = x.getPixelForValue(s[2]);
          ctx.fillRect(x0 - 1, a.top, Math.max(2, x1 - x0 + 2), a.bottom - a.top);
        }
      }
      ctx.restore();
    },
    afterDatasetsDraw(chart) {
      const p = policies[state.policy], tl = p.timeline;
      if (!tl) return;
      const { ctx, chartArea: a, scales: { x, y } } = chart;
      ctx.save();
      if (p.budget_bytes) {
        const yb = y.getPixelForValue(p.budget_bytes);
        ctx.strokeStyle = '#c00'; ctx.setLineDash([6, 4]); ctx.lineWidth = 1.5;
        ctx.beginPath(); ctx.moveTo(a.left, yb); ctx.lineTo(a.right, yb); ctx.stroke();
        ctx.setLineDash([]); ctx.fillStyle = '#c00';
        ctx.fillText('budget ' + fmtBytes(p.budget_bytes), a.left + 6, yb - 4);
      }
      const px = x.getPixelForValue(tl.peak_event), py = y.getPixelForValue(tl.peak_bytes);
      ctx.fillStyle = '#000';
      ctx.beginPath(); ctx.moveTo(px, py); ctx.lineTo(px - 6, py - 10); ctx.lineTo(px + 6, py - 10); ctx.fill();
      ctx.textAlign = px > (a.left + a.right) / 2 ? 'right' : 'left';
      ctx.fillText('peak ' + fmtBytes(tl.peak_bytes), px + (ctx.textAlign === 'right' ? -8 : 8), py - 12);
      if (state.hover !== null) {
        const hx = x.getPixelForValue(tl.event[state.hover]);
        ctx.strokeStyle = 'rgba(0,0,0,0.6)'; ctx.lineWidth = 1;
        ctx.beginPath(); ctx.moveTo(hx, a.top); ctx.lineTo(hx, a.bottom); ctx.stroke();
      }
      ctx.restore();
    }
  };

  function timelineDatasets(p) {
    const tl = p.timeline;
    const ds = tl.series.map((s, i) => ({
      label: s, stack: 'allocated', fill: i === 0 ? 'origin' : '-1', borderWidth: 0, pointRadius: 0,
      backgroundColor: SERIES_COLORS[s] || '#999', borderColor: SERIES_COLORS[s] || '#999',
      data: tl.event.map((e, k) => ({ x: e, y: tl.values[s][k] }))
    }));
    ds.push({
      label: 'reserved', stack: 'reserved', fill: false, borderWidth: 1.5, borderDash: [4, 3], pointRadius: 0,
      borderColor: '#333', backgroundColor: 'rgba(0,0,0,0)', data: tl.event.map((e, k) => ({ x: e, y: tl.reserved[k] }))
    });
    if (tl.host) {  // offload: the pinned host tier, beside the device's bytes (not stacked on them)
      ds.push({
        label: HOST_LABEL, stack: 'host', order: -1, fill: false, borderWidth: 2.5, pointRadius: 0, stepped: 'before',
        borderColor: HOST_COLOR, backgroundColor: HOST_COLOR, data: tl.event.map((e, k) => ({ x: e, y: tl.host.values[k] }))
      });
    }
    return ds;
  }
  let timeline = null;
  function yMax(p) {
    return Math.max(p.peak_reserved_bytes, p.peak_bytes, p.budget_bytes || 0, p.host_peak_bytes || 0) * 1.08 || 1;
  }
  function drawTimeline() {
    const p = policies[state.policy];
    if (!p.timeline) {
      $('timeline-note').textContent = 'no events recorded for this policy';
      $('host-live').hidden = true;
      return;
    }
    const cfg = {
      type: 'line',
      data: { datasets: timelineDatasets(p) },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false, parsing: true, normalized: true,
        interaction: { mode: 'nearest', intersect: false, axis: 'x' },
        plugins: { tooltip: { enabled: false }, legend: { position: 'top' } },
        scales: {
          x: { type: 'linear', min: 0, max: Math.max(1, p.timeline.events - 1),
               title: { display: true, text: 'allocator events of one training step' } },
          y: { stacked: true, ...byteAxis(yMax(p) / 1.08, 'bytes live'),
               title: { display: true, text: 'bytes live' } }
        }
      },
      plugins: [timelinePlugin]
    };
    if (timeline) timeline.destroy();
    timeline = new Chart($('timeline'), cfg);
    window.rematPage.timeline = timeline;
    const pk = $('peak-value');
    pk.textContent = 'peak ' + exact(p.timeline.peak_bytes) + ' (' + fmtBytes(p.timeline.peak_bytes) + ') at event ' +
                     p.timeline.peak_event + ' of ' + p.timeline.events;
    pk.dataset.bytes = String(p.timeline.peak_bytes);
  }

  // The point under the mouse: of the points within 3 pixels, the one with the most bytes
  // live (so the peak is always reachable, whatever the resolution).
  function pointAt(px) {
    const tl = policies[state.policy].timeline, x = timeline.scales.x;
    let best = null, bestTotal = -1;
    const lo = x.getValueForPixel(px - 3), hi = x.getValueForPixel(px + 3);
    let a = 0, b = tl.event.length;
    while (a < b) { const m = (a + b) >> 1; if (tl.event[m] < lo) a = m + 1; else b = m; }
    for (let k = a; k < tl.event.length && tl.event[k] <= hi; ++k) {
      let t = 0;
      for (const s of tl.series) t += tl.values[s][k];
      if (t > bestTotal) { bestTotal = t; best = k; }
    }
    if (best === null) {  // between sparse points: the nearest
      const v = x.getValueForPixel(px);
      best = Math.min(tl.event.length - 1, a);
      if (best > 0 && Math.abs(tl.event[best - 1] - v) < Math.abs(tl.event[best] - v)) best -= 1;
    }
    return best;
  }
  $('timeline').addEventListener('mousemove', (ev) => {
    if (!timeline) return;
    const r = ev.target.getBoundingClientRect();
    const px = ev.clientX - r.left;
    const a = timeline.chartArea;
    if (px < a.left || px > a.right) return;
    const k = pointAt(px);
    if (k !== state.hover) { state.hover = k; showLive(k); timeline.draw(); }
  });

  function showLive(k) {
    const p = policies[state.policy], tl = p.timeline, box = $('live-rows');
    const e = tl.event[k];
    let total = 0;
    for (const s of tl.series) total += tl.values[s][k];
    const isPeak = e === tl.peak_event;
    $('live-head').textContent = (isPeak ? 'At the peak, event ' : 'At event ') + e + ': ' + exact(total) + ' (' +
                                 fmtBytes(total) + ') in ' + tl.live_count[k] + ' tensors';
    const byId = tensorIndex(tl);
    const rows = (isPeak ? tl.live_at_peak : tl.top[k].map((id) => byId.get(id))).map((t) => (
      { id: t[0], bytes: t[3], series: tl.series[t[4]], phase: t[5], layer: tl.layers[t[6]], shape: tl.shapes[t[7]] }));
    let shown = 0;
    const frag = document.createDocumentFragment();
    for (const t of rows) {
      const tr = el('tr');
      tr.dataset.id = String(t.id);
      tr.dataset.layer = t.layer;
      const when = t.phase === 'setup' || (t.series === 'recomputed' && t.phase === 'recompute') ? '' : ' (' + t.phase + ')';
      tr.appendChild(el('td', '#' + t.id + ' ' + t.series + when, 't'));
      const lt = el('td', null, 't');
      lt.appendChild(el('span', t.layer, 'layer'));  // a click selects it (below)
      tr.appendChild(lt);
      tr.appendChild(el('td', t.shape, 't'));
      const bt = el('td', fmtBytes(t.bytes));
      bt.title = exact(t.bytes);
      bt.dataset.bytes = String(t.bytes);
      tr.appendChild(bt);
      if (state.layer && layerMatches(t.layer, state.layer)) tr.className = 'hl';
      frag.appendChild(tr);
      shown += t.bytes;
    }
    box.textContent = '';
    box.appendChild(frag);
    const more = tl.live_count[k] - rows.length;
    $('live-more').textContent = more > 0 ? '… and ' + more + ' smaller tensors, ' + fmtBytes(total - shown) : '';
    showHost(tl, e);
  }
  // The offloaded products held in pinned host memory at event e (tl.host.tensors rows:
  // [begin, end, bytes, layer]; end -1 held to the end), largest first, the first ten.
  function showHost(tl, e) {
    const head = $('host-head'), box = $('host-rows');
    box.textContent = '';
    $('host-live').hidden = !tl.host;
    if (!tl.host) return;
    const held = tl.host.tensors.filter((t) => t[0] <= e && (t[1] < 0 || e < t[1])).sort((a, b) => b[2] - a[2]);
    let bytes = 0;
    for (const t of held) bytes += t[2];
    head.textContent = 'In pinned host memory: ' + exact(bytes) + ' (' + fmtBytes(bytes) + ') in ' + held.length +
                       ' offloaded products (the line in the timeline)';
    head.dataset.bytes = String(bytes);
    for (const t of held.slice(0, 10)) {
      const tr = el('tr');
      tr.dataset.layer = t[3];
      const lt = el('td', null, 't');
      lt.appendChild(el('span', t[3], 'layer'));
      tr.appendChild(lt);
      const bt = el('td', fmtBytes(t[2]));
      bt.title = exact(t[2]);
      bt.dataset.bytes = String(t[2]);
      tr.appendChild(bt);
      box.appendChild(tr);
    }
    $('host-more').textContent = held.length > 10 ? '… and ' + (held.length - 10) + ' smaller' : '';
  }
  $('host-rows').addEventListener('click', (ev) => {
    if (ev.target.classList.contains('layer')) selectLayer(layerOf(ev.target.closest('tr').dataset.layer));
  });
  $('live-rows').addEventListener('click', (ev) => {
    if (ev.target.classList.contains('layer')) selectLayer(layerOf(ev.target.closest('tr').dataset.layer));
  });
  const tensorIndexCache = new Map();
  function tensorIndex(tl) {  // id -> row of tensor_fields, from tensors and live_at_peak
    if (!tensorIndexCache.has(tl)) tensorIndexCache.set(tl, new Map(tl.tensors.concat(tl.live_at_peak).map((t) => [t[0], t])));
    return tensorIndexCache.get(tl);
  }

  // ---- policies side by side -------------------------------------------------------------
  function drawCompare() {
    const ds = [];
    let budget = 0, top = 1;
    policies.forEach((p, i) => {
      top = Math.max(top, p.peak_bytes);
      if (p.budget_bytes) budget = Math.max(budget, p.budget_bytes);
      const tl = p.timeline;
      if (!tl) return;
      const n = Math.max(1, tl.events - 1);
      const { col, dash } = policyStyle(i);
      ds.push({
        label: pname(p) + ' (peak ' + fmtBytes(p.peak_bytes) + ')', borderColor: col, backgroundColor: col,
        borderWidth: 1.5, borderDash: dash, pointRadius: 0, fill: false,
        data: tl.event.map((e, k) => { let t = 0; for (const s of tl.series) t += tl.values[s][k]; return { x: e / n, y: t }; })
      });
      ds.push({ label: pname(p) + ' peak', type: 'scatter', pointStyle: 'triangle', pointRadius: 6,
                borderColor: col, backgroundColor: col, data: [{ x: tl.peak_event / n, y: tl.peak_bytes }] });
    });
    if (budget) ds.push({ label: 'budget ' + fmtBytes(budget), borderColor: '#c00', borderDash: [6, 4], pointRadius: 0,
                          borderWidth: 1.5, fill: false, data: [{ x: 0, y: budget }, { x: 1, y: budget }] });
    window.rematPage.compare = new Chart($('compare'), {
      type: 'line', data: { datasets: ds },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false,
        plugins: { legend: { labels: { filter: (item) => !item.text.endsWith(' peak') } },
                   tooltip: { callbacks: { label: (c) => c.dataset.label + ': ' + fmtBytes(c.parsed.y) } } },
        scales: { x: { type: 'linear', min: 0, max: 1, title: { display: true, text: 'progress through the step' } },
                  y: byteAxis(Math.max(top, budget), 'bytes allocated') }
      }
    });
  }

  // ---- the planner's Pareto front ---------------------------------------------------------
  function drawPareto() {
    if (!R.pareto) { $('pareto-section').hidden = true; return; }  // a run's page: no planner here
    const pt = (c) => ({ x: c.peak_bytes, y: c.recompute_flops, name: c.name });
    const ds = [
      { label: 'candidate plans', type: 'scatter', data: R.pareto.candidates.map(pt), backgroundColor: '#bbb', pointRadius: 3 },
      { label: 'Pareto front', type: 'line', data: R.pareto.front.map(pt), borderColor: '#d62728',
        backgroundColor: '#d62728', pointRadius: 4, fill: false, borderWidth: 1.5 }
    ];
    policies.forEach((p, i) => {
      const { col } = policyStyle(i);
      ds.push({ label: 'policy ' + p.policy, type: 'scatter', pointStyle: 'rectRot', pointRadius: 8, borderColor: '#000',
                backgroundColor: col, data: [{ x: p.peak_bytes, y: p.recompute_flops, name: p.policy }] });
    });
    let budget = 0;
    for (const p of policies) if (p.budget_bytes) budget = Math.max(budget, p.budget_bytes);
    // The FLOP axis ends a little above the front and the policies; candidates above it
    // (e.g. revolve:1's quadratic re-runs) are counted in the note instead of squashing the chart.
    let ymax = 1;
    for (const c of R.pareto.front) ymax = Math.max(ymax, c.recompute_flops);
    for (const p of policies) ymax = Math.max(ymax, p.recompute_flops);
    ymax *= 1.1;
    const above = R.pareto.candidates.filter((c) => c.recompute_flops > ymax).length;
    if (above) $('pareto-note').textContent += ' ' + above + ' candidate plan(s) re-run more than the chart shows.';
    if (budget) ds.push({ label: 'budget ' + fmtBytes(budget), type: 'line', data: [{ x: budget, y: 0 }, { x: budget, y: ymax }],
                          borderColor: '#c00', borderDash: [6, 4], pointRadius: 0, fill: false, borderWidth: 1.5 });
    window.rematPage.pareto = new Chart($('pareto'), {
      type: 'scatter', data: { datasets: ds },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false,
        plugins: { tooltip: { callbacks: { label: (c) => (c.raw.name || c.dataset.label) + ': peak ' + fmtBytes(c.raw.x) +
                                                          ', recompute ' + fmtFlops(c.raw.y) } } },
        scales: { x: { ticks: { callback: (v) => fmtBytes(v) }, title: { display: true, text: 'peak bytes' },
                       afterBuildTicks: (axis) => { const a = byteAxis(axis.max, ''); const t = [];
                         for (let v = Math.ceil(axis.min / a.ticks.stepSize) * a.ticks.stepSize; v <= axis.max; v += a.ticks.stepSize) t.push({ value: v });
                         axis.ticks = t; } },
                  y: { min: 0, max: ymax, ticks: { callback: (v) => fmtFlops(v) }, title: { display: true, text: 'recomputed FLOPs' } } }
      }
    });
  }

  // ---- per layer -------------------------------------------------------------------------
  const layerTable = $('layer-table');
  function drawLayers() {
    const p = policies[state.policy];
    $('layer-policy').textContent = p.policy;
    const lcols = [
      { label: 'layer', left: true, key: (l) => l.name, cell: (l) => { const s = el('span', l.name, 'layer'); return s; } },
      { label: 'type', left: true, key: (l) => l.type, cell: (l) => l.type },
      { label: 'plan', left: true, key: (l) => (l.keep ? (l.keep_extras ? 0 : 1) : 2),
        cell: (l) => (l.keep ? (l.keep_extras ? 'keep' : 'rec. extras') : 'recompute') },
      { label: 'kept bytes', key: (l) => l.saved_bytes, cell: (l) => fmtBytes(l.saved_bytes), title: (l) => exact(l.saved_bytes) },
      { label: 'recomputed bytes', key: (l) => l.recomputed_bytes, cell: (l) => fmtBytes(l.recomputed_bytes) },
      { label: 'forward FLOPs', key: (l) => l.forward_flops, cell: (l) => fmtFlops(l.forward_flops) },
      { label: 'recompute FLOPs', key: (l) => l.recompute_flops, cell: (l) => fmtFlops(l.recompute_flops) },
      { label: 'recompute share', key: (l) => l.recompute_share, cell: (l) => (100 * l.recompute_share).toFixed(2) + '%' }
    ];
    sortableTable(layerTable, lcols, p.layers, (l) => selectLayer(l.name), (l) => l.name);
    markLayerRow();
  }
  layerTable.addEventListener('rendered', markLayerRow);
  function markLayerRow() {
    if (!layerTable.tBodies[0]) return;
    for (const r of layerTable.tBodies[0].rows) r.classList.toggle('sel', r.dataset.key === state.layer);
  }

  function selectLayer(name) {
    state.layer = state.layer === name ? null : name;
    $('layer-sel').textContent = state.layer ? 'layer ' + state.layer + ' highlighted (its spans shaded orange, its tensors marked); click it again to clear' : '';
    markLayerRow();
    for (const r of $('live-rows').rows) r.classList.toggle('hl', !!state.layer && layerMatches(r.dataset.layer, state.layer));
    if (timeline) timeline.draw();
    const row = state.layer && Array.from(layerTable.tBodies[0].rows).find((r) => r.dataset.key === state.layer);
    if (row && row.scrollIntoView) row.scrollIntoView({ block: 'nearest' });
  }
  function selectPolicy(i) {
    state.policy = i;
    state.hover = null;
    Array.from(buttons.children).forEach((b, k) => b.classList.toggle('on', k === i));
    markPolicyRow();
    const tl = policies[i].timeline;
    if (tl) state.hover = tl.event.indexOf(tl.peak_event);  // the panel starts at the peak
    T.sel0 = performance.now();
    drawTimeline();
    T.sel1 = performance.now();
    drawLayers();
    T.sel2 = performance.now();
    if (tl) showLive(state.hover);
    T.sel3 = performance.now();
  }

  window.rematPage = { data: R, selectPolicy: selectPolicy, selectLayer: selectLayer, state: state };
  T.parsed = performance.now();
  drawCompare();
  T.compare = performance.now();
  drawPareto();
  T.pareto = performance.now();
  selectPolicy(0);
  T.timeline = performance.now();
  window.rematPage.timings = T;
  window.rematPage.drawnAtMs = performance.now();  // since navigation started
  window.rematPage.ready = true;
})();
)js";

const char* const kBody = R"html(
<h1 id="title"></h1>
<p class="note">One training step, as the memory profiler simulated or measured it (remat memprof). Hover the timeline
to see what is live; click a layer to find it.</p>
<h2>Policies</h2>
<p class="note">Peak allocated and its split by category; click a column to sort, a row to show that policy below.</p>
<div class="scroll"><table id="policy-table"></table></div>
<h2>Timeline</h2>
<div id="policies"></div>
<p class="note"><span id="peak-value"></span> <span id="phase-legend"></span> <span id="timeline-note"></span></p>
<p class="note" id="layer-sel"></p>
<div class="row">
  <div class="chart"><canvas id="timeline"></canvas></div>
  <div id="live"><h3 id="live-head"></h3>
    <table><thead><tr><th class="t">tensor</th><th class="t">layer</th><th class="t">shape</th><th>bytes</th></tr></thead>
    <tbody id="live-rows"></tbody></table><p class="note" id="live-more"></p></div>
</div>
<div id="host-live" hidden><h3 id="host-head"></h3>
  <table><thead><tr><th class="t">offloaded product of layer</th><th>bytes</th></tr></thead><tbody id="host-rows"></tbody></table>
  <p class="note" id="host-more"></p></div>
<h2>Policies side by side</h2>
<div class="chart small"><canvas id="compare"></canvas></div>
<section id="pareto-section">
<h2>Checkpoint plans: peak vs recompute</h2>
<p class="note" id="pareto-note">Every plan the planner simulated (grey), its Pareto front (red) and the policies above.</p>
<div class="chart small"><canvas id="pareto"></canvas></div>
</section>
<h2>Per layer (policy <span id="layer-policy"></span>)</h2>
<p class="note">Kept bytes: what the layer's forward still holds when the forward pass ends. Click a column to sort, a
row to highlight the layer in the timeline.</p>
<div class="scroll"><table id="layer-table"></table></div>
)html";

// JSON text safe inside a <script> element: '<', '>' and '&' only occur inside strings.
std::string script_safe_json(const nlohmann::json& j) {
  const std::string s = j.dump();
  std::string o;
  o.reserve(s.size() + s.size() / 64);
  for (char c : s) {
    if (c == '<')
      o += "\\u003c";
    else if (c == '>')
      o += "\\u003e";
    else if (c == '&')
      o += "\\u0026";
    else
      o += c;
  }
  return o;
}

std::string html_comment_safe(std::string s) {
  for (size_t k; (k = s.find("--")) != std::string::npos;) s.replace(k, 2, "- -");
  return s;
}

}  // namespace

bool memory_html_available() { return detail::chartjs_available(); }

std::string memory_html(const nlohmann::json& report) {
  REMAT_CHECK(
      detail::chartjs_available(),
      "the HTML memory page needs Chart.js, from the Debian package libjs-chart.js (tools/bootstrap.sh installs "
      "it): install it and configure remat again");
  REMAT_CHECK(
      report.is_object() && report.contains("policies") && report["policies"].is_array() && !report["policies"].empty(),
      "memory_html: the report has no policies");
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  // Nothing may be fetched: scripts and styles are inline, images data: URLs only.
  h += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'; "
       "style-src 'unsafe-inline'; img-src data:\">\n";
  h += "<title>remat memory</title>\n<style>" + std::string(kStyle) + "</style>\n";
  h += "<!-- Chart.js 3 (Debian package libjs-chart.js), inlined. Its licence:\n" +
       html_comment_safe(detail::chartjs_license()) + "-->\n";
  h += "<script>\n" + detail::chartjs_source() + "\n</script>\n</head>\n<body>\n";
  h += kBody;
  h += "<script type=\"application/json\" id=\"remat-data\">" + script_safe_json(report) + "</script>\n";
  h += "<script>" + std::string(kScript) + "</script>\n</body>\n</html>\n";
  return h;
}

}  // namespace remat
