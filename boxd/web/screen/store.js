// What the screen knows of the box, kept current from the API and the live events, and the
// views that want to hear when it changes.

import { get } from "./api.js";
import * as live from "./live.js";

export const state = { tasks: new Map(), approvals: [], paused: false, loaded: false, doctor: null };
const watchers = new Set();
export function watch(watcher) { watchers.add(watcher); return () => watchers.delete(watcher); }
function changed(what) { watchers.forEach((watcher) => watcher(what)); }

// D-Bus property names on a task object, as the events carry them, and the API's.
const FIELDS = { State: "state", Step: "step", CostCents: "costCents", Error: "error", Title: "title", Workspace: "workspace" };

export async function loadTasks() {
  const tasks = await get("/api/tasks");
  state.tasks = new Map(tasks.map((task) => [task.id, task]));
  state.loaded = true;
  changed("tasks");
}

export async function loadApprovals() {
  const approvals = await get("/api/approvals");
  state.approvals = approvals.filter((approval) => approval.state === "pending");
  changed("approvals");
}

// Each read or answer of the pause state takes a number; a read answered after a newer one
// (the page's first read, still on its way when the owner pressed Pause) is not let undo it.
let pauseSeen = 0;

export async function loadPause() {
  const asked = ++pauseSeen;
  const paused = Boolean((await get("/api/pause")).paused);
  if (asked !== pauseSeen) return;
  state.paused = paused;
  changed("pause");
}

// What the box found of this machine (GET /api/doctor checks it anew): while a check that
// blocks tasks fails, no task starts, and the header says why.
export async function loadDoctor() {
  state.doctor = await get("/api/doctor");
  changed("doctor");
}

export function setPaused(paused) {
  pauseSeen += 1;
  state.paused = paused;
  changed("pause");
}

export function putTask(task) {
  state.tasks.set(task.id, { ...state.tasks.get(task.id), ...task });
  changed("tasks");
}

// Several events in a burst cost one reload.
function later(work, wait = 250) {
  let timer = null;
  return () => {
    if (timer) return;
    timer = setTimeout(() => { timer = null; work().catch(() => {}); }, wait);
  };
}
const reloadTasks = later(loadTasks);
const reloadApprovals = later(loadApprovals);

export function start() {
  live.on("task", ({ task, changed: properties, new: isNew }) => {
    const known = state.tasks.get(task);
    if (isNew || !known) { reloadTasks(); return; }
    for (const [name, value] of Object.entries(properties || {})) {
      if (FIELDS[name]) known[FIELDS[name]] = value === "" ? undefined : value;
    }
    if (properties && "State" in properties) { reloadApprovals(); reloadTasks(); }
    changed("tasks");
  });
  live.on("approval", reloadApprovals);
  live.on("step", ({ event }) => { if (event && event.kind === "approval") reloadApprovals(); });
  live.on("reconnected", () => { reloadTasks(); reloadApprovals(); changed("reconnected"); });
  live.connect();
}
