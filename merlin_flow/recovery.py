"""The recovery sweep: find steps whose lease expired and put their jobs back in motion.

The embedded broker never redelivers a message whose worker was killed (kill -9, power
loss), and Redis only does so after its visibility timeout. So every worker runs this
sweep when it starts and every ``MERLIN_SWEEP_INTERVAL`` seconds. A step held by a worker
whose lease expired counts a recovery; past ``max_recoveries`` it fails as "worker lost"
instead of looping. A queued step whose message has waited past ``handoff_seconds`` is
enqueued again without counting (the duplicate is harmless: whichever message comes
second finds the lease or the phase changed and stops).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import select, update

from merlin_flow.config import MerlinConfig
from merlin_flow.graph import is_active
from merlin_flow.leases import QUEUED, queued_values
from merlin_flow.lifecycle import (
    add_event,
    fail_job_in_session,
    finalize_job,
    lock_job,
    start_runnable,
)
from merlin_flow.settings import Settings
from merlin_flow.store import (
    FINAL_JOB_STATUSES,
    FINISHED_STEP_STATUSES,
    Database,
    Job,
    JobStatus,
    Step,
    utcnow,
)

log = logging.getLogger(__name__)

WORKER_LOST = "worker lost"


def sweep(
    db: Database, settings: Settings, enqueue: Callable[[str, str | None], object]
) -> list[str]:
    """Re-enqueue the steps that lost their worker or their message; return their jobs' ids.

    ``enqueue(job_id, step_key)`` publishes a step's chain (the finalize for None). Every
    step of a job is looked at: steps of one job run at once, and each holds its own
    lease. A job whose steps all finished, or that ended, is finalized if it was not.
    """
    now = utcnow()
    with db.reader() as session:
        jobs = session.scalars(select(Job).where(Job.finished_at.is_(None))).all()
        candidates: list[tuple[str, int | None, str | None, datetime | None]] = []
        stalled: list[str] = []
        for job in jobs:
            if job.status in (JobStatus.PLANNING, JobStatus.AWAITING_APPROVAL):
                continue  # no steps yet: its planner, or a person, has it
            unfinished = [s for s in job.steps if s.status not in FINISHED_STEP_STATUSES]
            if job.status in FINAL_JOB_STATUSES or not unfinished:
                # Nothing left to run, but never closed (its worker died first): close it.
                candidates.append((job.id, None, None, None))
                continue
            if job.status in (JobStatus.PENDING, JobStatus.RUNNING) and not any(
                is_active(step) for step in unfinished
            ):
                stalled.append(job.id)
            for step in unfinished:
                expires = step.lease_expires_at
                if expires is not None and expires < now:
                    candidates.append((job.id, step.id, step.lease_owner, expires))
    recovered: list[str] = []
    for job_id, step_id, owner, expires in candidates:
        try:  # one broken job (its repository deleted, say) must not stop the others
            if step_id is None:
                finalize_job(db, settings, job_id)
                continue
            key = _take_over(db, settings, job_id, step_id, owner, expires)
            if key is not None:
                recovered.append(job_id)
                enqueue(job_id, key)
        except Exception:
            log.exception("recovery sweep: job %s could not be recovered", job_id)
    for job_id in stalled:
        try:
            for key in _start_stalled(db, settings, job_id):
                recovered.append(job_id)
                enqueue(job_id, key)
        except Exception:
            log.exception("recovery sweep: job %s could not be restarted", job_id)
    return list(dict.fromkeys(recovered))


def _start_stalled(db: Database, settings: Settings, job_id: str) -> tuple[str, ...]:
    """Queue the runnable steps of a job with none running or queued (none should be)."""
    with db.session() as session:
        job = lock_job(session, job_id)
        if job.status in FINAL_JOB_STATUSES or any(is_active(step) for step in job.steps):
            return ()
        dispatch = start_runnable(session, job, settings.handoff_seconds)
        for key in dispatch.start:
            add_event(session, job_id, "step_recovered", f"step {key} queued: none was", key)
        return dispatch.start


def _take_over(
    db: Database, settings: Settings, job_id: str, step_id: int, owner: str | None, expires: object
) -> str | None:
    """Hand an expired step back to the queue; its key if this sweep won and should enqueue."""
    worker_died = owner not in (None, QUEUED)
    with db.session() as session:
        job = session.get_one(Job, job_id, with_for_update=True)  # job first, as everywhere
        ended = job.status in FINAL_JOB_STATUSES  # cancelled since the sweep read it
        if ended:
            session.execute(
                update(Step)
                .where(Step.id == step_id, Step.lease_owner == owner)
                .values(lease_owner=None, lease_expires_at=None)
                .execution_options(synchronize_session=False)
            )
    if ended:
        finalize_job(db, settings, job_id)  # its worker is gone: close the job
        return None
    with db.session() as session:
        job = session.get_one(Job, job_id, with_for_update=True)
        limits = MerlinConfig.model_validate(job.config).limits
        result = session.execute(
            update(Step)
            .where(Step.id == step_id, Step.lease_owner == owner, Step.lease_expires_at == expires)
            .values(
                recoveries=Step.recoveries + (1 if worker_died else 0),
                **queued_values(settings.handoff_seconds),
            )
            .execution_options(synchronize_session=False)
        )
        if not result.rowcount:  # type: ignore[attr-defined]
            return None  # another sweep, or the step's own worker, got there first
        step = session.get_one(Step, step_id)
        session.refresh(step)
        if worker_died and step.recoveries > limits.max_recoveries:
            step.lease_owner = step.lease_expires_at = None
            reason = (
                f"step {step.key} failed: {WORKER_LOST} {step.recoveries} times "
                f"(max_recoveries = {limits.max_recoveries})"
            )
            fail_job_in_session(session, job_id, step, reason)
            failed = True
        else:
            what = "its worker was lost" if worker_died else "its message waited too long"
            add_event(
                session,
                job_id,
                "step_recovered",
                f"step {step.key} re-enqueued: {what}",
                step.key,
                recoveries=step.recoveries,
            )
            failed = False
    if failed:
        log.warning("job %s failed: a step was lost more than max_recoveries times", job_id)
        finalize_job(db, settings, job_id)
        return None
    return None if job.status in FINAL_JOB_STATUSES else step.key
