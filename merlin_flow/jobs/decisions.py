"""Deciding on a plan without the planner: rejecting it, and the checks approval shares.

``merlin reject`` ends a job waiting for approval as ``rejected``: no step runs, no
branch is made. It reads and writes only the job's row, so this module imports nothing
of the planner, the models or the agents (``merlin_flow.jobs.requesting`` holds
``approve_job``, which needs them to choose each step's agent and exit command).
"""

from __future__ import annotations

import getpass

from sqlalchemy.orm import Session

from merlin_flow.engine.lifecycle import reject_plan
from merlin_flow.errors import InputError, JobNotFoundError
from merlin_flow.store import Database, Job, JobStatus, utcnow
from merlin_flow.store.database import write_patiently


def reject_job(db: Database, job_id: str, rejected_by: str | None = None) -> None:
    """End a job waiting for approval as ``rejected``: no step runs, no branch is made."""
    who = rejected_by or user_name()

    def write(session: Session) -> None:
        job = waiting(session.get(Job, job_id, with_for_update=True), job_id, "rejected")
        job.plan = dict(job.plan or {}, rejected_by=who, rejected_at=utcnow().isoformat())
        reject_plan(session, job, who)

    write_patiently(db, write, lambda s: decided(s, job_id), f"the rejection of {job_id}")


def decided(session: Session, job_id: str) -> bool:
    """Whether the job no longer waits for approval (a cut commit landed after all)."""
    job = session.get(Job, job_id)
    return job is not None and job.status != JobStatus.AWAITING_APPROVAL


def found(job: Job | None, job_id: str) -> Job:
    """The job's row; JobNotFoundError when there is none."""
    if job is None:
        raise JobNotFoundError(f"no job with id {job_id!r}")
    return job


def waiting(job: Job | None, job_id: str, verb: str) -> Job:
    """The job's row; InputError unless it waits for approval (``verb``: what was asked)."""
    job = found(job, job_id)
    if job.status != JobStatus.AWAITING_APPROVAL:
        raise InputError(
            f"job {job_id} is {job.status}; only a job awaiting approval can be {verb}"
        )
    return job


def user_name() -> str:
    """Who approves or rejects: the login name of this process."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return "unknown"
