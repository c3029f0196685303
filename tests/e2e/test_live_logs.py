"""A live view of the agent: the transcript is stored per turn, `logs --follow`, `watch`."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import (
    MERLIN,
    merlin,
    merlin_env,
    start_worker,
    status_json,
    stop_worker,
    wait_for,
    write_job_files,
)

pytestmark = pytest.mark.e2e
SLEEP = 'run_command {"command": "sleep 4"}'
SLEEP_CALL = '\\"command\\": \\"sleep 4\\"'  # the call's arguments, as a JSON line has them


def _read_pty_until(fd: int, needle: str, timeout: float) -> str:
    """Read a terminal's output until ``needle`` shows up in it."""
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:  # the process closed the terminal
                break
            if needle in seen.decode(errors="replace"):
                return seen.decode(errors="replace")
    raise AssertionError(f"{needle!r} never showed; the terminal had:\n{seen[-3000:]!r}")


def test_the_conversation_is_visible_while_the_agent_works(tmp_path: Path, py_repo: Path) -> None:
    env = merlin_env(tmp_path / "home")
    tasklist, config = write_job_files(tmp_path / "job", sleep_seconds=4)
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        submitted = merlin(
            env, "submit", str(tasklist), "--repo", str(py_repo), "--config", str(config)
        )
        job_id = submitted.stdout.strip()
        following = subprocess.Popen(
            [*MERLIN, "logs", job_id, "--follow"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        following_json = subprocess.Popen(
            [*MERLIN, "logs", job_id, "--follow", "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        primary, secondary = pty.openpty()
        rows_columns_pixels = struct.pack("HHHH", 50, 160, 0, 0)
        fcntl.ioctl(secondary, termios.TIOCSWINSZ, rows_columns_pixels)
        watching = subprocess.Popen(
            [*MERLIN, "watch", job_id],
            env={**env, "TERM": "xterm"}, stdin=secondary, stdout=secondary, stderr=secondary,
        )  # fmt: skip
        os.close(secondary)
        try:
            # While step slow's command runs, its attempt is open and its call is stored.
            def slow_is_sleeping() -> str | None:
                text = merlin(env, "logs", job_id, "--step", "slow").stdout
                return text if SLEEP in text else None

            during = wait_for(slow_is_sleeping, 60, "the sleep call in the stored transcript")
            assert "step slow · attempt 1 · execute@local · running" in during
            assert "double() added" not in during  # the conversation is not over yet
            # `merlin watch` on a terminal shows the working step's last tool call.
            _read_pty_until(primary, f"[slow] now: → {SLEEP}", 30)
            # `--follow --json` has given the call as a line of its own, before the job ended
            assert following_json.stdout is not None
            early = [json.loads(following_json.stdout.readline())]
            while not (early[-1]["type"] == "message" and SLEEP_CALL in json.dumps(early[-1])):
                early.append(json.loads(following_json.stdout.readline()))
            assert (early[-1]["step"], early[-1]["attempt"]) == ("slow", 1)
            assert following_json.poll() is None  # a line as it happens, not all at the end
            _read_pty_until(primary, "completed", 120)  # read on: a full terminal blocks it
            assert watching.wait(timeout=30) == 0
        finally:
            os.close(primary)
            if watching.poll() is None:
                watching.kill()
        out, err = following.communicate(timeout=120)
        json_out, json_err = following_json.communicate(timeout=120)
    finally:
        stop_worker(worker)
    assert following_json.returncode == 0, json_err
    lines = early + [json.loads(text) for text in json_out.splitlines()]
    assert lines[-1]["type"] == "job_end"
    assert lines[-1]["status"] == "completed"
    ends = [(x["step"], x["attempt"], x["status"]) for x in lines if x["type"] == "attempt_end"]
    assert ends == [("fix", 1, "passed"), ("slow", 1, "passed"), ("docs", 1, "passed")]
    assert following.returncode == 0, err
    assert status_json(env, job_id)["status"] == "completed"
    order = [
        "── step fix · attempt 1 · execute@local",
        '→ edit_file {"path": "app.py", "old": "return 41", "new": "return 42"}',
        "── attempt 1 of step fix: passed",
        "── step slow · attempt 1 · execute@local",
        f"→ {SLEEP}",
        "assistant: double() added",
        "── attempt 1 of step slow: passed",
        "── attempt 1 of step docs: passed",
    ]
    positions = [out.index(line) for line in order]
    assert positions == sorted(positions), out
    assert out.count("── step slow · attempt 1") == 1  # each message printed once
    assert out.count(f"→ {SLEEP}") == 1
