"""How vault secrets are named: by the owner, in BOX_HOME/vault, and in a broker's credentials.

Shared by the manager, which writes them, and the broker, which reads them.
"""

import re

SECRET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SUFFIX = ".cred"
# The ID of `LoadCredentialEncrypted=ID:/var/lib/box/vault` in box-broker@.service.
CREDENTIAL_ID = "vault"


def credential_name(name: str) -> str:
    """The name systemd gives the secret in a broker's credentials directory."""
    return f"{CREDENTIAL_ID}_{name}{SUFFIX}"
