// What waits (GET /queues, one call): pending jobs in all the queues the viewer sees, the longest wait, and the
// queues that hold pending jobs, longest wait first.

import { api } from '../api.js';
import { h, panel, table, tile } from '../dom.js';
import { dateTime, parseTime, since } from '../format.js';

function draw(queues) {
  const waiting = queues.filter((q) => q.pending_jobs > 0)
    .sort((a, b) => (parseTime(a.oldest_pending_at) ?? 0) - (parseTime(b.oldest_pending_at) ?? 0));
  const pending = waiting.reduce((sum, q) => sum + q.pending_jobs, 0);
  const oldest = waiting.find((q) => q.oldest_pending_at);
  const tiles = h('div', { class: 'tiles' },
    tile('Pending jobs', pending, `in ${waiting.length} of ${queues.length} queues`, 'pending-count'),
    tile('Longest wait', oldest ? since(oldest.oldest_pending_at) : '—',
      oldest ? `queue ${oldest.name}, since ${dateTime(oldest.oldest_pending_at)}` : 'nothing is waiting',
      'oldest-wait'));
  return [tiles, table([
    { label: 'queue', cell: (q) => q.name },
    { label: 'pending', class: 'num', cell: (q) => q.pending_jobs },
    { label: 'longest wait', class: 'num', cell: (q) => (q.oldest_pending_at ? since(q.oldest_pending_at) : '—') },
    { label: 'running', class: 'num', cell: (q) => q.running_jobs },
  ], waiting, { empty: 'No queue has a pending job.', rowAttrs: (q) => ({ dataset: { queue: q.name } }) })];
}

export function waitingPanel() {
  return panel('Waiting', () => api('/queues'), draw, { id: 'waiting' });
}
