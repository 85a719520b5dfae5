// Queues (GET /queues, one call) as a tree: guaranteed, used, limit and fair share of GPUs per queue as bars on one
// scale, and how long the oldest pending job has waited.

import { api } from '../api.js';
import { quotaBar } from '../charts.js';
import { h, panel, table } from '../dom.js';
import { gpus, since } from '../format.js';

const REFRESH_MS = 5000;

/** A quota's GPUs as a number, or null when it sets none. */
function amount(resources) {
  const value = resources?.gpus;
  return value === undefined || value === null ? null : Number(value);
}

const keyOf = (org, name) => `${org ?? ''}/${name}`;

/**
 * The queues depth first, each child right under its parent (siblings by name), with `depth` and `parentKey` set.
 * A queue's `parent` names its organisation's queue of that name, else a shared one (as the API resolves it); a
 * queue whose parent the viewer cannot see is drawn as a root.
 */
export function treeOrder(queues) {
  const byKey = new Map(queues.map((q) => [keyOf(q.org, q.name), q]));
  const parentOf = (q) => (q.parent ? byKey.get(keyOf(q.org, q.parent)) ?? byKey.get(keyOf(null, q.parent)) : null);
  const children = new Map();
  for (const q of queues) {
    const parent = parentOf(q);
    const key = parent ? keyOf(parent.org, parent.name) : null;
    children.set(key, [...(children.get(key) ?? []), q]);
  }
  const out = [];
  const visit = (parentKey, depth) => {
    const mine = (children.get(parentKey) ?? []).sort((a, b) => a.name.localeCompare(b.name));
    for (const q of mine) {
      const key = keyOf(q.org, q.name);
      out.push({ ...q, depth, parentKey });
      if (depth < 16) visit(key, depth + 1); // a loop cannot be made through the API; stop anyway
    }
  };
  visit(null, 0);
  return out;
}

function draw(queues) {
  const rows = treeOrder(queues).map((q) => ({ ...q, g: amount(q.guaranteed) ?? 0, cap: amount(q.limit) }));
  const scale = Math.max(1, ...rows.flatMap((q) => [q.g, q.used_gpus, q.cap ?? 0, q.fair_share_gpus])) * 1.05;
  const legend = h('p', { class: 'quota-legend small' },
    h('span', { class: 'key guaranteed' }), ' guaranteed ', h('span', { class: 'key used' }), ' used ',
    h('span', { class: 'key borrowed' }), ' used above the guarantee (borrowed) ', h('span', { class: 'key limit' }),
    ' limit ', h('span', { class: 'key fair' }), ' fair share');
  return [legend, table([
    { label: 'queue', cell: (q) => h('span', { class: `depth-${Math.min(q.depth, 4)}` }, q.depth ? '└ ' : '', q.name) },
    { label: 'org', cell: (q) => q.org ?? 'shared' },
    { label: 'GPUs', class: 'bar-cell', cell: (q) => quotaBar({ used: q.used_gpus, guaranteed: q.g, limit: q.cap,
      fairShare: q.fair_share_gpus, scale }) },
    { label: 'used', class: 'num', cell: (q) => gpus(q.used_gpus) },
    { label: 'guaranteed', class: 'num', cell: (q) => gpus(q.g) },
    { label: 'limit', class: 'num', cell: (q) => (q.cap === null ? '—' : gpus(q.cap)) },
    { label: 'fair share', class: 'num', cell: (q) => gpus(q.fair_share_gpus) },
    { label: 'running', class: 'num', cell: (q) => q.running_jobs },
    { label: 'pending', class: 'num', cell: (q) => q.pending_jobs },
    { label: 'longest wait', class: 'num wait', cell: (q) => (q.oldest_pending_at ? since(q.oldest_pending_at) : '—') },
    { label: 'weight', class: 'num', cell: (q) => q.over_quota_weight },
  ], rows, { empty: 'No queues you can see.',
    rowAttrs: (q) => ({ dataset: { queue: q.name, org: q.org ?? '', parent: q.parent ?? '', depth: String(q.depth) } }) })];
}

export function render(ctx) {
  const queues = panel('Queues', () => api('/queues'), draw, { id: 'queues' });
  ctx.every(REFRESH_MS, queues.refresh);
  return h('div', { class: 'page queues' }, queues.el);
}
