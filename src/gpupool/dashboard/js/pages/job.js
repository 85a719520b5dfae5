// One job: its fields and allocations (GET /jobs/{id}), why it is pending (GET /jobs/{id}/why), its events
// (GET /jobs/{id}/events) and its log (GET /jobs/{id}/logs, followed every 2 s from X-Next-Offset). Cancel, and approve
// or deny for a job awaiting approval (approval.js).

import { api } from '../api.js';
import { decisionButtons } from '../approval.js';
import { badge, confirmClick, errorBox, h, idRef, panel, table } from '../dom.js';
import { TERMINAL, dateTime, duration, parseTime } from '../format.js';

const LOG_POLL_MS = 2000;
const LOG_KEEP_CHARS = 2 << 20; // the page keeps the last 2 MiB of a log

function field(name, value) {
  return [h('dt', {}, name), h('dd', { dataset: { field: name } }, value ?? '—')];
}

/** An argument as a shell would need it written: quoted when it holds anything but plain characters. */
function shellWord(arg) {
  return /^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replaceAll("'", "'\\''")}'`;
}

function runtime(job) {
  const start = parseTime(job.started_at);
  if (!start) return '—';
  return duration(((parseTime(job.finished_at) ?? new Date()) - start) / 1000);
}

function cancelButton(ctx, job, onDone) {
  if (TERMINAL.has(job.state) || ctx.me.role === 'viewer') return null;
  const button = h('button', { type: 'button', id: 'cancel-job', class: 'danger' }, 'Cancel job');
  return confirmClick(button, 'Click again to cancel', async () => {
    button.disabled = true;
    try {
      await api(`/jobs/${encodeURIComponent(job.id)}/cancel`, { method: 'POST' });
      onDone();
    } catch (error) {
      button.replaceWith(errorBox(error));
    }
  });
}

function allocations(job) {
  return table([
    { label: 'task', class: 'num', cell: (a) => a.task_index },
    { label: 'attempt', class: 'num', cell: (a) => a.attempt },
    { label: 'node', cell: (a) => a.node },
    { label: 'GPUs', cell: (a) => a.gpus.map((g) => `#${g.index}${g.milli < 1000 ? ` (${g.milli / 1000})` : ''}`)
      .join(' ') },
    { label: 'state', cell: (a) => badge(a.state) },
    { label: 'started', cell: (a) => dateTime(a.started_at) },
    { label: 'released', cell: (a) => dateTime(a.released_at) },
    { label: 'exit', class: 'num', cell: (a) => a.exit_code ?? '—' },
  ], job.allocations, { empty: 'Not placed yet.' });
}

function jobFields(ctx, job, refreshAll) {
  const tags = Object.entries(job.tags).map(([k, v]) => `${k}=${v}`).join(', ');
  return [
    h('div', { class: 'job-head' }, badge(job.state), h('span', { class: 'spacer' }),
      decisionButtons(ctx, job, refreshAll), cancelButton(ctx, job, refreshAll)),
    h('dl', { class: 'fields' },
      field('id', idRef(job.id)), field('name', job.name || '—'), field('state', job.state),
      field('project', job.project), field('user', job.user), field('queue', job.queue),
      field('GPUs', job.tasks > 1 ? `${job.tasks} tasks × ${job.gpus}` : job.gpus),
      field('priority', job.priority), field('attempt', job.attempt), field('preemptions', job.preemptions),
      field('command', h('code', {}, job.command.map(shellWord).join(' '))), field('tags', tags || '—'),
      field('submitted', dateTime(job.submitted_at)), field('started', dateTime(job.started_at)),
      field('finished', dateTime(job.finished_at)), field('runtime', runtime(job)), field('exit code', job.exit_code)),
    h('h3', {}, 'Allocations'), allocations(job),
  ];
}

function why(reason) {
  if (!reason) return h('p', { class: 'muted' }, 'No reason recorded.');
  const details = reason.details ?? [];
  const keys = [...new Set(details.flatMap((d) => Object.keys(d)))];
  return [h('p', { id: 'why-message' }, badge(reason.kind, 'reason'), ' ', reason.message),
    details.length ? table(keys.map((k) => ({ label: k, cell: (d) => formatDetail(d[k]) })), details) : null];
}

function formatDetail(value) {
  if (value === undefined || value === null) return '';
  return typeof value === 'object' ? JSON.stringify(value) : String(value);
}

function events(list) {
  return table([
    { label: 'at', cell: (e) => dateTime(e.at) },
    { label: 'event', cell: (e) => badge(e.kind, 'event') },
    { label: 'message', cell: (e) => e.message },
  ], list, { empty: 'No events.' });
}

/** The log panel: fetches from the last offset every 2 s while "follow" is on and the job may still write. */
function logPanel(ctx, id, onState) {
  const pre = h('pre', { class: 'log', id: 'log', tabindex: 0 });
  const status = h('span', { class: 'muted small', role: 'status' });
  const follow = h('input', { type: 'checkbox', id: 'follow', checked: true });
  const task = h('select', { 'aria-label': 'task', hidden: true }, h('option', { value: '0' }, 'task 0'));
  let offset = 0;
  let finished = false;
  let busy = false;
  async function poll() {
    if (busy) return;
    busy = true;
    try {
      const response = await api(`/jobs/${encodeURIComponent(id)}/logs`, { query: { offset, task: task.value },
        as: 'response' });
      const text = await response.text();
      const state = response.headers.get('X-Job-State');
      offset = Number(response.headers.get('X-Next-Offset') ?? offset + text.length);
      if (text) {
        const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.textContent = (pre.textContent + text).slice(-LOG_KEEP_CHARS);
        if (atBottom) pre.scrollTop = pre.scrollHeight;
      }
      // The last lines of a finished job may still be on their way from the agent: stop after an empty answer.
      finished = TERMINAL.has(state) && !text;
      status.textContent = `${offset} bytes${finished ? ' · job finished' : follow.checked ? ' · following' : ''}`;
      onState(state);
    } catch (error) {
      status.replaceChildren(errorBox(error));
    } finally {
      busy = false;
    }
  }
  task.addEventListener('change', () => {
    offset = 0;
    pre.textContent = '';
    poll();
  });
  follow.addEventListener('change', () => follow.checked && poll());
  ctx.every(LOG_POLL_MS, () => follow.checked && !finished && poll());
  poll();
  const el = h('section', { class: 'panel', id: 'logs' },
    h('header', {}, h('h2', {}, 'Log'), task, h('label', { class: 'small' }, follow, ' follow'),
      h('span', { class: 'spacer' }), status), h('div', { class: 'panel-body' }, pre));
  function setTasks(count) { // a gang job: one log per task
    if (count === task.options.length) return;
    task.replaceChildren(...Array.from({ length: count }, (_, i) => h('option', { value: String(i) }, `task ${i}`)));
    task.hidden = count < 2;
  }
  return { el, setTasks };
}

export function render(ctx, id) {
  const path = `/jobs/${encodeURIComponent(id)}`;
  let known = null;
  const refreshAll = () => [job, reason, history].forEach((p) => p.refresh());
  // The log answers carry the job's state: when it changes, the other panels reload (no extra polling).
  const log = logPanel(ctx, id, (state) => state && known && state !== known && refreshAll());
  const job = panel('Job', async () => {
    const out = await api(path);
    known = out.state;
    log.setTasks(out.tasks);
    return out;
  }, (out) => jobFields(ctx, out, refreshAll), { id: 'job' });
  const reason = panel('Why pending', () => api(`${path}/why`), why, { id: 'why' });
  const history = panel('Events', () => api(`${path}/events`), events, { id: 'events' });
  return h('div', { class: 'page job' }, h('p', {}, h('a', { href: '#/jobs' }, '← all jobs')), job.el,
    h('div', { class: 'two' }, reason.el, history.el), log.el);
}
