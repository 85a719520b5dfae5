// Nodes that need a look (GET /nodes, one call): every node not ready (unreachable, lost, draining, reset…) or
// cordoned, with how long since it was last heard; a count of those ready.

import { api } from '../api.js';
import { badge, h, panel, table, tile } from '../dom.js';
import { since } from '../format.js';

/** What is wrong with a node, as badges' words: its state unless ready, and cordoned or draining. */
export function troubles(node) {
  const out = node.state === 'ready' ? [] : [node.state];
  if (node.drain_since && node.state !== 'draining') out.push('draining');
  if (node.cordoned) out.push('cordoned');
  return out;
}

function draw(nodes) {
  const odd = nodes.filter((n) => troubles(n).length);
  const counts = new Map();
  for (const word of odd.flatMap(troubles)) counts.set(word, (counts.get(word) ?? 0) + 1);
  const note = [...counts.entries()].map(([word, n]) => `${n} ${word}`).join(', ');
  const ready = nodes.length - odd.length;
  const tiles = h('div', { class: 'tiles' },
    tile('Nodes ready', `${ready} / ${nodes.length}`, note || (nodes.length ? 'all nodes ready' : 'no node has joined'),
      'nodes-ready'));
  const anySite = odd.some((n) => n.site);
  return [tiles, table([
    { label: 'node', cell: (n) => n.name },
    anySite ? { label: 'site', cell: (n) => n.site || '—' } : null,
    { label: 'state', cell: (n) => troubles(n).map((word) => badge(word)) },
    { label: 'GPUs', class: 'num', cell: (n) => n.gpus.length },
    { label: 'last heard', class: 'num', cell: (n) => (n.last_seen ? `${since(n.last_seen)} ago` : '—') },
  ].filter(Boolean), odd, { empty: 'Every node is ready and schedulable.',
    rowAttrs: (n) => ({ dataset: { node: n.name, state: n.state } }) })];
}

export function attentionPanel() {
  return panel('Nodes needing attention', () => api('/nodes'), draw, { id: 'attention' });
}
