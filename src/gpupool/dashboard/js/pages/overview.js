// Overview: the cluster's figures over time from GET /cluster/samples (one call): current totals, GAR and GFR,
// and GPUs allocated vs used vs capacity.

import { api } from '../api.js';
import { lineChart } from '../charts.js';
import { h, panel, segmented } from '../dom.js';
import { apiMoment, gpus, parseTime, percent } from '../format.js';

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
  ctx.every(REFRESH_MS, cluster.refresh);
  return h('div', { class: 'page overview' }, cluster.el);
}

function tile(label, value, note, id) {
  return h('div', { class: 'tile', id }, h('div', { class: 'tile-label' }, label),
    h('div', { class: 'tile-value' }, value), note ? h('div', { class: 'tile-note muted' }, note) : null);
}

function draw(samples) {
  const points = samples.map((s) => ({ ...s, t: parseTime(s.at) }));
  const last = points[points.length - 1];
  const tiles = last
    ? [tile('GPUs', gpus(last.gpus), 'capacity now', 'total-gpus'),
      tile('Allocated', gpus(last.allocated), `of ${gpus(last.gpus)} GPUs`, 'total-allocated'),
      tile('Used', gpus(last.used), 'utilisation-weighted GPUs', 'total-used'),
      tile('GAR', percent(last.gar), 'allocated / capacity', 'total-gar'),
      tile('GFR', percent(last.gfr), 'GPU nodes partly allocated', 'total-gfr')]
    : [h('p', { class: 'muted' }, 'No samples yet: the control plane records one every metering interval.')];
  const rates = lineChart([
    { name: 'GAR (allocated / capacity)', points: points.map((p) => [p.t, p.gar]), area: true },
    { name: 'GFR (nodes partly allocated)', points: points.map((p) => [p.t, p.gfr]) },
  ], { yMax: 1, yFormat: (v) => `${Math.round(v * 100)}%`, valueFormat: percent,
    caption: 'GPU allocation rate and fragmentation rate' });
  const amounts = lineChart([
    { name: 'allocated GPUs', points: points.map((p) => [p.t, p.allocated]), area: true },
    { name: 'used GPUs', points: points.map((p) => [p.t, p.used]), area: true },
    { name: 'capacity', points: points.map((p) => [p.t, p.gpus]), dash: true },
  ], { yFormat: gpus, caption: 'GPUs allocated vs used' });
  return [h('div', { class: 'tiles' }, tiles), h('div', { class: 'charts' }, rates, amounts)];
}
