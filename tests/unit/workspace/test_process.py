"""run_command: exit code, output tail, and the whole process group killed afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from merlin_flow.workspace import guard_server
from merlin_flow.workspace.process import (
    STOPPED_EXIT_CODE,
    TIMEOUT_EXIT_CODE,
    run_command,
    tool_environment,
)


def process_gone(pid: int, wait: float = 2.0) -> bool:
    """True once ``pid`` no longer runs (absent, or a zombie waiting for init to reap it)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return True
        state = next((line for line in status.splitlines() if line.startswith("State:")), "")
        if state.split()[1:2] in (["Z"], ["X"]):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def read_pid(path: Path) -> int:
    deadline = time.monotonic() + 2
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} was never written"
        time.sleep(0.02)
    return int(path.read_text())


def test_exit_code_and_output(tmp_path: Path) -> None:
    result = run_command(["sh", "-c", "echo out; echo err >&2; exit 3"], tmp_path, 5)
    assert result.exit_code == 3
    assert result.output_tail == "out\nerr\n"
    assert not result.timed_out
    assert not result.ok
    assert result.duration >= 0


def test_success_is_ok(tmp_path: Path) -> None:
    result = run_command(["true"], tmp_path, 5)
    assert result.exit_code == 0
    assert result.ok
    assert result.output_tail == ""


def test_only_the_tail_of_the_output_is_kept(tmp_path: Path) -> None:
    script = "for i in $(seq 1 2000); do echo line$i; done"
    result = run_command(["sh", "-c", script], tmp_path, 5, tail_chars=50)
    assert len(result.output_tail) == 50
    assert result.output_tail.endswith("line1999\nline2000\n")
    assert "line1\n" not in result.output_tail


def test_runs_in_cwd_with_the_given_environment(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "MERLIN_PROBE": "42"}
    result = run_command(["sh", "-c", 'pwd -P; echo "$MERLIN_PROBE"'], tmp_path, 5, env)
    assert result.output_tail.splitlines() == [str(tmp_path.resolve()), "42"]


def test_stdin_is_closed(tmp_path: Path) -> None:
    result = run_command(["cat"], tmp_path, 5)
    assert result.ok
    assert not result.timed_out


def test_undecodable_output_is_replaced(tmp_path: Path) -> None:
    result = run_command(["sh", "-c", r"printf 'a\377b'"], tmp_path, 5)
    assert result.output_tail == "a\ufffdb"


def test_missing_program_is_127_with_a_message(tmp_path: Path) -> None:
    result = run_command(["merlin-no-such-program-xyz", "--flag"], tmp_path, 5)
    assert result.exit_code == 127
    assert "cannot run 'merlin-no-such-program-xyz'" in result.output_tail
    assert not result.timed_out
    assert not result.ok


def test_timeout_kills_the_whole_process_group(tmp_path: Path, cleanup_pids: list[int]) -> None:
    started = time.monotonic()
    result = run_command(
        ["sh", "-c", "sleep 300 & echo $! > child.pid; echo started; sleep 300"], tmp_path, 1
    )
    elapsed = time.monotonic() - started
    child = read_pid(tmp_path / "child.pid")
    cleanup_pids.append(child)

    assert result.timed_out
    assert result.exit_code == TIMEOUT_EXIT_CODE == 124
    assert not result.ok
    assert result.output_tail.startswith("started\n")
    assert "timed out after 1 s" in result.output_tail
    assert 0.9 <= elapsed < 5
    assert process_gone(child), f"background child {child} survived the timeout"


def test_a_command_is_stopped_when_stop_says_so(tmp_path: Path, cleanup_pids: list[int]) -> None:
    asked: list[float] = []
    started = time.monotonic()

    def stop() -> bool:  # the job is cancelled 1 s in
        asked.append(time.monotonic() - started)
        return asked[-1] >= 1.0

    result = run_command(
        ["sh", "-c", "sleep 300 & echo $! > child.pid; echo started; sleep 300"],
        tmp_path,
        60,
        stop=stop,
    )
    elapsed = time.monotonic() - started
    cleanup_pids.append(read_pid(tmp_path / "child.pid"))
    assert result.stopped
    assert not result.timed_out
    assert not result.ok
    assert result.exit_code == STOPPED_EXIT_CODE
    assert result.output_tail.startswith("started\n")
    assert "command stopped after 1." in result.output_tail
    assert 1.0 <= elapsed < 3
    assert process_gone(cleanup_pids[-1])
    assert len(asked) >= 2  # asked as it ran, not once


def test_a_command_that_ends_first_is_not_stopped(tmp_path: Path) -> None:
    result = run_command(["sh", "-c", "sleep 0.7; exit 3"], tmp_path, 60, stop=lambda: False)
    assert (result.exit_code, result.stopped, result.timed_out) == (3, False, False)


def test_background_child_is_killed_after_a_successful_command(
    tmp_path: Path, cleanup_pids: list[int]
) -> None:
    started = time.monotonic()
    # The child inherits the output file; the call must neither wait for it nor leave it.
    result = run_command(
        ["sh", "-c", "sleep 300 & echo $! > child.pid; echo done; exit 0"], tmp_path, 30
    )
    elapsed = time.monotonic() - started
    child = read_pid(tmp_path / "child.pid")
    cleanup_pids.append(child)

    assert result.ok
    assert not result.timed_out
    assert result.output_tail == "done\n"
    assert elapsed < 5
    assert process_gone(child), f"background child {child} outlived its command"


SESSION_PROBE = "import os; print(os.getpid(), os.getsid(0), os.getpgid(0), os.getppid())"


def test_without_the_server_a_command_runs_behind_a_guard_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard_server, "_unusable", True)
    probe = SESSION_PROBE + "; print(open(f'/proc/{os.getppid()}/cmdline').read())"
    result = run_command([sys.executable, "-c", probe], tmp_path, 10)
    ids, parent_command = result.output_tail.split("\n", 1)
    _, session, group, parent = map(int, ids.split())
    assert session == group == parent  # the guard leads the command's session and group
    assert "command_guard.py" in parent_command
    assert "--serve" not in parent_command
    missing = run_command(["no-such-program-xyz"], tmp_path, 10)
    assert missing.exit_code == 127
    assert "no-such-program-xyz" in missing.output_tail


def test_tool_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    env = tool_environment("/opt/merlin/bin")
    assert env["PATH"] == "/opt/merlin/bin" + os.pathsep + "/usr/bin:/bin"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert "PYTHONPATH" not in env
    assert os.environ["PYTHONPATH"] == "/somewhere"  # the worker's own environment is intact
    assert tool_environment()["PATH"] == "/usr/bin:/bin"


def test_colour_codes_a_project_forces_are_left_out_of_the_output(tmp_path: Path) -> None:
    # pytest --color=yes (humanize sets it in its pyproject.toml) prints these.
    script = r"printf '\033[33m\033[1mno tests ran\033[0m in 0.01s\n\033[2K\033[?25hok\n'"
    result = run_command(["sh", "-c", script], cwd=tmp_path, timeout=10)
    assert result.output_tail == "no tests ran in 0.01s\nok\n"


WORKER = """
import sys, threading
from pathlib import Path
from merlin_flow.workspace.process import run_command

folder = Path(sys.argv[1])
script = (
    "sleep 300 & echo $! > child.pid; setsid sleep 300 & echo $! > daemon.pid; "
    "echo $$ > command.pid; wait"
)
# The command runs from a pool thread, as on the llm queue's thread pool.
thread = threading.Thread(target=run_command, args=(["sh", "-c", script], folder, 600))
thread.start()
thread.join()
"""


def test_a_command_dies_with_the_worker_that_ran_it(
    tmp_path: Path, cleanup_pids: list[int]
) -> None:
    # A stand-in worker runs a command (with a child and a setsid daemon) from a thread,
    # and is SIGKILLed: the command's guard must kill all three.
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path)])
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "command.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [read_pid(tmp_path / f"{name}.pid") for name in ("command", "child", "daemon")]
        cleanup_pids.extend(pids)
        assert not any(process_gone(pid, wait=0) for pid in pids)
    finally:
        worker.kill()
        worker.wait()
    for pid in pids:
        assert process_gone(pid, wait=3), f"{pid} outlived its worker"


def test_the_exit_code_of_a_command_killed_by_a_signal_passes_through_its_guard(
    tmp_path: Path,
) -> None:
    result = run_command(["sh", "-c", "kill -TERM $$"], tmp_path, 10)
    assert result.exit_code == -signal.SIGTERM


def _wait_for_exec(pid: int, argv: list[bytes]) -> None:
    """Until the process runs ``argv``: mid-exec, its environment reads empty."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            if file.read().split(b"\0")[:-1] == argv:
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never ran {argv}")


def test_a_marked_process_caught_in_exec_is_killed_on_a_later_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mid-exec, a process's environment reads empty: the scan looks again, not stops."""
    from merlin_flow.workspace import command_guard

    mark = "mid-exec-" + os.urandom(4).hex()
    env = {"PATH": os.environ["PATH"], command_guard.MARK_VARIABLE: mark}
    sleeper = subprocess.Popen(["sleep", "30"], env=env)
    _wait_for_exec(sleeper.pid, [b"sleep", b"30"])
    real, reads = command_guard._environ, {"n": 0}

    def environ(pid: int) -> list[bytes]:
        if pid == sleeper.pid:
            reads["n"] += 1
            if reads["n"] == 1:
                return [b""]  # what /proc shows between exec's new memory and its stack
        return real(pid)

    monkeypatch.setattr(command_guard, "_environ", environ)
    try:
        assert command_guard.kill_marked(mark) == 1
        assert sleeper.wait(5) == -signal.SIGKILL
        assert reads["n"] >= 2
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_process_slow_to_die_is_killed_and_counted_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under load a SIGKILLed process lingers: later passes do not count it again."""
    from merlin_flow.workspace import command_guard

    mark = "slow-death-" + os.urandom(4).hex()
    env = {"PATH": os.environ["PATH"], command_guard.MARK_VARIABLE: mark}
    sleeper = subprocess.Popen(["sleep", "32"], env=env)
    signals: list[tuple[int, int]] = []
    try:
        _wait_for_exec(sleeper.pid, [b"sleep", b"32"])
        monkeypatch.setattr(command_guard.os, "kill", lambda *sent: signals.append(sent))
        assert command_guard.kill_marked(mark) == 1
        monkeypatch.undo()
        assert signals == [(sleeper.pid, signal.SIGKILL)]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_process_with_an_empty_environment_is_left_alone_after_the_last_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from merlin_flow.workspace import command_guard

    bare = subprocess.Popen(["/usr/bin/env", "-i", "sleep", "31"])
    naps: list[float] = []
    try:
        _wait_for_exec(bare.pid, [b"sleep", b"31"])  # `env` has exec'd sleep with nothing
        assert command_guard._environ(bare.pid) == [b""]
        monkeypatch.setattr(command_guard.time, "sleep", naps.append)
        assert command_guard.kill_marked("no-such-mark") == 0
        monkeypatch.undo()
        assert len(naps) == command_guard.PASSES  # it looked again each time, then gave up
        assert bare.poll() is None
    finally:
        bare.kill()
        bare.wait()
