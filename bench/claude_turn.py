"""A one-turn Claude Code task from `POST /api/tasks` to done, beside `claude -p` alone on the
same machine against the same scripted model.

Run as root from the repository: `python -m bench.claude_turn [--runs N]`. It boots a test
machine, installs this checkout, lets boxd install Claude Code from the registry stand-in
(testbed/npm_registry.py, the host's cached package), and scripts the model upstream
(testbed/model_server.py) to answer each request with one line of text. Inside the machine it
then times, in turn: a task with `"worker": "claude"` from its POST until the box reports it
done (its sandbox, broker, worker, Claude Code, the relay, the gateway, the steps), and the
same `claude -p` run as root with the worker's environment and flags but no box around it (its
model straight at the upstream). Prints p50 and p90 of both and their ratio.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

RUNS = 10
API = "http://127.0.0.1:7700"
PROMPT = "Say hello."
INSTALL_UNIT = "boxd-claude-install.service"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _api(method: str, path: str, token: str, body: object = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{API}{path}", data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())


def one_task(token: str) -> float:
    started = time.monotonic()
    body = {"title": "bench", "prompt": PROMPT, "worker": "claude", "model": "sonnet"}
    task = _api("POST", "/api/tasks", token, body)
    assert isinstance(task, dict)
    while True:
        shown = _api("GET", f"/api/tasks/{task['id']}", token)
        assert isinstance(shown, dict)
        if shown["state"] in ("done", "failed"):
            assert shown["state"] == "done", shown
            return time.monotonic() - started
        time.sleep(0.01)


def one_claude(base_url: str, model: str) -> float:
    from boxd.claude.release import claude_binary
    from boxd.workers.claude.config import command, environment

    with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as work:
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": home,
            # The machine trusts the outside world's CA; Claude Code reads only its own bundle.
            "NODE_EXTRA_CA_CERTS": "/etc/ssl/certs/ca-certificates.crt",
            **environment(Path(home), base_url),
        }
        # The worker's flags, but for its MCP server and the permission tool on it: there is no
        # broker here.
        flags = command(
            claude_binary(), model=model, autonomy="low", plan=False, mcp={}, resume=None
        )
        argv: list[str] = []
        for flag in flags:
            if argv and argv[-1] in ("--mcp-config", "--permission-prompt-tool"):
                argv.pop()
                continue
            argv.append(flag)
        started = time.monotonic()
        done = subprocess.run(argv, input=PROMPT.encode(), env=env, cwd=work, capture_output=True)
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        return took


def measure(token: str, runs: int, base_url: str, model: str) -> None:
    box: list[float] = []
    alone: list[float] = []
    one_task(token)  # the first starts nothing ahead and may still be settling
    for _ in range(runs):
        box.append(one_task(token))
        alone.append(one_claude(base_url, model))
    for name, values in (("POST to done (box)", box), ("claude -p alone", alone)):
        print(
            f"{name:20} p50 {percentile(values, 0.5) * 1000:7.0f} ms   "
            f"p90 {percentile(values, 0.9) * 1000:7.0f} ms   "
            f"mean {statistics.fmean(values) * 1000:7.0f} ms"
        )
    print(f"ratio (p50)          {percentile(box, 0.5) / percentile(alone, 0.5):.2f}x")


def run_in_machine(runs: int) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.in_machine import run_script
    from boxd.wire.claude_models import resolve_model
    from testbed.box_api import boxctl
    from testbed.droid_cache import claude_tarball
    from testbed.machine import Machine, install_boxd
    from testbed.model_server import BASE_URL, ModelServer
    from testbed.npm_registry import NpmRegistry
    from testbed.outside_world import start_outside

    claude_tarball()
    with Machine() as machine:
        install_boxd(machine)
        NpmRegistry(machine).start(unit=INSTALL_UNIT)
        outside = start_outside(machine)
        server = ModelServer(machine).start()
        server.set_script([{"blocks": [{"type": "text", "text": "Hello."}]}] * (4 * runs + 4))
        boxctl(machine, "settings", "set", "modelBaseUrl", BASE_URL)
        machine.run("boxctl", "vault", "set", "ANTHROPIC_API_KEY", input="sk-ant-api03-bench\n")
        token = machine.run("boxctl", "token", "create", "--name", "bench").stdout.strip()
        model = resolve_model("sonnet")
        args = ["--runs", str(runs), "--base-url", BASE_URL, "--model", model]
        done = run_script(machine, __file__, token, args, timeout=1800)
        print(done.stdout, end="")
        print(done.stderr, end="", file=sys.stderr)
        server.stop()
        outside.kill()
        return done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--inside", metavar="TOKEN", help="measure here")
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--base-url")
    parser.add_argument("--model")
    arguments = parser.parse_args()
    if arguments.inside:
        measure(arguments.inside, arguments.runs, arguments.base_url, arguments.model)
        return
    sys.exit(run_in_machine(arguments.runs))


if __name__ == "__main__":
    main()
