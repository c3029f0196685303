"""`merlin agents run`: one step with a named agent, worked in this process, end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import git
from tests.e2e.helpers import merlin, merlin_env, write_job_files

pytestmark = pytest.mark.e2e

# The reviewer reads the code, then finishes: its step is a check (Verify), so the
# project's test suite decides.
REVIEWER = """\
rules:
  - match: 'Step run \\(Verify\\): Review app\\.py'
    turn: 0
    reply:
      tool_calls:
        - name: read_file
          arguments: {path: app.py}
  - match: 'Step run \\(Verify\\)'
    turn: 1
    reply:
      tool_calls:
        - name: finish
          arguments: {summary: "app.py: no findings"}
"""
PASSING_TEST = "from app import answer\n\n\ndef test_answer():\n    assert answer() == 41\n"


def test_agents_run_works_one_step_with_the_named_agent(tmp_path: Path, py_repo: Path) -> None:
    (py_repo / "test_app.py").write_text(PASSING_TEST)
    git(py_repo, "commit", "-qam", "a passing test")
    env = merlin_env(tmp_path / "home")
    _, config = write_job_files(tmp_path / "job", local=REVIEWER)
    args = ["reviewer", "Review app.py for bugs.", "--repo", str(py_repo)]
    result = merlin(env, "agents", "run", *args, "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    view = json.loads(result.stdout)
    assert view["status"] == "completed"
    assert view["title"] == "Review app.py for bugs."
    (step,) = view["steps"]
    assert (step["id"], step["step_type"], step["agent"]) == ("run", "Verify", "reviewer")
    assert step["agent_choice"] == "named"
    assert step["exit_command"] == "python -m pytest -q"
    assert step["result"] == "app.py: no findings"
    assert [(a["tier"], a["status"]) for a in step["attempts"]] == [("local", "passed")]
    assert git(py_repo, "diff", "main", view["branch"]) == ""  # a reviewer changes nothing


def test_agents_run_exits_1_when_the_step_fails(tmp_path: Path, py_repo: Path) -> None:
    """py_repo's test fails, and a reviewer may not fix it: the job fails, as `merlin run`'s."""
    env = merlin_env(tmp_path / "home")
    _, config = write_job_files(tmp_path / "job", local=REVIEWER)
    args = ["reviewer", "Review app.py for bugs.", "--repo", str(py_repo)]
    result = merlin(env, "agents", "run", *args, "--config", str(config))
    assert result.returncode == 1, result.stderr
    assert "working it in this process" in result.stdout
    assert "run · Verify · agent reviewer · Failed" in result.stdout
    assert re.search(r"job [0-9a-f]{12} failed", result.stdout), result.stdout
