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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from merlin_flow.workspace.command_guard import MARK_VARIABLE, NOT_STARTED_EXIT_CODE, kill_marked

OUTPUT_TAIL_CHARS = 4000
TIMEOUT_EXIT_CODE = 124
GUARD = Path(__file__).with_name("command_guard.py")


@dataclass(frozen=True)
class CommandResult:
    """How a command ended: exit code, the tail of its output, and whether it timed out."""

    exit_code: int
    output_tail: str
    timed_out: bool
    duration: float

    @property
    def ok(self) -> bool:
        """True when the command exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out


def run_command(
    argv: Sequence[str],
    cwd: Path,
    timeout: float,
    env: Mapping[str, str] | None = None,
    tail_chars: int = OUTPUT_TAIL_CHARS,
    limits: ResourceLimits | None = None,
) -> CommandResult:
    """Run ``argv`` (no shell) in ``cwd``; kill its process group after ``timeout`` s.

    The command runs behind its guard (``merlin_flow.workspace.command_guard``), which kills it
    if this process dies first.
    """
    started = time.monotonic()
    mark = uuid.uuid4().hex
    marked = {**(os.environ if env is None else env), MARK_VARIABLE: mark}
    guarded = [sys.executable, "-I", "-S", str(GUARD), str(os.getpid()), "--"]
    with tempfile.TemporaryFile() as output:
        try:
            process = subprocess.Popen(
                guarded + (limits or ResourceLimits()).wrap(list(argv)),
                cwd=cwd,
                env=marked,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            return CommandResult(
                NOT_STARTED_EXIT_CODE, f"cannot run {argv[0]!r}: {exc}", False, 0.0
            )
        timed_out = False
        try:
            exit_code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(process.pid)
            process.wait()
            exit_code = TIMEOUT_EXIT_CODE
        finally:
            _kill_group(process.pid)
            kill_marked(mark)
        text = _tail(output, tail_chars)
    if timed_out:
        text += f"\n[merlin] command timed out after {timeout:g} s; its process group was killed"
    return CommandResult(exit_code, text[-tail_chars:], timed_out, time.monotonic() - started)


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
