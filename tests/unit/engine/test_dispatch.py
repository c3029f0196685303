"""remaining_tasks and start_runnable: the messages a job still waits for, the steps it starts."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import update

from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.dispatch import (
    Outcome,
    PlannedTask,
    TaskName,
    remaining_tasks,
    start_runnable,
)
from merlin_flow.engine.leases import QUEUED
from merlin_flow.engine.lifecycle import end_job
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Job, JobStatus, Step, StepStatus
from tests.unit.scripted_jobs import scripted_job

STEP, VERIFY, FINALIZE = TaskName.STEP, TaskName.VERIFY, TaskName.FINALIZE


def test_a_new_job_waits_for_its_first_step_and_its_verdict(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path, steps=2)  # s1 needs s0
    assert remaining_tasks(db, job_id) == [[PlannedTask(STEP, "s0"), PlannedTask(VERIFY, "s0")]]
    assert remaining_tasks(db, job_id, only="s1") == []


def test_a_committed_attempt_waits_for_its_verdict_alone(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    assert remaining_tasks(db, job_id) == [[PlannedTask(VERIFY, "s0")]]


def test_an_ended_job_waits_for_its_finalize_and_a_finished_one_for_nothing(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    with db.session() as session:
        end_job(session, job_id, None, "cancelled on request", JobStatus.CANCELLED)
    assert remaining_tasks(db, job_id) == [[PlannedTask(FINALIZE)]]
    with db.session() as session:
        session.get_one(Job, job_id).finished_at = session.get_one(Job, job_id).created_at
    assert remaining_tasks(db, job_id) == []
    assert remaining_tasks(db, "no-such-job") == []


def test_start_runnable_queues_what_may_start_within_the_limit(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path, steps=3)
    with db.session() as session:  # three independent steps, none queued yet
        session.execute(
            update(Step)
            .where(Step.job_id == job_id)
            .values(depends_on=[], lease_owner=None, lease_expires_at=None)
        )
    with db.session() as session:
        job = session.get_one(Job, job_id)
        job.config = {**job.config, "limits": {"max_parallel_steps": 2}}
        dispatch = start_runnable(session, job, 60.0)
        assert dispatch.start == ("s0", "s1")  # file order, two at a time
        assert not dispatch.finalize
        assert [s.lease_owner for s in job.steps] == [QUEUED, QUEUED, None]
        for step in job.steps:
            step.status = StepStatus.COMPLETED
        assert start_runnable(session, job, 60.0).finalize
