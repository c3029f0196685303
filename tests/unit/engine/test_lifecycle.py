"""Named transitions of a job's life: failing and finalizing, on real git and SQLite."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from merlin_flow.engine.finalize import fail_job
from merlin_flow.engine.leases import claim
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Step
from tests.unit.scripted_jobs import scripted_job


def test_fail_job_only_from_the_lease_holder(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    with db.reader() as session:
        step_id = session.scalars(select(Step.id).where(Step.job_id == job_id)).one()
    assert claim(db, step_id, "attempt", "owner", 30)
    assert not fail_job(db, settings, job_id, "s0", "zombie", "boom")
    assert job_view(db, job_id)["status"] == "pending"
    assert fail_job(db, settings, job_id, "s0", "owner", "boom")
    assert job_view(db, job_id)["status"] == "failed"
