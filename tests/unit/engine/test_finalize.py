"""finalize_job and fail_job: a job closed once, with its patch and summary, whoever closes it."""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy import func, select

from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.dispatch import Outcome
from merlin_flow.engine.finalize import fail_job, finalize_job
from merlin_flow.engine.leases import claim
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Event, Job, Step
from tests.conftest import git
from tests.unit.scripted_jobs import scripted_job


def test_a_finished_job_is_closed_once_with_its_patch(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    assert finalize_job(db, settings, job_id) == "pending"  # a stale finalize: s0 is to run
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    assert verify_step(db, settings, job_id, "s0", "w:2")[0] is Outcome.CONTINUE
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(finalize_job(db, settings, job_id)))
        for _ in range(3)
    ]  # the finalize task and two sweeps at once
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == ["completed"] * 3
    with db.reader() as session:
        job = session.get_one(Job, job_id)
        finished = select(func.count()).where(Event.job_id == job_id, Event.kind == "job_finished")
        assert session.scalar(finished) == 1
        assert job.patch_path is not None
    patch = Path(job.patch_path).read_text()
    assert "+    return 42" in patch
    # git's own bytes, binary files included (`git apply` takes it as it is)
    assert patch == git(py_repo, "diff", "--binary", job.base_commit, f"merlin/{job_id}") + "\n"
    assert (Path(job.patch_path).parent / "summary.md").is_file()
    assert finalize_job(db, settings, "no-such-job") is None


def test_fail_job_leaves_a_step_another_worker_holds(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    assert not fail_job(db, settings, job_id, "s0", "not-the-owner", "boom")
    assert not fail_job(db, settings, job_id, "no-such-step", "x", "boom")
    with db.reader() as session:
        assert session.get_one(Job, job_id).status == "pending"


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


# -- every named transition from every state ----------------------------------------------

"""The transition does not apply: TransitionRefused, nothing written."""
"""The transition is a no-op there: nothing written, no error."""
