"""Requests in plain words, end to end: planned, approved or rejected, run by a real worker;
a question answered read-only. The planner and the agents are scripted models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from merlin_flow.store import Database, LlmCall
from tests.conftest import git
from tests.e2e.helpers import (
    LOCAL_SCRIPT,
    merlin,
    merlin_env,
    start_worker,
    status_json,
    stop_worker,
    wait_for,
    write_job_files,
)

pytestmark = pytest.mark.e2e

PLAN = json.dumps(
    {
        "steps": [
            {"id": "fix", "step_type": "Debug", "title": "Fix answer()",
             "instruction": "answer() must return 42", "estimated_tokens": 4000,
             "files": ["app.py"]},
            {"id": "slow", "step_type": "Feature", "title": "Add double()",
             "instruction": "add double(x) with a test", "depends_on": ["fix"],
             "estimated_tokens": 6000},
            {"id": "docs", "step_type": "Refactor", "title": "Add a README",
             "instruction": "add a README", "depends_on": ["slow"]},
        ]
    }
)  # fmt: skip
ANSWER = json.dumps("Here is the plan:\n" + PLAN)
# The planner answers with the plan only when app.py's text reached its prompt (@app.py).
PLANNER_RULES = f"""\
  - match: 'You plan changes[\\s\\S]*--- @app.py ---\\s*def answer'
    turn: 0
    reply:
      content: {ANSWER}
  - match: 'You plan changes'
    reply: {{content: "no plan without the file"}}
  - match: 'You answer questions'
    turn: 0
    reply:
      tool_calls:
        - name: grep
          arguments: {{pattern: "return 4"}}
  - match: 'You answer questions[\\s\\S]*app.py:2'
    turn: 1
    reply: {{content: "answer() returns 41: app.py line 2 says `return 41`."}}
"""
REQUEST = (
    "Three changes, see @app.py:\n1. answer() must return 42\n2. add double(x) with a test\n"
    "3. add a README"
)


def _job_files(tmp_path: Path) -> tuple[dict[str, str], Path]:
    _, config = write_job_files(tmp_path / "job", local=LOCAL_SCRIPT.replace(
        "rules:\n", "rules:\n" + PLANNER_RULES, 1
    ))  # fmt: skip
    return merlin_env(tmp_path / "home"), config


def _submit(env: dict[str, str], repo: Path, config: Path, *extra: str) -> dict[str, Any]:
    result = merlin(
        env, "submit", REQUEST, "--repo", str(repo), "--config", str(config), "--json", *extra
    )
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _planning_calls(home: Path, job_id: str) -> list[LlmCall]:
    db = Database(f"sqlite:///{home / 'merlin.db'}")
    try:
        with db.reader() as session:
            query = select(LlmCall).where(LlmCall.job_id == job_id, LlmCall.attempt_id.is_(None))
            rows = list(session.scalars(query.order_by(LlmCall.seq)).all())
            session.expunge_all()
            return rows
    finally:
        db.dispose()


def _finished(env: dict[str, str], job_id: str) -> dict[str, Any]:
    return wait_for(
        lambda: (s := status_json(env, job_id))["finished_at"] and s, 180, "the job to end"
    )


def test_a_request_with_yes_is_planned_and_run_by_a_worker(tmp_path: Path, py_repo: Path) -> None:
    env, config = _job_files(tmp_path)
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        job_id = _submit(env, py_repo, config, "--yes")["job_id"]
        status = _finished(env, job_id)
    finally:
        stop_worker(worker)
    assert status["status"] == "completed", (tmp_path / "worker.log").read_text()[-3000:]
    assert [s["id"] for s in status["steps"]] == ["fix", "slow", "docs"]
    assert status["request"] == REQUEST
    plan = status["plan"]
    assert (plan["planned"], plan["fallback"], plan["kind"]) == (True, False, "task")
    assert plan["answers"] == ["Here is the plan:\n" + PLAN]  # the raw answer, kept
    assert plan["approved_by"]
    assert plan["approved_at"]
    # The @app.py file reached the planner's prompt: the journal holds the one call,
    # answered by the rule that needs the file's text.
    (call,) = _planning_calls(tmp_path / "home", job_id)
    assert call.response is not None
    assert "Here is the plan" in call.response["content"]
    assert git(py_repo, "show", f"merlin/{job_id}:app.py").endswith("return 42")


def test_a_plan_waits_for_approval_then_runs(tmp_path: Path, py_repo: Path) -> None:
    env, config = _job_files(tmp_path)
    submitted = _submit(env, py_repo, config)
    job_id = submitted["job_id"]
    assert submitted["status"] == "awaiting_approval"
    waiting = status_json(env, job_id)
    assert (waiting["status"], waiting["steps"]) == ("awaiting_approval", [])
    assert git(py_repo, "branch", "--list", f"merlin/{job_id}") == ""  # no branch before
    shown = merlin(env, "status", job_id)
    assert "awaiting approval" in shown.stdout, shown.stdout
    assert "Add double()" in shown.stdout
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        approved = merlin(env, "approve", job_id)
        assert approved.returncode == 0, approved.stderr
        status = _finished(env, job_id)
    finally:
        stop_worker(worker)
    assert status["status"] == "completed", (tmp_path / "worker.log").read_text()[-3000:]
    again = merlin(env, "approve", job_id)
    assert again.returncode == 2
    assert "only a job awaiting approval" in again.stderr


def test_a_rejected_plan_ends_the_job_and_nothing_runs(tmp_path: Path, py_repo: Path) -> None:
    env, config = _job_files(tmp_path)
    job_id = _submit(env, py_repo, config)["job_id"]
    rejected = merlin(env, "reject", job_id)
    assert rejected.returncode == 0, rejected.stderr
    status = status_json(env, job_id)
    assert (status["status"], status["steps"]) == ("rejected", [])
    assert status["plan"]["rejected_by"]
    assert git(py_repo, "branch", "--list", f"merlin/{job_id}") == ""


def test_run_of_a_planned_request_without_a_terminal_or_yes_is_refused(
    tmp_path: Path, py_repo: Path
) -> None:
    env, config = _job_files(tmp_path)
    result = merlin(env, "run", REQUEST, "--repo", str(py_repo), "--config", str(config))
    assert result.returncode == 2
    assert "pass --yes" in result.stderr
    assert json.loads(merlin(env, "list", "--json").stdout) == []  # refused before any job


def test_a_question_is_answered_read_only_with_no_branch(tmp_path: Path, py_repo: Path) -> None:
    env, config = _job_files(tmp_path)
    before = git(py_repo, "for-each-ref")
    result = merlin(
        env, "run", "What does answer() return?", "--repo", str(py_repo), "--config", str(config)
    )
    assert result.returncode == 0, result.stderr
    assert "answer() returns 41: app.py line 2" in result.stdout
    assert git(py_repo, "for-each-ref") == before  # no branch, nothing committed
    assert git(py_repo, "status", "--porcelain") == ""
    jobs = json.loads(merlin(env, "list", "--json").stdout)
    status = status_json(env, jobs[0]["id"])
    assert (status["status"], status["steps"]) == ("completed", [])
    assert status["answer"].startswith("answer() returns 41")
    assert len(_planning_calls(tmp_path / "home", status["id"])) == 2  # grep, then the answer
    # No branch was made, and no view says otherwise.
    assert status["branch"] is None
    assert jobs[0]["branch"] is None
    # Its conversation is there as an attempt's would be: the question, the grep, the answer.
    logs = merlin(env, "logs", status["id"])
    assert logs.returncode == 0, logs.stderr
    assert "── step question · attempt 1 · execute@local · passed" in logs.stdout
    assert '→ grep {"pattern": "return 4"}' in logs.stdout
    assert "assistant: answer() returns 41" in logs.stdout
    entries = json.loads(merlin(env, "logs", status["id"], "--json").stdout)
    assert [(e["step"], e["status"], e["turns"]) for e in entries] == [("question", "passed", 2)]
    assert [m["role"] for m in entries[0]["transcript"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert entries[0]["prompt_tokens"] > 0
    # Replayed offline from its journal: the same calls, the same answer.
    replayed = merlin(env, "replay", status["id"], "--json")
    assert replayed.returncode == 0, replayed.stderr
    report = json.loads(replayed.stdout)
    assert (report["reproduced"], report["calls"], report["identical_requests"]) == (True, 2, 2)
    assert report["replay_answer"] == status["answer"]


SPEC = """\
# The answer

## Invariants

answer() never returns a negative number.

## Notes

Not a constraint: this section stays out of prompts.
"""
SPEC_LOCAL = """\
rules:
  # the fix attempt: its feedback carries the violation
  - match: 'Step fix \\([\\s\\S]*VIOLATION app.py:2'
    turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return -42", new: "return 42"}
  - match: 'Step fix \\([\\s\\S]*VIOLATION app.py:2'
    turn: 1
    reply: {content: "answer() is positive again"}
  # the first attempt breaks the invariant, and only if the invariant is in its prompt
  - match: 'Step fix \\([\\s\\S]*never returns a negative number'
    turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return 41", new: "return -42"}
  - match: 'Step fix \\('
    turn: 1
    reply: {content: "answer() returns -42"}
"""
CHECKER = """\
rules:
  - match: '\\+\\s*return -42'
    reply: {content: "VIOLATION app.py:2: answer() returns a negative number"}
  - reply: {content: "PASS"}
"""
SPEC_CONFIG = """\
[[tiers]]
name = "local"
model = "scripted/local.yaml"

[[tiers]]
name = "checker"
model = "scripted/checker.yaml"

[specs]
check = "enforce"
check_tier = "checker"

[limits]
exit_command_timeout = 120
"""
SPEC_TASKLIST = """\
title: Keep the answer
steps:
  - id: fix
    step_type: Debug
    description: change what answer() returns
    exit_command: python -c "import app"
"""


def test_an_enforced_spec_check_fails_the_breaking_attempt_and_passes_the_fix(
    tmp_path: Path, py_repo: Path
) -> None:
    (py_repo / "specs").mkdir()
    (py_repo / "specs" / "answer.md").write_text(SPEC)
    git(py_repo, "add", "-A")
    git(py_repo, "commit", "-q", "-m", "spec")
    job = tmp_path / "job"
    job.mkdir()
    (job / "local.yaml").write_text(SPEC_LOCAL)
    (job / "checker.yaml").write_text(CHECKER)
    (job / "merlin.toml").write_text(SPEC_CONFIG)
    (job / "tasklist.yaml").write_text(SPEC_TASKLIST)
    env = merlin_env(tmp_path / "home")
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        result = merlin(
            env, "submit", str(job / "tasklist.yaml"), "--repo", str(py_repo),
            "--config", str(job / "merlin.toml"), "--json",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        status = _finished(env, json.loads(result.stdout)["job_id"])
    finally:
        stop_worker(worker)
    assert status["status"] == "completed", (tmp_path / "worker.log").read_text()[-3000:]
    attempts = status["steps"][0]["attempts"]
    assert [(a["kind"], a["status"], a["exit_code"]) for a in attempts] == [
        ("execute", "failed", 0),  # its exit command passed; the spec check failed it
        ("fix", "passed", 0),
    ]
    assert "VIOLATION app.py:2: answer() returns a negative number" in attempts[0]["error"]
    logs = merlin(env, "logs", status["id"], "--json")
    first_prompt = json.loads(logs.stdout)[0]["transcript"][0]["content"]
    assert "answer() never returns a negative number." in first_prompt
    assert "Not a constraint" not in first_prompt
    assert git(py_repo, "show", f"{status['branch']}:app.py").endswith("return 42")
