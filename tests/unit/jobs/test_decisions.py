"""Rejecting a plan: only a job awaiting approval, recorded once, with who did it."""

from __future__ import annotations

import getpass
from pathlib import Path

import pytest
from sqlalchemy import select

from merlin_flow.errors import InputError, JobNotFoundError
from merlin_flow.jobs.decisions import reject_job, user_name
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Event, Job, JobStatus
from merlin_flow.store.events import EventKind
from tests.unit.scripted_jobs import scripted_job


def _awaiting(db: Database, settings: Settings, repo: Path, tmp_path: Path) -> str:
    job_id = scripted_job(db, settings, repo, tmp_path)
    with db.session() as session:
        session.get_one(Job, job_id).status = JobStatus.AWAITING_APPROVAL
    return job_id


def test_a_rejected_job_ends_with_who_rejected_it(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _awaiting(db, settings, py_repo, tmp_path)
    reject_job(db, job_id, "grace")
    with db.reader() as session:
        job = session.get_one(Job, job_id)
        kinds = session.scalars(select(Event.kind).where(Event.job_id == job_id)).all()
        assert job.status == JobStatus.REJECTED
        assert job.finished_at is not None
        assert job.plan is not None
        assert job.plan["rejected_by"] == "grace"
    assert kinds.count(EventKind.PLAN_REJECTED) == 1


def test_only_a_job_awaiting_approval_can_be_rejected(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _awaiting(db, settings, py_repo, tmp_path)
    reject_job(db, job_id, "grace")
    with pytest.raises(InputError, match=f"job {job_id} is rejected; only a job awaiting"):
        reject_job(db, job_id, "grace")
    with pytest.raises(JobNotFoundError, match="no job with id 'nope'"):
        reject_job(db, "nope", "grace")


def test_without_a_login_name_the_decider_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    def nameless() -> str:
        raise KeyError("getpwuid(): uid not found: 4242")

    monkeypatch.setattr(getpass, "getuser", nameless)
    assert user_name() == "unknown"
