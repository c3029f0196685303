"""Agents, permissions and MCP tools through `merlin run`, a real worker and the sandbox.

One job on a repository that holds a secret, with `Read(./secrets/**)` and
`Bash(git push:*)` denied and an MCP stdio server configured; the scripted model
plays each step's agent:

- ``review``, with the read-only builtin reviewer: write_file is not offered, and its
  `run_command` cannot write the read-only worktree;
- ``secret``, with a project agent: `read_file` of the secret is refused by the rule,
  `cat` of it fails inside the sandbox, `git push` is refused, the MCP tool answers;
- ``leak``: an exit command that reads the secret fails (the step fails, the job goes on);
- ``tests``: names no agent, and autodelegation gives it the test writer.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import make_repo
from tests.e2e.helpers import merlin, merlin_env, status_json

pytestmark = pytest.mark.e2e

MCP_SERVER = Path(__file__).resolve().parents[1] / "mcp_server.py"

WORKER_AGENT = """\
---
name: worker
description: General hands for chores.
---
You do what the step says, nothing more.
"""

SCRIPT = """\
rules:
  # review: the read-only reviewer tries to write, both ways, then reports.
  - {match: 'Step review \\(', turn: 0, reply: {tool_calls: [
      {name: write_file, arguments: {path: hacked.txt, content: x}},
      {name: run_command, arguments: {command: "echo x > hacked.txt"}}]}}
  - {match: 'Step review \\(', turn: 1, reply: {tool_calls: [
      {name: finish, arguments: {summary: "reviewed: answer() returns 41"}}]}}
  # secret: the deny rules, in the tools and in the sandbox; the MCP tool.
  - {match: 'Step secret \\(', turn: 0, reply: {tool_calls: [
      {name: read_file, arguments: {path: secrets/key}},
      {name: run_command, arguments: {command: "cat secrets/key"}},
      {name: run_command, arguments: {command: "git push origin HEAD"}},
      {name: mcp__calc__add, arguments: {a: 2, b: 3}}]}}
  - {match: 'Step secret \\(', turn: 1, reply: {tool_calls: [
      {name: edit_file, arguments: {path: app.py, old: "return 41", new: "return 42"}}]}}
  - {match: 'Step secret \\(', turn: 2, reply: {tool_calls: [
      {name: finish, arguments: {summary: "answer() returns 42"}}]}}
  # leak: nothing to do; its exit command tries to read the secret.
  - {match: 'Step leak \\(', reply: {tool_calls: [
      {name: finish, arguments: {summary: "nothing to change"}}]}}
  # tests: the test writer adds a test.
  - {match: 'Step tests \\(', turn: 0, reply: {tool_calls: [
      {name: write_file, arguments: {path: test_more.py,
        content: "def test_more():\\n    assert 1 + 1 == 2\\n"}}]}}
  - {match: 'Step tests \\(', turn: 1, reply: {tool_calls: [
      {name: finish, arguments: {summary: "test_more added"}}]}}
"""

TASKLIST = """\
title: Agents and permissions
steps:
  - id: review
    step_type: Feature
    description: review app.py for security problems
    agent: reviewer
    exit_command: "true"
    depends_on: []
  - id: secret
    step_type: Debug
    description: answer() must return 42
    agent: worker
    depends_on: []
  - id: leak
    step_type: Verify
    description: check the key is in place
    agent: worker
    exit_command: cat secrets/key
    on_failure: continue
    depends_on: []
  - id: tests
    step_type: Test
    description: write unit tests for the answer function
    depends_on: [secret]
"""

CONFIG = """\
[[tiers]]
name = "local"
model = "scripted/agents.yaml"

[environment]
setup = []

[permissions]
deny = ["Read(./secrets/**)", "Bash(git push:*)"]

[agents]
autodelegate = true

[mcp_servers.calc]
command = "python"
args = ["mcp_server.py"]
"""


def _tool_replies(env: dict[str, str], job_id: str, step: str) -> list[str]:
    """The tool replies of the step's first attempt, from `merlin logs --json`."""
    logs = json.loads(merlin(env, "logs", job_id, "--step", step, "--json").stdout)
    return [m["content"] for m in logs[0]["transcript"] if m.get("role") == "tool"]


def test_agents_permissions_and_mcp_in_one_job(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "repo",
        {
            "pyproject.toml": '[project]\nname = "sample"\nversion = "0"\n',
            "app.py": "def answer():\n    return 41\n",
            "test_app.py": "from app import answer\n\n\ndef test_answer():\n"
            "    assert answer() == 42\n",
            "secrets/key": "TOPSECRET\n",
            "mcp_server.py": MCP_SERVER.read_text(),
            ".merlin/agents/worker.md": WORKER_AGENT,
        },
    )
    job = tmp_path / "job"
    job.mkdir()
    (job / "agents.yaml").write_text(SCRIPT)
    (job / "merlin.toml").write_text(CONFIG)
    (job / "tasklist.yaml").write_text(TASKLIST)
    env = merlin_env(tmp_path / "home")

    run = merlin(
        env, "run", str(job / "tasklist.yaml"), "--repo", str(repo),
        "--config", str(job / "merlin.toml"), "--json", timeout=300,
    )  # fmt: skip

    assert run.returncode == 1, run.stderr  # the leak step failed: partially completed
    job_id = json.loads(run.stdout)["id"]
    view = status_json(env, job_id)
    steps = {step["id"]: step for step in view["steps"]}
    assert view["status"] == "partially_completed"
    assert {key: step["status"] for key, step in steps.items()} == {
        "review": "Completed",
        "secret": "Completed",
        "leak": "Failed",
        "tests": "Completed",
    }

    review = steps["review"]
    assert (review["agent"], review["agent_choice"]) == ("reviewer", "named")
    refused_write, command = _tool_replies(env, job_id, "review")[:2]
    assert "unknown tool 'write_file'" in refused_write
    assert "exit code: 0" not in command
    assert "Read-only file system" in command

    secret = steps["secret"]
    assert (secret["agent"], secret["agent_choice"]) == ("worker", "named")
    read, cat, push, add = _tool_replies(env, job_id, "secret")[:4]
    assert "refused by [permissions] deny rule Read(./secrets/**)" in read
    assert "TOPSECRET" not in cat
    assert "exit code: 0" not in cat
    assert "refused by [permissions] deny rule Bash(git push:*)" in push
    assert add.strip() == "5"

    leak = steps["leak"]
    assert all(a["exit_code"] not in (0, None) for a in leak["attempts"])
    assert "TOPSECRET" not in json.dumps(leak)

    tests = steps["tests"]
    assert (tests["agent"], tests["agent_choice"]) == ("test-writer", "autodelegated")
    assert tests["agent_score"] >= 0.2

    branch = f"merlin/{job_id}"
    tree = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", branch], cwd=repo, text=True,
        capture_output=True, check=True,
    ).stdout.split()  # fmt: skip
    assert "hacked.txt" not in tree
    assert "test_more.py" in tree

    shown = merlin(env, "status", job_id)  # not a terminal: plain lines
    assert "agent test-writer (autodelegated, score" in shown.stdout
