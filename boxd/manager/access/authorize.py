"""Who is calling: polkit decides for the owner's interface, the bearer token for the gateway's,
and the calling process's systemd unit for a broker's (only box-broker@<id> acts for <id>)."""

from collections import OrderedDict

from dbus_fast import Message
from dbus_fast.aio import MessageBus

from boxd.dbus import interface as api
from boxd.dbus.bus_daemon import connection_pid, connection_uid
from boxd.dbus.polkit import check_authorization
from boxd.errors import Problem, die
from boxd.manager.access.screen_sessions import ScreenSessions
from boxd.manager.access.tokens import DEVICE, token_hash
from boxd.manager.record.store import Store
from boxd.manager.units.systemd import Systemd
from boxd.manager.units.users import user_name
from boxd.manager.units.worker_unit import broker_service_unit
from boxd.wire.caller import Caller, Role
from boxd.wire.models.settings import MAX_RUNNING_TASKS

# Brokers whose unit is remembered, the most recently seen: every running task's, and then some.
# A broker forgotten is looked up again; one remembered for ever per broker ever started is a leak.
REMEMBERED_BROKERS = 2 * MAX_RUNNING_TASKS


class Authorizer:
    def __init__(
        self, bus: MessageBus, store: Store, systemd: Systemd, screen: ScreenSessions
    ) -> None:
        self._bus = bus
        self._screen = screen
        self._store = store
        self._systemd = systemd
        # Unique bus names are never reused while the bus runs, so a broker's unit is looked
        # up once per connection.
        self._brokers: OrderedDict[str, str] = OrderedDict()

    async def __call__(self, message: Message, method: api.Bound) -> Caller:
        sender = message.sender or ""
        if method.interface == api.MANAGER:
            await check_authorization(self._bus, sender, api.MANAGE_ACTION)
            uid = await connection_uid(self._bus, sender)
            account = user_name(uid)
            return Caller(Role.OWNER, account, user=account, uid=uid)
        if method.interface == api.GATEWAY and method.method == api.PAIR:
            # The code is checked by the method itself, and is all it takes.
            return Caller(Role.PAIRING, "a device with a pairing code")
        if method.interface == api.GATEWAY:
            token = message.body[0]
            link = self._screen.link_caller(token) if token else None
            if link is not None:
                return link
            found = await self._store.token(token_hash(token)) if token else None
            if found is None:
                die(Problem.UNAUTHORIZED, "a valid bearer token is required (boxctl token create)")
            if found.role == Role.SCREEN:
                await self._screen.refuse_if_over(found)
            if found.role == DEVICE:
                return Caller(Role.DEVICE, found.name, user=found.user, device=found.name)
            return Caller(Role(found.role), found.name, user=found.user, limits=found.limits)
        task_id = message.body[0]
        if await self._broker_unit(sender) != broker_service_unit(task_id):
            die(Problem.FORBIDDEN, f"only the broker of task {task_id} may do this")
        return Caller(Role.BROKER, sender, task=task_id)

    async def _broker_unit(self, sender: str) -> str | None:
        if sender in self._brokers:
            self._brokers.move_to_end(sender)
            return self._brokers[sender]
        unit = await self._systemd.unit_of_pid(await connection_pid(self._bus, sender))
        if unit is None:
            return None
        self._brokers[sender] = unit
        while len(self._brokers) > REMEMBERED_BROKERS:
            self._brokers.popitem(last=False)
        return unit
