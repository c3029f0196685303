"""Fixtures of the workspace tests."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest


@pytest.fixture
def cleanup_pids() -> Iterator[list[int]]:
    """Pids to SIGKILL after the test, so a failing test leaves no sleeper behind."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
