// The screen's session, kept where only this origin's pages reach it. A cookie would go to every
// port of 127.0.0.1 and be read by any page there (RFC 6265 §8.5): the session lives in this
// tab's sessionStorage instead, is sent as a header (api.js), and is lent to a new tab of this
// screen over a BroadcastChannel, which only pages of this origin can join. It begins with
// boxctl open's link, whose one-time code follows "#login=": the browser sends no fragment to
// any server, and the code leaves the address bar and the history before anything else runs.

const KEY = "boxd.session";
export const LOGIN = "#login=";
// How long a new tab waits for another tab of this screen to lend it the session.
const ASK_MS = 700;

const channel = new BroadcastChannel("boxd.session");
const ended = new Set();

export function session() { return sessionStorage.getItem(KEY); }

// Told when another tab logged this session out.
export function onEnded(listener) { ended.add(listener); }

export function forget() { sessionStorage.removeItem(KEY); }

// After logging out: this tab and every other one holding the same session let go of it.
export function endEverywhere() {
  const gone = session();
  forget();
  if (gone) channel.postMessage({ ended: gone });
}

channel.addEventListener("message", ({ data }) => {
  const mine = session();
  if (data && data.ask === true && mine) channel.postMessage({ session: mine });
  if (data && typeof data.ended === "string" && data.ended === mine) {
    forget();
    ended.forEach((listener) => listener("You logged out of this computer's screen."));
  }
});

// Runs as the module loads, before the page's other scripts: the code is in no URL after this.
function takeCode() {
  if (!location.hash.startsWith(LOGIN)) return null;
  const code = location.hash.slice(LOGIN.length);
  history.replaceState(null, "", location.pathname);
  try { return decodeURIComponent(code); } catch { return code; }
}
const code = takeCode();

function askOtherTabs() {
  return new Promise((resolve) => {
    let timer = null;
    const answer = ({ data }) => {
      if (data && typeof data.session === "string") done(data.session);
    };
    const done = (value) => {
      clearTimeout(timer);
      channel.removeEventListener("message", answer);
      resolve(value);
    };
    timer = setTimeout(() => done(null), ASK_MS);
    channel.addEventListener("message", answer);
    channel.postMessage({ ask: true });
  });
}

export class LoginError extends Error {}

async function trade(code) {
  let response;
  try {
    response = await fetch("/api/session", {
      method: "POST", credentials: "omit", cache: "no-store",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify({ code }),
    });
  } catch {
    throw new LoginError("The box did not answer. Is boxd-web running? (systemctl status boxd-web)");
  }
  let data = null;
  try { data = await response.json(); } catch { data = null; }
  if (!response.ok) {
    throw new LoginError(data && typeof data.error === "string" ? data.error : `The box answered ${response.status}.`);
  }
  sessionStorage.setItem(KEY, data.session);
}

// Whether this tab has a session to act with: the link's code traded for one, the one this tab
// kept, or one another tab of this screen lends it. A LoginError says why a link did not work.
export async function begin() {
  if (code !== null) await trade(code);
  if (session()) return true;
  const lent = await askOtherTabs();
  if (lent) sessionStorage.setItem(KEY, lent);
  return Boolean(lent);
}
