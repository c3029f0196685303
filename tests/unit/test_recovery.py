"""The recovery sweep: jobs never finalized, and one broken job among others."""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path

from sqlalchemy import update

from merlin_flow.jobs import job_view
from merlin_flow.lifecycle import fail_job_in_session
from merlin_flow.recovery import sweep
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Step
from tests.conftest import make_repo
from tests.unit.scripted_jobs import scripted_job


def test_sweep_closes_a_failed_job_that_was_never_finalized(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path, steps=2)
    with db.session() as session:  # the worker died between failing the job and closing it
        fail_job_in_session(session, job_id, None, "died")
    assert job_view(db, job_id)["finished_at"] is None
    assert sweep(db, settings, lambda _: None) == []
    view = job_view(db, job_id)
    assert view["finished_at"] is not None
    assert [s["status"] for s in view["steps"]] == ["Skipped", "Skipped"]


def test_one_broken_job_does_not_stop_the_sweep(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    gone = make_repo(tmp_path / "gone", {"pyproject.toml": "", "app.py": "x = 1\n"})
    broken = scripted_job(db, settings, gone, tmp_path)
    with db.session() as session:
        fail_job_in_session(session, broken, None, "died")
    shutil.rmtree(gone)  # finalizing it now fails: its repository is gone
    healthy = scripted_job(db, settings, py_repo, tmp_path)
    with db.session() as session:
        session.execute(
            update(Step).where(Step.job_id == healthy).values(lease_expires_at=datetime(2000, 1, 1))
        )
    enqueued: list[str] = []
    assert sweep(db, settings, lambda job, _key: enqueued.append(job)) == [healthy]
    assert enqueued == [healthy]
