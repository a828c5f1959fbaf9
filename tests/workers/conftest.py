import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest


@pytest.fixture
async def socket_dir() -> AsyncIterator[Path]:
    """A folder for a test's Unix sockets: their paths must be short, and pytest's tmp_path may
    not be."""
    where = Path(tempfile.mkdtemp(prefix="worker-", dir="/tmp"))
    yield where
    shutil.rmtree(where, ignore_errors=True)
