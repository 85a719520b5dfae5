// Formatting of times, durations and amounts. The API writes UTC times, some without a zone suffix.

export const TERMINAL = new Set(['succeeded', 'failed', 'cancelled', 'denied']);
export const JOB_STATES = ['pending_approval', 'pending', 'scheduled', 'running', 'succeeded', 'failed', 'cancelled',
  'denied'];

export function parseTime(text) {
  if (!text) return null;
  return new Date(/([zZ]|[+-]\d\d:?\d\d)$/.test(text) ? text : `${text}Z`);
}

const pad = (n) => String(n).padStart(2, '0');

/** Local time as YYYY-MM-DD HH:MM:SS. */
export function dateTime(value) {
  const d = value instanceof Date ? value : parseTime(value);
  if (!d) return '—';
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock(d)}`;
}

export function clock(d) {
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** A local calendar date as YYYY-MM-DD (what <input type=date> holds). */
export function isoDate(d) {
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
}

/** A UTC moment as the API's `from`/`to` expect: YYYY-MM-DDTHH:MM:SS. */
export function apiMoment(d) {
  return d.toISOString().slice(0, 19);
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return '—';
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${pad(s % 60)}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${pad(Math.floor((s % 3600) / 60))}m`;
  return `${Math.floor(s / 86400)}d ${pad(Math.floor((s % 86400) / 3600))}h`;
}

export function since(text, now = Date.now()) {
  const d = parseTime(text);
  return d ? duration((now - d.getTime()) / 1000) : '—';
}

/** GPUs: "1", "0.5", "2.25". */
export function gpus(value) {
  return Number(value ?? 0).toFixed(3).replace(/\.?0+$/, '') || '0';
}

/** GPU-hours with as many decimals as small amounts need (the API rounds to 6). */
export function hours(value) {
  const v = Number(value ?? 0);
  if (v >= 100) return v.toFixed(1);
  if (v >= 1) return v.toFixed(3);
  return v.toFixed(6);
}

export function money(value) {
  const v = Number(value ?? 0);
  return v >= 1 ? v.toFixed(2) : v.toFixed(4);
}

export function percent(fraction) {
  return `${(100 * Number(fraction ?? 0)).toFixed(1)}%`;
}

export function mib(value) {
  return value >= 1024 ? `${(value / 1024).toFixed(value % 1024 ? 1 : 0)} GiB` : `${value} MiB`;
}
