"""The echo app: `echo.say` answers with the text it was given.

Harmless and free. It shows that a task's broker runs tools end to end (the call is checked,
logged as begun, run and logged with its result), and it is the no-op call `bench/broker.py`
times.
"""

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from boxd.sdk import App, Context, Tool

MAX_TEXT = 10_000


class Say(BaseModel):
    # Built on its tool's first call or GET /tools, not as the broker loads the apps.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    text: Annotated[
        StrictStr, Field(max_length=MAX_TEXT, description="What to say back, as given.")
    ]


async def say(say: Say, _: Context) -> dict[str, Any]:
    return {"text": say.text}


app = App(
    name="echo",
    tools=(
        Tool(
            verb="say",
            description=(
                "Answer with `text` exactly as given (up to 10000 characters). It changes nothing "
                "and costs nothing: use it to check that the box's tools work."
            ),
            input=Say,
            run=say,
        ),
    ),
)
