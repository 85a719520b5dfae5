// Who uses what, where: the open allocations the caller may see (GET /top) and GPU-hours over the last 30 days
// per project and per user (GET /usage?by=project, ?by=user) as bar charts. Three panels, one call each.

import { api } from '../api.js';
import { barChart } from '../charts.js';
import { h, idRef, panel, table } from '../dom.js';
import { gpus, hours, since } from '../format.js';

const TOP_REFRESH_MS = 5000;
const USAGE_REFRESH_MS = 30000;

function allocations(rows) {
  const total = rows.reduce((sum, r) => sum + r.gpus, 0);
  return table([
    { label: 'project', cell: (r) => r.project },
    { label: 'user', cell: (r) => r.user },
    { label: 'node', cell: (r) => r.node },
    { label: 'job', cell: (r) => idRef(r.job, `#/jobs/${encodeURIComponent(r.job)}`) },
    { label: 'GPUs', class: 'num', cell: (r) => gpus(r.gpus) },
    { label: 'models', cell: (r) => r.gpu_models.join(', ') },
    { label: 'for', class: 'num', cell: (r) => since(r.since) },
  ], rows, {
    empty: 'No GPU is allocated to anything you can see.',
    rowAttrs: (r) => ({ dataset: { job: r.job, project: r.project } }),
    foot: h('tr', {}, h('th', { colspan: 4 }, `${rows.length} allocations`), h('th', { class: 'num' }, gpus(total)),
      h('th', { colspan: 2 })),
  });
}

function hoursChart(rows, what) {
  const sorted = [...rows].sort((a, b) => b.gpu_hours - a.gpu_hours);
  const bars = sorted.map((r) => ({ label: r.key || '(none)', value: r.gpu_hours,
    title: `${what} ${r.key}: ${hours(r.gpu_hours)} GPU-hours, cost ${r.cost}` }));
  return barChart(bars, { format: hours, unit: 'GPU-hours' });
}

export function render(ctx) {
  const top = panel('Allocated now', () => api('/top'), allocations, { id: 'top' });
  const byProject = panel('GPU-hours per project, last 30 days', () => api('/usage', { query: { by: 'project' } }),
    (rows) => hoursChart(rows, 'project'), { id: 'hours-by-project' });
  const byUser = panel('GPU-hours per user, last 30 days', () => api('/usage', { query: { by: 'user' } }),
    (rows) => hoursChart(rows, 'user'), { id: 'hours-by-user' });
  ctx.every(TOP_REFRESH_MS, top.refresh);
  ctx.every(USAGE_REFRESH_MS, () => {
    byProject.refresh();
    byUser.refresh();
  });
  return h('div', { class: 'page usage' }, top.el, h('div', { class: 'two' }, byProject.el, byUser.el),
    h('p', { class: 'muted small' }, 'Bills and date ranges: see ', h('a', { href: '#/showback' }, 'Showback'), '.'));
}
