"""Each installed app's runner (box-app@<app>.service): its user, its secrets, its socket.

Which apps are installed is read as boxd starts, from the installed packages' metadata
(boxd.apps.registry.installed), importing none of them: root never runs an app's code. For each
app the manager makes its user, boxd-app-<app> (a system user with a group of its own, as a
package would make it), and its directory in the vault, and starts its socket, which starts the
runner on the first connection of a broker. The socket of an app no longer installed is
stopped. An app installed or removed while boxd runs is seen at boxd's next start (installing
the package restarts it; `systemctl restart boxd` does too).

A runner holds its app's secrets as they were when it started: when one is set or removed, the
runner is stopped (its runs finish first), and the next call starts it with the vault as it is.
"""

import asyncio
import logging
import os
from pathlib import Path

from boxd.apps.registry import installed
from boxd.manager.access.vault import Vault
from boxd.manager.app_state_of_before import split_state
from boxd.manager.units.systemd import Systemd
from boxd.manager.units.users import ensure_system_user, user_ids

log = logging.getLogger(__name__)


def runner_socket(app: str) -> str:
    return f"box-app@{app}.socket"


def runner_service(app: str) -> str:
    return f"box-app@{app}.service"


def app_user(app: str) -> str:
    return f"boxd-app-{app}"


class AppRunners:
    def __init__(self, systemd: Systemd, vault: Vault, home: Path) -> None:
        self._systemd = systemd
        self._vault = vault
        self._state = home / "apps"
        self.installed: frozenset[str] = frozenset()

    async def open(self) -> None:
        found = sorted(await asyncio.to_thread(installed))
        if await asyncio.to_thread(self._brokers_kept_state):
            await self._stop_old_brokers()
            await asyncio.to_thread(
                split_state, self._state, frozenset(found), self._state.parent / "apps-of-before"
            )
        await asyncio.to_thread(self._make_state_directory)
        ready = []
        for app in found:
            try:
                await ensure_system_user(app_user(app), f"boxd app {app}")
                await asyncio.to_thread(self._vault.app_directory, app)
                await asyncio.to_thread(self._make_app_state, app)
            except Exception:
                log.exception(
                    "app %s cannot be run: its user, vault or state directory is missing", app
                )
                continue
            ready.append(app)
        self.installed = frozenset(ready)
        for unit in await self._systemd.loaded_units(runner_socket("*")):
            app = unit.removeprefix("box-app@").removesuffix(".socket")
            if app not in self.installed:
                log.info("app %s is installed no more: its runner's socket is stopped", app)
                await self._systemd.stop_unit(unit)
                await self._systemd.stop_unit(runner_service(app))
        for app in ready:
            await self._systemd.start_unit(runner_socket(app))
        log.info("apps installed: %s", ", ".join(ready) or "none")

    def _brokers_kept_state(self) -> bool:
        """Whether BOX_HOME/apps is still the brokers' (a box upgraded from then)."""
        try:
            return self._state.stat().st_uid != os.geteuid()
        except FileNotFoundError:
            return False

    async def _stop_old_brokers(self) -> None:
        """Brokers started before the upgrade run apps' code with BOX_HOME/apps bound in: they
        are stopped first (each lets its running tools finish and record their results), so no
        tool of theirs meets its state given to its app's user halfway. Their sockets start
        each again, as the new unit says, on its worker's next request."""
        brokers = await self._systemd.loaded_units("box-broker@*.service")
        if brokers:
            log.info("stopping %d broker(s) of before the apps' runners", len(brokers))
        await asyncio.gather(*(self._systemd.stop_unit(unit) for unit in brokers))

    def _make_state_directory(self) -> None:
        """BOX_HOME/apps holds each app's state directory, which systemd makes and gives to the
        app's user (box-app@.service StateDirectory=box/apps/%i): the directory itself is the
        manager's (root's), and no more every broker's, as it once was."""
        self._state.mkdir(mode=0o700, exist_ok=True)
        if self._state.stat().st_uid != os.geteuid():
            os.chown(self._state, os.geteuid(), os.getegid())
        os.chmod(self._state, 0o700)

    def _make_app_state(self, app: str) -> None:
        """The app's state directory, made now if it is not there yet, as systemd would make it
        as the runner starts: made then, on a full disk, the runner could not start. One that
        is there (a box upgraded from when the brokers kept it) systemd gives to the app's
        user, walking it safely."""
        state = self._state / app
        if state.exists():
            return
        ids = user_ids(app_user(app))
        if ids is None:
            raise LookupError(f"no user {app_user(app)}")
        state.mkdir(mode=0o700)
        os.chown(state, *ids)

    async def secrets_changed(self, owner: str) -> None:
        """A secret of `owner` was set or removed: its runner, if running, is stopped, and the
        next call starts it with the vault as it is now."""
        if owner in self.installed:
            await self._systemd.stop_unit(runner_service(owner))
