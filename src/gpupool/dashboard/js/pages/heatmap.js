// GPU heatmap: every GPU of every node from GET /nodes (one call), grouped by site (where set) and node. The colour
// shows the allocated fraction, the utilisation or the temperature; each cell's tooltip has all three.

import { api } from '../api.js';
import { badge, h, panel, segmented } from '../dom.js';
import { gpus, mib } from '../format.js';

const REFRESH_MS = 5000;
const MODES = [['allocated', 'Allocated'], ['utilization', 'Utilisation'], ['temperature', 'Temperature']];
const TEMP_MIN = 30;
const TEMP_MAX = 90;

/** 0..1 for the chosen mode, or null when the GPU did not report it. */
function level(gpu, mode) {
  if (mode === 'allocated') return Math.min(1, gpu.allocated_milli / 1000);
  if (mode === 'utilization') return gpu.utilization_pct === null ? null : gpu.utilization_pct / 100;
  if (gpu.temperature_c === null) return null;
  return Math.max(0, Math.min(1, (gpu.temperature_c - TEMP_MIN) / (TEMP_MAX - TEMP_MIN)));
}

/** Light to strong in the mode's hue: blue for allocation, green for utilisation, yellow to red for heat. */
export function colour(value, mode) {
  if (value === null) return 'var(--cell-unknown)';
  if (mode === 'temperature') return `hsl(${Math.round(50 - 50 * value)} 90% ${Math.round(75 - 30 * value)}%)`;
  if (value === 0) return 'var(--cell-free)';
  const hue = mode === 'allocated' ? 221 : 142;
  return `hsl(${hue} 75% ${Math.round(80 - 45 * value)}%)`;
}

function label(gpu, mode) {
  if (mode === 'allocated') return gpu.allocated_milli ? gpus(gpu.allocated_milli / 1000) : '';
  if (mode === 'utilization') return gpu.utilization_pct === null ? '?' : `${gpu.utilization_pct}%`;
  return gpu.temperature_c === null ? '?' : `${gpu.temperature_c}°`;
}

function cell(node, gpu, mode) {
  const value = level(gpu, mode);
  const tip = [`${node.name} GPU ${gpu.index} · ${gpu.model} · ${mib(gpu.memory_mib)}${gpu.fake ? ' (fake)' : ''}`,
    `allocated: ${gpus(gpu.allocated_milli / 1000)} of 1 GPU`,
    `utilisation: ${gpu.utilization_pct ?? '?'}%`, `temperature: ${gpu.temperature_c ?? '?'} °C`].join('\n');
  const el = h('div', {
    class: `cell${gpu.allocated_milli > 0 ? ' allocated' : ' free'}${value !== null && value > 0.55 ? ' dark' : ''}`,
    title: tip, role: 'img', 'aria-label': tip,
    dataset: { node: node.name, gpu: String(gpu.index), allocatedMilli: String(gpu.allocated_milli) },
  }, h('span', { class: 'index' }, gpu.index), h('span', { class: 'value' }, label(gpu, mode)));
  el.style.background = colour(value, mode);
  return el;
}

function nodeCard(node, mode) {
  const models = [...new Set(node.gpus.map((g) => g.model))].join(', ') || 'no GPUs';
  const allocated = node.gpus.reduce((sum, g) => sum + g.allocated_milli, 0) / 1000;
  return h('div', { class: `node-card state-${node.state}`, dataset: { node: node.name } },
    h('div', { class: 'node-head' }, h('strong', {}, node.name), ' ', badge(node.state),
      node.cordoned ? badge('cordoned') : null),
    h('div', { class: 'muted small' }, `${models} · ${gpus(allocated)}/${node.gpus.length} allocated`),
    h('div', { class: 'cells' }, node.gpus.map((g) => cell(node, g, mode))));
}

function legend(mode) {
  const stops = [0, 0.25, 0.5, 0.75, 1];
  const text = { allocated: ['free', 'whole GPU allocated'], utilization: ['0 %', '100 %'],
    temperature: [`${TEMP_MIN} °C`, `${TEMP_MAX} °C`] }[mode];
  return h('div', { class: 'heat-legend' }, h('span', { class: 'muted small' }, text[0]),
    stops.map((s) => {
      const swatch = h('span', { class: 'swatch' });
      swatch.style.background = colour(s, mode);
      return swatch;
    }), h('span', { class: 'muted small' }, text[1]));
}

/**
 * The nodes grouped by site, named sites first: [{site, heading, members}]. Sites only where set: when no node names
 * one, the one group has no heading; otherwise the nodes naming none come last, as "nodes without a site".
 */
export function siteGroups(nodes) {
  const sites = new Map();
  for (const node of nodes) sites.set(node.site, [...(sites.get(node.site) ?? []), node]);
  const named = sites.size > 1 || !sites.has('');
  return [...sites.entries()].sort(([a], [b]) => (!a - !b) || a.localeCompare(b)).map(([site, members]) => ({
    site, members, heading: named ? (site ? `site ${site}` : 'nodes without a site') : null }));
}

function draw(nodes, mode) {
  if (!nodes.length) return h('p', { class: 'muted empty' }, 'No nodes have joined yet.');
  const groups = siteGroups(nodes).map(({ site, heading, members }) => h('div', { class: 'site', dataset: { site } },
    heading ? h('h3', {}, heading) : null, h('div', { class: 'nodes' }, members.map((n) => nodeCard(n, mode)))));
  return [legend(mode), ...groups];
}

export function render(ctx, _arg, query) {
  let mode = MODES.some(([m]) => m === query.colour) ? query.colour : 'allocated';
  const controls = segmented('colour by', MODES, mode, (value) => {
    mode = value;
    heat.rerender();
  });
  const heat = panel('GPUs by node', () => api('/nodes'), (nodes) => draw(nodes, mode),
    { controls, id: 'heatmap' });
  ctx.every(REFRESH_MS, heat.refresh);
  return h('div', { class: 'page heatmap' }, heat.el);
}
