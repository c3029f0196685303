"""job_summary: the Markdown summary finalize writes beside the patch."""

from __future__ import annotations

from pathlib import Path

from merlin_flow.settings import Settings
from merlin_flow.store import Database
from tests.unit.engine.finished_jobs import finished_job


def test_the_summary_names_the_outcome_and_every_attempt(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = finished_job(db, settings, py_repo, tmp_path, "sh -c 'exit 3'")
    summary = (settings.jobs_dir / job_id / "summary.md").read_text()
    assert f"- job: {job_id}, status: **failed**" in summary
    assert "| fix | Debug | Failed | execute@local: 3 |" in summary
    assert "| docs | Debug | Skipped |  |" in summary
