// Showback: GPU-hours and cost per project, user, queue, GPU model, job or tag between two dates
// (GET /usage?by=&from=&to=, one call) as a bar chart and a table, and monthly statements per project
// (GET /usage/statement?project=&month=&format=html|csv), fetched with the token and shown in a sandboxed frame.

import { api, apiUrl } from '../api.js';
import { barChart } from '../charts.js';
import { errorBox, h, panel, table } from '../dom.js';
import { hours, isoDate, money } from '../format.js';

const GROUPS = [['project', 'project'], ['user', 'user'], ['queue', 'queue'], ['model', 'GPU model'], ['job', 'job'],
  ['tag', 'tag…']];

/** [label, from, to] in calendar days: the last 30 days and today, this month, last month. */
function presets() {
  const now = new Date();
  const day = (offset) => isoDate(new Date(now.getFullYear(), now.getMonth(), now.getDate() + offset));
  const month = (offset) => isoDate(new Date(now.getFullYear(), now.getMonth() + offset, 1));
  return [['Last 30 days', day(-30), day(1)], ['This month', month(0), month(1)], ['Last month', month(-1), month(0)]];
}

const TAG_KEY = /^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$/; // the API's tag key syntax
const DAY = /^\d{4}-\d{2}-\d{2}$/;

/**
 * The report's parameters from the URL (#/showback?by=&tag=&from=&to=), each only if it is a valid value (the page
 * shows them), else the default: last 30 days by project.
 */
function params(query) {
  const [, from, to] = presets()[0];
  const by = GROUPS.some(([g]) => g === query.by) ? query.by : 'project';
  const valid = (value, syntax, otherwise) => (syntax.test(value ?? '') ? value : otherwise);
  return { by, tag: valid(query.tag, TAG_KEY, ''), from: valid(query.from, DAY, from), to: valid(query.to, DAY, to) };
}

function form(ctx, p) {
  const by = h('select', { id: 'group-by', 'aria-label': 'group by' },
    GROUPS.map(([v, l]) => h('option', { value: v }, l)));
  by.value = p.by;
  const tag = h('input', { id: 'tag-key', placeholder: 'tag key', value: p.tag, hidden: p.by !== 'tag',
    'aria-label': 'tag key', size: 10 });
  const from = h('input', { id: 'from', type: 'date', value: p.from, required: true, 'aria-label': 'from' });
  const to = h('input', { id: 'to', type: 'date', value: p.to, required: true, 'aria-label': 'to' });
  by.addEventListener('change', () => { tag.hidden = by.value !== 'tag'; });
  const apply = (f = from.value, t = to.value) => ctx.navigate('showback', '', { by: by.value, tag: tag.value, from: f,
    to: t });
  const el = h('form', { class: 'filters', id: 'showback-form' },
    h('label', {}, 'by ', by), tag, h('label', {}, 'from ', from), h('label', {}, 'to ', to),
    h('button', { type: 'submit' }, 'Apply'),
    presets().map(([label, f, t]) => h('button', { type: 'button', class: 'link', onclick: () => apply(f, t) }, label)),
    h('span', { class: 'muted small' }, 'UTC dates; "to" is exclusive'));
  el.addEventListener('submit', (event) => {
    event.preventDefault();
    apply();
  });
  return el;
}

function statementLink(project, month, show) {
  const url = apiUrl('/usage/statement', { project, month, format: 'html' });
  return h('a', { href: url.pathname + url.search, class: 'statement-link', dataset: { project },
    onclick: (event) => {
      event.preventDefault(); // the API wants the bearer token, which a plain link cannot send
      show(project, month, 'html');
    } }, `statement ${month}`);
}

function report(rows, p, month, show) {
  const total = rows.reduce((s, r) => ({ hours: s.hours + r.gpu_hours, cost: s.cost + r.cost, n: s.n + r.entries }),
    { hours: 0, cost: 0, n: 0 });
  const sorted = [...rows].sort((a, b) => b.gpu_hours - a.gpu_hours);
  const columns = [
    { label: p.by === 'tag' ? `tag ${p.tag}` : p.by, cell: (r) => r.key || '(none)' },
    { label: 'GPU-hours', class: 'num gpu-hours', cell: (r) => hours(r.gpu_hours) },
    { label: 'cost', class: 'num', cell: (r) => money(r.cost) },
    { label: 'share', class: 'num', cell: (r) => `${total.hours ? ((100 * r.gpu_hours) / total.hours).toFixed(1) : 0}%`
    },
    { label: 'ledger entries', class: 'num', cell: (r) => r.entries },
  ];
  if (p.by === 'project') columns.push({ label: 'statement', cell: (r) => statementLink(r.key, month, show) });
  const foot = h('tr', {}, h('th', {}, 'total'), h('th', { class: 'num', id: 'total-gpu-hours' }, hours(total.hours)),
    h('th', { class: 'num' }, money(total.cost)), h('th', {}), h('th', { class: 'num' }, total.n),
    p.by === 'project' ? h('th', {}) : null);
  return [
    barChart(sorted.map((r) => ({ label: r.key || '(none)', value: r.gpu_hours })),
      { format: hours, unit: 'GPU-hours' }),
    table(columns, sorted, { empty: 'No usage in this window.', foot,
      rowAttrs: (r) => ({ dataset: { key: r.key, gpuHours: String(r.gpu_hours), cost: String(r.cost) } }) }),
  ];
}

/** The statement panel: pick a project and month; the answer shows in a sandboxed frame and can be saved. */
function statementPanel(ctx) {
  const month = h('input', { id: 'month', type: 'month', value: isoDate(new Date()).slice(0, 7),
    'aria-label': 'month' });
  const project = h('input', { id: 'statement-project', list: 'project-names', value: ctx.me.projects[0] ?? '',
    'aria-label': 'project', size: 14 });
  const names = h('datalist', { id: 'project-names' }, ctx.me.projects.map((p) => h('option', { value: p })));
  const frame = h('iframe', { id: 'statement', sandbox: '', title: 'monthly statement', hidden: true });
  const links = h('span', { class: 'small' });
  let saved = null; // the blob URL of the last statement, released when the next one comes
  async function show(name, when, format) {
    project.value = name;
    month.value = when;
    links.replaceChildren('Loading…');
    try {
      const text = await api('/usage/statement', { query: { project: name, month: when, format }, as: 'text' });
      if (saved) URL.revokeObjectURL(saved);
      saved = URL.createObjectURL(new Blob([text], { type: format === 'html' ? 'text/html' : 'text/csv' }));
      links.replaceChildren(h('a', { href: saved, download: `statement-${name}-${when}.${format}` },
        `save ${format.toUpperCase()}`));
      if (format === 'html') {
        frame.srcdoc = text;
        frame.hidden = false;
      }
    } catch (error) {
      links.replaceChildren(errorBox(error));
    }
  }
  const el = h('section', { class: 'panel', id: 'statements' },
    h('header', {}, h('h2', {}, 'Monthly statement'), h('span', { class: 'spacer' })),
    h('div', { class: 'panel-body' },
      h('div', { class: 'filters' }, h('label', {}, 'project ', project), names, h('label', {}, 'month ', month),
        h('button', { type: 'button', id: 'view-statement', onclick: () => show(project.value, month.value, 'html') },
          'View'),
        h('button', { type: 'button', onclick: () => show(project.value, month.value, 'csv') }, 'CSV'), links),
      frame));
  return { el, show, month: () => month.value };
}

export function render(ctx, _arg, query) {
  const p = params(query);
  const statements = statementPanel(ctx);
  const by = p.by === 'tag' ? `tag:${p.tag}` : p.by;
  const title = `GPU-hours by ${p.by === 'tag' ? `tag ${p.tag}` : p.by}, ${p.from} to ${p.to}`;
  const usage = p.by === 'tag' && !p.tag ? { el: errorBox('Name a tag key to group by.') }
    : panel(title, () => api('/usage', { query: { by, from: p.from, to: p.to } }),
      (rows) => report(rows, p, statements.month(), statements.show), { id: 'showback' });
  return h('div', { class: 'page showback' }, form(ctx, p), usage.el, statements.el);
}
