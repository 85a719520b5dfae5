// Nodes (GET /nodes, one call). Operators get the node actions; nobody else sees them:
// cordon / uncordon (POST /nodes/{name}/cordon|uncordon, answering with the new node list); drain, with a deadline
// chosen beside it, and undrain (POST /nodes/{name}/drain|undrain); remove (DELETE /nodes/{name}, two clicks; a
// node that runs work answers 409 naming it, shown in place of the button). Drain and remove answer with what they
// did, so the list is loaded again after them. Kubernetes nodes (source "kubernetes") are listed beside agents'
// nodes, with what gpupool allocated there; they take no actions here (kubectl cordons and drains them).

import { api } from '../api.js';
import { badge, errorBox, h, panel, table } from '../dom.js';
import { dateTime, duration, gpus, mib, parseTime, since } from '../format.js';

const REFRESH_MS = 5000;
// the deadlines the drain button offers: [seconds or '' for none, label]
const DEADLINES = [['', 'no deadline'], ['600', 'evict in 10 min'], ['3600', 'evict in 1 h'],
  ['7200', 'evict in 2 h'], ['28800', 'evict in 8 h']];

function gpuSummary(node) {
  const models = new Map();
  for (const g of node.gpus) models.set(g.model, (models.get(g.model) ?? 0) + 1);
  return [...models.entries()].map(([model, n]) => `${n} × ${model}`).join(', ') || 'none';
}

function call(button, request, onDone) {
  button.addEventListener('click', async () => {
    button.disabled = true;
    try {
      onDone(await request());
    } catch (error) {
      button.replaceWith(errorBox(error));
    }
  });
  return button;
}

function cordonButton(node, onNodes) {
  const verb = node.cordoned ? 'uncordon' : 'cordon';
  const button = h('button', { type: 'button', class: verb, dataset: { action: verb, node: node.name } },
    node.cordoned ? 'Uncordon' : 'Cordon');
  return call(button, () => api(`/nodes/${encodeURIComponent(node.name)}/${verb}`, { method: 'POST' }), onNodes);
}

function drainControls(node, reload) {
  const path = `/nodes/${encodeURIComponent(node.name)}`;
  if (node.drain_since) {
    const button = h('button', { type: 'button', dataset: { action: 'undrain', node: node.name } }, 'Undrain');
    return call(button, () => api(`${path}/undrain`, { method: 'POST' }), reload);
  }
  const deadline = h('select', { dataset: { deadline: node.name }, 'aria-label': `drain deadline of ${node.name}` },
    DEADLINES.map(([value, label]) => h('option', { value }, label)));
  const button = h('button', { type: 'button', dataset: { action: 'drain', node: node.name } }, 'Drain');
  call(button, () => api(`${path}/drain`, { method: 'POST',
    body: deadline.value ? { deadline_s: Number(deadline.value) } : {} }), reload);
  return h('span', { class: 'drain' }, deadline, button);
}

function removeButton(node, reload) {
  const button = h('button', { type: 'button', class: 'danger', dataset: { action: 'remove', node: node.name } },
    'Remove');
  let armed = false;
  button.addEventListener('click', async () => {
    if (!armed) {
      armed = true;
      button.textContent = 'Click again to remove';
      setTimeout(() => { armed = false; button.textContent = 'Remove'; }, 5000);
      return;
    }
    button.disabled = true;
    try {
      await api(`/nodes/${encodeURIComponent(node.name)}`, { method: 'DELETE' });
      reload();
    } catch (error) {
      button.replaceWith(errorBox(error));
    }
  });
  return button;
}

/** The node's state badges: liveness, then cordoned, draining (with its deadline), drained or removing. */
function stateCell(node) {
  const out = [badge(node.state)];
  const drain = { dataset: { drain: node.name } };
  if (node.removing) out.push(h('span', { class: 'badge badge-draining', ...drain }, 'removing'));
  else if (node.drain_since && !node.tasks) out.push(h('span', { class: 'badge badge-cordoned', ...drain }, 'drained'));
  else if (node.drain_since) {
    const at = parseTime(node.drain_deadline);
    const left = at ? (at.getTime() - Date.now()) / 1000 : null;
    const words = at ? `deadline ${dateTime(at)}, ${left > 0 ? `in ${duration(left)}` : 'passed'}` : 'no deadline';
    out.push(h('span', { class: 'badge badge-draining', title: words, ...drain }, `draining (${words})`));
  } else if (node.cordoned) out.push(badge('cordoned'));
  return out;
}

export function render(ctx) {
  const columns = [
    { label: 'node', cell: (n) => n.name },
    { label: 'source', cell: (n) => n.source },
    { label: 'site', cell: (n) => n.site || '—' },
    { label: 'state', cell: stateCell },
    { label: 'GPUs', cell: gpuSummary },
    { label: 'allocated', class: 'num',
      cell: (n) => `${gpus(n.gpus.reduce((s, g) => s + g.allocated_milli, 0) / 1000)} / ${n.gpus.length}` },
    { label: 'CPUs', class: 'num', cell: (n) => gpus(n.cpu_milli / 1000) },
    { label: 'memory', class: 'num', cell: (n) => mib(n.memory_mib) },
    { label: 'last seen', class: 'num', cell: (n) => (n.last_seen ? `${since(n.last_seen)} ago` : '—') },
  ];
  const reload = () => list.refresh();
  if (ctx.isOperator) {
    // a Kubernetes node is cordoned and drained with kubectl, not here
    columns.push({ label: 'actions', cell: (n) => (n.source === 'kubernetes' ? 'kubectl' : h('span', { class: 'actions' },
      n.drain_since ? null : cordonButton(n, (nodes) => list.show(nodes)), drainControls(n, reload),
      removeButton(n, reload))) });
  }
  // Sites only where set: no column of dashes on a pool that names none.
  const shown = (nodes) => columns.filter((c) => c.label !== 'site' || nodes.some((n) => n.site));
  const draw = (nodes) => table(shown(nodes), nodes, { empty: 'No nodes have joined yet.',
    rowAttrs: (n) => ({ dataset: { node: n.name, cordoned: String(n.cordoned), draining: String(!!n.drain_since) } }) });
  const list = panel('Nodes', () => api('/nodes'), draw, { id: 'nodes' });
  ctx.every(REFRESH_MS, list.refresh);
  return h('div', { class: 'page nodes' }, list.el);
}
