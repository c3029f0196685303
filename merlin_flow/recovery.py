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
from merlin_flow.leases import QUEUED, queued_values
from merlin_flow.lifecycle import add_event, fail_job_in_session, finalize_job
from merlin_flow.settings import Settings
from merlin_flow.store import (
    FINAL_JOB_STATUSES,
    FINISHED_STEP_STATUSES,
    Database,
    Job,
    Step,
    utcnow,
)

log = logging.getLogger(__name__)

WORKER_LOST = "worker lost"


def sweep(db: Database, settings: Settings, enqueue: Callable[[str], object]) -> list[str]:
    """Re-enqueue jobs whose active step lost its worker; return their ids."""
    now = utcnow()
    with db.reader() as session:
        jobs = session.scalars(select(Job).where(Job.finished_at.is_(None))).all()
        candidates: list[tuple[str, int | None, str | None, datetime | None]] = []
        for job in jobs:
            active = next((s for s in job.steps if s.status not in FINISHED_STEP_STATUSES), None)
            if job.status in FINAL_JOB_STATUSES or active is None:
                # Nothing left to run, but never closed (its worker died first): close it.
                candidates.append((job.id, None, None, None))
            elif active.lease_expires_at is not None and active.lease_expires_at < now:
                candidates.append((job.id, active.id, active.lease_owner, active.lease_expires_at))
    recovered: list[str] = []
    for job_id, step_id, owner, expires in candidates:
        try:  # one broken job (its repository deleted, say) must not stop the others
            if step_id is None:
                finalize_job(db, settings, job_id)
            elif _take_over(db, settings, job_id, step_id, owner, expires):
                recovered.append(job_id)
                enqueue(job_id)
        except Exception:
            log.exception("recovery sweep: job %s could not be recovered", job_id)
    return recovered


def _take_over(
    db: Database, settings: Settings, job_id: str, step_id: int, owner: str | None, expires: object
) -> bool:
    """Hand an expired step back to the queue; True if this sweep won and should enqueue."""
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
        return False
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
            return False  # another sweep, or the step's own worker, got there first
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
        return False
    return job.status not in FINAL_JOB_STATUSES
