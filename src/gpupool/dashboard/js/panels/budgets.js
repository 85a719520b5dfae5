// Budgets and their burn (GET /budgets, one call): per budget, what its period used of it, how much of the period
// has gone, and where the budget ends at this pace. A hard budget stops new jobs once used up; a soft one warns.

import { api } from '../api.js';
import { badge, h, panel, table } from '../dom.js';
import { dateTime, hours, money, parseTime, percent } from '../format.js';

/** {used, limit, unit, fraction, elapsed, pace} of a budget at `now`: fraction used, share of the period gone, and
 * the fraction it would reach by the period's end at the rate so far (null early in a period). */
export function burn(budget, now = Date.now()) {
  const inHours = budget.gpu_hours !== null;
  const limit = inHours ? budget.gpu_hours : budget.cents / 100;
  const used = inHours ? budget.used_gpu_hours : budget.used_cents / 100;
  const start = parseTime(budget.period_start);
  const end = parseTime(budget.period_end);
  const elapsed = start && end ? Math.min(1, Math.max(0, (now - start) / (end - start))) : null;
  const fraction = limit > 0 ? used / limit : 0;
  return { used, limit, unit: inHours ? 'GPU-hours' : 'money', fraction, elapsed,
    pace: elapsed !== null && elapsed >= 0.02 ? fraction / elapsed : null };
}

function amount(value, unit) {
  if (unit !== 'GPU-hours') return money(value);
  return `${value ? hours(value) : '0'} GPU-hours`;
}

function bar(b) {
  const fill = h('span', { class: `fill${b.fraction >= 1 ? ' over' : ''}` });
  fill.style.width = `${Math.min(100, 100 * b.fraction)}%`;
  const mark = h('span', { class: 'elapsed', title: 'how much of the period has gone' });
  mark.style.left = `${100 * (b.elapsed ?? 0)}%`;
  return h('span', { class: 'burn-bar', role: 'img', 'aria-label': `${percent(b.fraction)} used` }, fill, mark);
}

function status(budget, b) {
  if (budget.exceeded) return badge(budget.hard ? 'used up: new jobs refused' : 'used up', 'exceeded');
  if (b.pace !== null && b.pace > 1) return badge('on pace to run out', 'warning');
  return badge('on track', 'ok');
}

function draw(budgets) {
  const now = Date.now();
  const rows = budgets.map((budget) => ({ budget, b: burn(budget, now) }));
  return table([
    { label: 'budget', cell: ({ budget }) => `${budget.scope} ${budget.name}` },
    { label: 'kind', cell: ({ budget }) => `${budget.hard ? 'hard' : 'soft'}, per ${budget.period}` },
    { label: 'used', class: 'num', cell: ({ b }) => `${amount(b.used, b.unit)} of ${amount(b.limit, b.unit)}` },
    { label: 'burn', cell: ({ b }) => [bar(b), ' ', percent(b.fraction)] },
    { label: 'period gone', class: 'num', cell: ({ b }) => (b.elapsed === null ? '—' : percent(b.elapsed)) },
    { label: 'at this pace', class: 'num', cell: ({ b }) => (b.pace === null ? '—' : percent(b.pace)) },
    { label: 'renews', cell: ({ budget }) => dateTime(budget.period_end) },
    { label: 'status', cell: ({ budget, b }) => status(budget, b) },
  ], rows, { empty: 'No budgets are set.',
    rowAttrs: ({ budget }) => ({ dataset: { budget: `${budget.scope}/${budget.name}`,
      exceeded: String(budget.exceeded) } }) });
}

export function budgetsPanel() {
  return panel('Budgets', () => api('/budgets'), draw, { id: 'budgets' });
}
