// Nodes (GET /nodes, one call). Operators get cordon / uncordon buttons (POST /nodes/{name}/cordon|uncordon,
// which answer with the new node list); nobody else sees them.

import { api } from '../api.js';
import { badge, errorBox, h, panel, table } from '../dom.js';
import { gpus, mib, since } from '../format.js';

const REFRESH_MS = 5000;

function gpuSummary(node) {
  const models = new Map();
  for (const g of node.gpus) models.set(g.model, (models.get(g.model) ?? 0) + 1);
  return [...models.entries()].map(([model, n]) => `${n} × ${model}`).join(', ') || 'none';
}

function actionButton(node, onNodes) {
  const verb = node.cordoned ? 'uncordon' : 'cordon';
  const button = h('button', { type: 'button', class: verb, dataset: { action: verb, node: node.name } },
    node.cordoned ? 'Uncordon' : 'Cordon');
  button.addEventListener('click', async () => {
    button.disabled = true;
    try {
      onNodes(await api(`/nodes/${encodeURIComponent(node.name)}/${verb}`, { method: 'POST' }));
    } catch (error) {
      button.replaceWith(errorBox(error));
    }
  });
  return button;
}

export function render(ctx) {
  const columns = [
    { label: 'node', cell: (n) => n.name },
    { label: 'site', cell: (n) => n.site || '—' },
    { label: 'state', cell: (n) => [badge(n.state), n.cordoned ? badge('cordoned') : null] },
    { label: 'GPUs', cell: gpuSummary },
    { label: 'allocated', class: 'num',
      cell: (n) => `${gpus(n.gpus.reduce((s, g) => s + g.allocated_milli, 0) / 1000)} / ${n.gpus.length}` },
    { label: 'CPUs', class: 'num', cell: (n) => gpus(n.cpu_milli / 1000) },
    { label: 'memory', class: 'num', cell: (n) => mib(n.memory_mib) },
    { label: 'last seen', class: 'num', cell: (n) => (n.last_seen ? `${since(n.last_seen)} ago` : '—') },
  ];
  if (ctx.isOperator) columns.push({ label: 'actions', cell: (n) => actionButton(n, (nodes) => list.show(nodes)) });
  // Sites only where set: no column of dashes on a pool that names none.
  const shown = (list) => columns.filter((c) => c.label !== 'site' || list.some((n) => n.site));
  const draw = (list) => table(shown(list), list, { empty: 'No nodes have joined yet.',
    rowAttrs: (n) => ({ dataset: { node: n.name, cordoned: String(n.cordoned) } }) });
  const list = panel('Nodes', () => api('/nodes'), draw, { id: 'nodes' });
  ctx.every(REFRESH_MS, list.refresh);
  return h('div', { class: 'page nodes' }, list.el);
}
