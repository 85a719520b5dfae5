// Jobs awaiting approval (GET /jobs?state=pending_approval, one call), oldest first, with Approve and Deny for those
// allowed to decide (approval.js). `onDecided` runs after each decision (the overview reloads what it changed).

import { api } from '../api.js';
import { APPROVER, decisionButtons } from '../approval.js';
import { h, idRef, panel, table } from '../dom.js';
import { since } from '../format.js';

const LIMIT = 100;

export function approvalsPanel(ctx, onDecided) {
  const columns = [
    { label: 'job', cell: (j) => idRef(j.id, `#/jobs/${encodeURIComponent(j.id)}`) },
    { label: 'name', cell: (j) => j.name || '—' },
    { label: 'project', cell: (j) => j.project },
    { label: 'user', cell: (j) => j.user },
    { label: 'queue', cell: (j) => j.queue },
    { label: 'GPUs', class: 'num', cell: (j) => (j.tasks > 1 ? `${j.tasks} × ${j.gpus}` : j.gpus) },
    { label: 'waiting', class: 'num', cell: (j) => since(j.submitted_at) },
  ];
  if (ctx.atLeast(APPROVER)) {
    columns.push({ label: 'decide', cell: (j) => decisionButtons(ctx, j, () => onDecided()) });
  }
  const load = async () => (await api('/jobs', { query: { state: 'pending_approval', limit: LIMIT } })).items
    .reverse();
  const draw = (jobs) => table(columns, jobs, { empty: 'No job awaits approval.',
    rowAttrs: (j) => ({ dataset: { job: j.id } }) });
  const approvals = panel('Awaiting approval', load, draw, { id: 'approvals' });
  return approvals;
}
