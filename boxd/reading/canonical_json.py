"""The hash that names a JSON value: the broker's `inputHash` of a call, the MCP relay's keys.

Standard library only: the MCP relay imports it, and Droid waits for the relay to start.
"""

import hashlib
import json
from typing import Any


def input_hash(value: Any) -> str:
    """sha256 of the input as canonical JSON: keys sorted, no spaces, UTF-8."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
