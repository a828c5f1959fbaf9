"""`make run`: boot a box on this computer, start a demo task, and keep the box up until Ctrl-C.

The machine shares this computer's network, so the box's API at 127.0.0.1:7700 is reachable
from here. Run as root from the repository root:

    .venv/bin/python -m testbed.run_box
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .machine import Machine

HOST = "127.0.0.1"
PORT = 7700
API = f"http://{HOST}:{PORT}"
OWNER = "owner"
BOXD_JOURNAL = (
    "journalctl",
    "-b",
    "--no-pager",
    "-n",
    "60",
    "-u",
    "boxd.service",
    "-u",
    "boxd-web.service",
)
DEMO_TASK = {
    "title": "Demo: a fake task",
    "worker": "fake",
    "prompt": "step Hello from the demo task\n"
    "sh id -un\n"
    "write hello.txt Hello, box\n"
    "sh printf 'Meeting notes, 2 December\\n- Launch moves to March\\n- Ada owns the budget\\n"
    "- Two new hires start Monday\\n- Next meeting Thursday\\n' > notes.md\n"
    "sleep 1\n"
    "step Wrote hello.txt and notes.md\n"
    "sh cat hello.txt",
}
# The seed's own example (docs/spec/start-a-task.txt): a Droid task on the notes the fake task
# wrote.
DROID_TASK = {
    "title": "Summarise the meeting notes",
    "prompt": "Read notes.md and write a five-line summary to summary.md.",
    "workspace": "home",
    "budgetCents": 50,
}
MODEL_KEY = "ANTHROPIC_API_KEY"
WITHOUT_DROID = (
    f"To see Droid at work here too: {MODEL_KEY}=<your key> make run. The key goes into the "
    "box's vault, where only the task's broker reads it; no task ever sees it."
)


def say(text: str = "") -> None:
    print(text, flush=True)


def port_in_use() -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Lets the bind succeed over leftover TIME_WAIT connections; a listener still fails it.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, PORT))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def wait_for_port(timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((HOST, PORT), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"nothing listens on {HOST}:{PORT} {timeout:g} s after "
                    "boxd was installed; is boxd-web.socket enabled?"
                ) from None
            time.sleep(0.2)


def start_task(token: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{API}/api/tasks",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            task: dict[str, Any] = json.load(response)
    except urllib.error.HTTPError as e:
        raise RuntimeError(
            f"POST {API}/api/tasks answered {e.code} {e.reason}: "
            f"{e.read().decode(errors='replace')}"
        ) from None
    return task


def screen_link(m: Machine) -> str:
    """A one-time link to the owner's screen, as the owner's `boxctl open` prints it where
    there is no desktop."""
    printed = m.run("boxctl", "open", user=OWNER, check=False)
    for word in printed.stdout.split():
        if word.startswith(f"{API}/#login="):
            return word
    return f"(boxctl open failed: {(printed.stdout + printed.stderr).strip()})"


def how_to(m: Machine, token: str, task_id: str) -> str:
    shell = shlex.join(m.command("bash", "-l", env={"TERM": os.environ.get("TERM", "xterm")}))
    return f"""
The box is up. The owner's screen, in a browser on this computer (the link works once, within
a minute; `runuser -u {OWNER} -- boxctl open` in the box makes another):

  {screen_link(m)}

From this computer:

  curl -s -H 'Authorization: Bearer {token}' {API}/api/tasks
  curl -s -H 'Authorization: Bearer {token}' -H 'Content-Type: application/json' \\
       -d '{{"title": "Try", "worker": "fake", "prompt": "step Hi"}}' {API}/api/tasks

A shell inside the box (as root on this computer, in another terminal):

  {shell}

and in there:

  boxctl list
  boxctl show {task_id}
  journalctl BOX_TASK={task_id}
  busctl tree org.boxd.Box1
  busctl introspect org.boxd.Box1 /org/boxd/Box1
  runuser -u {OWNER} -- boxctl list      # the same, as the box's owner

The demo's files, where the owner sees them (the workspace home as it stands: its base with
every done task's changes over it):

  on the screen: Workspaces, then home (each file with the task that wrote it)
  curl -s -H 'Authorization: Bearer {token}' {API}/api/workspaces/home/list
  curl -s -H 'Authorization: Bearer {token}' {API}/api/workspaces/home/files/notes.md
  and in the box's shell:
  runuser -u {OWNER} -- boxctl cat home:notes.md
  runuser -u {OWNER} -- boxctl get home /tmp/home-copy   # the whole workspace, as your files
  runuser -u {OWNER} -- ls -l /run/boxd/views/home/        # the read-only view, for boxd-owner

Press Ctrl-C to stop the box. Everything in it is thrown away.
"""


def show(m: Machine, task_id: str) -> None:
    say(f"\n$ boxctl show {task_id}")
    shown = m.run("boxctl", "show", task_id, check=False)
    say((shown.stdout + shown.stderr).rstrip())


def droid_demo(m: Machine, token: str, key: str) -> str:
    """The key into the vault, Droid installed by boxd's own unit (from this computer's cache of
    the package), then the seed's example task, followed to its end."""
    from .npm_registry import install_droid

    say(f"\nPutting {MODEL_KEY} in the box's vault...")
    m.run("boxctl", "vault", "set", MODEL_KEY, input=key)
    say("Installing Droid (boxd-droid-install.service)...")
    install_droid(m)
    task = start_task(token, DROID_TASK)
    say("Started a Droid task:")
    say(json.dumps(task, indent=2))
    task_id = str(task["id"])
    say(f"\n$ boxctl follow {task_id}")
    m.spawn("boxctl", "follow", task_id, stdout=None, stderr=None).wait()
    show(m, task_id)
    return task_id


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main() -> int:
    from .machine import Machine, MachineError, install_boxd

    if os.geteuid() != 0:
        say("make run boots a systemd-nspawn machine and has to run as root.")
        return 1
    if port_in_use():
        say(
            f"Port {PORT} on {HOST} is already in use on this computer, and the box needs it "
            "for its API. Stop whatever listens there (`ss -ltnp 'sport = 7700'` shows it; "
            "perhaps another `make run`) and try again."
        )
        return 1

    # SIGTERM or a closed terminal ends the demo the same way as Ctrl-C: by stopping the
    # machine cleanly.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    # On this computer's own network, where its browser reaches the box; the box's tasks need
    # CAP_NET_ADMIN (their namespaces, IPAddressDeny=), over this computer's network then.
    m = Machine(private_network=False, host_network_admin=True)
    try:
        say("Booting the box (the first run builds its image, about 2 minutes)...")
        m.start()
        say("Installing boxd's package (make deb, then apt-get install ./boxd_*.deb)...")
        install_boxd(m)
        if m.run("id", OWNER, check=False).returncode != 0:
            m.run("useradd", "-m", "-G", "boxd-owner", OWNER)
        token = m.run("boxctl", "token", "create").stdout.strip()
        say(f"\nAPI token: {token}\n")
        wait_for_port()

        task = start_task(token, DEMO_TASK)
        say("Started the demo task:")
        say(json.dumps(task, indent=2))
        task_id = str(task["id"])

        say(f"\n$ boxctl follow {task_id}")
        # Straight to this terminal, so its lines show as they come.
        follow = m.spawn("boxctl", "follow", task_id, stdout=None, stderr=None)
        follow.wait()

        show(m, task_id)
        key = os.environ.get(MODEL_KEY, "").strip()
        if key:
            task_id = droid_demo(m, token, key)
        else:
            say(f"\n{WITHOUT_DROID}")

        say(how_to(m, token, task_id))
        while True:
            signal.pause()
    except KeyboardInterrupt:
        say("\nStopping the box...")
        return 0
    except (MachineError, RuntimeError, OSError) as e:
        say(f"\nmake run failed: {e}")
        if m.running:
            say("\nWhat boxd logged:")
            say(m.run(*BOXD_JOURNAL, check=False).stdout.rstrip())
        return 1
    finally:
        # Ignore a second Ctrl-C while the machine shuts down, so it is never left half-way.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        m.stop()
        say("The box is stopped.")


if __name__ == "__main__":
    if not __package__:
        # Run as a file (`python testbed/run_box.py`): run again as a module from the repo
        # root, so the harness's package-relative imports resolve.
        os.chdir(Path(__file__).resolve().parents[1])
        os.execv(sys.executable, [sys.executable, "-m", "testbed.run_box", *sys.argv[1:]])
    sys.exit(main())
