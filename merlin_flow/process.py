"""Run a command in its own process group, with a timeout that kills the whole group.

Used by the verify task for exit commands and by the agent's ``run_command`` tool. The
command's output (stdout and stderr together) goes to a temporary file, not a pipe, so a
background grandchild that keeps the pipe open cannot hang us; only its tail is kept.
After the command ends, for any reason, what is left of its process group is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

OUTPUT_TAIL_CHARS = 4000
TIMEOUT_EXIT_CODE = 124


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
) -> CommandResult:
    """Run ``argv`` (no shell) in ``cwd``; kill its process group after ``timeout`` s."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as output:
        try:
            process = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            return CommandResult(127, f"cannot run {argv[0]!r}: {exc}", False, 0.0)
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
        output.seek(0)
        text = output.read().decode("utf-8", errors="replace")
    if timed_out:
        text += f"\n[merlin] command timed out after {timeout:g} s; its process group was killed"
    return CommandResult(exit_code, text[-tail_chars:], timed_out, time.monotonic() - started)


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
