"""The processes a benchmark starts: each in a process group of its own, always stopped whole.

A benchmark starts workers and servers with ``start_new_session``, so Ctrl-C in its
terminal reaches the benchmark alone, and nothing but the benchmark stops them. It does
so in ``finally`` (``stop_group``), on a failure, on Ctrl-C and, inside
``terminated_as_exit``, on SIGTERM. ``wait_until`` waits for one to be ready and, when
it is not, says what it waited for and ends with the tail of the process's log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

READY_SECONDS = 180.0
"""How long a worker may take to be ready: about 8 s here, much more on a loaded machine."""


class NotReady(RuntimeError):
    """A process a benchmark started did not become ready, or exited first."""


def log_tail(log: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of ``log`` ('' if there is none)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def wait_until(
    predicate: Callable[[], Any],
    what: str,
    processes: list[subprocess.Popen[bytes]],
    logs: list[Path],
    timeout: float = READY_SECONDS,
    poll: float = 0.1,
) -> Any:
    """Poll ``predicate`` until it is truthy; ``NotReady`` on timeout or if a process exits."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        ended = [p for p in processes if p.poll() is not None]
        if ended or time.monotonic() > deadline:
            why = (
                f"exited with status {ended[0].returncode}"
                if ended
                else f"timed out after {timeout:g} s"
            )
            tails = "\n".join(f"--- the last lines of {log}:\n{log_tail(log)}" for log in logs)
            raise NotReady(f"{why} waiting for {what}\n{tails}")
        time.sleep(poll)


def stop_group(process: subprocess.Popen[bytes] | None, grace: float = 20.0) -> None:
    """SIGTERM to ``process`` (a warm shutdown), then SIGKILL to its whole group.

    The group is killed even when the process has ended, so nothing it started stays
    behind. Ctrl-C and SIGTERM wait until this is done.
    """
    if process is None:
        return
    blocked = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def terminated_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit, so that ``finally`` stops the processes and folders go."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
