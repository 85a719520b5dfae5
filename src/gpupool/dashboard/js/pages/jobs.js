// Jobs (GET /jobs, one call per page of 50), filtered by state; "More" follows the cursor.

import { api } from '../api.js';
import { badge, h, idRef, panel, table } from '../dom.js';
import { JOB_STATES, dateTime } from '../format.js';

const REFRESH_MS = 5000;
const PAGE = 50;

function rows(items) {
  return table([
    { label: 'job', cell: (j) => idRef(j.id, `#/jobs/${encodeURIComponent(j.id)}`) },
    { label: 'name', cell: (j) => j.name },
    { label: 'state', cell: (j) => badge(j.state) },
    { label: 'project', cell: (j) => j.project },
    { label: 'user', cell: (j) => j.user },
    { label: 'queue', cell: (j) => j.queue },
    { label: 'GPUs', class: 'num', cell: (j) => (j.tasks > 1 ? `${j.tasks} × ${j.gpus}` : j.gpus) },
    { label: 'submitted', cell: (j) => dateTime(j.submitted_at) },
  ], items, { empty: 'No jobs.', rowAttrs: (j) => ({ dataset: { job: j.id, state: j.state } }) });
}

export function render(ctx, _arg, query) {
  const state = JOB_STATES.includes(query.state) ? query.state : '';
  const select = h('select', { id: 'state-filter', 'aria-label': 'state' },
    h('option', { value: '' }, 'all states'), JOB_STATES.map((s) => h('option', { value: s }, s)));
  select.value = state;
  select.addEventListener('change', () => ctx.navigate('jobs', '', { state: select.value }));
  // The panel loads the first page; "More" appends the next one (one call each). Auto-refresh stops once paged.
  let extra = [];
  let cursor = null;
  const more = h('button', { type: 'button', id: 'more-jobs', hidden: true }, 'More');
  async function load() {
    const page = await api('/jobs', { query: { state, limit: PAGE } });
    extra = [];
    cursor = page.next_cursor;
    more.hidden = !cursor;
    return page.items;
  }
  const list = panel('Jobs', load, (items) => rows(items.concat(extra)), { controls: select, id: 'jobs' });
  more.addEventListener('click', async () => {
    const page = await api('/jobs', { query: { state, limit: PAGE, cursor } });
    extra = extra.concat(page.items);
    cursor = page.next_cursor;
    more.hidden = !cursor;
    list.rerender();
  });
  ctx.every(REFRESH_MS, () => extra.length || list.refresh());
  return h('div', { class: 'page jobs' }, list.el, more);
}
