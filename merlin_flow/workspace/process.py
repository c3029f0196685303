"""Run a command in its own process group, with a timeout that kills the whole group.

Used through ``merlin_flow.workspace.sandbox`` by exit commands, the agent's ``run_command`` tool
and environment setup. The command's output (stdout and stderr together) goes to a
temporary file, not a pipe, so a background grandchild that keeps the pipe open cannot
hang us; only its tail is read back, so a command printing 100 MB costs the worker no
memory. After the command ends, for any reason, what is left of its process group is
killed, and so is every process that still carries the command's mark: a variable
(``MARK_VARIABLE``) with a value of its own, inherited by all the command starts, found
in ``/proc/<pid>/environ``. That catches a daemon that left the group with ``setsid``
(``setsid sleep 1000 &``), which the group kill misses when commands run without the
sandbox; in the sandbox its PID namespace ends with the command and takes it along. A
process that clears its environment (``env -i``) escapes the mark: only the sandbox
stops it. File-size and memory limits are applied with util-linux's ``prlimit``.

Every command runs behind its guard (``merlin_flow.workspace.command_guard``): if the worker
process dies while the command runs (SIGKILL, the OOM killer), the guard kills the
command and everything carrying its mark, so a resumed attempt never runs beside it.
The guard is kept once per worker process (``merlin_flow.workspace.guard_server``); where
it cannot be, each command starts a guard of its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from merlin_flow.workspace import guard_server
from merlin_flow.workspace.command_guard import MARK_VARIABLE, NOT_STARTED_EXIT_CODE, kill_marked

OUTPUT_TAIL_CHARS = 4000
TIMEOUT_EXIT_CODE = 124
STOPPED_EXIT_CODE = 143
"""The exit code of a command stopped because its job ended (128 + SIGTERM, as a shell says)."""
STOP_POLL_SECONDS = 0.5
"""How often a running command asks whether it should stop (its job cancelled)."""
GUARD = guard_server.GUARD


@dataclass(frozen=True)
class CommandResult:
    """How a command ended: exit code, the tail of its output, and whether it timed out."""

    exit_code: int
    output_tail: str
    timed_out: bool
    duration: float
    stopped: bool = False
    """True when it was killed because ``stop`` said so (its job was cancelled)."""

    @property
    def ok(self) -> bool:
        """True when the command exited 0 within its timeout, and was not stopped."""
        return self.exit_code == 0 and not self.timed_out and not self.stopped


def run_command(
    argv: Sequence[str],
    cwd: Path,
    timeout: float,
    env: Mapping[str, str] | None = None,
    tail_chars: int = OUTPUT_TAIL_CHARS,
    limits: ResourceLimits | None = None,
    stop: Callable[[], bool] | None = None,
) -> CommandResult:
    """Run ``argv`` (no shell) in ``cwd``; kill its process group after ``timeout`` s.

    ``stop`` is asked every ``STOP_POLL_SECONDS`` while the command runs; once it says
    True the command is killed as on a timeout (``stopped``). The command runs behind its
    guard (``merlin_flow.workspace.command_guard``), which kills it if this process dies
    first.
    """
    started = time.monotonic()
    mark = uuid.uuid4().hex
    marked = {**(os.environ if env is None else env), MARK_VARIABLE: mark}
    command = (limits or ResourceLimits()).wrap(list(argv))
    with tempfile.TemporaryFile() as output:
        try:
            process = _start(command, cwd, marked, output)
        except OSError as exc:
            return CommandResult(
                NOT_STARTED_EXIT_CODE, f"cannot run {argv[0]!r}: {exc}", False, 0.0
            )
        if isinstance(process, str):
            return CommandResult(NOT_STARTED_EXIT_CODE, process, False, 0.0)
        try:
            exit_code, stopped = _wait(process, started + timeout, stop)
        finally:
            _kill_group(process.pid)
            kill_marked(mark)
            process.close()
        text = _tail(output, tail_chars)
    duration = time.monotonic() - started
    if exit_code is not None:
        return CommandResult(exit_code, text[-tail_chars:], False, duration)
    if stopped:
        text += f"\n[merlin] command stopped after {duration:.1f} s: its job ended"
        return CommandResult(STOPPED_EXIT_CODE, text[-tail_chars:], False, duration, stopped=True)
    text += f"\n[merlin] command timed out after {timeout:g} s; its process group was killed"
    return CommandResult(TIMEOUT_EXIT_CODE, text[-tail_chars:], True, duration)


class _Guarded(Protocol):
    """A started command, behind the worker's guard server or a guard of its own."""

    @property
    def pid(self) -> int: ...

    def wait(self, timeout: float | None) -> int | None: ...

    def close(self) -> None: ...


@dataclass
class _OwnGuard:
    """A command behind a guard process of its own (where the guard server cannot run)."""

    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self, timeout: float | None) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        self.process.wait()  # its group was killed: this reaps the guard


def _start(command: list[str], cwd: Path, env: dict[str, str], output: IO[bytes]) -> _Guarded | str:
    """Start ``command`` behind the worker's guard server (or a guard of its own); or why not."""
    keeper = guard_server.server()
    if keeper is not None:
        with contextlib.suppress(OSError):  # the server is gone: a guard of its own
            return keeper.start(command, cwd, env, output.fileno())
    guarded = [sys.executable, "-I", "-S", str(GUARD), str(os.getpid()), "--"]
    process = subprocess.Popen(
        guarded + command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return _OwnGuard(process)


def _wait(
    process: _Guarded, deadline: float, stop: Callable[[], bool] | None
) -> tuple[int | None, bool]:
    """The command's exit code, or (None, stopped) when the deadline or ``stop`` came first."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, False
        code = process.wait(min(left, STOP_POLL_SECONDS) if stop else left)
        if code is not None:
            return code, False
        if stop is not None and stop():
            return None, True


@dataclass(frozen=True)
class ResourceLimits:
    """Per-process limits for a command (and everything it starts), in bytes."""

    file_size: int | None = None
    """Largest file the command may write (RLIMIT_FSIZE)."""
    memory: int | None = None
    """Address space of each process (RLIMIT_AS)."""

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` behind ``prlimit`` when a limit is set (unchanged when none is)."""
        options = []
        if self.file_size is not None:
            options.append(f"--fsize={self.file_size}")
        if self.memory is not None:
            options.append(f"--as={self.memory}")
        prlimit = shutil.which("prlimit")
        if not options or prlimit is None:  # util-linux is missing (macOS): no limits
            return argv
        return [prlimit, *options, "--", *argv]


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
"""Terminal colour and cursor codes: a project may force them (pytest --color=yes)."""


def _tail(output: IO[bytes], chars: int) -> str:
    """The last ``chars`` characters of the output file, reading at most 4 bytes each."""
    size = output.seek(0, os.SEEK_END)
    output.seek(max(0, size - 4 * chars))
    return ANSI_ESCAPE.sub("", output.read().decode("utf-8", errors="replace"))[-chars:]


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def tool_environment(extra_path: str | None = None) -> dict[str, str]:
    """The environment for commands run in a worktree.

    merlin's own interpreter folder is put first on PATH, so `python -m pytest` finds the
    interpreter merlin runs in; byte-code files are not written into worktrees.
    """
    env = dict(os.environ)
    if extra_path:
        env["PATH"] = extra_path + os.pathsep + env.get("PATH", "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # The worker's PYTHONPATH points at the worker's code, not at the job's worktree.
    env.pop("PYTHONPATH", None)
    return env
