"""The owner's live events (`GET /api/events`) in a real box, heard with curl as a browser would:
a fake task's steps and task events arrive; a member's or an app's token is 403; a revoked
token's stream ends; a local stranger's forged signal, sent straight to the gateway's
connection, never reaches a stream; the bus sends the gateway boxd's signals only while a stream
is open."""

import json
import queue
import threading
import time
from typing import Any

from boxd.dbus.interface import BUS_NAME, ROOT_PATH
from boxd.wire.caller import OWNER_ONLY
from testbed.box_api import API, boxctl, finish, http, start_fake
from testbed.bus_signals import forge, main_pid
from testbed.machine import Machine, MachineProcess

_END = "the stream ended"


class Stream:
    """A `curl -N` on the event stream, its lines read by a thread as they come."""

    def __init__(self, machine: Machine, token: str) -> None:
        self.process: MachineProcess = machine.spawn(
            "curl", "-sSN", "-i", "-H", f"Authorization: Bearer {token}", f"{API}/api/events"
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.head = self._until_blank()
        assert self.head[0].split()[1] == "200", self.head
        assert self.frame() == [": live"]

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\r\n"))
        self._lines.put(_END)

    def line(self, timeout: float = 30) -> str:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the stream said nothing in {timeout} s") from None

    def _until_blank(self) -> list[str]:
        lines: list[str] = []
        while (line := self.line()) != "":
            assert line != _END, lines
            lines.append(line)
        return lines

    def frame(self) -> list[str]:
        """The next event or comment's lines; [_END] once the stream is over."""
        return self._until_blank() if (first := self.line()) == "" else self._rest(first)

    def _rest(self, first: str) -> list[str]:
        if first == _END:
            return [_END]
        return [first, *self._until_blank()]

    def event(self, timeout: float = 60) -> tuple[str, Any]:
        """The next event, heartbeats skipped: its name and data."""
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"no event in {timeout} s, only heartbeats"
            lines = self.frame()
            if lines == [_END]:
                return _END, None
            if lines[0].startswith(":"):
                continue
            name = lines[0].removeprefix("event: ")
            data = "\n".join(line.removeprefix("data: ") for line in lines[1:])
            return name, json.loads(data)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def _of_task(stream: Stream, task_id: str, until: str) -> list[tuple[str, Any]]:
    """The stream's events about the task, until its step saying it became `until` (which
    comes after the property change: boxd shows the new state, then logs it)."""
    seen: list[tuple[str, Any]] = []
    while True:
        name, data = stream.event()
        assert name != _END, seen
        if isinstance(data, dict) and data.get("task") == task_id:
            seen.append((name, data))
            event = data.get("event", {})
            if event.get("kind") == "task.state" and event["data"].get("state") == until:
                return seen


def test_the_owner_hears_a_task_s_steps_and_states(machine: Machine, token: str) -> None:
    stream = Stream(machine, token)
    try:
        head = {
            line.split(":", 1)[0].lower(): line.split(":", 1)[1].strip() for line in stream.head[1:]
        }
        assert head["content-type"] == "text/event-stream"
        assert head["cache-control"] == "no-store"
        assert head["x-accel-buffering"] == "no"
        task = start_fake(machine, token, "step hello from the box")
        seen = _of_task(stream, task["id"], "done")
        assert seen[0][0] == "task" and seen[0][1]["new"] is True, seen
        assert seen[0][1]["changed"]["Id"] == task["id"]
        steps = [data["event"] for name, data in seen if name == "step"]
        assert [s["kind"] for s in steps][-1] == "task.state", steps
        assert any("hello from the box" in json.dumps(s["data"]) for s in steps), steps
        assert [s["seq"] for s in steps] == sorted(s["seq"] for s in steps)
        states = [d["changed"]["State"] for n, d in seen if n == "task" and "State" in d["changed"]]
        assert states[-1] == "done" and "running" in states, states
        assert finish(machine, task["id"])["state"] == "done"
    finally:
        stream.close()


def test_members_and_apps_are_refused_and_no_token_is_no_one(machine: Machine) -> None:
    member = boxctl(machine, "token", "create", "--member", "u-listener").stdout.strip()
    app = boxctl(machine, "token", "create", "--name", "listener", "--app").stdout.strip()
    for refused in (member, app):
        assert http(machine, "GET", "/api/events", refused) == (403, {"error": OWNER_ONLY})
    status, said = http(machine, "GET", "/api/events")
    assert status == 401 and "Bearer" in said["error"]
    assert http(machine, "GET", "/api/events", "box_forged")[0] == 401


def test_a_revoked_token_s_stream_ends(machine: Machine, token: str) -> None:
    listener = boxctl(machine, "token", "create", "--name", "revoked-listener").stdout.strip()
    stream = Stream(machine, listener)
    try:
        boxctl(machine, "token", "revoke", "revoked-listener")
        # Events flowing make the stream ask again; at the latest, its heartbeat does.
        task = start_fake(machine, token, "step after the revocation")
        while True:
            name, data = stream.event()
            if name in ("end", _END):
                break
        assert name == "end" and "valid bearer token" in data["error"], (name, data)
        assert stream.event() == (_END, None)
        assert stream.process.wait(timeout=10) == 0
        finish(machine, task["id"])
    finally:
        stream.close()


def test_a_stranger_s_forged_signals_never_reach_a_stream(machine: Machine, token: str) -> None:
    stream = Stream(machine, token)
    try:
        gateway = main_pid(machine, "boxd-web.service")
        assert gateway > 0
        path = "/org/boxd/Box1/task/t000forged"
        forged = {"seq": 1, "task": "t000forged", "kind": "task.step", "at": 1.0,
                  "data": {"text": "forged by a stranger"}}  # fmt: skip
        forge(machine, f"pid:{gateway}", path, "org.boxd.Box1.Task.Event", "tss",
              [1, "task.step", json.dumps(forged)])  # fmt: skip
        approval = {"id": "t000forged.k", "state": "pending", "question": "forged"}
        forge(machine, f"pid:{gateway}", "/org/boxd/Box1", "org.boxd.Box1.Manager.ApprovalAsked",
              "s", [json.dumps(approval)])  # fmt: skip
        # The bus passes one sender's messages on in order and routed the forged ones before
        # the task existed: by the time its events arrive, the forged ones would have.
        task = start_fake(machine, token, "step real")
        seen: list[tuple[str, Any]] = []
        while True:
            name, data = stream.event()
            assert name != _END
            seen.append((name, data))
            ours = isinstance(data, dict) and data.get("task") == task["id"]
            if ours and data.get("changed", {}).get("State") == "done":
                break
        assert "forged" not in json.dumps(seen), seen
        assert any(name == "step" and data["task"] == task["id"] for name, data in seen)
    finally:
        stream.close()


def gateway_rules(machine: Machine) -> list[str]:
    """The match rules the bus holds for the gateway's connection, as dbus-daemon's Debug.Stats
    interface tells them (root may ask)."""
    gateway = main_pid(machine, "boxd-web.service")
    bus = ("org.freedesktop.DBus", "/org/freedesktop/DBus")
    stats = (*bus, "org.freedesktop.DBus.Debug.Stats", "GetAllMatchRules")
    rules = json.loads(machine.run("busctl", "--json=short", "call", *stats).stdout)["data"][0]
    for name, held in rules.items():
        pid = machine.run(
            "busctl", "--json=short", "call", *bus, "org.freedesktop.DBus",
            "GetConnectionUnixProcessID", "s", name, check=False,
        )  # fmt: skip
        if pid.returncode == 0 and json.loads(pid.stdout)["data"][0] == gateway:
            return [str(rule) for rule in held]
    raise AssertionError(f"the bus knows no connection of the gateway (pid {gateway})")


def hears_boxd(machine: Machine) -> bool:
    return any(
        f"sender='{BUS_NAME}'" in rule and f"path_namespace='{ROOT_PATH}'" in rule
        for rule in gateway_rules(machine)
    )


def until_deaf(machine: Machine, timeout: float = 15) -> None:
    """A stream's rule goes once the gateway sees its stream closed, a moment after curl ends."""
    deadline = time.monotonic() + timeout
    while hears_boxd(machine):
        assert time.monotonic() < deadline, gateway_rules(machine)
        time.sleep(0.1)


def test_the_gateway_hears_boxd_only_while_a_stream_is_open(machine: Machine, token: str) -> None:
    """With no screen open, a task's steps wake neither the gateway nor the bus on its behalf."""
    assert http(machine, "GET", "/api/tasks", token)[0] == 200
    until_deaf(machine)
    stream = Stream(machine, token)
    try:
        assert hears_boxd(machine)
        task = start_fake(machine, token, "step heard")
        assert any(name == "step" for name, _ in _of_task(stream, task["id"], "done"))
    finally:
        stream.close()
    until_deaf(machine)
    quiet = start_fake(machine, token, "step unheard")
    assert finish(machine, quiet["id"])["state"] == "done"
    assert not hears_boxd(machine)
