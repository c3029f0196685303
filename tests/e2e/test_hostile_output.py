"""Hostile model output and exit commands in a real job: every step ends cleanly.

One `merlin run` (embedded worker) of a job whose steps are attacked: malformed calls,
an unknown tool, NUL bytes and a lone surrogate in a write, a model that never stops
calling tools, an exit command printing 100 MB, an exit command that leaves a daemon
(`setsid sleep ... &`). The worker goes on to the next step after each, its peak memory
stays bounded, and no process is left behind. In bubblewrap and with `mode = "none"`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from merlin_flow.workspace.sandbox import sandbox_problem
from tests.e2e.helpers import MERLIN, merlin, merlin_env, write_job_files

pytestmark = pytest.mark.e2e

SCRIPT = r"""
rules:
  - match: 'Step endless \('
    reply:
      tool_calls:
        - name: list_files
          arguments: {}
  - match: 'Step junk \('
    turn: 0
    reply:
      tool_calls:
        - {name: write_file, arguments: '{not json'}
        - {name: write_file, arguments: '[[[[[[[[[[[[[[[['}
        - {name: no_such_tool, arguments: {}}
        - {name: write_file, arguments: '{"path": "s.txt", "content": "bad \udcff"}'}
        - {name: write_file, arguments: {path: nul.txt, content: "a\0b"}}
  - match: 'Step junk \('
    turn: 1
    reply:
      tool_calls:
        - {name: finish, arguments: {summary: "survived the junk"}}
  - match: 'Step loud \('
    turn: 0
    reply:
      tool_calls:
        - {name: write_file, arguments: {path: loud.txt, content: "loud\n"}}
  - match: 'Step daemon \('
    turn: 0
    reply:
      tool_calls:
        - {name: write_file, arguments: {path: daemon.txt, content: "daemon\n"}}
  - reply: {content: "done"}
"""
TASKLIST = """\
title: Hostile
steps:
  - id: junk
    step_type: Feature
    description: junk calls
    exit_command: test -f nul.txt
  - id: loud
    step_type: Feature
    description: print a lot
    exit_command: >-
      sh -c 'yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c 104857600; echo; echo loud-end'
    depends_on: [junk]
  - id: daemon
    step_type: Feature
    description: leave a daemon
    exit_command: sh -c 'setsid sleep MARK >/dev/null 2>&1 </dev/null & echo started'
    depends_on: [loud]
  - id: endless
    step_type: Feature
    description: never stop
    exit_command: "true"
    depends_on: [daemon]
"""


MEASURED = [
    sys.executable,
    "-c",
    "import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, file=sys.stderr); "
    "sys.exit(code)",
]
"""Runs a command and prints its peak resident memory (bytes) last on stderr."""
PEAK_BYTES = 400 * 2**20
"""A plain one-step `merlin run` peaks at about 320 MB (litellm loaded); reading the
100 MB output whole would add 200 MB (bytes, then text)."""


def sleepers(mark: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", f"sleep {mark}"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_a_job_of_hostile_steps_ends_cleanly(tmp_path: Path, py_repo: Path, mode: str) -> None:
    if mode == "bwrap" and sandbox_problem():
        pytest.skip(f"bubblewrap cannot run here: {sandbox_problem()}")
    mark = f"1000.{uuid.uuid4().int % 10**12}"
    tasklist, config = write_job_files(
        tmp_path / "job", local=SCRIPT, premium=SCRIPT, tasklist=TASKLIST.replace("MARK", mark)
    )
    with config.open("a") as handle:
        handle.write("max_turns = 4\nfix_attempts = 0\n")
        handle.write(f'\n[sandbox]\nmode = "{mode}"\n\n[environment]\nsetup = []\n')
    env = merlin_env(tmp_path / "home")
    try:
        job = [str(tasklist), "--repo", str(py_repo), "--config", str(config), "--json"]
        result = subprocess.run(
            [*MEASURED, *MERLIN, "run", *job],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        peak = int(result.stderr.split()[-1])
        view = json.loads(result.stdout)
        steps = {step["id"]: step for step in view["steps"]}
        assert view["status"] == "failed", result.stderr  # the endless step, last, failed
        assert steps["endless"]["status"] == "Failed"
        errors = [a.get("error") or "" for a in steps["endless"]["attempts"]]
        assert all("turn limit reached: 4 model replies" in e for e in errors), errors
        for key in ("junk", "loud", "daemon"):  # each ran after the one before, and passed
            assert steps[key]["status"] == "Completed", steps[key]
        logs = merlin(env, "logs", view["id"]).stdout
        assert "loud-end" in logs
        assert "lone surrogate" in logs
        assert "unknown tool 'no_such_tool'" in logs
        nul = subprocess.run(
            ["git", "-C", str(py_repo), "show", f"{view['branch']}:nul.txt"],
            capture_output=True,
            check=True,
        )
        assert nul.stdout == b"a\x00b"
        assert peak < PEAK_BYTES, f"merlin run peaked at {peak / 2**20:.0f} MB"
        assert sleepers(mark) == [], f"`setsid sleep {mark} &` outlived its exit command"
    finally:
        for pid in sleepers(mark):
            os.kill(pid, signal.SIGKILL)
