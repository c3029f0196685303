"""The command guard kept once per worker process, instead of started once per command.

Starting ``command_guard.py`` costs about 20 ms of interpreter start-up per command; a
step's exit command paid it every time. ``GuardServer`` starts the same file once per
process with ``--serve`` and hands it each command over a socket pair: the command's
request (argv, cwd, environment) goes on a socket of its own, whose other end travels,
with the output file, as file descriptors (``SCM_RIGHTS``). The server starts the command
in a session of its own and answers its pid, then its exit status.

The guarantees are the per-command guard's: when the worker dies, each command's socket
closes and the server kills that command and everything carrying its mark; when the
control socket closes (the worker is gone) it kills them all and exits. A process that
forks (Celery's prefork pool) gets a server of its own in the child. Where the server
cannot run (no ``pidfd_open``: not Linux) or stops answering, ``server()`` says None and
``run_command`` falls back to the per-command guard.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GUARD = Path(__file__).with_name("command_guard.py")
START_SECONDS = 30.0
"""How long the server may take to start a command (it answers in about a millisecond)."""


class Answers:
    """The lines the server writes on one command's socket, read with a timeout."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buffer = b""

    def next(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next answer, or None when ``timeout`` passes first.

        Raises ``ConnectionResetError`` when the server closes the socket instead.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.conn], [], [], left)
            if not ready:
                return None
            chunk = self.conn.recv(65536)
            if not chunk:
                raise ConnectionResetError("the command guard closed the command's socket")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer


@dataclass
class GuardedCommand:
    """A command the server started: its pid, and the socket its exit status comes on."""

    pid: int
    answers: Answers

    def wait(self, timeout: float | None) -> int | None:
        """The command's exit code (negative: the signal), or None if ``timeout`` passed first.

        A server that died first (killed on its own) says ``-SIGKILL``: ``run_command``
        kills the command's group and marked processes then, as the server would have.
        """
        try:
            answer = self.answers.next(timeout)
        except (ConnectionResetError, ValueError):
            return -signal.SIGKILL
        return None if answer is None else int(answer["code"])

    def close(self) -> None:
        """Close the socket (after a kill, the server reaps the command on its own)."""
        self.answers.conn.close()


class GuardServer:
    """One ``command_guard.py --serve`` process and the socket that controls it."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair()
        self.owner = os.getpid()
        self.lock = threading.Lock()
        self.control = mine
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(GUARD), "--serve", str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
                start_new_session=True,  # a terminal's Ctrl-C is the worker's to handle
            )
        finally:
            theirs.close()

    def start(
        self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], output: int
    ) -> GuardedCommand | str:
        """Start ``argv``, its output on the file descriptor ``output``; or why it could not.

        Raises ``OSError`` when the server does not answer.
        """
        mine, theirs = socket.socketpair()
        try:
            with self.lock:
                socket.send_fds(self.control, [b"c"], [theirs.fileno(), output])
            request = {"argv": list(argv), "cwd": str(cwd), "env": dict(env)}
            mine.sendall(json.dumps(request).encode() + b"\n")
            answers = Answers(mine)
            started = answers.next(START_SECONDS)
            if started is None:
                raise TimeoutError(f"the command guard did not answer in {START_SECONDS:g} s")
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        if "error" in started:
            mine.close()
            return str(started["error"])
        return GuardedCommand(int(started["pid"]), answers)

    def gone(self) -> bool:
        """True once the server has exited or is exiting.

        A dying server's end of the control socket closes (it never writes there) before
        its exit status can be read.
        """
        if self.process.poll() is not None:
            return True
        readable, _, _ = select.select([self.control], [], [], 0)
        return bool(readable)

    def stop(self) -> None:
        """Close the control socket: the server kills what still runs and exits."""
        self.control.close()
        self.process.wait()


def _stop_at_exit() -> None:
    if _server is not None and _server.owner == os.getpid():
        _server.stop()


_server: GuardServer | None = None
_unusable = not hasattr(os, "pidfd_open") or not hasattr(socket, "send_fds")
_starting = threading.Lock()


def server() -> GuardServer | None:
    """The guard server of this process, started on first use; None where it cannot run."""
    global _server, _unusable
    if _unusable:
        return None
    with _starting:
        if _server is not None and _server.owner != os.getpid():
            forget()  # forked without the fork hook (it runs for os.fork)
        if _server is not None and _server.gone():
            _server.stop()  # it died (killed on its own): a new one
            _server = None
        if _server is None:
            try:
                _server = GuardServer()
            except OSError:
                _unusable = True
                return None
        return _server


def forget() -> None:
    """In a forked child: drop the parent's server (its socket is the parent's to close)."""
    global _server
    if _server is not None and _server.owner != os.getpid():
        _server.control.close()
        _server.process.returncode = 0  # the parent's child, never this process's to wait for
    _server = None


os.register_at_fork(after_in_child=forget)
atexit.register(_stop_at_exit)
