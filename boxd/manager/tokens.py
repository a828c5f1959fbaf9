"""Bearer tokens for the HTTP API. Only a hash is stored: tokens are long random strings, so a
plain SHA-256 is enough, and a stolen database gives no token back."""

import hashlib
import secrets

from boxd.errors import Problem, die

MAX_NAME = 100


def new_token() -> str:
    return "box_" + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_token_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > MAX_NAME:
        die(Problem.INVALID, f"a token needs a name of 1 to {MAX_NAME} characters")
    return name
