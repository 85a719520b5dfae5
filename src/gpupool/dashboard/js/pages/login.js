// Sign in with an API token: the shell trades it for a session token (POST /api/v1/sessions), the only token kept
// in this tab's sessionStorage. `ctx.notice` is the shell's own message (why the last session ended), never text
// from the URL.

import { h } from '../dom.js';

export function render(ctx) {
  if (ctx.me) return signedIn(ctx);
  const input = h('input', { id: 'token', type: 'password', autocomplete: 'off', spellcheck: 'false', required: true,
    placeholder: 'gp_…', 'aria-label': 'API token' });
  const message = h('p', { id: 'login-message', class: ctx.notice ? 'error' : 'muted', role: 'status' },
    ctx.notice ?? '');
  const form = h('form', { id: 'login', class: 'panel login' },
    h('h1', {}, 'Sign in to gpupool'),
    h('label', { for: 'token' }, 'API token'), input,
    h('button', { type: 'submit' }, 'Sign in'), message,
    h('p', { class: 'muted small' }, 'Operators find the first token in DATA_DIR/admin.token; everyone else gets one ',
      'from an admin (', h('code', {}, 'gpupool token create --user NAME'), '). ',
      'This tab keeps only a session token (12 h; "Log out" revokes it), sent to this server alone.'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    message.className = 'muted';
    message.textContent = 'Checking…';
    try {
      await ctx.signIn(input.value.trim());
      ctx.navigate('overview');
    } catch (error) {
      message.className = 'error';
      message.textContent = error.status === 401 ? 'That token was refused.' : `Sign-in failed: ${error.message}`;
    }
  });
  queueMicrotask(() => input.focus());
  return form;
}

function signedIn(ctx) {
  const { user, org, role, projects } = ctx.me;
  return h('section', { class: 'panel login', id: 'signed-in' },
    h('h1', {}, 'Signed in'),
    h('dl', { class: 'fields' },
      h('dt', {}, 'user'), h('dd', {}, user ?? '—'),
      h('dt', {}, 'organisation'), h('dd', {}, org ?? '—'),
      h('dt', {}, 'role'), h('dd', {}, role),
      h('dt', {}, 'projects'), h('dd', {}, projects.join(', ') || 'none')),
    h('p', {}, h('a', { href: '#/overview' }, 'Go to the overview'), ' or ',
      h('button', { type: 'button', onclick: () => ctx.signOut() }, 'log out')));
}
