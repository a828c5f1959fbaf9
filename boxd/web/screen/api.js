// The box's HTTP API, as the screen's session: every request carries it as its bearer token
// (session.js keeps it), and none carries a cookie. The browser adds nothing by itself, so
// another page cannot make a request that acts for the owner.

import { forget, session } from "./session.js";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

const listeners = new Set();
// Told when the box says the session is gone (401), so the page can say how to log in again.
export function onSignedOut(listener) { listeners.add(listener); }

// The answer to one request, once it says it went well; an ApiError in the box's words if not.
// A FormData body goes as it is (the browser writes its multipart boundary); anything else as JSON.
export async function request(method, path, { body, accept = "application/json", signal, headers: more = {} } = {}) {
  const headers = { Accept: accept, ...more };
  const token = session();
  if (token) headers.Authorization = `Bearer ${token}`;
  const raw = body instanceof FormData;
  if (body !== undefined && !raw) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method, headers, signal, credentials: "omit", cache: "no-store",
      body: body === undefined || raw ? body : JSON.stringify(body),
    });
  } catch (error) {
    if (signal && signal.aborted) throw error;
    throw new ApiError(0, "The box did not answer. Is boxd-web running? (systemctl status boxd-web)");
  }
  if (response.ok) return response;
  let data = null;
  try { data = await response.json(); } catch { data = null; }
  const message = data && typeof data.error === "string" ? data.error : `The box answered ${response.status}.`;
  if (response.status === 401) {
    forget();
    listeners.forEach((listener) => listener(message));
  }
  throw new ApiError(response.status, message);
}

export async function api(method, path, body) {
  const text = await (await request(method, path, { body })).text();
  try { return text ? JSON.parse(text) : null; } catch { return null; }
}

export const get = (path) => api("GET", path);
export const post = (path, body) => api("POST", path, body);
