// The box's HTTP API, as the screen's session: the cookie goes by itself; every request that
// changes something carries the CSRF token the login set in a cookie this page can read.

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function csrfToken() {
  for (const part of document.cookie.split(";")) {
    const [name, ...value] = part.trim().split("=");
    if (name === "boxd_csrf") return decodeURIComponent(value.join("="));
  }
  return "";
}

const listeners = new Set();
// Told when the box says the session is gone (401), so the page can say how to log in again.
export function onSignedOut(listener) { listeners.add(listener); }

export async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = csrfToken();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method, headers, credentials: "same-origin", cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch {
    throw new ApiError(0, "The box did not answer. Is boxd-web running? (systemctl status boxd-web)");
  }
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!response.ok) {
    const message = data && typeof data.error === "string" ? data.error : `The box answered ${response.status}.`;
    if (response.status === 401) listeners.forEach((listener) => listener(message));
    throw new ApiError(response.status, message);
  }
  return data;
}

export const get = (path) => api("GET", path);
export const post = (path, body) => api("POST", path, body);
