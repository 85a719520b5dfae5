// Charts as inline SVG, no dependencies: line/area charts over time, horizontal bar charts and quota bars.
// Every mark carries a <title>, which the browser shows as its tooltip. Colours come from CSS classes
// (series-0, series-1, ...) or an explicit `color`.

const NS = 'http://www.w3.org/2000/svg';
const MAX_POINTS = 360; // more points than pixels only slow the page down

export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) el.setAttribute(key, String(value));
  }
  for (const child of children.flat()) if (child !== null && child !== undefined) el.append(child);
  return el;
}

export const tooltip = (text) => svg('title', {}, text);

/** Round tick values from 0 to at least `max`: 0, 0.5, 1, ... or 0, 20, 40, ... */
export function niceTicks(max, count = 4) {
  if (!(max > 0)) return [0, 1];
  const raw = max / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((s) => s >= raw);
  const ticks = [];
  for (let i = 0; i * step < max + step * 0.999; i += 1) ticks.push(Number((i * step).toPrecision(12)));
  return ticks;
}

const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400]
  .map((s) => s * 1000);

/** Tick times between t0 and t1 (ms) at a round step; labels HH:MM:SS, HH:MM or MM-DD as the step asks. */
export function timeTicks(t0, t1, count = 6) {
  const step = TIME_STEPS.find((s) => s >= (t1 - t0) / count) ?? 86400000 * Math.ceil((t1 - t0) / count / 86400000);
  const offset = new Date(t0).getTimezoneOffset() * 60000; // align ticks to local round times
  const ticks = [];
  for (let t = Math.ceil((t0 - offset) / step) * step + offset; t <= t1; t += step) ticks.push(t);
  return { ticks, label: (t) => timeLabel(new Date(t), step) };
}

function timeLabel(d, step) {
  const two = (n) => String(n).padStart(2, '0');
  if (step >= 86400000) return `${two(d.getMonth() + 1)}-${two(d.getDate())}`;
  const hm = `${two(d.getHours())}:${two(d.getMinutes())}`;
  return step < 60000 ? `${hm}:${two(d.getSeconds())}` : hm;
}

/** Every k-th point (and the last) when there are more than `max`. */
export function thin(points, max = MAX_POINTS) {
  if (points.length <= max) return points;
  const k = Math.ceil(points.length / max);
  const kept = points.filter((_, i) => i % k === 0);
  if (kept[kept.length - 1] !== points[points.length - 1]) kept.push(points[points.length - 1]);
  return kept;
}

/** Split [t, v] points where the time gap is far above the usual one (the line must not bridge an outage). */
function segments(points) {
  if (points.length < 3) return [points];
  const gaps = points.slice(1).map((p, i) => p[0] - points[i][0]).sort((a, b) => a - b);
  const usual = gaps[Math.floor(gaps.length / 2)];
  const out = [[points[0]]];
  for (let i = 1; i < points.length; i += 1) {
    if (points[i][0] - points[i - 1][0] > 5 * usual) out.push([]);
    out[out.length - 1].push(points[i]);
  }
  return out;
}

function legend(series) {
  const el = document.createElement('div');
  el.className = 'legend';
  series.forEach((s, i) => {
    const key = document.createElement('span');
    key.className = `key series-${i}${s.dash ? ' dashed' : ''}`;
    el.append(key, ` ${s.name}  `);
  });
  return el;
}

function frame(el, label, caption) {
  const figure = document.createElement('figure');
  figure.className = 'chart';
  if (caption) {
    const fc = document.createElement('figcaption');
    fc.textContent = caption;
    figure.append(fc);
  }
  figure.append(el);
  if (label) figure.setAttribute('aria-label', label);
  return figure;
}

/**
 * A time chart. series: [{name, points: [[Date|ms, value]], area?, dash?}] sharing timestamps. Options: yMax,
 * yFormat(v) for the axis, valueFormat(v) for tooltips, caption, width, height. The time axis spans the data.
 * Hovering anywhere shows every series' value at that time.
 */
export function lineChart(series, options = {}) {
  const { yMax, yFormat = String, valueFormat = yFormat, caption, width = 720, height = 220 } = options;
  const prepared = series.map((s) => ({ ...s, points: thin(s.points.map(([t, v]) => [+t, v])) }));
  const all = prepared.flatMap((s) => s.points);
  if (!all.length) return frame(emptyNote(width, 'no samples in this window yet'), caption, caption);
  const m = { top: 10, right: 14, bottom: 24, left: 48 };
  const t0 = Math.min(...all.map((p) => p[0]));
  const t1 = Math.max(t0 + 1000, ...all.map((p) => p[0]));
  const ticks = niceTicks(yMax ?? Math.max(...all.map((p) => p[1])));
  const top = yMax ?? ticks[ticks.length - 1];
  const x = (t) => m.left + ((t - t0) / (t1 - t0)) * (width - m.left - m.right);
  const y = (v) => height - m.bottom - (Math.min(v, top) / top) * (height - m.top - m.bottom);
  const chart = svg('svg', { viewBox: `0 0 ${width} ${height}`, class: 'line-chart', role: 'img' });
  if (caption) chart.append(tooltip(caption));
  const grid = svg('g', { class: 'axis' });
  for (const v of ticks.filter((tick) => tick <= top)) {
    grid.append(svg('line', { x1: m.left, x2: width - m.right, y1: y(v), y2: y(v), class: 'gridline' }),
      svg('text', { x: m.left - 6, y: y(v) + 4, 'text-anchor': 'end' }, yFormat(v)));
  }
  const time = timeTicks(t0, t1);
  for (const t of time.ticks) {
    grid.append(svg('line', { x1: x(t), x2: x(t), y1: height - m.bottom, y2: height - m.bottom + 4 }),
      svg('text', { x: x(t), y: height - 6, 'text-anchor': 'middle' }, time.label(t)));
  }
  grid.append(svg('line', { x1: m.left, x2: width - m.right, y1: height - m.bottom, y2: height - m.bottom }));
  chart.append(grid);
  prepared.forEach((s, i) => {
    for (const seg of segments(s.points)) {
      const line = seg.map(([t, v], k) => `${k ? 'L' : 'M'}${x(t).toFixed(1)},${y(v).toFixed(1)}`).join('');
      if (s.area && seg.length > 1) {
        const base = y(0).toFixed(1);
        chart.append(svg('path', { d: `${line}L${x(seg[seg.length - 1][0]).toFixed(1)},${base}` +
          `L${x(seg[0][0]).toFixed(1)},${base}Z`, class: `area series-${i}` }));
      }
      chart.append(svg('path', { d: line, class: `line series-${i}${s.dash ? ' dashed' : ''}` }));
      if (seg.length === 1) {
        chart.append(svg('circle', { cx: x(seg[0][0]), cy: y(seg[0][1]), r: 2.5, class: `dot series-${i}` }));
      }
    }
  });
  chart.append(hoverColumns(prepared, x, m.top, height - m.bottom - m.top, valueFormat));
  const figure = frame(chart, caption, caption);
  figure.append(legend(series));
  return figure;
}

/** Invisible full-height columns, one per timestamp, each titled with every series' value at that time. */
function hoverColumns(series, x, top, plotHeight, yFormat) {
  const values = new Map();
  for (const s of series) {
    for (const [t, v] of s.points) values.set(t, [...(values.get(t) ?? []), `${s.name}: ${yFormat(v)}`]);
  }
  const times = [...values.keys()].sort((a, b) => a - b);
  const g = svg('g', { class: 'hover' });
  times.forEach((t, i) => {
    const left = i ? (x(times[i - 1]) + x(t)) / 2 : x(t) - 3;
    const right = i < times.length - 1 ? (x(t) + x(times[i + 1])) / 2 : x(t) + 3;
    const label = `${new Date(t).toLocaleString([], { hour12: false })}\n${values.get(t).join('\n')}`;
    g.append(svg('rect', { x: left, y: top, width: Math.max(1, right - left), height: plotHeight }, tooltip(label)));
  });
  return g;
}

function emptyNote(width, text) {
  return svg('svg', { viewBox: `0 0 ${width} 40`, class: 'line-chart empty' },
    svg('text', { x: width / 2, y: 24, 'text-anchor': 'middle', class: 'muted' }, text));
}

/**
 * Horizontal bars. rows: [{label, value, title?}]; options: format(v), caption, width, unit. Bars share one
 * scale (the largest value); each bar's tooltip names its label and value.
 */
export function barChart(rows, { format = String, caption, width = 720, unit = '' } = {}) {
  if (!rows.length) return frame(emptyNote(width, 'nothing in this window'), caption, caption);
  const bar = 18;
  const gap = 6;
  const left = 170;
  const right = 110;
  const height = rows.length * (bar + gap) + gap;
  const max = Math.max(...rows.map((r) => r.value)) || 1;
  const chart = svg('svg', { viewBox: `0 0 ${width} ${height}`, class: 'bar-chart', role: 'img' });
  if (caption) chart.append(tooltip(caption));
  rows.forEach((row, i) => {
    const y = gap + i * (bar + gap);
    const w = Math.max(row.value > 0 ? 1 : 0, (row.value / max) * (width - left - right));
    const name = row.label.length > 24 ? `${row.label.slice(0, 23)}…` : row.label;
    chart.append(svg('g', { class: 'bar', 'data-key': row.label, 'data-value': row.value },
      tooltip(row.title ?? `${row.label}: ${format(row.value)}${unit ? ` ${unit}` : ''}`),
      svg('text', { x: left - 8, y: y + bar / 2 + 4, 'text-anchor': 'end' }, name),
      svg('rect', { x: left, y, width: w, height: bar, rx: 2, class: row.class ?? 'series-0' }),
      svg('text', { x: left + w + 6, y: y + bar / 2 + 4, class: 'value' }, format(row.value))));
  });
  return frame(chart, caption, caption);
}

/**
 * One queue's quota as a bar on a shared `scale` (GPUs): the guaranteed band, what is used (the part above the
 * guarantee is borrowed), the limit and the fair share as markers.
 */
export function quotaBar({ used, guaranteed, limit, fairShare, scale, width = 460, height = 26 }) {
  const x = (v) => 2 + (Math.min(v, scale) / scale) * (width - 4);
  const fmt = (v) => Number(v.toFixed(3)).toString();
  const summary = `used ${fmt(used)} GPUs · guaranteed ${fmt(guaranteed)} · `
    + `limit ${limit === null ? 'none' : fmt(limit)} · fair share ${fmt(fairShare)}`;
  const chart = svg('svg', { viewBox: `0 0 ${width} ${height}`, class: 'quota-bar', role: 'img' }, tooltip(summary),
    svg('rect', { x: 2, y: 3, width: width - 4, height: height - 6, rx: 3, class: 'track' }));
  if (guaranteed > 0) {
    chart.append(svg('rect', { x: 2, y: 3, width: x(guaranteed) - 2, height: height - 6, rx: 3, class: 'guaranteed' },
      tooltip(`guaranteed: ${fmt(guaranteed)} GPUs`)));
  }
  const within = Math.min(used, guaranteed);
  if (within > 0) {
    chart.append(svg('rect', { x: 2, y: 8, width: x(within) - 2, height: height - 16, class: 'used' },
      tooltip(`used within the guarantee: ${fmt(within)} GPUs`)));
  }
  if (used > guaranteed) {
    chart.append(svg('rect', { x: x(guaranteed), y: 8, width: x(used) - x(guaranteed), height: height - 16,
      class: 'borrowed' }, tooltip(`used above the guarantee (borrowed): ${fmt(used - guaranteed)} GPUs`)));
  }
  if (fairShare > 0) {
    chart.append(svg('line', { x1: x(fairShare), x2: x(fairShare), y1: 1, y2: height - 1, class: 'fair' },
      tooltip(`fair share: ${fmt(fairShare)} GPUs`)));
  }
  if (limit !== null) {
    chart.append(svg('line', { x1: x(limit), x2: x(limit), y1: 0, y2: height, class: 'limit' },
      tooltip(`limit: ${fmt(limit)} GPUs`)));
  }
  return chart;
}
