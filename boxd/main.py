"""`boxd`: the box's services, one subcommand each, as the units in units/ start them."""

import argparse
import sys

from boxd.errors import BoxError


def main() -> None:
    parser = argparse.ArgumentParser(prog="boxd", description="The box's system services.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("manager", help="the manager (boxd.service)")
    commands.add_parser("web", help="the HTTP gateway (boxd-web.service)")
    broker = commands.add_parser("broker", help="one task's broker (box-broker@.service)")
    broker.add_argument("task", help="the task id")
    app = commands.add_parser("app", help="one app's runner (box-app@.service)")
    app.add_argument("name", help="the app's name")
    commands.add_parser(
        "droid-install", help="install the pinned Droid binary (boxd-droid-install.service)"
    )
    commands.add_parser(
        "claude-install",
        help="install the pinned Claude Code binary (boxd-claude-install.service)",
    )
    # Parsed here, its module imported only when it runs: every broker's start reads this file.
    checks = commands.add_parser(
        "doctor",
        help="check what boxd needs of this machine, as root (exit status 1: tasks cannot start)",
    )
    checks.add_argument("--json", action="store_true", help="print the findings as JSON")
    arguments = parser.parse_args()
    try:
        if arguments.command == "manager":
            from boxd.manager.main import main as manager

            manager()
        elif arguments.command == "web":
            from boxd.web.main import main as web

            web()
        elif arguments.command == "doctor":
            from boxd.manager.doctor.command import main as doctor

            doctor(arguments.json)
        elif arguments.command == "droid-install":
            from boxd.droid.installer import main as droid_install

            droid_install()
        elif arguments.command == "claude-install":
            from boxd.claude.installer import main as claude_install

            claude_install()
        elif arguments.command == "app":
            from boxd.apps.app_server import main as app_main

            app_main(arguments.name)
        else:
            # Before the broker imports asyncio: a task's processes have it without ssl.
            from boxd.patches.asyncio import import_asyncio_without_ssl

            import_asyncio_without_ssl()
            from boxd.broker.main import main as broker_main

            broker_main(arguments.task)
    except BoxError as error:
        print(f"boxd: {error.message}", file=sys.stderr)
        sys.exit(1)
