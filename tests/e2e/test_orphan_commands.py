"""Commands die with their worker: a killed worker leaves no command running.

A worker's whole process group is SIGKILLed while its agent's ``run_command`` runs, and
again while an exit command runs. The command lives in a session of its own (so that a
timeout can kill its group), out of reach of the kill; its guard
(``merlin_flow.workspace.command_guard``) must end it within seconds, and the attempt resumed on
another worker must never run beside it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.e2e.helpers import (
    kill_worker,
    merlin,
    merlin_env,
    start_worker,
    stop_worker,
    wait_for,
    write_job_files,
)

TOOL_SLEEP = "3.71"
EXIT_SLEEP = "3.73"
"""Each command is a ``sleep`` of its own length, found by it in ``/proc/*/cmdline``."""

SCRIPT = f"""\
rules:
  - match: 'Step slow \\('
    turn: 0
    reply:
      tool_calls:
        - name: run_command
          arguments: {{command: "sleep {TOOL_SLEEP}"}}
  - match: 'Step slow \\('
    turn: 1
    reply:
      tool_calls:
        - name: write_file
          arguments: {{path: done.txt, content: "done\\n"}}
  - reply: {{content: "done"}}
"""

TASKLIST = f"""\
title: One slow step
steps:
  - id: slow
    step_type: Feature
    description: write done.txt
    exit_command: sleep {EXIT_SLEEP}
"""


def sleeping(seconds: str) -> list[int]:
    """Pids of the live ``sleep <seconds>`` processes (zombies are dead: not counted)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if cmdline[:2] == [b"sleep", seconds.encode()] and state != "Z":
            pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize(
    ("sandbox", "seconds"),
    [("none", TOOL_SLEEP), ("none", EXIT_SLEEP), ("bwrap", EXIT_SLEEP)],
    ids=["run_command", "exit-command", "exit-command-in-bwrap"],
)
def test_a_killed_workers_command_dies_with_it(
    tmp_path: Path, py_repo: Path, sandbox: str, seconds: str
) -> None:
    if sandbox == "bwrap" and os.path.exists("/usr/bin/bwrap") is False:
        pytest.skip("bubblewrap is not installed")  # .ci/run installs it
    home = tmp_path / "home"
    env = merlin_env(home)
    tasklist, config = write_job_files(
        tmp_path / "job", local=SCRIPT, tasklist=TASKLIST, lease_seconds=2
    )
    config.write_text(config.read_text() + f'\n[sandbox]\nmode = "{sandbox}"\n')
    log = tmp_path / "worker.log"
    first = start_worker(env, log)
    second = None
    try:
        submitted = merlin(
            env, "submit", str(tasklist), "--repo", str(py_repo), "--config", str(config), "--json"
        )
        assert submitted.returncode == 0, submitted.stderr
        job_id = json.loads(submitted.stdout)["job_id"]
        wait_for(lambda: sleeping(seconds), 90, f"`sleep {seconds}` to start")
        kill_worker(first)
        wait_for(lambda: not sleeping(seconds), 3, "the killed worker's command to die")

        second = start_worker(env, log)
        most = 0

        def finished() -> bool:
            nonlocal most
            most = max(most, len(sleeping(seconds)))
            status = merlin(env, "status", job_id, "--json")
            return json.loads(status.stdout)["finished_at"] is not None

        wait_for(finished, 120, "the job to finish on the second worker", poll=0.1)
    finally:
        kill_worker(first)
        if second is not None:
            stop_worker(second)
    status = json.loads(merlin(env, "status", job_id, "--json").stdout)
    assert status["status"] == "completed", log.read_text()[-4000:]
    assert most == 1  # the resumed attempt ran the command again, and alone
    assert not sleeping(seconds)
