// Queues (GET /queues, one call): guaranteed, used, limit and fair share of GPUs per queue as bars on one scale.

import { api } from '../api.js';
import { quotaBar } from '../charts.js';
import { h, panel, table } from '../dom.js';
import { gpus } from '../format.js';

const REFRESH_MS = 5000;

/** A quota's GPUs as a number, or null when it sets none. */
function amount(resources) {
  const value = resources?.gpus;
  return value === undefined || value === null ? null : Number(value);
}

function draw(queues) {
  const rows = queues.map((q) => ({ ...q, g: amount(q.guaranteed) ?? 0, cap: amount(q.limit) }));
  const scale = Math.max(1, ...rows.flatMap((q) => [q.g, q.used_gpus, q.cap ?? 0, q.fair_share_gpus])) * 1.05;
  const depth = (q) => (q.parent ? 1 + depth(rows.find((p) => p.name === q.parent) ?? {}) : 0);
  const legend = h('p', { class: 'quota-legend small' },
    h('span', { class: 'key guaranteed' }), ' guaranteed ', h('span', { class: 'key used' }), ' used ',
    h('span', { class: 'key borrowed' }), ' used above the guarantee (borrowed) ', h('span', { class: 'key limit' }),
    ' limit ', h('span', { class: 'key fair' }), ' fair share');
  return [legend, table([
    { label: 'queue', cell: (q) => h('span', { class: `depth-${Math.min(depth(q), 4)}` }, q.name) },
    { label: 'org', cell: (q) => q.org ?? 'shared' },
    { label: 'GPUs', class: 'bar-cell', cell: (q) => quotaBar({ used: q.used_gpus, guaranteed: q.g, limit: q.cap,
      fairShare: q.fair_share_gpus, scale }) },
    { label: 'used', class: 'num', cell: (q) => gpus(q.used_gpus) },
    { label: 'guaranteed', class: 'num', cell: (q) => gpus(q.g) },
    { label: 'limit', class: 'num', cell: (q) => (q.cap === null ? '—' : gpus(q.cap)) },
    { label: 'fair share', class: 'num', cell: (q) => gpus(q.fair_share_gpus) },
    { label: 'running', class: 'num', cell: (q) => q.running_jobs },
    { label: 'pending', class: 'num', cell: (q) => q.pending_jobs },
    { label: 'weight', class: 'num', cell: (q) => q.over_quota_weight },
  ], rows, { empty: 'No queues you can see.', rowAttrs: (q) => ({ dataset: { queue: q.name } }) })];
}

export function render(ctx) {
  const queues = panel('Queues', () => api('/queues'), draw, { id: 'queues' });
  ctx.every(REFRESH_MS, queues.refresh);
  return h('div', { class: 'page queues' }, queues.el);
}
