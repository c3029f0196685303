"""The guard server: one command guard per worker process, for every command it runs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from merlin_flow.workspace import guard_server
from merlin_flow.workspace.process import run_command
from tests.unit.workspace.test_process import SESSION_PROBE, process_gone, read_pid


def test_command_runs_in_its_own_session_behind_the_guard_server(tmp_path: Path) -> None:
    first = run_command([sys.executable, "-c", SESSION_PROBE], tmp_path, 10)
    pid, session, group, parent = map(int, first.output_tail.split())
    assert pid == session == group  # it leads a session and group of its own
    assert session != os.getsid(0)
    keeper = guard_server.server()
    assert keeper is not None
    assert parent == keeper.process.pid
    assert "--serve" in Path(f"/proc/{parent}/cmdline").read_text()
    second = run_command([sys.executable, "-c", SESSION_PROBE], tmp_path, 10)
    assert int(second.output_tail.split()[3]) == parent  # one server for every command


def test_a_server_killed_under_a_command_takes_the_command_and_is_replaced(
    tmp_path: Path, cleanup_pids: list[int]
) -> None:
    keeper = guard_server.server()
    assert keeper is not None
    script = "echo $$ > command.pid; sleep 300"
    killer = threading.Timer(0.5, lambda: os.kill(keeper.process.pid, signal.SIGKILL))
    killer.start()
    started = time.monotonic()
    result = run_command(["sh", "-c", script], tmp_path, 60)
    command = read_pid(tmp_path / "command.pid")
    cleanup_pids.append(command)
    assert result.exit_code == -signal.SIGKILL
    assert time.monotonic() - started < 10
    assert process_gone(command)
    replaced = guard_server.server()
    assert replaced is not None
    assert replaced.process.pid != keeper.process.pid
    assert run_command(["true"], tmp_path, 10).ok


FORKING = """
import os, sys
from pathlib import Path
from merlin_flow.workspace.process import run_command

probe = "import os; print(os.getppid())"
before = run_command([sys.executable, "-c", probe], Path("."), 10).output_tail.strip()
child = os.fork()
if child == 0:  # a prefork pool process: its commands go to a server of its own
    mine = run_command([sys.executable, "-c", probe], Path("."), 10).output_tail.strip()
    its_parent = Path(f"/proc/{mine}/stat").read_text().split()[3]
    print("child", before, mine, its_parent, os.getpid(), flush=True)
    os._exit(0)
os.waitpid(child, 0)
after = run_command([sys.executable, "-c", probe], Path("."), 10).output_tail.strip()
print("parent", before, after, flush=True)
"""


def test_a_forked_worker_process_gets_a_guard_server_of_its_own(tmp_path: Path) -> None:
    ran = subprocess.run(
        [sys.executable, "-c", FORKING], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    lines = dict(line.split(" ", 1) for line in ran.stdout.splitlines())
    before, mine, its_parent, child = lines["child"].split()
    assert mine != before  # not the parent's server: one the child started
    assert its_parent == child
    assert lines["parent"].split() == [before, before]  # the parent's own is untouched


def test_commands_of_several_threads_run_at_once_each_with_its_own_output(
    tmp_path: Path,
) -> None:
    # The llm queue's thread pool runs several steps' commands through one server.
    results: dict[int, str] = {}

    def run(number: int) -> None:
        script = f"sleep 0.5; echo {number}; exit {number}"
        result = run_command(["sh", "-c", script], tmp_path, 30)
        results[number] = f"{result.exit_code} {result.output_tail.strip()}"

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {n: f"{n} {n}" for n in range(4)}
    assert time.monotonic() - started < 1.9  # not one after another (4 x 0.5 s)


def test_a_server_whose_control_socket_closed_is_gone_before_its_exit_shows() -> None:
    """It closed its files on the way out: replaced at once, not handed another command."""
    alive = subprocess.Popen(["sleep", "30"])
    try:
        mine, theirs = socket.socketpair()
        dying = guard_server.GuardServer.__new__(guard_server.GuardServer)
        dying.process, dying.control = alive, mine
        assert not dying.gone()
        theirs.close()  # what the kernel does first when the server is killed
        assert dying.gone()
        assert alive.poll() is None
        mine.close()
    finally:
        alive.kill()
        alive.wait()
