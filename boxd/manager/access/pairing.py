"""Pairing codes: the owner makes one for a device's name (`boxctl pair NAME`); the device
exchanges it, once and within ten minutes, for a token of its own (`POST /api/pair`).

Codes live in boxd's memory only: a restart voids them, and the owner makes another. A code is
ten characters from an alphabet without look-alikes (0/O, 1/I/L, U/V), some 49 bits, good for
ten minutes: a guesser at thousands of tries a second has about one chance in 10^8 per code.
Wrong codes void nothing and hold nothing up: the door needs no credentials, so any local user,
task or web page could otherwise keep the owner from ever pairing.
"""

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from boxd.errors import Problem, die

LIFETIME = 600.0
# Open codes at once: the oldest goes when the owner makes more.
MAX_OPEN = 16
ALPHABET = "ABCDEFGHJKMNPQRSTWXYZ23456789"
LENGTH = 10
MAX_DEVICE_NAME = 60
AGAIN = "make a new one with boxctl pair NAME"
WRONG = f"that pairing code is not one this box made: check it, or {AGAIN}"
USED = f"that pairing code was used already: a code pairs one device, once; {AGAIN}"
EXPIRED = f"that pairing code expired: a code works for ten minutes; {AGAIN}"


def check_device_name(name: str) -> str:
    """Tasks from the device get source phone:<name>, so the name is shown as it is."""
    name = name.strip()
    if not 0 < len(name) <= MAX_DEVICE_NAME or not name.isprintable():
        die(
            Problem.INVALID,
            f"a device's name must be 1 to {MAX_DEVICE_NAME} printable characters, "
            "such as anna-phone",
        )
    return name


def _key(code: str) -> str:
    """Codes are typed by people: case, spaces and dashes do not count."""
    plain = "".join(c for c in code.upper() if c not in " -")
    return hashlib.sha256(plain.encode()).hexdigest()


@dataclass
class _Open:
    device: str
    maker: str | None
    expires: float
    used: bool = False


@dataclass(frozen=True)
class Paired:
    device: str
    maker: str | None


class Pairings:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._codes: dict[str, _Open] = {}

    def make(self, device: str, maker: str | None) -> str:
        """A new code for `device`, shown as XXXXX-XXXXX."""
        self._forget_expired()
        while len(self._codes) >= MAX_OPEN:
            del self._codes[next(iter(self._codes))]
        code = "".join(secrets.choice(ALPHABET) for _ in range(LENGTH))
        self._codes[_key(code)] = _Open(device, maker, self._clock() + LIFETIME)
        return f"{code[:5]}-{code[5:]}"

    def redeem(self, code: str) -> Paired:
        """The device the code was made for; a code is good once, within LIFETIME."""
        found = self._codes.get(_key(code))
        if found is None:
            die(Problem.FORBIDDEN, WRONG)
        if found.expires <= self._clock():
            die(Problem.FORBIDDEN, EXPIRED)
        if found.used:
            die(Problem.FORBIDDEN, USED)
        found.used = True
        return Paired(found.device, found.maker)

    def _forget_expired(self) -> None:
        now = self._clock()
        self._codes = {k: v for k, v in self._codes.items() if v.expires > now}
