// The screen: its session first (session.js), then which view the address names (#/tasks,
// #/task/ID, #/new, #/workspaces, #/files/WS/a/b (a folder of a workspace), #/file/WS/a/b.md
// (one of its files), #/settings), the header's counts, pause and log-out buttons,
// and what to do when the session is gone.

import { LOGIN, LoginError, begin, endEverywhere, onEnded } from "./session.js";
import { api, onSignedOut } from "./api.js";
import { h, replace, toast } from "./dom.js";
import { disconnect } from "./live.js";
import { loadApprovals, loadDoctor, loadPause, loadTasks, start, state, watch } from "./store.js";
import { settingsView, togglePause, workspacesView } from "./admin.js";
import { startView } from "./start.js";
import { taskView, tasksView } from "./tasks.js";
import { filesView } from "./files.js";
import { fileView } from "./file_view.js";
import { placeOf } from "./places.js";

const main = document.getElementById("main");
let leave = () => {};
let signedOut = false;

// Any page may link here: a broken %-escape is a task id no task has, not an exception.
function decoded(id) {
  try { return decodeURIComponent(id); } catch { return id; }
}

function route() {
  if (signedOut) return;
  leave();
  const [, view = "tasks", id, ...more] = location.hash.split("/");
  const section = view === "task" ? "tasks" : view === "files" || view === "file" ? "workspaces" : view;
  document.querySelectorAll("[data-nav]").forEach((link) => {
    if (link.dataset.nav === section) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  });
  const views = { tasks: tasksView, new: startView, workspaces: workspacesView, settings: settingsView };
  const place = placeOf([id, ...more]);
  if (view === "task" && id) leave = taskView(main, decoded(id));
  else if (view === "files" && place.workspace) leave = filesView(main, place.workspace, place.parts);
  else if (view === "file" && place.workspace && place.parts.length) leave = fileView(main, place.workspace, place.parts);
  else leave = (views[view] || tasksView)(main);
  document.title = `boxd · ${view === "task" ? "task" : section}`;
}

function header() {
  const count = document.getElementById("waiting-count");
  const pause = document.getElementById("pause");
  const banner = document.getElementById("paused-banner");
  const render = () => {
    const waiting = state.approvals.length;
    count.hidden = waiting === 0;
    count.textContent = String(waiting);
    count.setAttribute("aria-label", `${waiting} waiting for your OK`);
    pause.hidden = signedOut;
    pause.textContent = state.paused ? "Resume agents" : "Pause agents";
    pause.classList.toggle("primary", state.paused);
    banner.hidden = !state.paused;
    doctorBanner();
  };
  pause.addEventListener("click", () => togglePause(pause));
  watch(render);
  render();
  const logout = document.getElementById("logout");
  logout.hidden = false;
  logout.addEventListener("click", async () => {
    logout.disabled = true;
    try {
      await api("DELETE", "/api/session");
    } catch (error) {
      // A session the box no longer knows is logged out already (and a 401 said so).
      if (error.status !== 401) { toast(error.message, "bad"); logout.disabled = false; return; }
    }
    endEverywhere();
    showSignedOut("You logged out of this computer's screen.");
  });
}

// The checks that stop every task from starting, each with what is missing and how to fix it.
function doctorBanner() {
  const banner = document.getElementById("doctor-banner");
  const failing = state.doctor ? state.doctor.checks.filter((check) => check.blocks && !check.ok) : [];
  banner.hidden = failing.length === 0;
  replace(banner,
    h("p", {}, h("b", {}, "No task starts on this machine until it is fixed"), ", so that none runs in a weaker sandbox than boxd promises."),
    failing.map((check) => h("p", {}, h("b", {}, check.name), `: ${check.problem} To fix it: ${check.fix}`)),
    failing.length ? h("p", {}, "Then run ", h("code", {}, "boxctl doctor"), " on this computer, or reload this page: either checks again.") : null);
}

function showSignedOut(message) {
  if (signedOut) return;
  signedOut = true;
  leave();
  disconnect();
  document.getElementById("logout").hidden = true;
  document.getElementById("pause").hidden = true;
  replace(main, h("div", { class: "panel notice" },
    h("h1", {}, "Open the screen from this computer"),
    h("p", {}, message),
    h("p", {}, "In a terminal on this computer, as the box's owner, run ", h("code", {}, "boxctl open"), ". It opens this page with a new one-time link.")));
}

onSignedOut(showSignedOut);
onEnded(showSignedOut);
window.addEventListener("hashchange", () => {
  // A new link pasted into this tab: loaded again, the page takes its code as it loads.
  if (location.hash.startsWith(LOGIN)) location.reload();
  else route();
});

async function boot() {
  try {
    if (!(await begin())) {
      showSignedOut("This tab is not logged in to the box's screen, and no other tab of it is open.");
      return;
    }
  } catch (error) {
    if (!(error instanceof LoginError)) throw error;
    showSignedOut(error.message);
    return;
  }
  header();
  route();
  await Promise.all([loadTasks(), loadApprovals(), loadPause()]);
  start();
  // Not waited for: checking the machine anew takes the box a moment (docs/performance.md).
  loadDoctor().catch((error) => toast(error.message, "bad"));
}

boot().catch((error) => { if (!signedOut) toast(error.message, "bad"); });
