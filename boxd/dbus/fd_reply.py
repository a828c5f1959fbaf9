"""What the handler of a method declared `passes_fd` returns: its JSON answer and the file
descriptor that goes with it. The server owns the descriptor from then on: it closes it once
the reply is written to the bus (or at once, when no reply is to be sent)."""

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Opened:
    answer: Any
    fd: int

    def close(self) -> None:
        os.close(self.fd)
