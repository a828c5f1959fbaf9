"""Task ids: `t` and nine of [0-9a-z], short enough for a user name and a unit name."""

import re
import secrets

from boxd.errors import Problem, die

_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
_TASK_ID = re.compile(r"t[0-9a-z]{9}")


def new_task_id() -> str:
    return "t" + "".join(secrets.choice(_ALPHABET) for _ in range(9))


def is_task_id(text: str) -> bool:
    return _TASK_ID.fullmatch(text) is not None


def check_task_id(text: str) -> str:
    if not is_task_id(text):
        die(Problem.NOT_FOUND, f"no task {text}")
    return text


def task_user(task_id: str) -> str:
    return f"box-{task_id}"
