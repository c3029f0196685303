"""Helpers for end-to-end tests: real `merlin` processes on a per-test MERLIN_HOME."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MERLIN = [sys.executable, "-m", "merlin_flow.cli"]

LOCAL_SCRIPT = """\
rules:
  # step fix: one edit, then done
  - match: 'Step fix \\('
    turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return 41", new: "return 42"}
  - match: 'Step fix \\('
    turn: 1
    reply: {content: "answer() returns 42"}
  # step slow: a slow command first (the window for the crash test), then the feature
  - match: 'Step slow \\('
    turn: 0
    reply:
      tool_calls:
        - name: run_command
          arguments: {command: "sleep SLEEP_SECONDS"}
  - match: 'Step slow \\('
    turn: 1
    reply:
      tool_calls:
        - name: write_file
          arguments:
            path: double.py
            content: "def double(x):\\n    return 2 * x\\n"
        - name: write_file
          arguments:
            path: test_double.py
            content: "from double import double\\n\\n\\ndef test_double():\\n    \\
              assert double(4) == 8\\n"
  - match: 'Step slow \\('
    turn: 2
    reply: {content: "double() added"}
  # step docs
  - match: 'Step docs \\('
    turn: 0
    reply:
      tool_calls:
        - name: write_file
          arguments: {path: README.md, content: "# sample\\n"}
  - match: 'Step docs \\('
    turn: 1
    reply: {content: "README written"}
"""

THREE_STEPS = """\
title: Three steps
steps:
  - id: fix
    step_type: Debug
    description: answer() must return 42
  - id: slow
    step_type: Feature
    description: add double(x) with a test
    depends_on: [fix]
  - id: docs
    step_type: Refactor
    description: add a README
    exit_command: test -f README.md
    depends_on: [slow]
"""

CONFIG = """\
[[tiers]]
name = "local"
model = "scripted/local.yaml"
price_in = 1.0
price_out = 2.0

[[tiers]]
name = "premium"
model = "scripted/premium.yaml"
price_in = 3.0
price_out = 15.0

[limits]
lease_seconds = LEASE
exit_command_timeout = 120
"""


def write_job_files(
    folder: Path,
    local: str = LOCAL_SCRIPT,
    premium: str = "rules: []\n",
    tasklist: str = THREE_STEPS,
    sleep_seconds: float = 0.1,
    lease_seconds: float = 60,
) -> tuple[Path, Path]:
    """Write scripts, a merlin.toml and a TaskList into ``folder``; return (tasklist, config)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "local.yaml").write_text(local.replace("SLEEP_SECONDS", f"{sleep_seconds:g}"))
    (folder / "premium.yaml").write_text(premium)
    config = folder / "merlin.toml"
    config.write_text(CONFIG.replace("LEASE", f"{lease_seconds:g}"))
    tasklist_file = folder / "tasklist.yaml"
    tasklist_file.write_text(tasklist)
    return tasklist_file, config


def one_step(path: Path, step: str, description: str, step_type: str = "Feature") -> Path:
    """Write a TaskList of one step of ``step_type`` (its default exit command) to ``path``."""
    path.write_text(
        f"title: {description}\nsteps:\n  - id: {step}\n    step_type: {step_type}\n"
        f"    description: {description}\n"
    )
    return path


def merlin_env(home: Path, **extra: str) -> dict[str, str]:
    """Environment for merlin subprocesses using ``home`` as MERLIN_HOME."""
    base = {
        k: v for k, v in os.environ.items() if k not in ("MERLIN_DATABASE_URL", "MERLIN_BROKER_URL")
    }
    return {
        **base,
        "MERLIN_HOME": str(home),
        "MERLIN_SWEEP_INTERVAL": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        **extra,
    }


def merlin(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the merlin CLI to completion."""
    return subprocess.run(
        [*MERLIN, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def start_worker(
    env: dict[str, str], log: Path, *args: str, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start `merlin worker` in its own process group, logging to ``log``."""
    with log.open("ab") as handle:
        return subprocess.Popen(
            [*MERLIN, "worker", "--concurrency", "1", "--loglevel", "INFO", *args],
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
        )


def kill_worker(worker: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the worker's whole process group and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, sig)
    worker.wait(timeout=30)


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """Stop a worker: SIGTERM (warm shutdown), then SIGKILL if it lingers."""
    if worker.poll() is not None:
        return
    os.kill(worker.pid, signal.SIGTERM)
    try:
        worker.wait(timeout=20)
    except subprocess.TimeoutExpired:
        kill_worker(worker)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def status_json(env: dict[str, str], job_id: str) -> dict[str, Any]:
    """`merlin status JOB --json`, parsed."""
    result = merlin(env, "status", job_id, "--json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data
