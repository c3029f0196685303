"""Commands that read jobs, through the CLI: `list --status/--limit`, `logs --follow`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from merlin_flow.cli.app import app
from merlin_flow.cli.common import state
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.verdict import verify_step
from merlin_flow.store import Job, JobStatus
from tests.unit.scripted_jobs import scripted_job


@pytest.fixture
def finished_job(merlin_home: Path, py_repo: Path, tmp_path: Path) -> str:
    """A one-step job in MERLIN_HOME, worked, verified and closed: completed."""
    settings, db = state()
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    execute_step(db, settings, job_id, "s0", "w:1")
    verify_step(db, settings, job_id, "s0", "w:2")
    finalize_job(db, settings, job_id)
    return job_id


def test_logs_follow_json_prints_one_object_a_line_and_ends_with_the_job(
    finished_job: str,
) -> None:
    result = CliRunner().invoke(app, ["logs", finished_job, "--follow", "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]  # each line whole JSON
    assert all(line["job"] == finished_job for line in lines)
    types = [line["type"] for line in lines]
    assert {"event", "attempt_start", "message", "attempt_end"} <= set(types)
    assert types[-1] == "job_end"
    assert lines[-1]["status"] == "completed"
    messages = [line for line in lines if line["type"] == "message"]
    assert all((m["step"], m["attempt"]) == ("s0", 1) for m in messages)
    assert messages[0]["message"]["role"] == "user"
    [end] = [line for line in lines if line["type"] == "attempt_end"]
    assert (end["status"], end["exit_code"], end["exit_command"]) == (
        "passed", 0, "python -m pytest -q",
    )  # fmt: skip
    only = CliRunner().invoke(app, ["logs", finished_job, "-f", "--json", "--step", "nope"])
    assert only.exit_code == 2
    assert "has no step 'nope'" in only.output


def test_logs_follow_as_text_prints_each_attempt_with_its_end(finished_job: str) -> None:
    result = CliRunner().invoke(app, ["logs", finished_job, "--follow"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    order = [
        "── step s0 · attempt 1 · execute@local · passed, exit code 0",
        "user: ",
        '→ edit_file {"path": "app.py"',
        "── attempt 1 of step s0: passed",
        "$ python -m pytest -q  (exit code 0)",
    ]
    positions = [out.index(line) for line in order]
    assert positions == sorted(positions), out
    assert out.count("── step s0 · attempt 1") == 1


def _jobs(merlin_home: Path, py_repo: Path, tmp_path: Path, statuses: list[JobStatus]) -> list[str]:
    """Jobs made oldest first, then set to ``statuses``."""
    settings, db = state()
    ids = [scripted_job(db, settings, py_repo, tmp_path) for _ in statuses]
    with db.session() as session:
        for job_id, status in zip(ids, statuses, strict=True):
            session.get_one(Job, job_id).status = status
    return ids


def _listed(*args: str) -> list[tuple[str, str]]:
    result = CliRunner().invoke(app, ["list", "--json", *args])
    assert result.exit_code == 0, result.output
    return [(job["id"], job["status"]) for job in json.loads(result.stdout)]


def test_list_filters_by_status_and_limits_the_count(
    merlin_home: Path, py_repo: Path, tmp_path: Path
) -> None:
    failed, running, cancelled = _jobs(
        merlin_home, py_repo, tmp_path, [JobStatus.FAILED, JobStatus.RUNNING, JobStatus.CANCELLED]
    )
    assert _listed() == [(cancelled, "cancelled"), (running, "running"), (failed, "failed")]
    assert _listed("--status", "failed") == [(failed, "failed")]
    assert _listed("--status", "failed", "--status", "cancelled") == [
        (cancelled, "cancelled"), (failed, "failed"),
    ]  # fmt: skip
    assert _listed("--limit", "2") == [(cancelled, "cancelled"), (running, "running")]
    assert _listed("--status", "completed") == []
    table = CliRunner().invoke(app, ["list", "--status", "running"])
    assert table.exit_code == 0, table.output
    assert running in table.stdout
    assert failed not in table.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--status", "done"], "--status 'done' is not a job status; the statuses: planning,"),
        (["--status", "Failed"], "--status 'Failed' is not a job status"),
        (["--limit", "0"], "Invalid value for '--limit'"),
        (["--limit", "many"], "Invalid value for '--limit'"),
    ],
)
def test_list_refuses_an_unknown_status_or_a_limit_below_one(
    merlin_home: Path, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(app, ["list", *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "budget_exceeded" in result.output or "--limit" in result.output
