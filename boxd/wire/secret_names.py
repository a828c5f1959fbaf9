"""How vault secrets are named, and whose each one is: by the owner, in BOX_HOME/vault, and in
the credentials directory of the one process that gets it.

A secret belongs to an app or to the box. `<app>.<name>` is app <app>'s (`mail.password` is the
mail app's): only that app's tools may declare it, and only that app's runner is handed it. The
model keys (boxd.wire.model_key) are the box's: they go to the model gateway and never to a tool.
A name that is neither (the vault let any name in before) belongs to no one and reaches no one.

Shared by the manager, which writes them, the apps' runners, which read theirs, and the broker,
which reads the box's.
"""

import re

from boxd.wire.model_key import KEY_NAMES

SECRET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# An app's name: the instance of its units (box-app@<app>), the user its tools run as
# (boxd-app-<app>, at most 32 characters) and the first part of its tools' and secrets' names.
APP_NAME = re.compile(r"[a-z][a-z0-9-]{0,22}")
APP_NAME_WORDS = "1 to 23 lowercase letters, digits or '-', starting with a letter"
# What `belongsTo` says of the box's own secrets; no app may take the name.
BOX = "box"
SUFFIX = ".cred"
# The ID of `LoadCredentialEncrypted=ID:...` in the units that load vault secrets.
CREDENTIAL_ID = "vault"


def credential_name(name: str) -> str:
    """The name systemd gives the secret in a credentials directory."""
    return f"{CREDENTIAL_ID}_{name}{SUFFIX}"


def is_app_name(name: str) -> bool:
    return bool(APP_NAME.fullmatch(name)) and name != BOX


def belongs_to(name: str) -> str | None:
    """`box` for the box's secrets, the app's name for an app's, None for a name that is
    neither."""
    if name in KEY_NAMES:
        return BOX
    app, dot, rest = name.partition(".")
    return app if dot and rest and is_app_name(app) else None
