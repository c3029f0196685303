"""Cancel stops the step's running command within 2 s, on the worker process that runs it.

The command is found by its arguments in /proc (the sandbox's processes are the host's
too); the time counts from `merlin cancel`'s return, when the job's status is written.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import git
from tests.e2e.helpers import (
    merlin,
    merlin_env,
    start_worker,
    status_json,
    stop_worker,
    wait_for,
    write_job_files,
)

pytestmark = pytest.mark.e2e

STOP_WITHIN = 2.0
"""Seconds from the cancel to the command's end: the issue's promise."""

LONG_VERIFY = """\
title: A long exit command
steps:
  - id: fix
    step_type: Debug
    description: answer() must return 42
    exit_command: sleep 61.25
"""


def _running(*argv: str) -> list[int]:
    """The pids of processes running exactly ``argv``."""
    wanted = "\0".join(argv).encode() + b"\0"
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes() == wanted:
                    pids.append(int(entry.name))
            except OSError:  # it ended meanwhile
                continue
    return pids


def _cancel_while(
    env: dict[str, str], tasklist: Path, config: Path, repo: Path, *argv: str
) -> dict[str, Any]:
    """Submit, wait for ``argv`` to run, cancel; the closed job's view.

    The command must end within ``STOP_WITHIN`` seconds of the cancel.
    """
    submitted = merlin(env, "submit", str(tasklist), "--repo", str(repo), "--config", str(config))
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    wait_for(lambda: _running(*argv), 120, f"`{' '.join(argv)}` to start")
    cancelled = merlin(env, "cancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    since = time.monotonic()
    wait_for(lambda: not _running(*argv), 30, f"`{' '.join(argv)}` to end", poll=0.05)
    took = time.monotonic() - since
    assert took < STOP_WITHIN, f"`{' '.join(argv)}` ran on {took:.1f} s after the cancel"
    closed = wait_for(
        lambda: (v := status_json(env, job_id))["finished_at"] and v, 30, "the job to close"
    )
    return dict(closed)


def _events(home: Path, job_id: str) -> list[tuple[str, str | None]]:
    with sqlite3.connect(home / "merlin.db") as conn:
        rows = conn.execute(
            "SELECT kind, step_key FROM events WHERE job_id = ? ORDER BY id", (job_id,)
        ).fetchall()
    return [(str(kind), step) for kind, step in rows]


def test_cancel_stops_a_long_exit_command(tmp_path: Path, py_repo: Path) -> None:
    home = tmp_path / "home"
    env = merlin_env(home)
    tasklist, config = write_job_files(tmp_path / "job", tasklist=LONG_VERIFY)
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        view = _cancel_while(env, tasklist, config, py_repo, "sleep", "61.25")
    finally:
        stop_worker(worker)
    assert view["status"] == "cancelled"
    job_id = view["id"]
    [attempt] = view["steps"][0]["attempts"]
    # Recorded as stopped, not as a failure to fix or escalate; the branch stays.
    assert attempt["status"] == "cancelled"
    assert attempt["error"] == "stopped: the job ended while its exit command ran"
    assert "[merlin] command stopped after" in attempt["output_tail"]
    kinds = [kind for kind, _ in _events(home, job_id)]
    assert "command_stopped" in kinds
    assert "verify_failed" not in kinds
    assert "fix_planned" not in kinds
    assert git(py_repo, "rev-parse", "--verify", f"merlin/{job_id}")


def test_cancel_stops_a_long_agent_command(tmp_path: Path, py_repo: Path) -> None:
    home = tmp_path / "home"
    env = merlin_env(home)
    # Step "slow" runs `sleep 62.5` as its first tool call.
    tasklist, config = write_job_files(tmp_path / "job", sleep_seconds=62.5)
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        view = _cancel_while(env, tasklist, config, py_repo, "sleep", "62.5")
        logs = merlin(env, "logs", view["id"], "--step", "slow", "--json")
    finally:
        stop_worker(worker)
    assert view["status"] == "cancelled"
    job_id = view["id"]
    steps = {s["id"]: s for s in view["steps"]}
    assert [a["status"] for a in steps["slow"]["attempts"]] == ["cancelled"]
    assert ("command_stopped", "slow") in _events(home, job_id)
    # The agent was told, and its transcript keeps it; no model call came after.
    [entry] = json.loads(logs.stdout)
    results = [m["content"] for m in entry["transcript"] if m["role"] == "tool"]
    assert "[merlin] command stopped after" in results[-1]
    assert [m["role"] for m in entry["transcript"]] == ["user", "assistant", "tool"]
    assert git(py_repo, "rev-parse", "--verify", f"merlin/{job_id}")
