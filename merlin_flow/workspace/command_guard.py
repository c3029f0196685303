"""A command's guard: it dies with its worker, and takes the command along.

``merlin_flow.workspace.process.run_command`` starts every command (the agent's ``run_command``,
exit commands, environment setup) behind this guard, in a process group of its own::

    python -I -S command_guard.py <worker pid> -- <argv...>

The guard asks the kernel for SIGTERM when the thread that started it exits
(``PR_SET_PDEATHSIG``): the worker thread that waits for the command, which exits only
when its whole process does (a SIGKILL, the OOM killer). On that signal, or if the
worker was already gone when the guard started, it SIGKILLs every process carrying the
command's mark (``MARK_VARIABLE``, inherited by everything the command starts, even a
``setsid`` daemon) and then its own process group, within milliseconds of the kill;
another worker resumes the attempt at the soonest after the next recovery sweep, a
message, a claim, a worktree and a model turn. So no command of a killed worker runs
beside the attempt that another worker resumes. The guard itself passes the
command's exit status on: its exit code, or the signal that killed it.

This file imports a few standard modules only (no ``subprocess``, no ``pathlib``): it
runs as a script with ``-I -S``, so that starting it costs about 20 ms.

``--serve FD`` runs the same guard once per worker process instead of once per command
(``merlin_flow.workspace.guard_server``): it receives each command's own socket and output
file over the socket ``FD``, starts the command in a session of its own, tells its pid and
then its exit status. When a command's socket closes before the command ends (its worker
died), or when ``FD`` closes (the worker is gone), it kills the command and everything
carrying its mark, as the per-command guard does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from types import FrameType

TYPE_CHECKING = False  # not typing's: the guard imports as little as it can
if TYPE_CHECKING:
    import subprocess
    from typing import Any

MARK_VARIABLE = "MERLIN_COMMAND_MARK"
"""The variable whose value marks one command's processes, to kill them afterwards."""
PR_SET_PDEATHSIG = 1
NOT_STARTED_EXIT_CODE = 127
PROC = "/proc"
PASSES = 5
"""Most scans ``kill_marked`` makes."""
PF_KTHREAD = 0x00200000
"""The flag of a kernel thread in ``/proc/PID/stat``."""


def kill_marked(mark: str) -> int:
    """SIGKILL every process whose environment holds ``MARK_VARIABLE=mark``; how many.

    Runs until a pass finds none (a marked process may fork while the others die), at
    most ``PASSES``. A process in the middle of ``exec`` shows an empty environment for
    a moment (the kernel sets the new one last): while a pass sees such a process, not a
    kernel thread, it is not taken as the last one. Without ``/proc`` (macOS) nothing is
    found. The calling process is spared: the guard carries the mark too. A process
    killed on one pass and not yet gone is not counted again.
    """
    entry = f"{MARK_VARIABLE}={mark}".encode()
    killed: set[int] = set()
    for _ in range(PASSES):
        found, unsure = set(), False
        for pid in _pids():
            if pid == os.getpid() or pid in killed:
                continue  # a process already sent SIGKILL cannot fork again
            environ = _environ(pid)
            if entry in environ:
                found.add(pid)
            elif environ == [b""] and not unsure:  # readable, and empty
                unsure = not _kernel_thread(pid)
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= found
        if not found and not unsure:
            break
        if not found:
            time.sleep(0.002)  # let an exec finish
    return len(killed)


def _kernel_thread(pid: int) -> bool:
    """True for a kernel thread (its environment is always empty), or a process gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return True
    return len(fields) < 7 or bool(int(fields[6]) & PF_KTHREAD)


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir(PROC) if name.isdigit()]
    except OSError:
        return []


def _environ(pid: int) -> list[bytes]:
    """The environment a process started with (empty when it is gone or not ours)."""
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as file:
            return file.read().split(b"\0")
    except OSError:
        return []


def _die_with_parent() -> None:
    """Ask for SIGTERM when the parent thread exits (Linux; elsewhere nothing happens)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _kill_everything(*_: object) -> None:
    """Kill the command's marked processes and this process group (the guard included)."""
    mark = os.environ.get(MARK_VARIABLE)
    if mark:
        kill_marked(mark)
    if os.getpgrp() == os.getpid():  # never a group the guard does not lead
        os.killpg(0, signal.SIGKILL)
    os._exit(137)


def main(argv: list[str]) -> int:
    """Run ``argv[2:]`` (after ``<worker pid> --``) until it ends or the worker dies."""
    worker, command = int(argv[0]), argv[2:]
    signal.signal(signal.SIGTERM, _on_signal)
    _die_with_parent()
    if os.getppid() != worker:  # the worker died before the guard asked to follow it
        _kill_everything()
    child = os.fork()
    if child == 0:
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"cannot run {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        os._exit(NOT_STARTED_EXIT_CODE)
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    if code < 0:  # killed by a signal: end the same way, so the worker sees it
        with contextlib.suppress(OSError, ValueError):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal whose default is to be ignored
    return code


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _kill_everything()


def serve(control_fd: int) -> int:
    """Start the commands asked for on the socket ``control_fd``, until it closes."""
    import json
    import select
    import socket
    import threading

    control = socket.socket(fileno=control_fd)
    running: dict[int, str] = {}  # pid -> mark of every command still running

    def end_all(*_: object) -> None:
        for pid, mark in list(running.items()):
            _kill_command(pid, mark)
        os._exit(137)

    def say(conn: socket.socket, answer: dict[str, object]) -> None:
        with contextlib.suppress(OSError):  # the worker's end is gone: nobody to tell
            conn.sendall(json.dumps(answer).encode() + b"\n")

    def run_one(conn: socket.socket, output: int) -> None:
        with conn:
            with conn.makefile("rb") as lines:  # the worker writes one line, then waits
                request = json.loads(lines.readline() or b"{}")
            process = _start(request, output) if request else "no request"
            os.close(output)
            if isinstance(process, str):  # it could not start: the reason
                say(conn, {"error": process})
                return
            pid = process.pid
            running[pid] = request["env"].get(MARK_VARIABLE, "")
            say(conn, {"pid": pid})
            ended = os.pidfd_open(pid)
            try:
                ready, _, _ = select.select([conn.fileno(), ended], [], [])
                if ended not in ready:  # the worker's end closed first: it died
                    _kill_command(pid, running[pid])
                code = process.wait()
            finally:
                os.close(ended)
                del running[pid]
            say(conn, {"code": code})

    signal.signal(signal.SIGTERM, end_all)
    worker = os.getppid()
    while True:
        ready, _, _ = select.select([control], [], [], 1.0)
        if not ready:
            if os.getppid() != worker:  # reparented: the worker is gone
                end_all()
            continue
        fds: list[int] = []
        with contextlib.suppress(OSError):
            _, fds, _, _ = socket.recv_fds(control, 1, 2)
        if len(fds) != 2:  # the control socket closed (or a malformed message)
            end_all()
        conn = socket.socket(fileno=fds[0])
        threading.Thread(target=run_one, args=(conn, fds[1]), daemon=True).start()


def _kill_command(pid: int, mark: str) -> None:
    """Kill the command ``pid`` leads: its process group, and every process marked ``mark``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    kill_marked(mark)


def _start(request: dict[str, Any], output: int) -> subprocess.Popen[bytes] | str:
    """Start the request's command in a session of its own: the process, or why not."""
    import subprocess

    argv = request["argv"]
    try:
        return subprocess.Popen(
            argv,
            cwd=request["cwd"],
            env=request["env"],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=True,
        )
    except OSError as exc:
        return f"cannot run {argv[0]!r}: {exc}"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        sys.exit(serve(int(sys.argv[2])))
    sys.exit(main(sys.argv[1:]))
