// Overview, for an operator's morning: what waits and for how long, jobs awaiting approval (with Approve and Deny for
// those allowed), nodes needing attention, budgets and their burn (panels/), then the cluster's figures over time
// from GET /cluster/samples: current totals, the allocation and fragmentation rates named in words (the acronyms
// GAR, SOR and GFR in tooltips), and GPUs allocated vs used vs capacity. Each panel is one API call per refresh.

import { api } from '../api.js';
import { lineChart } from '../charts.js';
import { h, panel, segmented, tile } from '../dom.js';
import { apiMoment, gpus, parseTime, percent } from '../format.js';
import { approvalsPanel } from '../panels/approvals.js';
import { attentionPanel } from '../panels/attention.js';
import { budgetsPanel } from '../panels/budgets.js';
import { waitingPanel } from '../panels/waiting.js';

const WINDOWS = [['900', '15 min'], ['3600', '1 h'], ['21600', '6 h'], ['86400', '24 h']];
const REFRESH_MS = 10000;

export function render(ctx, _arg, query) {
  let seconds = Number(WINDOWS.some(([w]) => w === query.window) ? query.window : 3600);
  const load = () => api('/cluster/samples', { query: { from: apiMoment(new Date(Date.now() - seconds * 1000)) } });
  const controls = segmented('time window', WINDOWS, String(seconds), (value) => {
    seconds = Number(value);
    cluster.refresh();
  });
  const cluster = panel('Cluster', load, draw, { controls, id: 'cluster' });
  const waiting = waitingPanel();
  const approvals = approvalsPanel(ctx, () => [approvals, waiting].forEach((p) => p.refresh()));
  const attention = attentionPanel();
  const budgets = budgetsPanel();
  for (const p of [cluster, waiting, approvals, attention, budgets]) ctx.every(REFRESH_MS, p.refresh);
  return h('div', { class: 'page overview' }, h('div', { class: 'two' }, waiting.el, attention.el), approvals.el,
    budgets.el, cluster.el);
}

/** The rates in words, their acronyms (as the simulator and papers name them) in the tooltip. */
export const RATES = {
  gar: { words: 'GPUs allocated', hint: 'GAR, the GPU allocation rate: GPUs allocated / GPUs of schedulable nodes' },
  gfr: { words: 'Nodes partly allocated', hint: 'GFR, the GPU fragmentation rate: the share of GPU nodes with some '
    + 'but not all of their GPUs allocated (free GPUs there fit only small jobs)' },
  sor: { words: 'GPUs allocated or held', hint: 'SOR, the scheduling occupancy rate: GPUs allocated, plus idle GPUs '
    + 'the scheduler holds for a waiting job (a reservation), over all GPUs; SOR above GAR is capacity held back' },
};

function draw(samples) {
  const points = samples.map((s) => ({ ...s, t: parseTime(s.at) }));
  const last = points[points.length - 1];
  const tiles = last
    ? [tile('GPUs', gpus(last.gpus), 'capacity now', 'total-gpus'),
      tile('Allocated', gpus(last.allocated), `of ${gpus(last.gpus)} GPUs`, 'total-allocated'),
      tile('Busy', gpus(last.used), 'GPUs of work: utilisation summed', 'total-used'),
      tile(`${RATES.gar.words} (GAR)`, percent(last.gar), 'allocated / capacity', 'total-gar', RATES.gar.hint),
      tile(`${RATES.sor.words} (SOR)`, percent(last.sor), `${gpus(last.reserved)} GPUs held for waiting jobs`,
        'total-sor', RATES.sor.hint),
      tile(`${RATES.gfr.words} (GFR)`, percent(last.gfr), 'of GPU nodes', 'total-gfr', RATES.gfr.hint)]
    : [h('p', { class: 'muted' }, 'No samples yet: the control plane records one every metering interval.')];
  const rates = lineChart([
    { name: `${RATES.gar.words} (GAR)`, points: points.map((p) => [p.t, p.gar]), area: true },
    { name: `${RATES.sor.words} (SOR)`, points: points.map((p) => [p.t, p.sor]) },
    { name: `${RATES.gfr.words} (GFR)`, points: points.map((p) => [p.t, p.gfr]) },
  ], { yMax: 1, yFormat: (v) => `${Math.round(v * 100)}%`, valueFormat: percent,
    caption: 'Share of GPUs allocated (and held for waiting jobs), and of GPU nodes partly allocated' });
  const amounts = lineChart([
    { name: 'allocated GPUs', points: points.map((p) => [p.t, p.allocated]), area: true },
    { name: 'used GPUs', points: points.map((p) => [p.t, p.used]), area: true },
    { name: 'capacity', points: points.map((p) => [p.t, p.gpus]), dash: true },
  ], { yFormat: gpus, caption: 'GPUs allocated vs used' });
  return [h('div', { class: 'tiles' }, tiles), h('div', { class: 'charts' }, rates, amounts)];
}
