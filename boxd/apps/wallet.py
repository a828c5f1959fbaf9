"""The wallet app: pays people from the box's ledger and says how much went out.

Every payment is booked under the call's idempotency key, so a call cut off and run again finds
its first booking instead of paying twice.
"""

import asyncio
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from boxd.sdk import App, Context, Tool, ToolError

MAX_CENTS = 100_000
LEDGER = "ledger.db"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS bookings (
    task TEXT NOT NULL,
    key TEXT NOT NULL,
    payee TEXT NOT NULL,
    cents INTEGER NOT NULL,
    memo TEXT NOT NULL,
    booked_at INTEGER NOT NULL,
    PRIMARY KEY (task, key)
)
"""


class Pay(BaseModel):
    # Built on its tool's first call or GET /tools, not as the broker loads the apps.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    to: Annotated[StrictStr, Field(min_length=1, max_length=200, description="Who gets paid.")]
    cents: Annotated[StrictInt, Field(ge=1, le=MAX_CENTS, description="How much, in US cents.")]
    memo: Annotated[StrictStr, Field(max_length=500, description="What the payment is for.")] = ""


class Balance(BaseModel):
    # Built on its tool's first call or GET /tools, not as the broker loads the apps.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


_SETUP = threading.Lock()


def _open(state_dir: Path) -> sqlite3.Connection:
    state_dir.mkdir(parents=True, exist_ok=True)
    # Autocommit mode, so the transactions below are exactly the BEGINs written here; the long
    # timeout lets concurrent calls queue for the write lock instead of failing.
    db = sqlite3.connect(state_dir / LEDGER, timeout=30, isolation_level=None)
    # Switching a new ledger to WAL and creating its table take locks that SQLite's busy
    # timeout does not wait for; calls racing to do it first take turns here.
    with _SETUP:
        if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            db.execute("PRAGMA journal_mode=WAL")
        db.execute(_SCHEMA)
    # A booking the call reported must survive a power cut, or a rerun would pay again.
    db.execute("PRAGMA synchronous=FULL")
    return db


def _book(state_dir: Path, task: str, key: str, pay: Pay) -> dict[str, Any]:
    with closing(_open(state_dir)) as db:
        # IMMEDIATE takes the write lock before reading, so two runs of one key cannot both see
        # "not booked yet".
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "INSERT OR IGNORE INTO bookings VALUES (?, ?, ?, ?, ?, ?)",
                (task, key, pay.to, pay.cents, pay.memo, int(time.time())),
            )
            row = db.execute(
                "SELECT payee, cents, memo, booked_at FROM bookings WHERE task = ? AND key = ?",
                (task, key),
            ).fetchone()
            db.execute("COMMIT")
        except BaseException:
            # SQLite rolls back by itself on some errors (a full disk among them); a second
            # ROLLBACK would fail and hide why.
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
    payee, cents, memo, booked_at = row
    if (payee, cents) != (pay.to, pay.cents):
        raise ToolError(
            f"the key {key!r} was already used to pay {cents} cents to {payee!r}; "
            "a new payment needs a new key"
        )
    return {"booking": key, "to": payee, "cents": cents, "memo": memo, "bookedAt": booked_at}


def _totals(state_dir: Path) -> dict[str, Any]:
    with closing(_open(state_dir)) as db:
        paid, count = db.execute(
            "SELECT COALESCE(SUM(cents), 0), COUNT(*) FROM bookings"
        ).fetchone()
    return {"paidCents": paid, "payments": count}


async def pay(pay: Pay, ctx: Context) -> dict[str, Any]:
    return await asyncio.to_thread(_book, ctx.state_dir, str(ctx.task["id"]), ctx.key, pay)


async def balance(_: Balance, ctx: Context) -> dict[str, Any]:
    return await asyncio.to_thread(_totals, ctx.state_dir)


def _cost(pay: Pay) -> float:
    return pay.cents


app = App(
    name="wallet",
    tools=(
        Tool(
            verb="pay",
            description=(
                "Pay someone from the box's wallet: `to` is who gets the money, `cents` how much "
                "in US cents (1 to 100000), `memo` what it is for. Calling again with the same "
                "key returns the first booking and never pays twice."
            ),
            input=Pay,
            run=pay,
            cost=_cost,
        ),
        Tool(
            verb="balance",
            description="How much the wallet has paid out in all, in US cents, and in how many "
            "payments.",
            input=Balance,
            run=balance,
        ),
    ),
)
