"""The worker's sandbox, tried from inside real tasks: every refusal is asserted, not just tried.

The fake worker's `sh` runs a command as the task's user inside its unit; a command that fails
fails the task with its output, and a command that succeeds shows its output as the step.
cgroup memory and task limits are not enforced in the nspawn test machine, so those are asserted
as the unit's properties, as systemd holds them.
"""

import re
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.box_api import boxctl, finish, http, start_fake, wait_for_step
from testbed.machine import Machine

PROXIES_LISTEN = (
    "python3 -c \"import socket; [socket.create_connection(('127.0.0.1', p)).close() "
    "for p in (3128, 1080)]; print('both listen')\""
)


def unit_properties(machine: Machine, task_id: str, *names: str) -> dict[str, str]:
    shown = machine.run(
        "systemctl", "show", f"box-task-{task_id}.service", *(f"--property={n}" for n in names)
    ).stdout
    return {name: value for name, _, value in (ln.partition("=") for ln in shown.splitlines())}


def run_sh(machine: Machine, token: str, command: str) -> str:
    """Runs one shell command in a task that must succeed; returns what it printed."""
    task = start_fake(machine, token, f"sh {command}")
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    text = ended["steps"][0]["text"]
    assert isinstance(text, str)
    return text


def failed_sh(machine: Machine, token: str, command: str) -> str:
    """Runs one shell command in a task that must fail; returns the task's error."""
    task = start_fake(machine, token, f"sh {command}")
    ended = finish(machine, task["id"])
    assert ended["state"] == "failed", ended
    error = ended["error"]
    assert isinstance(error, str)
    return error


@pytest.fixture
def running(machine: Machine, token: str) -> Iterator[dict[str, Any]]:
    """A task whose worker sleeps, with a secret in its own working view; stopped afterwards."""
    task = start_fake(machine, token, "write mine.txt the other task's secret\nsleep 120")
    wait_for_step(machine, task["id"])
    yield task
    http(machine, "POST", f"/api/tasks/{task['id']}/stop", token)


def main_pid(machine: Machine, task_id: str) -> int:
    return int(unit_properties(machine, task_id, "MainPID")["MainPID"])


def test_worker_unit_has_the_sandbox(machine: Machine, running: dict[str, Any]) -> None:
    task_id = running["id"]
    shown = unit_properties(
        machine,
        task_id,
        "User",
        "Group",
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "PrivateIPC",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectClock",
        "ProtectHostname",
        "ProtectProc",
        "RestrictSUIDSGID",
        "RestrictNamespaces",
        "RestrictRealtime",
        "LockPersonality",
        "NoNewPrivileges",
        "CapabilityBoundingSet",
        "AmbientCapabilities",
        "SystemCallArchitectures",
        "RestrictAddressFamilies",
        "NetworkNamespacePath",
        "TemporaryFileSystem",
        "BindPaths",
        "InaccessiblePaths",
    )
    work = f"/var/lib/box/tasks/{task_id}/work"
    home = f"/var/lib/box/tasks/{task_id}/home"
    door = f"/var/lib/box/tasks/{task_id}/broker.sock"
    assert shown == {
        "User": f"box-{task_id}",
        "Group": "boxd-work",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "PrivateIPC": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "ProtectClock": "yes",
        "ProtectHostname": "yes",
        "ProtectProc": "invisible",
        "RestrictSUIDSGID": "yes",
        "RestrictNamespaces": "yes",
        "RestrictRealtime": "yes",
        "LockPersonality": "yes",
        "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "",
        "AmbientCapabilities": "",
        "SystemCallArchitectures": "native",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "NetworkNamespacePath": f"/run/netns/box-{task_id}",
        "TemporaryFileSystem": (
            "/var/lib/box:mode=0755 /run:mode=0755 /dev/shm:mode=1777,nosuid,nodev "
            "/run/lock:mode=1777,nosuid,nodev"
        ),
        "BindPaths": f"{work}:{work}:rbind {home}:{home} {door}:{door}",
        "InaccessiblePaths": "-/dev/mqueue -/etc/claude-code",
    }
    # systemd keeps address lists as sets: their order varies.
    addresses = unit_properties(machine, task_id, "IPAddressDeny", "IPAddressAllow")
    assert set(addresses["IPAddressDeny"].split()) == {"0.0.0.0/0", "::/0"}
    assert set(addresses["IPAddressAllow"].split()) == {"127.0.0.0/8", "::1/128"}
    # An allow list: @system-service's calls are in it, @mount's and @reboot's are not.
    allowed = set(unit_properties(machine, task_id, "SystemCallFilter")["SystemCallFilter"].split())
    assert {"execve", "clone", "openat", "connect"} <= allowed
    assert not {"mount", "umount2", "reboot", "kexec_load", "init_module", "ptrace"} & allowed
    report = machine.run(
        "systemd-analyze", "security", "--no-pager", f"box-task-{task_id}.service", check=False
    ).stdout
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", report)
    assert found is not None, report
    assert float(found.group(1)) <= 2.0, report


def test_limits_come_from_the_settings(machine: Machine, token: str) -> None:
    # Not enforced in this nspawn machine (no cgroup memory or pids control here): what is
    # asserted is what systemd was told to enforce.
    task = start_fake(machine, token, "step up\nsleep 120")
    wait_for_step(machine, task["id"])
    limits = ("MemoryMax", "TasksMax", "CPUQuotaPerSecUSec")
    assert unit_properties(machine, task["id"], *limits) == {
        "MemoryMax": str(4 * 1024**3),
        "TasksMax": "1024",
        "CPUQuotaPerSecUSec": "2s",
    }
    http(machine, "POST", f"/api/tasks/{task['id']}/stop", token)
    changes = {"taskMemoryMaxBytes": "536870912", "taskTasksMax": "64", "taskCPUPercent": "50"}
    try:
        for name, value in changes.items():
            boxctl(machine, "settings", "set", name, value)
        task = start_fake(machine, token, "step up\nsleep 120")
        wait_for_step(machine, task["id"])
        assert unit_properties(machine, task["id"], *limits) == {
            "MemoryMax": "536870912",
            "TasksMax": "64",
            "CPUQuotaPerSecUSec": "500ms",
        }
        http(machine, "POST", f"/api/tasks/{task['id']}/stop", token)
        refused = boxctl(machine, "settings", "set", "taskTasksMax", "3", check=False)
        assert refused.returncode != 0
        assert "taskTasksMax must be a whole number of processes from 16 to 65536" in (
            refused.stderr
        )
    finally:
        defaults = {"taskMemoryMaxBytes": "4294967296", "taskTasksMax": "1024"}
        for name, value in {**defaults, "taskCPUPercent": "200"}.items():
            boxctl(machine, "settings", "set", name, value)


def test_own_network_namespace_with_loopback_only_gone_when_it_ends(
    machine: Machine, token: str
) -> None:
    task = start_fake(
        machine,
        token,
        "sh tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '\n"
        "sh readlink /proc/self/ns/net\n"
        # The proxy sockets systemd bound in the namespace, on its loopback.
        f"sh {PROXIES_LISTEN}\n"
        "sleep 120",
    )
    wait_for_step(machine, task["id"], count=3)
    netns = f"/run/netns/box-{task['id']}"
    inode = machine.run("stat", "-L", "-c", "%i", netns).stdout.strip()
    http(machine, "POST", f"/api/tasks/{task['id']}/stop", token)
    ended = finish(machine, task["id"])
    interfaces, namespace, proxies = (s["text"] for s in ended["steps"][:3])
    assert interfaces == "lo"
    assert namespace == f"net:[{inode}]"
    assert proxies == "both listen"
    assert machine.run("test", "-e", netns, check=False).returncode == 1


def test_box_home_shows_only_its_own_view_and_socket(
    machine: Machine, token: str, running: dict[str, Any]
) -> None:
    task = start_fake(machine, token, "sh find /var/lib/box -maxdepth 3 | sort")
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    own = f"/var/lib/box/tasks/{task['id']}"
    assert ended["steps"][0]["text"].splitlines() == [
        "/var/lib/box",
        "/var/lib/box/tasks",
        own,
        f"{own}/broker.sock",
        f"{own}/home",
        f"{own}/work",
    ]


def test_a_tasks_directory_is_passed_through_not_listed_by_other_users(
    machine: Machine, running: dict[str, Any]
) -> None:
    """Another user of the box (here nobody) may not learn what a task keeps, even by name:
    its worker needs only to pass through to its socket, home and view."""
    own = f"/var/lib/box/tasks/{running['id']}"
    assert machine.run("stat", "-c", "%a %U", own).stdout.split() == ["711", "root"]
    listed = machine.run("ls", own, user="nobody", check=False)
    assert listed.returncode != 0
    assert "Permission denied" in listed.stderr


def test_another_tasks_broker_socket_is_out_of_reach(
    machine: Machine, token: str, running: dict[str, Any]
) -> None:
    other = f"/var/lib/box/tasks/{running['id']}/broker.sock"
    assert machine.run("test", "-S", other, check=False).returncode == 0
    error = failed_sh(
        machine,
        token,
        f"python3 -c \"import socket; socket.socket(socket.AF_UNIX).connect('{other}')\"",
    )
    assert "FileNotFoundError: [Errno 2] No such file or directory" in error


def test_another_tasks_layer_the_database_and_the_vault_are_out_of_reach(
    machine: Machine, token: str, running: dict[str, Any]
) -> None:
    done = start_fake(machine, token, "write layer-secret.txt kept in a layer")
    assert finish(machine, done["id"])["state"] == "done"
    assert machine.run("sh", "-c", "ls /var/lib/box/layers/home/*/layer-secret.txt").stdout
    targets = {
        "a done task's layer": "/var/lib/box/layers/home/*/layer-secret.txt",
        "a running task's view": f"/var/lib/box/tasks/{running['id']}/work/mine.txt",
        "a running task's layer": f"/var/lib/box/tasks/{running['id']}/upper/mine.txt",
        "the database": "/var/lib/box/box.db",
        "the vault": "/var/lib/box/vault",
        "the workspace base": "/var/lib/box/workspaces/home",
    }
    for what, path in targets.items():
        assert machine.run("sh", "-c", f"ls -d {path}").returncode == 0, what
        error = failed_sh(machine, token, f"ls {path}")
        assert "No such file or directory" in error, (what, error)


def test_etc_shadow_is_unreadable(machine: Machine, token: str) -> None:
    error = failed_sh(machine, token, "cat /etc/shadow")
    assert "cat: /etc/shadow: Permission denied" in error


def test_writing_outside_the_workspace_is_refused(machine: Machine, token: str) -> None:
    places = [
        "/etc/boxd-was-here",
        "/usr/local/bin/boxd-was-here",
        "/usr/lib/boxd/boxd-was-here",
        "/var/lib/box/boxd-was-here",
        "/var/lib/box/tasks/boxd-was-here",
        "/var/log/boxd-was-here",
        "/run/boxd-was-here",
        "/home/boxd-was-here",
        "/root/boxd-was-here",
        "/dev/boxd-was-here",
    ]
    script = "; ".join(f"touch {p} 2>&1 || true" for p in places)
    printed = run_sh(machine, token, f"{script}; touch here.txt && echo wrote here.txt")
    lines = printed.splitlines()
    assert lines[-1] == "wrote here.txt"
    for place, line in zip(places, lines, strict=False):
        assert line.startswith(f"touch: cannot touch '{place}': "), printed
        assert line.endswith(("Read-only file system", "Permission denied")), printed
    assert len(lines) == len(places) + 1, printed
    # The world-writable places are the task's own: what it writes there is nowhere on the box.
    for place in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        probe = f"{place}/boxd-probe"
        assert run_sh(machine, token, f"echo private > {probe} && cat {probe}") == "private"
        assert machine.run("test", "-e", probe, check=False).returncode == 1, place
    # Nothing else is writable: its working view, and those.
    task = start_fake(
        machine,
        token,
        "sh find / \\( -path /proc -o -path /sys \\) -prune -o -writable -type d -print "
        "2>/dev/null | grep -v '^/tmp/\\|^/var/tmp/\\|/work/'; true",
    )
    ended = finish(machine, task["id"])
    assert sorted(ended["steps"][0]["text"].splitlines()) == [
        "/dev/shm",
        "/run/lock",
        "/tmp",
        f"/var/lib/box/tasks/{task['id']}/home",
        f"/var/lib/box/tasks/{task['id']}/work",
        "/var/tmp",
    ]


def test_a_setuid_binary_gives_no_privilege(machine: Machine, token: str) -> None:
    machine.run("install", "-m", "4755", "/usr/bin/id", "/usr/local/bin/suid-id")
    # As a user outside the sandbox, the set-uid bit works: the test is a real one.
    assert machine.run("suid-id", "-u", user="nobody").stdout.strip() == "0"
    printed = run_sh(machine, token, "suid-id -u; id -u; grep NoNewPrivs /proc/self/status")
    euid, uid, nnp = printed.splitlines()
    assert euid == uid != "0"
    assert nnp.split() == ["NoNewPrivs:", "1"]
    error = failed_sh(machine, token, "touch s && chmod u+s s")
    assert "chmod: changing permissions of 's': Operation not permitted" in error
    caps = run_sh(machine, token, "grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status")
    assert [line.split()[1] for line in caps.splitlines()] == ["0000000000000000"] * 4
    error = failed_sh(machine, token, "unshare --net true")
    assert "Operation not permitted" in error


def test_other_tasks_processes_are_invisible_and_untouchable(
    machine: Machine, token: str, running: dict[str, Any]
) -> None:
    pid = main_pid(machine, running["id"])
    assert pid > 0
    task = start_fake(
        machine,
        token,
        "sh ps -eo user= | sort -u\n"
        f"sh test -e /proc/{pid} && echo visible || echo invisible\n"
        f"sh kill -0 {pid} 2>&1 || true\n"
        'sh python3 -c "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); '
        f'r = libc.ptrace(16, {pid}, 0, 0); print(r, os.strerror(ctypes.get_errno()))"',
    )
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    users, seen, kill, ptrace = (s["text"] for s in ended["steps"])
    assert users == f"box-{task['id']}"
    assert seen == "invisible"
    assert kill.endswith("Operation not permitted"), kill
    assert ptrace == "-1 Operation not permitted"
    # It is still running, untouched.
    assert main_pid(machine, running["id"]) == pid


def test_the_system_bus_and_other_tasks_units_and_namespaces_are_out_of_reach(
    machine: Machine, token: str, running: dict[str, Any]
) -> None:
    for path in (
        "/run/dbus/system_bus_socket",
        f"/run/systemd/transient/box-task-{running['id']}.service",
        f"/run/netns/box-{running['id']}",
    ):
        assert machine.run("test", "-e", path, check=False).returncode == 0, path
        error = failed_sh(machine, token, f"cat {path}")
        # Its /run is an empty one of its own.
        assert f"cat: {path}: No such file or directory" in error, error


def test_the_box_gateway_on_loopback_is_out_of_reach(machine: Machine, token: str) -> None:
    # 127.0.0.1 in the task's namespace is its own loopback: the box's gateway is not there.
    assert machine.run("curl", "-sS", "-o", "/dev/null", "http://127.0.0.1:7700/").returncode == 0
    error = failed_sh(
        machine, token, "curl -sS --noproxy '*' --max-time 5 http://127.0.0.1:7700/api/tasks"
    )
    assert "Failed to connect to 127.0.0.1 port 7700" in error


def test_the_namespace_outlives_a_boxd_restart(machine: Machine, token: str) -> None:
    task = start_fake(machine, token, "step one\nsleep 3\nsh readlink /proc/self/ns/net")
    wait_for_step(machine, task["id"])
    netns = f"/run/netns/box-{task['id']}"
    inode = machine.run("stat", "-L", "-c", "%i", netns).stdout.strip()
    machine.run("systemctl", "restart", "boxd.service")
    assert machine.run("stat", "-L", "-c", "%i", netns).stdout.strip() == inode
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert ended["steps"][-1]["text"] == f"net:[{inode}]"
    assert machine.run("test", "-e", netns, check=False).returncode == 1


def test_a_task_resumed_after_a_reboot_gets_its_namespace_and_proxies_again(
    machine: Machine, token: str
) -> None:
    task = start_fake(machine, token, f"step one\nsleep 3\nsh {PROXIES_LISTEN}")
    wait_for_step(machine, task["id"])
    task_id = task["id"]
    # What a power cut leaves: no units of the task, and an empty /run.
    machine.run("systemctl", "stop", "boxd.service")
    machine.run("systemctl", "kill", "--signal=KILL", f"box-task-{task_id}.service")
    machine.run(
        "sh", "-c", f"while systemctl is-active -q box-task-{task_id}.service; do sleep 0.05; done"
    )
    machine.run("systemctl", "reset-failed", f"box-task-{task_id}.service")
    machine.run(
        "systemctl",
        "stop",
        f"box-broker@{task_id}.service",
        f"box-broker@{task_id}.socket",
        f"box-egress-http@{task_id}.socket",
        f"box-egress-socks@{task_id}.socket",
        f"box-model@{task_id}.socket",
    )
    machine.run("ip", "netns", "delete", f"box-{task_id}")
    machine.run("systemctl", "start", "boxd.service")
    ended = finish(machine, task_id)
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["one", "slept 3 s", "both listen"]


def test_dev_shm_is_the_tasks_own(machine: Machine, token: str) -> None:
    first = start_fake(machine, token, "sh echo hidden > /dev/shm/boxd-probe\nsleep 120")
    wait_for_step(machine, first["id"])
    try:
        error = failed_sh(machine, token, "cat /dev/shm/boxd-probe")
        assert "cat: /dev/shm/boxd-probe: No such file or directory" in error
        assert machine.run("test", "-e", "/dev/shm/boxd-probe", check=False).returncode == 1
    finally:
        http(machine, "POST", f"/api/tasks/{first['id']}/stop", token)


def test_what_agents_run_still_works_in_the_sandbox(machine: Machine, token: str) -> None:
    """node (a JIT: no MemoryDenyWriteExecute), python with multiprocessing (semaphores in its
    own /dev/shm), git and a C compiler whose program runs from the workspace."""
    task = start_fake(
        machine,
        token,
        "sh node -e \"console.log('node', require('os').cpus().length > 0, 6 * 7)\"\n"
        'sh python3 -c "import multiprocessing as m; '
        "print('python', m.Pool(2).map(abs, [-1, -2]))\"\n"
        "sh git init -q repo && cd repo && git -c user.name=a -c user.email=a@b commit -q "
        "--allow-empty -m first && git log --format=%s\n"
        "sh printf '#include <stdio.h>\\nint main(void){puts(\"compiled\");return 0;}' > hi.c "
        "&& gcc -O2 -o hi hi.c && ./hi",
    )
    ended = finish(machine, task["id"], timeout=180)
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == [
        "node true 42",
        "python [1, 2]",
        "first",
        "compiled",
    ]
