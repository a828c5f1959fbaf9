"""boxctl: start, list, show, follow and stop tasks; tokens, settings and the vault. Talks to
boxd over D-Bus, so polkit decides: root and members of boxd-owner may use it."""

import argparse
import asyncio
import getpass
import json
import os
import sys
from functools import partial
from typing import Any

from boxd.cli import get, show, workspace_files
from boxd.cli.follow import follow
from boxd.cli.open_screen import open_screen
from boxd.cli.put import create_from, put
from boxd.dbus import interface as api
from boxd.dbus.client import BoxClient, connect_system_bus, pages, whole
from boxd.dbus.interface import MANAGER
from boxd.errors import BoxError, Problem, die
from boxd.wire.caller import Role
from boxd.wire.doctor import Finding, age_line, report


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="boxctl", description="Work with the box's tasks.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    start = commands.add_parser("start", help="start a task")
    start.add_argument("prompt", help="what the worker should do; - reads it from stdin")
    start.add_argument("--title", help="a short name for people (default: the prompt's start)")
    start.add_argument("--worker", help="droid (default), claude (Claude Code) or fake")
    start.add_argument("--workspace", help="a folder in BOX_HOME/workspaces (default: home)")
    start.add_argument(
        "--folder",
        action="append",
        dest="folders",
        # Relative to where boxctl runs; the box wants absolute paths.
        type=os.path.abspath,
        help="one of your real folders to work on a copy of (repeat for several)",
    )
    start.add_argument("--budget", type=int, dest="budgetCents", help="budget in US cents")
    start.add_argument("--host", action="append", dest="hosts", help="a host it may reach")
    start.add_argument("--tool", action="append", dest="tools", help="a tool it may call")
    start.add_argument("--model", help="haiku, sonnet, opus or a claude-... id")
    start.add_argument("--source", help="who started it, for the log (default: api)")
    start.add_argument("--follow", action="store_true", help="follow its steps until it ends")
    start.add_argument("--json", action="store_true", help="print the task as JSON")

    listing = commands.add_parser("list", help="list tasks, newest first")
    listing.add_argument("--json", action="store_true")

    for name, text in (
        ("show", "show a task and its steps"),
        ("follow", "print a task's steps live until it ends"),
        ("stop", "stop a running task"),
        ("undo", "take a task's changes out of its workspace"),
        ("keep", "apply a personal task's changes to your real folders"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("id", help="the task id, like t3k9x2a1b2")
        command.add_argument("--json", action="store_true")

    review = commands.add_parser("diff", help="review what a task changed, file by file")
    review.add_argument("id", help="the task id, like t3k9x2a1b2")
    review.add_argument("--json", action="store_true")

    approvals = commands.add_parser("approvals", help="list what tasks wait for you to approve")
    approvals.add_argument("--json", action="store_true")
    for name, text in (("approve", "say yes to an approval"), ("deny", "say no to an approval")):
        command = commands.add_parser(name, help=text)
        command.add_argument("id", help="the approval id, like t3k9x2a1b2.line-3")
        command.add_argument("--json", action="store_true")

    workspace = commands.add_parser("workspace", help="the folders tasks work on")
    workspace_commands = workspace.add_subparsers(dest="workspace_command", required=True)
    listing = workspace_commands.add_parser("ls", help="list workspaces")
    listing.add_argument("--json", action="store_true")
    for name, text in (
        ("create", "make a workspace, empty or (--from DIR) with a folder's files"),
        ("rm", "move a workspace to BOX_HOME/trash"),
    ):
        command = workspace_commands.add_parser(name, help=text)
        command.add_argument("name", help="the workspace's name")
        command.add_argument("--json", action="store_true")
        if name == "create":
            command.add_argument(
                "--from", dest="source", metavar="DIR", help="import this folder's files"
            )

    put_files = commands.add_parser(
        "put", help="add your files and folders to a workspace, as one change of yours"
    )
    put_files.add_argument("sources", nargs="+", metavar="SRC", help="a file or folder")
    put_files.add_argument(
        "target", metavar="WORKSPACE[:FOLDER]", help="where they go, like home or home:docs"
    )
    put_files.add_argument("--json", action="store_true")

    commands.add_parser(
        "open", help="open this computer's own screen in your browser (a one-time link)"
    )
    token = commands.add_parser("token", help="bearer tokens for the HTTP API")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    create = token_commands.add_parser("create", help="make a token and print it")
    create.add_argument("--name", help="what the token is for (default: owner)")
    kind = create.add_mutually_exclusive_group()
    kind.add_argument(
        "--app",
        action="store_true",
        help="for an app: it may start and follow tasks, but not act as the owner",
    )
    kind.add_argument(
        "--member",
        metavar="ID",
        help="for a person: their tasks get requester ID; they see and stop only their own",
    )
    create.add_argument(
        "--max-budget",
        type=int,
        metavar="CENTS",
        dest="maxBudgetCents",
        help="an app's or member's tasks ask for at most this budget "
        "(default: Settings defaultBudgetCents)",
    )
    create.add_argument(
        "--tool", action="append", dest="tools", help="a tool their tasks may name (repeat)"
    )
    create.add_argument(
        "--host",
        action="append",
        dest="hosts",
        help="a host rule their tasks' hosts must fall within (repeat; default: none)",
    )
    create.add_argument(
        "--workspace",
        action="append",
        dest="workspaces",
        help="a workspace their tasks may work on (repeat; default: home)",
    )
    tokens = token_commands.add_parser("ls", help="list tokens: id, name, role, made by, limits")
    tokens.add_argument("--json", action="store_true")
    revoke = token_commands.add_parser("revoke", help="revoke a token: it is refused at once")
    revoke.add_argument("id", help="the token's id, or its name if no other token has it")

    settings = commands.add_parser("settings", help="show or change the box's settings")
    settings.add_argument("--json", action="store_true")
    settings_commands = settings.add_subparsers(dest="settings_command")
    change = settings_commands.add_parser("set", help="change one setting")
    change.add_argument("name", help="defaultBudgetCents, defaultHosts, networkDefault, ...")
    change.add_argument("value", help="a JSON value, or plain text for a string")

    droid = commands.add_parser(
        "droid", help="the Droid version installed, or whether its install is under way"
    )
    droid.add_argument("--json", action="store_true")
    claude = commands.add_parser(
        "claude", help="the Claude Code version installed, or whether its install is under way"
    )
    claude.add_argument("--json", action="store_true")

    doctor = commands.add_parser(
        "doctor",
        help="have boxd check this machine anew: what is missing and how to fix it "
        "(exit status 1: tasks cannot start)",
    )
    doctor.add_argument("--json", action="store_true")
    pair = commands.add_parser(
        "pair", help="make a code a device exchanges once, within ten minutes, for a token"
    )
    pair.add_argument("name", help="the device's name: its tasks' source is phone:NAME")
    pair.add_argument("--json", action="store_true")

    for name, text in (
        ("pause", "pause the agents: new tasks stay queued, running ones carry on"),
        ("resume", "resume the agents: queued tasks start in the order they came"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("--json", action="store_true")

    workspace_files.add_parsers(commands)
    get.add_parser(commands)

    vault = commands.add_parser("vault", help="the secrets that tools use; values never show")
    vault_commands = vault.add_subparsers(dest="vault_command", required=True)
    put = vault_commands.add_parser("set", help="set a secret, its value read from stdin")
    put.add_argument("name", help="like mail.password")
    remove = vault_commands.add_parser("rm", help="remove a secret")
    remove.add_argument("name")
    names = vault_commands.add_parser("ls", help="list the secrets' names and whose each is")
    names.add_argument("--json", action="store_true")
    return parser


def _secret_value(name: str) -> str:
    """The value from stdin without its trailing newline; typed at a terminal, not echoed."""
    if sys.stdin.isatty():
        return getpass.getpass(f"{name}: ")
    try:
        value = sys.stdin.buffer.read().decode()
    except UnicodeDecodeError:
        die(Problem.INVALID, f"the value of {name} is not UTF-8 text; encode it, e.g. with base64")
    if value.endswith("\n"):
        value = value[:-1].removesuffix("\r")
    if "\0" in value:
        die(Problem.INVALID, f"the value of {name} holds a NUL byte; encode it, e.g. with base64")
    return value


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _print_event(event: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(event), flush=True)
    elif event["kind"] == "task.step":
        print(show.step_line({"at": event["at"], "text": event["data"]["text"]}), flush=True)
    elif event["kind"] == "task.state":
        data = event["data"]
        print(show.state_line(data["state"], data.get("error"), event["at"]), flush=True)


async def _follow(client: BoxClient, task_id: str, as_json: bool) -> int:
    state = await follow(client, task_id, lambda event: _print_event(event, as_json))
    return 0 if state == "done" else 1


async def _diff(client: BoxClient, task_id: str, as_json: bool) -> None:
    """Printed page by page as they come, so a long review is never held whole."""
    ask = partial(client.call, api.DIFF_TASK, task_id)
    if as_json:
        print(show.as_json(await whole(ask, "files")))
        return
    count = 0
    async for page in pages(ask):
        if count == 0:
            print(show.diff_head(page), flush=True)
        for item in page["files"]:
            print(show.diff_entry(item), flush=True)
            count += 1
        if page.get("truncated") and "next" not in page:
            print(f"... and more: a review lists the first {count:,} changes.")
    if count == 0:
        print("No changes.")


async def run(arguments: argparse.Namespace) -> int:
    client = BoxClient(await connect_system_bus(fds=True), MANAGER)
    as_json = getattr(arguments, "json", False)
    command = arguments.command
    if command in workspace_files.COMMANDS:
        return await workspace_files.run(client, arguments)
    if command == "get":
        return await get.run(client, arguments)
    if command == "start":
        prompt = sys.stdin.read() if arguments.prompt == "-" else arguments.prompt
        first_line = prompt.strip().splitlines()[0][:80] if prompt.strip() else ""
        request: dict[str, Any] = {"title": arguments.title or first_line, "prompt": prompt}
        for field in ("worker", "workspace", "budgetCents", "hosts", "tools", "model", "source"):
            if getattr(arguments, field) is not None:
                request[field] = getattr(arguments, field)
        if arguments.folders:
            real = arguments.folders
            request.update({"folder": real[0]} if len(real) == 1 else {"folders": real})
        task = await client.call(api.CREATE_TASK, json.dumps(request))
        print(show.as_json(task) if as_json else task["id"], flush=True)
        if arguments.follow:
            return await _follow(client, task["id"], as_json)
        return 0 if task["state"] != "failed" else 1
    if command == "list":
        tasks = (await whole(lambda page: client.call(api.LIST_TASKS, page), "tasks"))["tasks"]
        print(show.as_json(tasks) if as_json else show.task_table(tasks))
    elif command == "show":
        task = await whole(lambda page: client.call(api.GET_TASK, arguments.id, page), "steps")
        print(show.as_json(task) if as_json else show.task_details(task))
    elif command == "follow":
        return await _follow(client, arguments.id, as_json)
    elif command in ("stop", "undo", "keep"):
        method = {"stop": api.STOP_TASK, "undo": api.UNDO_TASK, "keep": api.KEEP_TASK}[command]
        task = await client.call(method, arguments.id)
        print(show.as_json(task) if as_json else show.task_line(task))
    elif command == "diff":
        await _diff(client, arguments.id, as_json)
    elif command == "approvals":
        pending = await whole(lambda page: client.call(api.LIST_APPROVALS, page), "approvals")
        pending = pending["approvals"]
        print(show.as_json(pending) if as_json else show.approval_table(pending))
    elif command in ("approve", "deny"):
        approval = await client.call(api.ANSWER_APPROVAL, arguments.id, command == "approve")
        print(show.as_json(approval) if as_json else show.approval_line(approval))
    elif command == "workspace":
        if arguments.workspace_command == "ls":
            found = await client.call(api.LIST_WORKSPACES)
            lines = [f"{w['name']:<20} {w['path']}" for w in found]
        elif arguments.workspace_command == "create" and arguments.source is not None:
            found = await create_from(client, arguments.name, arguments.source)
            lines = [f"{found['name']:<20} {show.task_line(found['change'])}"]
        elif arguments.workspace_command == "create":
            found = await client.call(api.CREATE_WORKSPACE, arguments.name)
            lines = [f"{found['name']:<20} {found['path']}"]
        else:
            found = await client.call(api.REMOVE_WORKSPACE, arguments.name)
            lines = [f"{found['name']} moved to {found['trash']}"]
        print(show.as_json(found) if as_json else "\n".join(lines))
    elif command == "put":
        change = await put(client, arguments.sources, arguments.target)
        print(show.as_json(change) if as_json else show.task_line(change))
    elif command == "open":
        return await open_screen(client)
    elif command == "token":
        if arguments.token_command == "ls":
            found = await client.call(api.LIST_TOKENS)
            print(show.as_json(found) if as_json else show.token_table(found))
        elif arguments.token_command == "revoke":
            revoked = await client.call(api.REVOKE_TOKEN, arguments.id)
            print(f"revoked {revoked['id']} ({revoked['name']})")
        else:
            limits = {
                field: getattr(arguments, field)
                for field in ("maxBudgetCents", "tools", "hosts", "workspaces")
                if getattr(arguments, field) is not None
            }
            if arguments.member is not None:
                if arguments.name is not None:
                    die(Problem.INVALID, "a member's token is named by their id: leave out --name")
                name, role = arguments.member, Role.MEMBER
            else:
                name, role = arguments.name or "owner", Role.APP if arguments.app else Role.OWNER
            print(await client.call(api.CREATE_TOKEN, name, role.value, json.dumps(limits)))
    elif command == "settings":
        if arguments.settings_command == "set":
            changes = {arguments.name: _value(arguments.value)}
            settings = await client.call(api.SET_SETTINGS, json.dumps(changes))
        else:
            settings = await client.call(api.GET_SETTINGS)
        if as_json:
            print(show.as_json(settings))
        else:
            for name, value in settings.items():
                print(f"{name}: {json.dumps(value)}")
    elif command == "droid":
        droid = await client.call(api.GET_DROID)
        print(show.as_json(droid) if as_json else show.install_line(droid, "Droid", "Droid"))
    elif command == "claude":
        claude = await client.call(api.GET_CLAUDE)
        first = "; boxd installs it for the first Claude task"
        print(
            show.as_json(claude)
            if as_json
            else show.install_line(claude, "Claude Code", "Claude", first)
        )
    elif command == "doctor":
        answer = await client.call(api.CHECK_MACHINE)
        findings = [Finding.read(shown) for shown in answer["checks"]]
        print(show.as_json(answer) if as_json else show.visible(report(findings), lines=True))
        if not as_json and (old := age_line(answer)) is not None:
            print(old)
        return 0 if answer["tasksStart"] else 1
    elif command == "pair":
        pairing = await client.call(api.CREATE_PAIRING, arguments.name)
        shown = show.pairing_text(pairing, qr=sys.stdout.isatty())
        print(show.as_json(pairing) if as_json else shown)
    elif command in ("pause", "resume"):
        agents = await client.call(api.PAUSE_AGENTS if command == "pause" else api.RESUME_AGENTS)
        print(show.as_json(agents) if as_json else show.agents_line(agents))
    elif command == "vault":
        if arguments.vault_command == "set":
            await client.call(api.SET_SECRET, arguments.name, _secret_value(arguments.name))
        elif arguments.vault_command == "rm":
            await client.call(api.REMOVE_SECRET, arguments.name)
        else:
            secrets = await client.call(api.LIST_SECRETS)
            print(show.as_json(secrets) if as_json else show.secret_table(secrets))
    return 0


def main() -> None:
    try:
        sys.exit(asyncio.run(run(_parser().parse_args())))
    except BoxError as error:
        print(f"boxctl: {show.visible(error.message)}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
