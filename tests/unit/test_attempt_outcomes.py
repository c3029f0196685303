"""What an attempt that changed nothing leads to: no verification, a reason that says so."""

from __future__ import annotations

from pathlib import Path

from merlin_flow.attempt import NO_CHANGES, execute_step
from merlin_flow.config import Limits, MerlinConfig, Tier
from merlin_flow.jobs import create_job, job_view
from merlin_flow.lifecycle import Outcome
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from merlin_flow.tasklist import parse_tasklist
from merlin_flow.verdict import verify_step

ONLY_TALKS = 'rules:\n  - reply: {content: "all done, nothing to change"}\n'


def _job(db: Database, settings: Settings, repo: Path, tmp_path: Path, step_type: str) -> str:
    script = tmp_path / "talks.yaml"
    script.write_text(ONLY_TALKS)
    config = MerlinConfig(
        tiers=[Tier(name="local", model=f"scripted/{script}")],
        limits=Limits(fix_attempts=0),
        exit_commands={step_type: "true"},
    )
    steps = [{"id": "s0", "step_type": step_type, "description": "answer 42"}]
    return create_job(db, settings, parse_tasklist({"title": "t", "steps": steps}), repo, config)


def test_an_attempt_that_changed_nothing_fails_without_verification(
    db: Database, py_repo: Path, tmp_path: Path
) -> None:
    settings = Settings(home=tmp_path / "home")
    job_id = _job(db, settings, py_repo, tmp_path, "Debug")
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    attempt = job_view(db, job_id)["steps"][0]["attempts"][0]
    assert attempt["status"] == "error"
    assert attempt["error"] == NO_CHANGES.format(turns=1)
    verify_step(db, settings, job_id, "s0", "w:2")
    view = job_view(db, job_id)
    assert view["status"] == "failed"  # its exit command (`true`) would have passed
    assert view["steps"][0]["attempts"][0]["exit_code"] is None  # never run
    assert "changed no file" in view["error"]


def test_a_verify_step_may_change_nothing(db: Database, py_repo: Path, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    job_id = _job(db, settings, py_repo, tmp_path, "Verify")
    execute_step(db, settings, job_id, "s0", "w:1")
    verify_step(db, settings, job_id, "s0", "w:2")
    attempt = job_view(db, job_id)["steps"][0]["attempts"][0]
    assert (attempt["status"], attempt["exit_code"]) == ("passed", 0)
