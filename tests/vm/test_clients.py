"""The clients agents use, run inside a task as their users install them (issue 36): Anthropic's
Python SDK, pip, requests and httpx; Anthropic's TypeScript SDK on Node; curl, git, npm and
Node's fetch. Each reaches a listed
host of the outside world (testbed/outside_world.py, the package site of
testbed/package_site.py) and is refused one the task does not list, the refusal in words in
the task's log; the SDK reaches the scripted model through the task's model gateway. What each
client reads and needs: docs/agents.md, whose compatibility table this module is."""

import re
import shutil
import tarfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.box_api import finish, start_fake
from testbed.client_cache import (
    NPM_PACKAGES,
    TYPESCRIPT_SDK,
    TYPESCRIPT_SDK_TREE,
    npm_tarballs,
)
from testbed.machine import Machine
from testbed.model_calls import MODEL, cost_of, scripted_model
from testbed.model_server import DEFAULT_USAGE, TLS_PORT, ModelServer
from testbed.outside_world import arrived
from testbed.package_site import GIT_TEXT, PORT, start_package_site

LISTED = "allowed.test"
UNLISTED = "other.test"
SITE = f"https://{LISTED}:{PORT}"
OTHER_SITE = f"https://{UNLISTED}:{PORT}"
SCRIPTS = "/usr/local/share/boxd-clients"
# npm as Node.js's own installer puts it beside node (Debian's nodejs comes without).
NPM = "/opt/npm/bin/npm-cli.js"
# The outside world's certificate is the machine's, in the system's store; clients that carry
# their own CA bundle (certifi, Node's) are pointed at the system's, as behind any private CA.
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"
CA_ENVIRONMENT = (
    f"SSL_CERT_FILE={SYSTEM_CA} REQUESTS_CA_BUNDLE={SYSTEM_CA} PIP_CERT={SYSTEM_CA} "
    f"NODE_EXTRA_CA_CERTS={SYSTEM_CA}"
)


ANTHROPIC_SDK = """
import os, anthropic

client = anthropic.Anthropic(base_url=os.environ["BOX_MODEL_URL"], api_key="placeholder")
lookup = {
    "name": "lookup",
    "description": "Looks a word up.",
    "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}},
    "cache_control": {"type": "ephemeral"},
}
message = client.messages.create(
    model="claude-sonnet-4-6",
    max_tokens=2048,
    system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    metadata={"user_id": "box-test"},
    tools=[lookup],
    tool_choice={"type": "auto"},
    stop_sequences=["END"],
    thinking={"type": "enabled", "budget_tokens": 1024},
    cache_control={"type": "ephemeral"},
    messages=[{"role": "user", "content": "Look up box."}],
)
use = message.content[0]
print("create", message.stop_reason, use.name, use.input)
with client.messages.stream(
    model="claude-sonnet-4-6",
    max_tokens=100,
    messages=[{"role": "user", "content": "Say hello."}],
) as stream:
    text = "".join(stream.text_stream)
    final = stream.get_final_message()
print("stream", text, final.stop_reason)
"""

PYTHON_HTTP = """
import requests, httpx

for url in ("https://allowed.test/py", "http://other.test/py-plain", "https://other.test/py-tls"):
    try:
        answer = requests.get(url, timeout=20)
        print("requests", url, answer.status_code, answer.text)
    except requests.RequestException as error:
        print("requests", url, "failed:", error)
    try:
        answer = httpx.get(url, timeout=20)
        print("httpx", url, answer.status_code, answer.text)
    except httpx.HTTPError as error:
        print("httpx", url, "failed:", type(error).__name__, error)
"""

# argv: the SDK's folder, and undici's to send fetch through the task's proxy as its users do
# on Node before 22.21 (NO_PROXY keeps the gateway direct), or none. Then the SDK pointed at
# an unlisted host: the scripted model again, under a name the task does not list.
TYPESCRIPT_SDK_SCRIPT = """
const Anthropic = require(process.argv[2]);
if (process.argv[3]) {
  const { EnvHttpProxyAgent, setGlobalDispatcher } = require(process.argv[3]);
  setGlobalDispatcher(new EnvHttpProxyAgent());
}

async function main() {
  const client = new Anthropic({ baseURL: process.env.BOX_MODEL_URL, apiKey: 'placeholder' });
  const message = await client.messages.create({
    model: 'claude-sonnet-4-6',
    max_tokens: 2048,
    system: [{ type: 'text', text: 'Be brief.', cache_control: { type: 'ephemeral' } }],
    metadata: { user_id: 'box-test' },
    tools: [{
      name: 'lookup',
      description: 'Looks a word up.',
      input_schema: { type: 'object', properties: { word: { type: 'string' } } },
      cache_control: { type: 'ephemeral' },
    }],
    tool_choice: { type: 'auto' },
    stop_sequences: ['END'],
    thinking: { type: 'enabled', budget_tokens: 1024 },
    cache_control: { type: 'ephemeral' },
    messages: [{ role: 'user', content: 'Look up box.' }],
  });
  const use = message.content[0];
  console.log('create', message.stop_reason, use.name, JSON.stringify(use.input));
  const stream = client.messages.stream({
    model: 'claude-sonnet-4-6',
    max_tokens: 100,
    messages: [{ role: 'user', content: 'Say hello.' }],
  });
  let text = '';
  stream.on('text', (delta) => { text += delta; });
  const final = await stream.finalMessage();
  console.log('stream', text, final.stop_reason);
  const elsewhere = new Anthropic({
    baseURL: process.argv[4], apiKey: 'placeholder', maxRetries: 0,
  });
  try {
    await elsewhere.messages.create({
      model: 'claude-sonnet-4-6',
      max_tokens: 100,
      messages: [{ role: 'user', content: 'Not through the gateway.' }],
    });
    console.log('unlisted answered');
  } catch (error) {
    const words = [];
    for (let e = error; e; e = e.cause) words.push(e.message || e.code);
    console.log('unlisted', error.constructor.name, words.join(' < '));
  }
}
main().catch((error) => { console.log('failed:', error.stack); });
"""

NODE_FETCH = """
const urls = ['https://allowed.test/node', 'http://other.test/node-plain',
              'https://other.test/node-tls'];
async function main() {
  if (process.argv[2] === 'undici') {
    const { EnvHttpProxyAgent, setGlobalDispatcher } = require(process.argv[3]);
    setGlobalDispatcher(new EnvHttpProxyAgent());
  }
  for (const url of urls) {
    try {
      const answer = await fetch(url);
      console.log('fetch', url, answer.status, await answer.text());
    } catch (error) {
      const cause = error.cause ?? error;
      const code = typeof cause.code === 'string' ? cause.code : '';
      const inner = cause.cause ? ` (${cause.cause.message})` : '';
      console.log('fetch', url, 'failed:', code || cause.message + inner);
    }
  }
}
main();
"""


@pytest.fixture(scope="module")
def model(machine: Machine) -> Iterator[ModelServer]:
    yield from scripted_model(machine)


@pytest.fixture(scope="module", autouse=True)
def site(machine: Machine, model: ModelServer) -> Iterator[None]:
    server = start_package_site(machine, LISTED)
    for name, text in (
        ("anthropic_sdk.py", ANTHROPIC_SDK),
        ("python_http.py", PYTHON_HTTP),
        ("node_fetch.js", NODE_FETCH),
        ("anthropic_sdk.js", TYPESCRIPT_SDK_SCRIPT),
    ):
        machine.run("install", "-D", "-m", "0644", "/dev/stdin", f"{SCRIPTS}/{name}", input=text)
    npm = machine.root / "opt/npm"
    shutil.rmtree(npm, ignore_errors=True)
    with tarfile.open(npm_tarballs()["npm"]) as archive:
        archive.extractall(machine.root / "opt", filter="data")
    (machine.root / "opt/package").rename(npm)
    yield
    server.kill()
    server.wait()


def steps(task: dict[str, Any]) -> list[str]:
    return [step["text"] for step in task["steps"]]


def refusals(machine: Machine, task_id: str, at_least: int) -> list[str]:
    """The task's refusal lines, once they count `at_least` refusals: the broker logs a host's
    first at once and counts the rest of that second into one line, whatever their port, which
    it may log only as it stops, after the task is done."""
    pattern = re.compile(
        rf"Task {task_id} was refused {UNLISTED}:\d+(?: (\d+) times)?: "
        "it is not in this task's hosts"
    )
    deadline = time.monotonic() + 30
    while True:
        machine.run("journalctl", "--sync")
        lines = machine.run(
            "journalctl", f"BOX_TASK={task_id}", "BOX_EVENT=net.refused", "-o", "cat"
        ).stdout.splitlines()
        found = [pattern.fullmatch(line) for line in lines]
        assert all(found), lines
        if sum(int(m.group(1) or 1) for m in found if m) >= at_least:
            return lines
        assert time.monotonic() < deadline, lines
        time.sleep(0.2)


def every_field_reached(created: dict[str, Any], streamed: dict[str, Any]) -> None:
    """What ANTHROPIC_SDK and TYPESCRIPT_SDK_SCRIPT create and stream reached the upstream as
    the SDK sent it, the model as the task asked for it."""
    body = created["body"]
    assert body["model"] == MODEL
    assert body["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    ]
    assert body["metadata"] == {"user_id": "box-test"}
    assert body["tools"][0]["name"] == "lookup"
    assert body["tools"][0]["cache_control"] == {"type": "ephemeral"}
    assert body["tool_choice"] == {"type": "auto"}
    assert body["stop_sequences"] == ["END"]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert body["cache_control"] == {"type": "ephemeral"}
    assert streamed["body"]["stream"] is True


def test_python_clients_from_a_package_index(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """pip installs Anthropic's SDK, requests and httpx from the index on a listed host; the SDK
    makes a client, creates and streams through the gateway; requests and httpx reach a listed
    host and are refused another."""
    model.set_script(
        [
            {"blocks": [{"type": "tool_use", "name": "lookup", "input": {"word": "box"}}]},
            {"blocks": [{"type": "text", "text": "Hello from the stream."}]},
        ]
    )
    pip = f"{CA_ENVIRONMENT} $HOME/venv/bin/pip install --disable-pip-version-check --retries 0"
    prompt = "\n".join(
        [
            f"sh python3 -m venv $HOME/venv && {pip} -q --index-url {SITE}/simple/ "
            "anthropic==2.17.0 requests httpx && echo installed",
            # One retry: pip tells why a connection broke only when it retries.
            f"sh {pip.replace('--retries 0', '--retries 1')} --index-url {OTHER_SITE}/simple/ six "
            "> $HOME/pip.log 2>&1; echo exit $?; "
            "grep -o -m 1 'Tunnel connection failed: 403 [^\")]*' $HOME/pip.log",
            f"sh $HOME/venv/bin/python {SCRIPTS}/anthropic_sdk.py 2>&1",
            # The trap boxd's environment no longer sets (docs/agents.md, "The proxy variables").
            f"sh ALL_PROXY=$BOX_SOCKS_PROXY $HOME/venv/bin/python {SCRIPTS}/anthropic_sdk.py "
            "2>&1 | grep -m 1 '^ImportError'",
            f"sh {CA_ENVIRONMENT} $HOME/venv/bin/python {SCRIPTS}/python_http.py 2>&1",
        ]
    )
    task = finish(
        machine, start_fake(machine, token, prompt, hosts=[LISTED], model="sonnet")["id"], 300
    )
    assert task["state"] == "done", task
    installed, pip_refused, sdk, trap, http_clients = steps(task)
    assert installed == "installed"
    assert pip_refused == (
        "exit 1\nTunnel connection failed: 403 Forbidden: boxd refused other.test:8443: it is not "
        "in this task's hosts"
    ), pip_refused
    # The CONNECT's status line carries boxd's words, which Python's clients show.
    https_refusal = "403 Forbidden: boxd refused other.test:443: it is not in this task's hosts"
    assert sdk.splitlines() == [
        "create tool_use lookup {'word': 'box'}",
        "stream Hello from the stream. end_turn",
    ]
    assert trap.startswith(
        "ImportError: Using SOCKS proxy, but the 'socksio' package is not installed."
    ), trap
    every_field_reached(*model.requests())
    assert task["costCents"] == pytest.approx(cost_of(DEFAULT_USAGE, DEFAULT_USAGE))
    lines = http_clients.splitlines()
    for client in ("requests", "httpx"):
        mine = [line for line in lines if line.startswith(client + " ")]
        assert mine[0] == f"{client} https://allowed.test/py 200 hello from 443 /py", lines
        assert mine[1] == (
            f"{client} http://other.test/py-plain 403 boxd refused other.test:80: it is not in "
            "this task's hosts"
        ), lines
        assert "failed:" in mine[2] and https_refusal in mine[2], lines
    # pip's two tries, requests' and httpx's two each.
    refusals(machine, task["id"], 6)
    assert f"{UNLISTED}:{PORT} /simple" not in arrived(machine)
    assert "/py-plain" not in arrived(machine) and "/py-tls" not in arrived(machine)


def test_curl_git_npm_and_node_fetch(machine: Machine, token: str) -> None:
    proj = "$HOME/proj"
    npm = f"{CA_ENVIRONMENT} node {NPM} --prefix {proj} --no-audit --no-fund --fetch-retries 0"
    undici = f"undici@{NPM_PACKAGES['undici']}"
    prompt = "\n".join(
        [
            f"sh curl -sS https://{LISTED}/curl",
            f"sh curl -sS http://{UNLISTED}/curl-plain",
            f"sh curl -sS https://{UNLISTED}/curl-tls 2>&1; echo exit $?",
            f"sh git clone -q {SITE}/git/hello.git $HOME/hello && cat $HOME/hello/hello.txt",
            f"sh git clone -q {OTHER_SITE}/git/hello.git $HOME/other 2>&1; echo exit $?",
            f"sh {npm} install --registry {SITE}/npm/ {undici} >/dev/null 2>&1 && "
            f"node -p \"require('{proj}/node_modules/undici/package.json').version\"",
            f"sh {npm} install --registry {OTHER_SITE}/npm/ {undici} > $HOME/npm.log 2>&1; "
            "echo exit $?; grep -m 1 'E403' $HOME/npm.log",
            f"sh {CA_ENVIRONMENT} node {SCRIPTS}/node_fetch.js undici "
            f"{proj}/node_modules/undici 2>/dev/null",
            f"sh {CA_ENVIRONMENT} node {SCRIPTS}/node_fetch.js 2>/dev/null",
        ]
    )
    task = finish(machine, start_fake(machine, token, prompt, hosts=[LISTED])["id"], 300)
    assert task["state"] == "done", task
    (
        curl,
        curl_plain,
        curl_tls,
        git,
        git_refused,
        npm_installed,
        npm_refused,
        fetch_undici,
        fetch_plain,
    ) = steps(task)
    assert curl == "hello from 443 /curl"
    assert curl_plain == "boxd refused other.test:80: it is not in this task's hosts"
    assert "CONNECT tunnel failed, response 403" in curl_tls, curl_tls
    assert git == GIT_TEXT
    assert "CONNECT tunnel failed, response 403" in git_refused, git_refused
    assert npm_installed == NPM_PACKAGES["undici"]
    assert npm_refused == "exit 1\nnpm error code E403", npm_refused
    # undici's proxy agent tunnels plain http too: a refused CONNECT, its words in the log.
    listed, plain, tls = fetch_undici.splitlines()
    assert listed == "fetch https://allowed.test/node 200 hello from 443 /node"
    # Node 20 tells why the request was cancelled; Node 18 does not.
    refused = "failed: Request was cancelled."
    assert plain.startswith(f"fetch http://other.test/node-plain {refused}"), plain
    assert tls.startswith(f"fetch https://other.test/node-tls {refused}"), tls
    # Node 20 (Debian 13's) and 18 read no proxy variable: fetch goes direct, where the task's
    # network has no route.
    assert fetch_plain.splitlines()[0] == "fetch https://allowed.test/node failed: ENETUNREACH"
    # curl's two, git's, npm's, and undici's two.
    refusals(machine, task["id"], 6)
    assert "-plain" not in arrived(machine) and "-tls" not in arrived(machine)


def test_typescript_sdk_on_node_from_the_npm_registry(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """npm installs Anthropic's TypeScript SDK and its dependencies from the registry on a
    listed host; the SDK creates and streams through the gateway, with undici's proxy agent as
    fetch's dispatcher and without; pointed at an unlisted host it is refused (through the
    proxy, in words in the task's log) or has no route (without)."""
    turns: list[dict[str, Any]] = [
        {"blocks": [{"type": "tool_use", "name": "lookup", "input": {"word": "box"}}]},
        {"blocks": [{"type": "text", "text": "Hello from the stream."}]},
    ]
    model.set_script(turns * 2)
    proj = "$HOME/proj"
    npm = f"{CA_ENVIRONMENT} node {NPM} --prefix {proj} --no-audit --no-fund --fetch-retries 0"
    sdk_version = NPM_PACKAGES[TYPESCRIPT_SDK]
    sdk = f"{proj}/node_modules/{TYPESCRIPT_SDK}"
    undici = f"{proj}/node_modules/undici"
    # The scripted model itself, under a name the task does not list.
    unlisted = f"https://{UNLISTED}:{TLS_PORT}"
    run = f"{CA_ENVIRONMENT} node {SCRIPTS}/anthropic_sdk.js"
    prompt = "\n".join(
        [
            f"sh {npm} install --registry {SITE}/npm/ {TYPESCRIPT_SDK}@{sdk_version} "
            f"undici@{NPM_PACKAGES['undici']} >/dev/null 2>&1 && "
            f'node -p "require(\'{sdk}/package.json\').version" && node -p "Object.keys(require('
            f"'{proj}/node_modules/.package-lock.json').packages).sort().join(' ')\"",
            f"sh {run} {sdk} {undici} {unlisted} 2>/dev/null",
            f"sh {run} {sdk} '' {unlisted} 2>/dev/null",
        ]
    )
    task = finish(
        machine, start_fake(machine, token, prompt, hosts=[LISTED], model="sonnet")["id"], 300
    )
    assert task["state"] == "done", task
    installed, with_proxy, without_proxy = steps(task)
    version, tree = installed.splitlines()
    assert version == sdk_version
    assert tree.split() == sorted(
        f"node_modules/{name}" for name in [*TYPESCRIPT_SDK_TREE, "undici"]
    ), tree
    created = 'create tool_use lookup {"word":"box"}'
    streamed = "stream Hello from the stream. end_turn"
    # The unlisted host: refused at the proxy (the SDK shows undici's words for a refused
    # CONNECT, boxd's are in the task's log), or unreachable without it.
    unlisted_error = f"unlisted APIConnectionError Connection to {UNLISTED}:{TLS_PORT} failed: "
    *answered, refused = with_proxy.splitlines()
    assert answered == [created, streamed], with_proxy
    # Node 20 names the code (UND_ERR_ABORTED) and ends "< Proxy response (403) !== 200 when
    # HTTP Tunneling"; Node 18 says "Error" and ends with the cancel.
    assert refused.startswith(unlisted_error), refused
    assert " < fetch failed < Request was cancelled." in refused, refused
    *answered, unreachable = without_proxy.splitlines()
    assert answered == [created, streamed], without_proxy
    assert unreachable.startswith(
        f"{unlisted_error}ENETUNREACH < fetch failed < connect ENETUNREACH"
    ), unreachable
    # Each run's create and stream, and nothing from the unlisted name.
    requests = model.requests()
    assert len(requests) == 4, requests
    every_field_reached(*requests[:2])
    every_field_reached(*requests[2:])
    assert task["costCents"] == pytest.approx(cost_of(*[DEFAULT_USAGE] * 4))
    refusals(machine, task["id"], 1)
