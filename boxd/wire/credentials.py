"""The vault's secrets as systemd hands them to a process: each decrypted into
$CREDENTIALS_DIRECTORY as `vault_<name>.cred` (`LoadCredentialEncrypted=`), readable by that
process's user alone: an app's runner holds its app's (box-app@.service) and hands a tool those
it declared; the model gateway reads the box's model key. Blocking: call it off the event
loop."""

import os
from pathlib import Path

from boxd.wire.secret_names import SECRET_NAME, credential_name


def read_secrets(names: tuple[str, ...]) -> dict[str, str]:
    """The secrets of `names` that the vault holds, by their vault names."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    found: dict[str, str] = {}
    if not directory:
        return found
    for name in names:
        path = Path(directory) / credential_name(name)
        if SECRET_NAME.fullmatch(name) and path.is_file():
            found[name] = path.read_text(encoding="utf-8")
    return found
