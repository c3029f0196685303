"""The verify task's work driven directly (no Celery), on real git and SQLite."""

from __future__ import annotations

from pathlib import Path

from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.dispatch import Outcome
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from tests.conftest import git
from tests.unit.scripted_jobs import scripted_job


def test_step_then_verify_advances_the_branch(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    # A duplicate delivery of the same step message finds the phase moved on.
    assert execute_step(db, settings, job_id, "s0", "w:2") is Outcome.STOP
    assert verify_step(db, settings, job_id, "s0", "w:3")[0] is Outcome.CONTINUE
    assert verify_step(db, settings, job_id, "s0", "w:4")[0] is Outcome.STOP
    assert finalize_job(db, settings, job_id) == "completed"
    assert "return 42" in git(py_repo, "show", f"merlin/{job_id}:app.py")
    assert not (settings.worktrees_dir / job_id).exists()
    summary = (settings.jobs_dir / job_id / "summary.md").read_text()
    assert "| s0 | Debug | Completed | execute@local: 0 |" in summary


def test_a_moved_job_branch_fails_the_job_instead_of_being_overwritten(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    (py_repo / "other.txt").write_text("someone else's work\n")
    git(py_repo, "add", "other.txt")
    git(py_repo, "commit", "-qm", "other")
    git(py_repo, "branch", "-f", f"merlin/{job_id}", "main")
    moved_to = git(py_repo, "rev-parse", f"merlin/{job_id}")
    assert verify_step(db, settings, job_id, "s0", "w:2")[0] is Outcome.STOP
    view = job_view(db, job_id)
    assert view["status"] == "failed"
    assert "was moved by someone else" in view["error"]
    assert view["finished_at"] is not None
    assert git(py_repo, "rev-parse", f"merlin/{job_id}") == moved_to
