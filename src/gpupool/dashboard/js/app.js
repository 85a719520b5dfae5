// The dashboard shell: sign-in state, navigation and a hash router (#/page/arg?query). Each page module exports
// `render(ctx, arg, query)` returning an element; ctx.every() polls (never faster than every 2 s) until the page
// is left. No text of the URL reaches a page unchecked: `arg` is a job id or nothing, and each page takes from
// `query` only values it recognises.

import { api, token, whenUnauthorized } from './api.js';
import { errorBox, h, idRef } from './dom.js';
import * as heatmap from './pages/heatmap.js';
import * as job from './pages/job.js';
import * as jobs from './pages/jobs.js';
import * as login from './pages/login.js';
import * as nodes from './pages/nodes.js';
import * as overview from './pages/overview.js';
import * as queues from './pages/queues.js';
import * as showback from './pages/showback.js';
import * as usage from './pages/usage.js';

export const MIN_POLL_MS = 2000;

const PAGES = {
  overview: { title: 'Overview', module: overview },
  heatmap: { title: 'GPU heatmap', module: heatmap },
  usage: { title: 'Who uses what', module: usage },
  queues: { title: 'Queues', module: queues },
  jobs: { title: 'Jobs', module: jobs, detail: job },
  nodes: { title: 'Nodes', module: nodes },
  showback: { title: 'Showback', module: showback },
};

const state = { me: null, timers: [], notice: '' };
/** The API's roles, least first (protocol.api.ROLES). */
const ROLES = ['viewer', 'member', 'project-admin', 'tenant-admin', 'operator'];
/** What a detail page's argument may be: a job id. Nothing else from the URL is ever shown. */
const JOB_ID = /^[0-9a-f]{32}$/;

function parseHash() {
  const [path, search = ''] = window.location.hash.replace(/^#\/?/, '').split('?');
  const [page = '', ...rest] = path.split('/');
  return { page: decodeURIComponent(page), arg: rest.map(decodeURIComponent).join('/'),
    query: Object.fromEntries(new URLSearchParams(search)) };
}

export function navigate(page, arg = '', query = {}) {
  const search = new URLSearchParams(Object.entries(query).filter(([, v]) => v !== '' && v != null)).toString();
  const hash = `#/${page}${arg ? `/${encodeURIComponent(arg)}` : ''}${search ? `?${search}` : ''}`;
  if (window.location.hash === hash) route();
  else window.location.hash = hash;
}

function stopTimers() {
  for (const id of state.timers) clearInterval(id);
  state.timers = [];
}

/** Calls fn every `ms` (at least MIN_POLL_MS) while this page is shown and the tab is visible. */
function every(ms, fn) {
  const id = setInterval(() => document.hidden || fn(), Math.max(MIN_POLL_MS, ms));
  state.timers.push(id);
  return id;
}

function renderChrome(current) {
  const nav = document.getElementById('nav');
  const who = document.getElementById('whoami');
  const logout = document.getElementById('logout');
  nav.hidden = logout.hidden = !state.me;
  who.replaceChildren();
  if (!state.me) return;
  nav.replaceChildren(...Object.entries(PAGES).map(([key, p]) => h('a', {
    href: `#/${key}`, 'aria-current': key === current ? 'page' : null }, p.title)));
  const { user, org, role } = state.me;
  who.append(h('span', { class: 'user', title: `projects: ${state.me.projects.join(', ') || 'none'}` }, user ?? '—'),
    ' @ ', h('span', { class: 'org' }, org ?? '—'), ' ', h('span', { class: 'badge role' }, role));
}

/** Trades the pasted API token for a session token (POST /sessions), the only token the tab then keeps. */
async function signIn(candidate) {
  const session = await api('/sessions', { method: 'POST', bearer: candidate });
  const me = await api('/whoami', { bearer: session.token });
  token.set(session.token);
  state.me = me;
  return me;
}

/**
 * Forgets the session and, unless the server already refused it, revokes it (DELETE /sessions/current), so that a
 * copy of it is worth nothing either. `notice` is one of this file's own messages, shown on the sign-in page.
 */
async function signOut(notice = '', { refused = false } = {}) {
  const held = token.get();
  token.clear();
  state.me = null;
  state.notice = notice;
  if (held && !refused) {
    try {
      await api('/sessions/current', { method: 'DELETE', bearer: held });
    } catch {
      // expired or revoked meanwhile: nothing left to revoke
    }
  }
  navigate('login');
}

async function route() {
  stopTimers();
  const view = document.getElementById('view');
  const { page: asked, arg, query } = parseHash();
  let page = asked;
  if (!state.me && token.get()) {
    try {
      state.me = await api('/whoami');
    } catch {
      token.clear();
    }
  }
  if (!state.me && page !== 'login') {
    navigate('login');
    return;
  }
  if (page !== 'login' && !PAGES[page]) page = 'overview';
  renderChrome(page);
  const ctx = { me: state.me, every, navigate, signIn, signOut, isOperator: state.me?.role === 'operator',
    atLeast: (role) => ROLES.indexOf(state.me?.role) >= ROLES.indexOf(role) };
  if (page === 'login') {
    document.title = 'Sign in · gpupool';
    view.replaceChildren(login.render({ ...ctx, notice: state.notice }));
    state.notice = '';
    return;
  }
  const entry = PAGES[page];
  if (arg && !(entry.detail && JOB_ID.test(arg))) {
    document.title = `${entry.title} · gpupool`;
    view.replaceChildren(h('h1', {}, entry.title), errorBox('There is no such page: check the link.'));
    return;
  }
  const pageModule = arg ? entry.detail : entry.module;
  document.title = `${arg || entry.title} · gpupool`;
  view.replaceChildren(h('h1', {}, arg ? [`${entry.title.replace(/s$/, '')} `, idRef(arg)] : entry.title),
    pageModule.render(ctx, arg, query));
}

whenUnauthorized(() => state.me && signOut('Your session was refused (logged out, revoked or expired). Sign in again.',
  { refused: true }));
document.getElementById('logout').addEventListener('click', () => signOut());
window.addEventListener('hashchange', route);
route();
