"""The recovery sweep: find steps whose lease expired and put their jobs back in motion.

The embedded broker never redelivers a message whose worker was killed (kill -9, power
loss), and Redis only does so after its visibility timeout. So every worker runs this
sweep when it starts and every ``MERLIN_SWEEP_INTERVAL`` seconds.

**A lost worker.** A step held by a worker whose lease expired, or whose process is
gone (``leases.process_gone``: a worker of this machine, killed, seen at once rather than
a lease later), is taken over: queued again and published (every take-over adds one to
``losses``). Whether the loss counts
against the step (``recoveries``, limited by ``max_recoveries``) follows one rule:

    A loss counts against a step only when the step is the one running in every loss
    since its previous one: between the step's previous loss (or its start) and this
    one, no other step, of any job, lost its worker (a different process), and no other
    worker went silent (``merlin_flow.engine.presence``: its beat stopped), busy or idle.

A poison step, one that kills its worker each time it is delivered, is the only one
lost in each of its deaths, so each death counts and it is parked ("failed: worker lost
N times ... a poison step") after ``max_recoveries``: never looped forever, and the
other jobs go on. A machine that loses workers for its own reasons (OOM kills of other
processes, a node drained, kill -9 at random) loses other steps too: the step is queued
again without counting, however often: a step that is merely unlucky would need the
machine to lose no other worker, busy or idle, between each of several of its losses
while it keeps losing the one running it. Losses of steps run by one process (a
threaded worker running two) are one death: both steps count it. An idle worker's death
shows as its beat going silent, two sweep intervals after its last beat; lease tokens
name their worker (``leases.new_token``), so a step's own worker's silence is not taken
for another's. A busy worker killed at the same moment as an idle one is taken over
before the idle one's silence shows (at once, when its process is seen gone), so that
loss counts; the idle one's is seen by every later take-over. A machine whose only
worker keeps dying, always while it runs the same step, still parks that step: from
the database it looks the same as a step that kills its worker.

**A lost message.** A queued step (a ``QUEUED`` lease) waits for its message. When the
caller can read the broker (``messages``), a queued step whose message is neither in a
queue nor just delivered, ``grace`` seconds after it was queued, lost it (its publisher
or the worker it was delivered to died first): it is published again at once, without
counting. The grace counts from when the sweeper began to watch (``watched_since``) if
that is later: a worker that boots after a job was queued (``merlin run``) takes the
message before its first sweep and claims the step a moment later. Otherwise, and on a
broker that cannot be read, a ``QUEUED`` lease that outlives ``handoff_seconds`` is
published again. A duplicate message is harmless:
whichever message comes second finds the lease or the phase changed and stops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from merlin_flow.config import MerlinConfig
from merlin_flow.engine.dispatch import start_runnable
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.graph import is_active
from merlin_flow.engine.held_step import lock_job
from merlin_flow.engine.leases import (
    QUEUED,
    process_gone,
    queued_values,
    token_process,
    token_worker,
)
from merlin_flow.engine.lifecycle import end_job
from merlin_flow.settings import Settings
from merlin_flow.store import (
    FINAL_JOB_STATUSES,
    FINISHED_STEP_STATUSES,
    Database,
    Job,
    JobStatus,
    Step,
    WorkerBeat,
    utcnow,
)
from merlin_flow.store.events import EventKind, add_event

log = logging.getLogger(__name__)

WORKER_LOST = "worker lost"
MESSAGE_LOST = "its message was lost"
MIN_GRACE_SECONDS = 3.0
"""A queued step's message is looked for this long (or a sweep interval) before it is lost:
long enough for a publisher between its commit and its publish (every publisher has
imported Celery before it commits), and for a worker between receiving a message and
claiming its step (under a second, unless the machine is overloaded). Shorter than a
lease, so a message a killed worker had reserved runs elsewhere within a lease."""

Messages = set[tuple[str, str]]
"""``(job id, step key)`` of every step or verify message in a queue or just delivered."""


@dataclass(frozen=True)
class _Candidate:
    """A step to take over (or a job to finalize: ``step_id`` None)."""

    job_id: str
    step_id: int | None = None
    owner: str | None = None
    expires: datetime | None = None
    message_lost: bool = False


def grace(settings: Settings) -> float:
    """Seconds a queued step's message may be missing from the broker before it is lost."""
    return max(MIN_GRACE_SECONDS, settings.sweep_interval)


def sweep(
    db: Database,
    settings: Settings,
    enqueue: Callable[[str, str | None], object],
    messages: Callable[[], Messages | None] | None = None,
    watched_since: datetime | None = None,
) -> list[str]:
    """Re-enqueue the steps that lost their worker or their message; return their jobs' ids.

    ``enqueue(job_id, step_key)`` publishes a step's chain (the finalize for None);
    ``messages()`` lists what the broker holds (None: it cannot tell), as watched since
    ``watched_since`` (the sweeper's start; see the module doc). Every step of a
    job is looked at: steps of one job run at once, and each holds its own lease. A job
    whose steps all finished, or that ended, is finalized if it was not.
    """
    on_broker = messages() if messages is not None else None  # read before the rows
    now = utcnow()
    handoff, wait = timedelta(seconds=settings.handoff_seconds), timedelta(seconds=grace(settings))
    with db.reader() as session:
        jobs = session.scalars(select(Job).where(Job.finished_at.is_(None))).all()
        candidates: list[_Candidate] = []
        stalled: list[str] = []
        for job in jobs:
            if job.status in (JobStatus.PLANNING, JobStatus.AWAITING_APPROVAL):
                continue  # no steps yet: its planner, or a person, has it
            unfinished = [s for s in job.steps if s.status not in FINISHED_STEP_STATUSES]
            if job.status in FINAL_JOB_STATUSES or not unfinished:
                # Nothing left to run, but never closed (its worker died first): close it.
                candidates.append(_Candidate(job.id))
                continue
            if job.status in (JobStatus.PENDING, JobStatus.RUNNING) and not any(
                is_active(step) for step in unfinished
            ):
                stalled.append(job.id)
            for step in unfinished:
                expires = step.lease_expires_at
                if expires is None:
                    continue
                lost = (
                    on_broker is not None
                    and step.lease_owner == QUEUED
                    # queued (or watched) more than ``grace`` ago
                    and max(expires - handoff, watched_since or expires - handoff) < now - wait
                    and (job.id, step.key) not in on_broker
                )
                gone = step.lease_owner != QUEUED and process_gone(step.lease_owner)
                if expires < now or lost or gone:
                    candidates.append(
                        _Candidate(
                            job.id, step.id, step.lease_owner, expires, lost and expires >= now
                        )
                    )
    recovered: list[str] = []
    for candidate in candidates:
        job_id = candidate.job_id
        try:  # one broken job (its repository deleted, say) must not stop the others
            if candidate.step_id is None:
                finalize_job(db, settings, job_id)
                continue
            key = _take_over(db, settings, candidate)
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
            message = f"step {key} queued: none was"
            add_event(session, job_id, EventKind.STEP_RECOVERED, message, key)
        return dispatch.start


def counts_against(
    session: Session, step: Step, owner: str | None, now: datetime, settings: Settings
) -> bool:
    """Whether losing ``owner`` counts against ``step``: no other worker was lost since.

    "Since" is the step's previous loss, or its start. Another worker was lost when
    another process lost a step, or when another worker's beat (``presence``) went
    silent, busy or idle: its last beat is after "since" and over two sweep intervals
    old (a worker that stops cleanly removes its beat). Steps lost right now (their
    worker's lease expired or its process is gone, not yet taken over) count as lost too,
    so that two workers lost together are seen by both take-overs, whichever comes first.
    """
    since = step.lost_at or step.started_at or datetime.min
    others = session.scalars(
        select(Step.lost_by).where(Step.id != step.id, Step.lost_at > since)
    ).all()
    held = session.execute(
        select(Step.lease_owner, Step.lease_expires_at).where(
            Step.id != step.id, Step.lease_owner.is_not(None), Step.lease_owner != QUEUED
        )
    ).all()
    dying = [
        other for other, ends in held if (ends is not None and ends < now) or process_gone(other)
    ]
    me = token_process(owner)
    if any(token_process(other) != me for other in [*others, *dying]):
        return False
    silent = session.scalars(
        select(WorkerBeat.name).where(
            WorkerBeat.last_seen > since,
            WorkerBeat.last_seen < now - timedelta(seconds=2 * settings.sweep_interval),
        )
    ).all()
    return all(name == token_worker(owner) for name in silent)


def _take_over(db: Database, settings: Settings, lost: _Candidate) -> str | None:
    """Hand an expired step back to the queue; its key if this sweep won and should enqueue."""
    job_id, step_id, owner, expires = lost.job_id, lost.step_id, lost.owner, lost.expires
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
    now = utcnow()
    with db.session() as session:
        job = session.get_one(Job, job_id, with_for_update=True)
        limits = MerlinConfig.model_validate(job.config).limits
        step = session.get_one(Step, step_id)
        counted = worker_died and counts_against(session, step, owner, now, settings)
        died: dict[str, object] = {}
        if worker_died:
            died = {"losses": Step.losses + 1, "lost_at": now, "lost_by": owner}
        result = session.execute(
            update(Step)
            .where(Step.id == step_id, Step.lease_owner == owner, Step.lease_expires_at == expires)
            .values(
                recoveries=Step.recoveries + (1 if counted else 0),
                **died,
                **queued_values(settings.handoff_seconds),
            )
            .execution_options(synchronize_session=False)
        )
        if not result.rowcount:  # type: ignore[attr-defined]
            return None  # another sweep, or the step's own worker, got there first
        session.refresh(step)
        if counted and step.recoveries > limits.max_recoveries:
            step.lease_owner = step.lease_expires_at = None
            reason = (
                f"step {step.key} failed: {WORKER_LOST} {step.recoveries} times with no other "
                f"step lost in between (max_recoveries = {limits.max_recoveries}): it kills "
                "its worker (a poison step), so it is parked"
            )
            end_job(session, job_id, step, reason, JobStatus.FAILED)
            failed = True
        else:
            if worker_died:
                what = "its worker was lost" + ("" if counted else " (other steps were too)")
            else:
                what = MESSAGE_LOST if lost.message_lost else "its message waited too long"
            add_event(
                session,
                job_id,
                EventKind.STEP_RECOVERED,
                f"step {step.key} re-enqueued: {what}",
                step.key,
                {"recoveries": step.recoveries, "losses": step.losses, "counted": counted},
            )
            failed = False
    if failed:
        log.warning("job %s failed: step parked as poison (lost its worker alone)", job_id)
        finalize_job(db, settings, job_id)
        return None
    return None if job.status in FINAL_JOB_STATUSES else step.key
