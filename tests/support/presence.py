"""Broker connections on a stand-in bus, for the model requests' tests."""

from boxd.wire.caller import Caller, Role

TASK = "t000000001"
BROKER = Caller(Role.BROKER, ":1.7", task=TASK)
LATER_BROKER = Caller(Role.BROKER, ":1.9", task=TASK)


class Presence:
    """Broker connections on a stand-in bus: those in `live` are still there."""

    def __init__(self) -> None:
        self.live = {BROKER.name, LATER_BROKER.name}

    async def holder(self, sender: str) -> str:
        return f"bus/{sender}"

    async def alive(self, holder: str) -> bool:
        return holder.removeprefix("bus/") in self.live
