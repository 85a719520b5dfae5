// Approve and deny a job awaiting approval (POST /jobs/{id}/approve and /deny). The buttons show only to those the
// API lets decide (the project-admin role and above); the API checks again. Deny ends the job: it takes a second click.

import { api } from './api.js';
import { confirmClick, errorBox, h } from './dom.js';

export const APPROVER = 'project-admin';

/** The Approve and Deny buttons for `job`, or null when it awaits no approval or the viewer may not decide.
 * `onDone(verb)` runs after the API took the decision. */
export function decisionButtons(ctx, job, onDone) {
  if (job.state !== 'pending_approval' || !ctx.atLeast(APPROVER)) return null;
  const button = (verb, label, extra = '') => h('button', { type: 'button', class: `${verb}${extra}`,
    dataset: { action: verb, job: job.id } }, label);
  const approve = button('approve', 'Approve');
  const deny = button('deny', 'Deny', ' danger');
  const group = h('span', { class: 'decision' }, approve, deny);
  async function decide(verb) {
    approve.disabled = deny.disabled = true;
    try {
      await api(`/jobs/${encodeURIComponent(job.id)}/${verb}`, { method: 'POST', body: {} });
      onDone(verb);
    } catch (error) {
      group.replaceChildren(errorBox(error));
    }
  }
  approve.addEventListener('click', () => decide('approve'));
  confirmClick(deny, 'Click again to deny', () => decide('deny'));
  return group;
}
