// DOM helpers. Elements are built with createElement and text nodes, never innerHTML: API data stays text.

/** h('a', {href: '#/x', class: 'c', onclick: fn}, 'text', child, [more]) */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else if (key === 'class') el.className = value;
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key === 'value') el.value = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** A table: columns [{label, cell: row => content, class?}], rows; `empty` when there are none. */
export function table(columns, rows, { empty = 'Nothing to show.', rowAttrs = () => ({}), foot } = {}) {
  if (!rows.length) return h('p', { class: 'muted empty' }, empty);
  const head = h('tr', {}, columns.map((c) => h('th', { class: c.class }, c.label)));
  const body = rows.map((row) => h('tr', rowAttrs(row), columns.map((c) => h('td', { class: c.class }, c.cell(row)))));
  return h('table', { class: 'grid' }, h('thead', {}, head), h('tbody', {}, body), foot ? h('tfoot', {}, foot) : null);
}

export function badge(text, kind = text) {
  return h('span', { class: `badge badge-${kind}` }, text);
}

export function errorBox(error) {
  const status = error?.status ? `${error.status} ` : '';
  return h('p', { class: 'error', role: 'alert' }, `${status}${error?.detail ?? error?.message ?? error}`);
}

/**
 * A titled panel whose body one loader fills: exactly one API call per refresh. `render(data)` returns the body's
 * content. Returns {el, refresh, show(data), rerender()}. `controls` go in the header (filters, toggles); a ↻ button
 * reloads by hand.
 */
export function panel(title, load, render, { controls = null, id } = {}) {
  const body = h('div', { class: 'panel-body' }, h('p', { class: 'muted' }, 'Loading…'));
  const stamp = h('span', { class: 'stamp muted' });
  let busy = false;
  let last = null;
  function show(data) {
    last = data;
    body.replaceChildren(...[render(data)].flat().filter(Boolean));
    stamp.textContent = `updated ${new Date().toLocaleTimeString([], { hour12: false })}`;
  }
  async function refresh() {
    if (busy) return;
    busy = true;
    try {
      show(await load());
    } catch (error) {
      body.replaceChildren(errorBox(error));
    } finally {
      busy = false;
    }
  }
  const reload = h('button', { type: 'button', class: 'icon', title: 'Reload', 'aria-label': 'Reload',
    onclick: refresh }, '↻');
  const el = h('section', { class: 'panel', id },
    h('header', {}, h('h2', {}, title), controls, h('span', { class: 'spacer' }), stamp, reload), body);
  refresh();
  return { el, refresh, show, rerender: () => last !== null && show(last) };
}

/** A row of toggle buttons; `onchange(value)` when the choice changes. */
export function segmented(name, options, current, onchange) {
  const group = h('div', { class: 'segmented', role: 'group', 'aria-label': name });
  for (const [value, label] of options) {
    const pressed = String(value === current);
    const button = h('button', { type: 'button', dataset: { value }, 'aria-pressed': pressed }, label);
    button.addEventListener('click', () => {
      for (const b of group.children) b.setAttribute('aria-pressed', String(b === button));
      onchange(value);
    });
    group.append(button);
  }
  return group;
}

/** A figure with its label (plain words; `hint` is the label's tooltip, e.g. the acronym spelled out) and a note. */
export function tile(label, value, note, id, hint) {
  return h('div', { class: 'tile', id }, h('div', { class: 'tile-label', title: hint }, label),
    h('div', { class: 'tile-value' }, value), note ? h('div', { class: 'tile-note muted' }, note) : null);
}

export const SHORT_ID = 12;

/**
 * An id shown short (its first 12 characters, which `gpupool job show` accepts as a unique prefix) with the whole id
 * as its tooltip, and a button that copies the whole id. Where the browser refuses the clipboard, the whole id is
 * shown selected instead, for the reader to copy. `href` makes the short id a link.
 */
export function idRef(id, href) {
  const attrs = { class: 'id', title: id, dataset: { id } };
  const text = href ? h('a', { ...attrs, href }, id.slice(0, SHORT_ID)) : h('code', attrs, id.slice(0, SHORT_ID));
  const copy = h('button', { type: 'button', class: 'icon copy', title: `Copy ${id}`, 'aria-label': 'Copy the whole id' },
    'copy');
  copy.addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText(id);
      copy.textContent = 'copied';
      setTimeout(() => { copy.textContent = 'copy'; }, 1500);
    } catch {
      text.textContent = id;
      window.getSelection().selectAllChildren(text);
    }
  });
  return h('span', { class: 'id-ref' }, text, copy);
}

/** Runs `action` on a second click within 5 s (no modal dialog); the first shows `confirmLabel`. */
export function confirmClick(button, confirmLabel, action) {
  const label = button.textContent;
  let armed = false;
  button.addEventListener('click', () => {
    if (armed) {
      armed = false;
      action();
      return;
    }
    armed = true;
    button.textContent = confirmLabel;
    setTimeout(() => {
      armed = false;
      if (!button.disabled) button.textContent = label;
    }, 5000);
  });
  return button;
}
