// The public HTTP API (/api/v1) with the signed-in user's session token as bearer, kept in sessionStorage (per tab).

const TOKEN_KEY = 'gpupool.token';
const BASE = '/api/v1';
let onUnauthorized = () => {};

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

/** Called when the API answers 401 to the stored token (logged out elsewhere, revoked or expired): the app signs out. */
export function whenUnauthorized(callback) {
  onUnauthorized = callback;
}

export class ApiError extends Error {
  constructor(status, detail) {
    super(`${status}: ${detail}`);
    this.status = status;
    this.detail = detail;
  }
}

async function detailOf(response) {
  try {
    const body = await response.json();
    if (typeof body.detail === 'string') return body.detail;
    if (Array.isArray(body.detail)) return body.detail.map((d) => `${(d.loc || []).join('.')}: ${d.msg}`).join('; ');
    return JSON.stringify(body);
  } catch {
    return response.statusText || 'request failed';
  }
}

/** A URL under /api/v1 with the query parameters that are set. */
export function apiUrl(path, query = {}) {
  const url = new URL(BASE + path, window.location.origin);
  for (const [key, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== '') url.searchParams.set(key, value);
  }
  return url;
}

/**
 * One API call. Options: query (object), method, body (sent as JSON), as ('json' | 'text' | 'response'),
 * bearer (a token to try instead of the stored one: the login form). Throws ApiError on a non-2xx answer.
 */
export async function api(path, { query, method = 'GET', body, as = 'json', bearer } = {}) {
  const headers = { Authorization: `Bearer ${bearer ?? token.get() ?? ''}` };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const response = await fetch(apiUrl(path, query), {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: 'no-store',
  });
  if (response.status === 401 && bearer === undefined) onUnauthorized();
  if (!response.ok) throw new ApiError(response.status, await detailOf(response));
  if (as === 'response') return response;
  if (as === 'text') return response.text();
  return response.status === 204 ? null : response.json();
}
